// Elementwise ops over flat tensors of n elements.
// OP (a const from the pipeline key) picks the function at compile time:
//   0 scale-shift  x * alpha + beta
//   1 SiLU         x * sigmoid(x)
//   2 ReLU         max(x, 0)
//   3 tanh clamp   tanh(x / alpha) * alpha      (TAE latent clamp, alpha = 3)
//   4 add          x + y                        (entry `binary`)
//   5 clamp        clamp(x, alpha, beta)        (Wan's output to [-1, 1])
// Storage through `#storage` accessors (f32, f16, packed f16/bf16); arithmetic is f32.
// `unary` may convert: x and out can have different storage types.
// One element per invocation: these ops are memory bound.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    n: u32,
    alpha: f32,
    beta: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// x and y may be out itself (in place).
#storage x 1 shared
#ifdef BINARY
#storage y 2 shared
#storage out 3 write
#else
#storage out 2 write
#endif

fn unary_op(v: f32) -> f32 {
    switch OP {
        case 0u: { return v * p.alpha + p.beta; }
        case 1u: { return v / (1.0 + exp(-v)); }
        case 2u: { return max(v, 0.0); }
        // tanh saturates long before |v| = 20 alpha; clamping avoids inf/inf.
        case 3u: { return tanh(clamp(v / p.alpha, -20.0, 20.0)) * p.alpha; }
        case 5u: { return clamp(v, p.alpha, p.beta); }
        default: { return v; }
    }
}

fn index(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + li;
}

#ifdef BINARY
@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.n { return; }
    out_st(i, x_ld(i) + y_ld(i));
}
#else
@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.n { return; }
    out_st(i, unary_op(x_ld(i)));
}
#endif
