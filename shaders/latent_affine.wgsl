// Pipeline latents → decoder input on the GPU, for latents that arrive in a
// device buffer (the host path does the same on the CPU, src/latents.rs):
//
//   z[b, c, Y, X] = f(x[b, c·r² + (Y % r)·r + X % r, Y / r, X / r], pc)
//          f(v, pc) = v * a[pc] + s[pc]   FLUX.2: a = sqrt(running_var + eps), s = running_mean
//  DIVIDE: f(v, pc) = v / a[pc] + s[pc]   Qwen-Image: a = 1 / latents_std, s = latents_mean
//                                         (the pipeline divides; so do we, for the same rounding)
//
// pc is the input channel; r = 2 un-patchifies FLUX.2's 2×2 patches (patch
// channel 4c + 2dy + dx), r = 1 is a per-channel affine map. f32 in and out
// (the decoder's input is f32 in every dtype). One output element per
// invocation: memory bound, and run once per decode.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    n: u32,     // output elements
    c: u32,     // output channels
    h: u32,     // output rows
    w: u32,     // output columns
    r: u32,     // patch side: 1 or 2
    cin: u32,   // input channels = c * r * r
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// a[0..cin] then s[0..cin].
@group(0) @binding(2) var<storage, read_write> coef: array<f32>;
@group(0) @binding(3) var<storage, read_write> z: array<f32>;

@compute @workgroup_size(WG)
fn latent_affine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    if i >= p.n { return; }
    let xx = i % p.w;
    let yy = (i / p.w) % p.h;
    let bc = i / (p.w * p.h);
    let c = bc % p.c;
    let b = bc / p.c;
    let pc = c * p.r * p.r + (yy % p.r) * p.r + xx % p.r;
    let hin = p.h / p.r;
    let win = p.w / p.r;
    let v = x[((b * p.cin + pc) * hin + yy / p.r) * win + xx / p.r];
#ifdef DIVIDE
    z[i] = v / coef[pc] + coef[p.cin + pc];
#else
    z[i] = v * coef[pc] + coef[p.cin + pc];
#endif
}
