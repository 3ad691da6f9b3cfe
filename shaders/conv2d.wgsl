// 2-D convolution as an implicit GEMM:  out[M = Cout, N = pixels] = W[M, K] * X[K, N]
// with K = Cin * KS * KS ordered k = ci * KS*KS + ky * KS + kx (PyTorch's order); the X
// operand is im2col computed on the fly.
//
// Fused on load:  nearest-2x upsample (UPSAMPLE), per-(image, channel) affine + activation
// (PROLOGUE, ACT), zero padding (after the prologue: padded taps contribute exactly 0).
// Frame offsets (in_frame, out_frame) let a causal video conv add one time tap at a time,
// reading earlier frames in place from the current input or the cache (Wan's 3x3x3 convs).
// Fused on store: bias (HAS_BIAS), residual add (HAS_RESIDUAL; `res` may alias `out`), and
// for f16 outputs a count of values f16 cannot hold (CHECK_RANGE).
//
// Specialisation (pipeline-key constants): a workgroup computes TM output channels x TN
// output pixels, the pixels being a (TN / TW) x TW patch of the output image (TW a power of
// two: tile coordinates need no division). Each invocation accumulates an RM x RN register
// block (RM channels x RN pixels of one output row) in f32. WG = (TM / RM) * (TN / RN).
// KS (1 | 3), STRIDE (1 | 2), ACT (0 none, 1 SiLU, 2 ReLU). x, wt, res and out are read and
// written through `#storage` accessors (f32, f16 or packed f16/bf16 each, from the key);
// accumulation is always f32.
//
// Two ways to feed the register blocks, chosen per device:
// - default (GPUs): both operand tiles are staged in workgroup memory, TK reduction steps at
//   a time (weights as vec4 rows, the input tile im2col'd while loading), and every
//   invocation reads its RM + RN operands per step from there.
// - DIRECT (CPU adapters such as lavapipe, where workgroup memory is ordinary memory reached
//   by a scalar loop over the SIMD lanes and barriers split the shader into coroutines):
//   each invocation reads its operands straight from the (cached) buffers, one kernel row
//   (ci, ky) at a time, loading the input row segment its RN pixels need once for all KS
//   taps.
//
// The register block is unrolled by the host (`micro_kernel_source` in conv2d.rs appends
// `alias Acc`, `micro_step` or `row_step`, and `store_block`): compilers keep accumulators in
// registers only under constant indices, and several (Mesa's among them) do not unroll loops
// of this size.
//
// Entry `naive` (flag NAIVE): one output per invocation, no reuse; for benchmarks only.
//
// Weights come re-laid-out by the host as Wt[kp][mp] (K-major, Cout contiguous), zero padded
// to multiples of TK and TM, so weight loads are vec4 wide and need no bounds checks.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    cin: u32,
    h: u32,        // input height (before upsample)
    w: u32,        // input width (before upsample)
    cout: u32,
    ho: u32,
    wo: u32,
    hin: u32,      // height the taps see (2h with upsample)
    win: u32,      // width the taps see (2w with upsample)
    pad_top: u32,
    pad_left: u32,
    ktot: u32,     // Cin * KS * KS
    mpad: u32,     // row length of Wt (a multiple of TM and of 4)
    tiles_x: u32,  // pixel tiles per row of tiles
    ntiles: u32,   // pixel tiles per image
    mtiles: u32,   // Cout tiles
    npix: u32,     // Ho * Wo
    in_frame: u32,  // input image read for dispatched image nb: nb + in_frame
    out_frame: u32, // output (and residual) image written for nb: nb + out_frame
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#storage x 1 read
#ifdef NAIVE
#storage wt 2 read
#else
#storage wt 2 read vec4
#endif
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> affine: array<vec2<f32>>;
// res may be out itself (in-place residual).
#storage res 5 shared
#storage out 6 write
// Counter of stored values outside f16's finite range (CHECK_RANGE, f16 outputs): a
// decode reads it once and redoes an overflowed f16 decode in bf16.
@group(0) @binding(7) var<storage, read_write> range_flags: array<atomic<u32>>;

fn out_store(i: u32, v: f32) {
#ifdef CHECK_RANGE
    // Negated so NaN counts too.
    if !(abs(v) < 65504.0) { atomicAdd(&range_flags[0], 1u); }
#endif
    out_st(i, v);
}

const KK = KS * KS;

fn activate(v: f32) -> f32 {
    switch ACT {
        case 1u: { return v / (1.0 + exp(-v)); }
        case 2u: { return max(v, 0.0); }
        default: { return v; }
    }
}

// a / b for a < 2^22 through f32 (exact there). Integer division is a scalar loop on SIMD
// CPUs, and compilers may recompute it after every barrier rather than keep it.
fn div_small(a: u32, b: u32) -> u32 {
    return u32((f32(a) + 0.5) / f32(b));
}

// k / KK and t / KS by multiply-shift, exact for k < 2^16 (the host checks Cin * KK).
fn div_kk(k: u32) -> u32 {
    if KK == 1u { return k; }
    return (k * 58255u) >> 19u;
}
fn div_ks(t: u32) -> u32 {
    if KS == 1u { return 0u; }
    return (t * 11u) >> 5u;
}

// Scale and shift of the prologue for a channel plane (nb * Cin + ci).
fn plane_affine(plane: u32, ok: bool) -> vec2<f32> {
#ifdef PROLOGUE
    return affine[select(0u, plane, ok)];
#else
    return vec2<f32>(1.0, 0.0);
#endif
}

// Index i of a row or column of n after padding: REPLICATE clamps it to the edge, REFLECT
// reflects it (PyTorch's "reflect", the edge not repeated; pads smaller than n), otherwise it
// stays (out of range reads zero).
fn padded(i: i32, n: i32) -> i32 {
#ifdef REPLICATE
    return clamp(i, 0, n - 1);
#else
#ifdef REFLECT
    var r = i;
    if r < 0 { r = -r; }
    if r >= n { r = 2 * (n - 1) - r; }
    return clamp(r, 0, n - 1);
#else
    return i;
#endif
#endif
}

// The input value at column ix of the (upsampled) frame in the row starting at x[rowbase];
// 0 outside the frame (unless padded()) or when !ok. The index is clamped, so
// the load is always valid.
fn xrow(rowbase: u32, ix_in: i32, ok: bool, ss: vec2<f32>) -> f32 {
    let c = xcol(rowbase, ix_in, ok);
    return finish(x_ld(c.x), c.y != 0u, ss);
}

// Column ix of the (upsampled) frame in the row starting at x[rowbase]: (index into x,
// inside); columns outside as padded() says, and outside (index 0: the load stays valid)
// when !ok.
fn xcol(rowbase: u32, ix_in: i32, ok: bool) -> vec2<u32> {
    let ix = padded(ix_in, i32(p.win));
    let inside = ok && u32(ix) < p.win;
#ifdef UPSAMPLE
    let sx = u32(ix) >> 1u;
#else
    let sx = u32(ix);
#endif
    return vec2<u32>(select(0u, rowbase + sx, inside), u32(inside));
}

// A loaded input value through the prologue (affine + activation), 0 outside the frame.
fn finish(v: f32, inside: bool, ss: vec2<f32>) -> f32 {
#ifdef PROLOGUE
    let a = activate(v * ss.x + ss.y);
#else
    let a = v;
#endif
    return select(0.0, a, inside);
}

// Row `iy` of the (upsampled) frame of a channel plane: (offset of the row in x, inside);
// rows outside as padded() says.
fn xrow_base(plane: u32, iy_in: i32, ok: bool) -> vec2<u32> {
    let iy = padded(iy_in, i32(p.hin));
    let inside = ok && u32(iy) < p.hin;
#ifdef UPSAMPLE
    let sy = u32(iy) >> 1u;
#else
    let sy = u32(iy);
#endif
    return vec2<u32>(select(0u, (plane * p.h + sy) * p.w, inside), u32(inside));
}

// Bias of output channel m (0 without HAS_BIAS); m < mpad, the padded bias length.
fn bias_of(m: u32) -> f32 {
#ifdef HAS_BIAS
    return bias[m];
#else
    return 0.0;
#endif
}

// acc + bias + residual for output channel m, pixel pix.
fn epilogue(nb: u32, m: u32, pix: u32, acc: f32, b: f32) -> f32 {
    var v = acc + b;
#ifdef HAS_RESIDUAL
    v += res_ld((nb * p.cout + m) * p.npix + pix);
#endif
    return v;
}

#ifdef NAIVE
// One output per invocation, every operand straight from global memory.
@compute @workgroup_size(WG)
fn naive(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = (wg.x + wg.y * nwg.x) * WG + li;
    let nb = wg.z;
    let nbi = nb + p.in_frame;
    let nbo = nb + p.out_frame;
    let m = i / p.npix;
    let pix = i % p.npix;
    if m >= p.cout { return; }
    let oy = pix / p.wo;
    let ox = pix % p.wo;
    let iy0 = i32(oy * STRIDE) - i32(p.pad_top);
    let ix0 = i32(ox * STRIDE) - i32(p.pad_left);
    var acc = 0.0;
    for (var ci = 0u; ci < p.cin; ci++) {
        let plane = nbi * p.cin + ci;
        let ss = plane_affine(plane, true);
        for (var t = 0u; t < KK; t++) {
            let row = xrow_base(plane, iy0 + i32(t / KS), true);
            let wv = wt_ld((ci * KK + t) * p.mpad + m);
            acc += wv * xrow(row.x, ix0 + i32(t % KS), row.y != 0u, ss);
        }
    }
    out_store((nbo * p.cout + m) * p.npix + pix, epilogue(nbo, m, pix, acc, bias_of(m)));
}
#else

const RM4 = RM / 4u;
const RN4 = RN / 4u;
const TH = TN / TW;
const TW_SHIFT = countTrailingZeros(TW);
const WGN = TN / RN;             // invocations (COOP: subgroups) along the pixel dimension
#ifdef COOP
const WG = (TM / RM) * WGN * LANES;
#else
const WG = (TM / RM) * WGN;

// acc[o + c * RN4] += a[c] * b: a 4 x 4 outer product (4 channels x 4 pixels).
fn outer4(acc: ptr<function, Acc>, o: u32, a: vec4<f32>, b: vec4<f32>) {
    (*acc)[o] += a.x * b;
    (*acc)[o + RN4] += a.y * b;
    (*acc)[o + 2u * RN4] += a.z * b;
    (*acc)[o + 3u * RN4] += a.w * b;
}

// Writes 4 consecutive pixels (oy, ox..ox+3) of output channel m.
fn store4(nb: u32, m: u32, oy: u32, ox: u32, v: vec4<f32>) {
    if m >= p.cout || oy >= p.ho { return; }
    let b = bias_of(m);
    let pix = oy * p.wo + ox;
    let base = (nb * p.cout + m) * p.npix + pix;
    if ox < p.wo { out_store(base, epilogue(nb, m, pix, v.x, b)); }
    if ox + 1u < p.wo { out_store(base + 1u, epilogue(nb, m, pix + 1u, v.y, b)); }
    if ox + 2u < p.wo { out_store(base + 2u, epilogue(nb, m, pix + 2u, v.z, b)); }
    if ox + 3u < p.wo { out_store(base + 3u, epilogue(nb, m, pix + 3u, v.w, b)); }
}
#endif

// Column kg of the implicit GEMM's input operand (kernel tap (ci, ky, kx) of input image
// nbi) at 4 consecutive pixels pn..pn+3 of the tile at (oy0, ox0): im2col on the fly, with
// the prologue applied and zeros for padding and for kg past the reduction.
fn im2col4(nbi: u32, kg: u32, pn: u32, oy0: u32, ox0: u32) -> vec4<f32> {
    return finish4(im2col4_raw(nbi, kg, pn, oy0, ox0));
}

// im2col4's loads before the prologue: the 4 values as stored (0 where outside), which are
// inside, and the plane's affine. Split so that a pipelined kernel can issue the loads and
// apply the prologue once they have arrived.
struct Raw4 {
    v: vec4<f32>,
    inside: vec4<bool>,
    ss: vec2<f32>,
}

fn im2col4_raw(nbi: u32, kg: u32, pn: u32, oy0: u32, ox0: u32) -> Raw4 {
    let ci = div_kk(kg);
    let t = kg - ci * KK;
    let ky = div_ks(t);
    let kx = t - ky * KS;
    let plane = nbi * p.cin + ci;
    let ok = kg < p.ktot;
    let py = oy0 + (pn >> TW_SHIFT);
    let px = ox0 + (pn & (TW - 1u));
    let row = xrow_base(plane, i32(py * STRIDE + ky) - i32(p.pad_top), ok && py < p.ho);
    let ix = i32(px * STRIDE + kx) - i32(p.pad_left);
    let s = i32(STRIDE);
    let rok = row.y != 0u;
    let c0 = xcol(row.x, ix, rok);
    let c1 = xcol(row.x, ix + s, rok);
    let c2 = xcol(row.x, ix + 2 * s, rok);
    let c3 = xcol(row.x, ix + 3 * s, rok);
    return Raw4(vec4<f32>(x_ld(c0.x), x_ld(c1.x), x_ld(c2.x), x_ld(c3.x)),
                vec4<bool>(c0.y != 0u, c1.y != 0u, c2.y != 0u, c3.y != 0u),
                plane_affine(plane, ok));
}

fn finish4(r: Raw4) -> vec4<f32> {
    return vec4<f32>(finish(r.v.x, r.inside.x, r.ss), finish(r.v.y, r.inside.y, r.ss),
                     finish(r.v.z, r.inside.z, r.ss), finish(r.v.w, r.inside.w, r.ss));
}

// The output tile workgroup (tile, z) computes: image nb of the dispatch (input image nbi,
// output image nbo), output channels m0.., pixels from (oy0, ox0).
struct TileAt {
    nbi: u32,
    nbo: u32,
    m0: u32,
    oy0: u32,
    ox0: u32,
}

fn tile_at(tile: u32, z: u32) -> TileAt {
    let nb = div_small(z, p.mtiles);
    let ty = div_small(tile, p.tiles_x);
    return TileAt(nb + p.in_frame, nb + p.out_frame, (z - nb * p.mtiles) * TM, ty * TH,
                  (tile - ty * p.tiles_x) * TW);
}

#ifdef COOP
// Cooperative matrices (tensor cores): the workgroup's TM x TN output tile is computed by
// subgroups that each own an RM x RN block of S x S f32 accumulators. Each TK step is staged
// in workgroup memory as f16: the weight tile A column-major (element (m, k) at k * PA + m)
// and the im2col'd input tile B row-major ((k, n) at k * PB + n). Rows are padded by PAD
// halves (PA = TM + PAD, PB = TN + PAD; PAD a multiple of 8 keeps every row, and so every
// cooperative load, 16-byte aligned, and staggers the rows of a fragment across banks).
// The staging is software-pipelined (the entry point, `conv2d_coop`, is generated by
// codegen.rs: accumulators and prefetch registers must be named variables): each invocation
// fetches its share of the next K step from global memory into registers (`a_fetch`,
// `b_fetch`) before the matrix products of the current step, and writes them to workgroup
// memory (`a_put`, `b_put`) after. With STAGES = 2 the next step goes to the other buffer
// and one barrier per step suffices; with STAGES = 1 a barrier separates the products from
// the writes. The epilogue stores each accumulator to its subgroup's scratch matrix in c_sh,
// and the subgroup's lanes apply bias, residual and the f16 range check from there.
// Barriers stay in workgroup-uniform control flow: every subgroup, including extra ones when
// the device runs smaller subgroups than planned (they repeat a planned subgroup's block and
// store the same values), takes the same path.
const TM4 = TM / 4u;
const TN4 = TN / 4u;
const TM4_SHIFT = countTrailingZeros(TM4);
const TN4_SHIFT = countTrailingZeros(TN4);
const SS = S * S;
const PA = TM + PAD;
const PB = TN + PAD;
const A_STAGE = TK * PA;
const B_STAGE = TK * PB;
// vec4s of A and B per K step, and each invocation's share (the last share may fall short).
const A_VECS = TK * TM4;
const B_VECS = TK * TN4;
const A_EXACT = A_VECS % WG == 0u;
const B_EXACT = B_VECS % WG == 0u;

// The stages' A tiles, then their B tiles: a_sh(s) = ab_sh[s * A_STAGE..], b_sh(s) =
// ab_sh[B_BASE + s * B_STAGE..].
const B_BASE = STAGES * A_STAGE;
var<workgroup> ab_sh: array<f16, STAGES * (A_STAGE + B_STAGE)>;
var<workgroup> c_sh: array<f32, MAX_SUBGROUPS * SS>;

// The j-th weight vec4 of invocation li for the K step at k0, as stored: cooperative tiles hold f16 weights (`wt` is an array<vec4<f16>>; codegen.rs builds
// no other variant), so nothing waits for the load before it is written to workgroup memory.
// Weights are padded to whole TK and TM tiles, so a share inside the step never reads past
// them.
fn a_fetch(li: u32, j: u32, k0: u32, m0: u32) -> vec4<f16> {
    // Past the share: the step's first vec4 (loaded, never put). No branch.
    let idx = select(li + j * WG, 0u, !A_EXACT && li + j * WG >= A_VECS);
    let kk = idx >> TM4_SHIFT;
    return vec4<f16>(wt[(k0 + kk) * (p.mpad >> 2u) + (m0 >> 2u) + (idx & (TM4 - 1u))]);
}

// The j-th input vec4 (4 pixels of one tile row, one tap) of invocation li, im2col'd: its
// loads only; `b_put` applies the prologue.
fn b_fetch(li: u32, j: u32, k0: u32, nbi: u32, oy0: u32, ox0: u32) -> Raw4 {
    let idx = li + j * WG;
    // Past the share: a reduction index past ktot, which loads index 0 and reads as zeros.
    let kk = select(idx >> TN4_SHIFT, p.ktot, !B_EXACT && idx >= B_VECS);
    return im2col4_raw(nbi, k0 + kk, (idx & (TN4 - 1u)) * 4u, oy0, ox0);
}

fn put4(o: u32, v: vec4<f16>) {
    ab_sh[o] = v.x;
    ab_sh[o + 1u] = v.y;
    ab_sh[o + 2u] = v.z;
    ab_sh[o + 3u] = v.w;
}

// Writes a fetched weight vec4 into stage `stage`'s A tile (row kk, channels m..m + 3).
fn a_put(stage: u32, li: u32, j: u32, v: vec4<f16>) {
    let idx = li + j * WG;
    if A_EXACT || idx < A_VECS {
        put4(stage * A_STAGE + (idx >> TM4_SHIFT) * PA + (idx & (TM4 - 1u)) * 4u, v);
    }
}

// Applies the prologue to a fetched input vec4 and writes it into stage `stage`'s B tile
// (row kk, pixels n..n + 3).
fn b_put(stage: u32, li: u32, j: u32, r: Raw4) {
    let idx = li + j * WG;
    if B_EXACT || idx < B_VECS {
        let o = B_BASE + stage * B_STAGE + (idx >> TN4_SHIFT) * PB + (idx & (TN4 - 1u)) * 4u;
        put4(o, vec4<f16>(finish4(r)));
    }
}

// A subgroup's lanes store the S x S matrix at c_sh[cb..] (row-major) as output channels
// m0.. and tile pixels n0.. through the epilogue.
fn coop_store(cb: u32, lane: u32, lanes: u32, nb: u32, m0: u32, n0: u32, oy0: u32, ox0: u32) {
    for (var e = lane; e < SS; e += lanes) {
        let m = m0 + e / S;
        let n = n0 + e % S;
        let oy = oy0 + (n >> TW_SHIFT);
        let ox = ox0 + (n & (TW - 1u));
        if m < p.cout && oy < p.ho && ox < p.wo {
            let pix = oy * p.wo + ox;
            out_store((nb * p.cout + m) * p.npix + pix, epilogue(nb, m, pix, c_sh[cb + e], bias_of(m)));
        }
    }
}
#else
#ifndef DIRECT
const TM4 = TM / 4u;
const TN4 = TN / 4u;
const TM4_SHIFT = countTrailingZeros(TM4);
const TN4_SHIFT = countTrailingZeros(TN4);

var<workgroup> a_tile: array<vec4<f32>, TK * TM4>;   // [k][m / 4]
var<workgroup> b_tile: array<vec4<f32>, TK * TN4>;   // [k][n / 4]
#endif

@compute @workgroup_size(WG)
fn conv2d(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let tile = wg.x + wg.y * nwg.x;
    if tile >= p.ntiles { return; }   // uniform over the workgroup
    let t = tile_at(tile, wg.z);
    let mpad4 = p.mpad >> 2u;
    // This invocation's block: channels m..m + RM, RN / 4 groups of 4 pixels of a row.
    let m = t.m0 + (li / WGN) * RM;

    var acc: Acc;
#ifdef DIRECT
    // Pixels (oy, ox..ox + RN): one row segment, so the taps share input values.
    let n0 = (li % WGN) * RN;
    let nstep = 4u;
    let oy = t.oy0 + (n0 >> TW_SHIFT);
    let ox = t.ox0 + (n0 & (TW - 1u));
    let iy0 = i32(oy * STRIDE) - i32(p.pad_top);
    let ix0 = i32(ox * STRIDE) - i32(p.pad_left);
    // Rows past the bottom edge read nothing; columns past the right edge are computed but
    // never stored.
    let rows_ok = oy < p.ho;
    for (var ci = 0u; ci < p.cin; ci++) {
        let plane = t.nbi * p.cin + ci;
        let ss = plane_affine(plane, true);
        for (var ky = 0u; ky < KS; ky++) {
            let row = xrow_base(plane, iy0 + i32(ky), rows_ok);
            row_step(&acc, (ci * KK + ky * KS) * mpad4 + (m >> 2u), row.x, row.y != 0u, ix0, ss);
        }
    }
#else
    // Pixel groups (li % WGN) + j * WGN of the tile.
    let n0 = (li % WGN) * 4u;
    let nstep = WGN * 4u;
    for (var k0 = 0u; k0 < p.ktot; k0 += TK) {
        // Weight tile: vec4 rows of the padded weights.
        for (var idx = li; idx < TK * TM4; idx += WG) {
            a_tile[idx] = wt_ld4((k0 + (idx >> TM4_SHIFT)) * mpad4 + (t.m0 >> 2u) + (idx & (TM4 - 1u)));
        }
        // Input tile, im2col on the fly: 4 pixels of one output row per element.
        for (var idx = li; idx < TK * TN4; idx += WG) {
            b_tile[idx] = im2col4(t.nbi, k0 + (idx >> TN4_SHIFT), (idx & (TN4 - 1u)) * 4u, t.oy0, t.ox0);
        }
        workgroupBarrier();
        let am = (li / WGN) * RM4;
        let bn = li % WGN;
        for (var kk = 0u; kk < TK; kk += 2u) {
            micro_step(&acc, kk * TM4 + am, kk * TN4 + bn);
            micro_step(&acc, (kk + 1u) * TM4 + am, (kk + 1u) * TN4 + bn);
        }
        workgroupBarrier();
    }
#endif
    store_block(&acc, t.nbo, m, t.oy0, t.ox0, n0, nstep);
}
#endif // COOP
#endif
