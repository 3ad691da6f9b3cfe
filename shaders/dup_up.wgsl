// Channels to space by a factor F (ORDER 1: HunyuanVideo 1.5's DCAE order, below): the shortcut of a residual Wan up block (diffusers'
// DupUp3D on a video's first frame, as Wan 2.2 and Qwen-Image 2.1 decode it; F = 2) and
// PyTorch's pixel_shuffle (FT = 1, repeats = 1):
//   out[n, o, Y, X] = src[n, c, Y / F, X / F],
//   c = (((o * FT + dt) * F + Y % F) * F + X % F) / repeats
// (the channel the repeat_interleave / view / permute of DupUp3D puts at that pixel). The
// first `lead` source frames are first chunks, which keep only their last sub-frame
// (dt = FT - 1); every later source frame t gives FT output frames, dt = 0 .. FT - 1. Y, X are whole-image coordinates:
// `out` is a window at (oy, ox) of the up-sampled image and `src` a window at (sy, sx) of
// the low-resolution one, so a tile reads the same values as the whole image does.
// One output element per invocation; storage through `#storage` accessors (same dtype both
// sides, copied exactly). All storage is read_write: pooled tensors share buffers.

struct Params {
    total: u32, // N * CO * OH * OW
    co: u32,
    oh: u32,
    ow: u32,
    ci: u32,
    sh: u32,
    sw: u32,
    ft: u32,
    oy: u32,
    ox: u32,
    sy: u32,
    sx: u32,
    repeats: u32,
    f: u32,
    lead: u32, // source frames that are first chunks
    order: u32, // 0: DupUp3D / pixel_shuffle order; 1: DCAE (sub-position slowest); 2: tiled
    g_first: u32, // DCAE: channels per sub-position of a first-chunk frame
    r_first: u32, // DCAE: repeats of a first-chunk frame
    g_next: u32,
    r_next: u32,
    add: u32, // 1: add into out (a residual) instead of overwriting it
    _p2: u32,
    _p3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#storage src 1 read
#storage out 2 write

// (x, y, channel, frame) of flat output element i of [N, CO, OH, OW].
fn out_coords(i: u32) -> vec4<u32> {
    let r1 = i / p.ow;
    let r2 = r1 / p.oh;
    return vec4<u32>(i % p.ow, r1 % p.oh, r2 % p.co, r2 / p.co);
}

#ifdef UNSHUFFLE
// PyTorch's pixel_unshuffle, space to channels (a patch-size-p TAEHV encoder's input):
//   out[n, c * F * F + dy * F + dx, y, x] = src[n, c, y * F + dy, x * F + dx]
// (out [N, CO, OH, OW], src [N, CI, SH, SW], CO = CI * F * F).
@compute @workgroup_size(WG)
fn pixel_unshuffle(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    if i >= p.total { return; }
    let at = out_coords(i);
    let x = at.x;
    let y = at.y;
    let o = at.z;
    let b = at.w;
    let c = o / (p.f * p.f);
    let dy = (o / p.f) % p.f;
    let dx = o % p.f;
    out_st(i, src_ld(((b * p.ci + c) * p.sh + y * p.f + dy) * p.sw + x * p.f + dx));
}
#else
@compute @workgroup_size(WG)
fn dup_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    if i >= p.total { return; }
    let at = out_coords(i);
    let x = at.x;
    let y = at.y;
    let o = at.z;
    let b = at.w;
    var sb = b;
    var dt = p.ft - 1u;
    if b >= p.lead {
        let j = b - p.lead;
        sb = p.lead + j / p.ft;
        dt = j % p.ft;
    }
    let gy = p.oy + y;
    let gx = p.ox + x;
    var c = (((o * p.ft + dt) * p.f + gy % p.f) * p.f + gx % p.f) / p.repeats;
    if p.order == 2u {
        // LTX-2's residual: g_next channels of FT * F * F sub-pixels, tiled.
        c = ((((o % p.g_next) * p.ft + dt) * p.f + gy % p.f) * p.f + gx % p.f);
    }
    if p.order == 1u {
        // HunyuanVideo 1.5's DCAE rearrange: packed channel (sub * G + o) / R, the
        // sub-pixel offset (dt, dy, dx) slowest; a first-chunk frame has no dt.
        let sub = gy % p.f * p.f + gx % p.f;
        if b < p.lead {
            c = (sub * p.g_first + o) / p.r_first;
        } else {
            c = ((dt * p.f * p.f + sub) * p.g_next + o) / p.r_next;
        }
    }
    let ly = gy / p.f - p.sy;
    let lx = gx / p.f - p.sx;
    var v = src_ld(((sb * p.ci + c) * p.sh + ly) * p.sw + lx);
    if p.add == 1u { v += out_ld(i); }
    out_st(i, v);
}
#endif
