// Norms over channels at every position:
//   default   out[n, c, i] = x[n, c, i] / max(||x[n, :, i]||, 1e-12) * gamma[c]   (Wan 2.1 VAE's
//             WanRMS_norm; gamma holds sqrt(C))
//   MEAN_EPS  x / sqrt(mean(x^2) + eps) * gamma          (nn.RMSNorm)
//   CENTER    (x - mean) / sqrt(var + eps) * gamma        (nn.LayerNorm without its bias)
// then SiLU when SILU is set (the norms Wan follows with SiLU; fused so the normed tensor is
// written once). One position per invocation: a pass over C for the norm, one to write.
// Storage through `#storage` accessors (f32, f16, packed f16/bf16); arithmetic is f32.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    positions: u32, // N * H * W
    c: u32,
    hw: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
#storage x 1 read
@group(0) @binding(2) var<storage, read_write> gamma: array<f32>;
#storage out 3 write

@compute @workgroup_size(WG)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    if i >= p.positions { return; }
    let nb = i / p.hw;
    let base = nb * p.c * p.hw + (i - nb * p.hw);
    var mean = 0.0;
#ifdef CENTER
    for (var c = 0u; c < p.c; c++) {
        mean += x_ld(base + c * p.hw);
    }
    mean /= f32(p.c);
#endif
    var ss = 0.0;
    for (var c = 0u; c < p.c; c++) {
        let v = x_ld(base + c * p.hw) - mean;
        ss += v * v;
    }
#ifdef CENTER
    let inv = 1.0 / sqrt(ss / f32(p.c) + p.eps);
#else
#ifdef MEAN_EPS
    let inv = 1.0 / sqrt(ss / f32(p.c) + p.eps);
#else
    let inv = 1.0 / max(sqrt(ss), 1e-12);
#endif
#endif
    for (var c = 0u; c < p.c; c++) {
        var v = (x_ld(base + c * p.hw) - mean) * inv * gamma[c];
#ifdef SILU
        v = v / (1.0 + exp(-v));
#endif
        out_st(base + c * p.hw, v);
    }
}
