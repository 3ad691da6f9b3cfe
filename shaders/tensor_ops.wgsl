// Window copies between NCHW tensors, for tiled decoding.
//
//   copy_window  dst[p, dy + y, dx + x] = src[p, sy + y, sx + x]
//                for every plane p < planes (N * C, the same in both tensors),
//                y < h, x < w.
//
// WORDS: elements are raw 32-bit words, so any 4-byte dtype works (f32
// activations, packed RGBA8 pixels). Otherwise elements go through `#storage`
// accessors (f16, packed f16/bf16: 16-bit elements that share words), exact
// because a half value survives the round trip through f32. One invocation per copied element, the
// linear index recovered from a 2-D grid (see linear_groups); each
// invocation handles ITEMS consecutive elements of a row segment to amortise
// the index arithmetic. Memory bound.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    planes: u32,
    h: u32,          // copied rows
    w: u32,          // copied columns
    row_chunks: u32, // ceil(w / ITEMS)
    src_h: u32,
    src_w: u32,
    sy: u32,
    sx: u32,
    dst_h: u32,
    dst_w: u32,
    dy: u32,
    dx: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#ifdef WORDS
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
#else
#storage src 1 read
#storage dst 2 write
#endif

@compute @workgroup_size(WG)
fn copy_window(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    let per_plane = p.h * p.row_chunks;
    if i >= p.planes * per_plane { return; }
    let plane = i / per_plane;
    let rem = i - plane * per_plane;
    let y = rem / p.row_chunks;
    let x0 = (rem - y * p.row_chunks) * ITEMS;
    let s = (plane * p.src_h + p.sy + y) * p.src_w + p.sx + x0;
    let d = (plane * p.dst_h + p.dy + y) * p.dst_w + p.dx + x0;
    let n = min(ITEMS, p.w - x0);
    for (var t = 0u; t < n; t++) {
#ifdef WORDS
        dst[d + t] = src[s + t];
#else
        dst_st(d + t, src_ld(s + t));
#endif
    }
}
