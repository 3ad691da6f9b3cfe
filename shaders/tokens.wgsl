// Token ops of transformer decoders (MiniMax-H3's ViT decoder). Tokens live as a channel-major
// image [1, C, rows, w]: token l is element l of each channel's plane (rows * w elements), a
// latent grid's T * h * w tokens first (l = (t * h + y) * w + x, so they fill T * h whole rows),
// then extra tokens and padding. 1x1 convs are then the linear layers, and per-position norms
// the per-token ones.
//
//   tokens      DIR 0: frames [T, C, h, w] -> tokens [1, C, plane], tokens past T * h * w zeroed;
//               DIR 1: back (the first T * h * w tokens).
//   unpatchify  the grid's tokens [F, plane] (F = C * ft * f * f, (c, dt, dy, dx) order) straight to
//               frames [T * ft, C, h * f, w * f] (ft in `half`, f in `nf`).
//   set_tokens  tokens l in [first, plane): reg[(l - first) * C + c] for the first `extra`
//               (register tokens, f32 [extra, C]), zero after (the zero token, padding).
//   rope        rotary embedding in place on f32 q or k viewed as [heads, d, plane]: for the
//               grid's tokens, channel pairs (j, j + half), j < half, rotate by the angle of
//               axis j / nf (t, y or x) and frequency j % nf, read from `table` (cos, sin) per
//               axis coordinate: [(T + h + w) * nf * 2]. Extra tokens sit at position 0 (no
//               rotation).
//   glu         out[c, l] = x[c, l] * silu(x[C + c, l])  (SwiGLU: value half, then gate half).
//   crossfade   frames [src0, src0 + n) of x [F, e] copied to out at dst0; the first `fade` of
//               them, with PREV, blended with prev's: prev * (1 - j / fade) + x * (j / fade),
//               as diffusers cross-fades the clips of a chunked video decode.
//   stitch      one spatial tile [P, th, tw] of a tiled clip decode into out [P, H, W] at (y0, x0),
//               its first `eh` rows blended with the tile above's last ones, then its first `ew`
//               columns with the left tile's last ones (both as decoded, unblended), cropped to
//               ch x cw: MiniMax-H3's `_stitch_tiles`.
// One output element (rope: one channel pair) per invocation; storage through `#storage`
// accessors (f32, f16, packed f16/bf16), arithmetic in f32. All storage is read_write: pooled
// tensors share buffers (see BindingKind).

struct Params {
    total: u32,  // invocations
    c: u32,      // channels (glu: output channels; rope: d)
    t: u32,      // grid frames
    h: u32,      // grid rows
    w: u32,      // grid columns
    plane: u32,  // tokens per channel (rows * w)
    first: u32,  // set_tokens: first extra token; crossfade: src0
    extra: u32,  // set_tokens: register tokens; crossfade: dst0
    half: u32,   // rope: rotated pairs per head
    nf: u32,     // rope: frequencies per axis
    fade: u32,   // crossfade: blended frames
    frame: u32,  // crossfade: elements per frame
    oh: u32,     // stitch: out rows
    ow: u32,     // stitch: out columns
    ch: u32,     // stitch: rows written
    cw: u32,     // stitch: columns written
    y0: u32,     // stitch: the tile's corner in out
    x0: u32,
    eh: u32,     // stitch: rows blended with the tile above
    ew: u32,     // stitch: columns blended with the tile to the left
}

@group(0) @binding(0) var<uniform> p: Params;

fn index(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.x + wg.y * nwg.x) * WG + li;
}

#ifdef TOKENS
#storage x 1 read
#storage out 2 write

@compute @workgroup_size(WG)
fn tokens(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let hw = p.h * p.w;
#ifdef BACK
    // out [T, C, h, w]
    let r = i % hw;
    let c = (i / hw) % p.c;
    let t = i / (hw * p.c);
    out_st(i, x_ld(c * p.plane + t * hw + r));
#else
    // out [1, C, plane]
    let l = i % p.plane;
    let c = i / p.plane;
    var v = 0.0;
    if l < p.t * hw {
        let t = l / hw;
        v = x_ld((t * p.c + c) * hw + (l - t * hw));
    }
    out_st(i, v);
#endif
}
#endif

#ifdef UNPATCHIFY
#storage x 1 read
#storage out 2 write

@compute @workgroup_size(WG)
fn unpatchify(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    // One output row segment of f pixels (one token's dx) per invocation.
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let f = p.nf;
    let oh = p.h * f;
    let x = i % p.w;
    let yo = (i / p.w) % oh;
    let c = (i / (p.w * oh)) % p.c;
    let tf = i / (p.w * oh * p.c);
    let t = tf / p.half;
    let dt = tf - t * p.half;
    let ch = ((c * p.half + dt) * f + yo % f) * f;
    let l = (t * p.h + yo / f) * p.w + x;
    let o = i * f;
    for (var dx = 0u; dx < f; dx++) {
        out_st(o + dx, x_ld((ch + dx) * p.plane + l));
    }
}
#endif

#ifdef SET_TOKENS
#storage x 1 write
@group(0) @binding(2) var<storage, read_write> reg: array<f32>;

@compute @workgroup_size(WG)
fn set_tokens(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let span = p.plane - p.first;
    let c = i / span;
    let k = i - c * span;
    var v = 0.0;
    if k < p.extra {
        v = reg[k * p.c + c];
    }
    x_st(c * p.plane + p.first + k, v);
}
#endif

#ifdef ROPE
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> table: array<f32>;

@compute @workgroup_size(WG)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let hw = p.h * p.w;
    let grid = p.t * hw;
    let j = i % p.half;
    let l = (i / p.half) % grid;
    let b = i / (p.half * grid);
    let axis = j / p.nf;
    let f = j - axis * p.nf;
    let t = l / hw;
    let y = (l - t * hw) / p.w;
    let xx = l % p.w;
    var at = t;
    if axis == 1u {
        at = p.t + y;
    } else if axis == 2u {
        at = p.t + p.h + xx;
    }
    let cs = (at * p.nf + f) * 2u;
    let cos_a = table[cs];
    let sin_a = table[cs + 1u];
    let base = b * p.c * p.plane + l;
    let i1 = base + j * p.plane;
    let i2 = base + (j + p.half) * p.plane;
    let a = x[i1];
    let bb = x[i2];
    x[i1] = a * cos_a - bb * sin_a;
    x[i2] = bb * cos_a + a * sin_a;
}
#endif

#ifdef GLU
#storage x 1 read
#storage out 2 write

@compute @workgroup_size(WG)
fn glu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let g = x_ld(i + p.c * p.plane);
    out_st(i, x_ld(i) * (g / (1.0 + exp(-g))));
}
#endif

#ifdef CROSSFADE
#storage x 1 read
#storage prev 2 read
#storage out 3 write

@compute @workgroup_size(WG)
fn crossfade(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let j = i / p.frame;
    let e = i - j * p.frame;
    var v = x_ld((p.first + j) * p.frame + e);
#ifdef PREV
    if j < p.fade {
        let wb = f32(j) / f32(p.fade);
        let wa = 1.0 - wb;
        v = prev_ld(j * p.frame + e) * wa + v * wb;
    }
#endif
    out_st((p.extra + j) * p.frame + e, v);
}
#endif

#ifdef STITCH
#storage x 1 read
#storage above 2 read
#storage left 3 read
#storage out 4 write

// h, w: the tile's rows and columns.
@compute @workgroup_size(WG)
fn stitch(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = index(wg, nwg, li);
    if i >= p.total { return; }
    let x = i % p.cw;
    let y = (i / p.cw) % p.ch;
    let plane = i / (p.cw * p.ch);
    let row = plane * p.h;
    var v = x_ld((row + y) * p.w + x);
    if y < p.eh {
        let wb = f32(y) / f32(p.eh);
        v = above_ld((row + p.h - p.eh + y) * p.w + x) * (1.0 - wb) + v * wb;
    }
    if x < p.ew {
        let wb = f32(x) / f32(p.ew);
        v = left_ld((row + y) * p.w + p.w - p.ew + x) * (1.0 - wb) + v * wb;
    }
    out_st((plane * p.oh + p.y0 + y) * p.ow + p.x0 + x, v);
}
#endif
