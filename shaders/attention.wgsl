// Flash attention (online softmax, O(T) memory) for every attention wgvae
// runs, plus the KV-cache append / int8 quantisation kernel.
//
// Sections (exactly one is compiled per variant):
//   ATTENTION          entry `attention`: multi-head flash attention over
//                      strided q / k / v / out, optional causal and
//                      frame-window masks, f32 or (KV_INT8) int8 K/V;
//                      with COOP, entry `attention_coop` instead (generated
//                      by kernels/attention/matrix.rs): unmasked f32 K/V on
//                      cooperative matrices (see "The cooperative variant").
//   KV_APPEND          entry `kv_append`: copies new keys or values into a KV
//                      cache, or (KV_INT8) quantises them to int8 on the way.
//
// ---------------------------------------------------------------------------
// Layouts. Every tensor is addressed as a 4-D view [batch, head, token,
// channel] through element strides in the uniforms, so one kernel serves
//   - the VAE mid-block: channel-major [N, d, T] (one head; token stride 1,
//     channel stride T), straight from the 1x1 convs;
//   - transformers: token-major [B, T, H, d] or head-major [B, H, T, d];
//   - KV caches: token-major [B, S, H, d] ring buffers (slots rotate).
// q and out share strides; k and v share strides. int8 K/V are packed four
// codes per u32 word (channel c in byte c % 4 of word c / 4, two's
// complement), strides in words with the channel innermost, and one f32
// scale per (batch, token, head) at index word_offset(b, h, t) / (d / 4),
// i.e. the codes' layout without the channel axis.
//
// ---------------------------------------------------------------------------
// The attention kernel. out[i] = sum_j softmax_j(q_i . k_j * scale) v_j over
// the keys j < n_kv that query i sees:
//   causal:        j <= q_pos0 + i (q_pos0: position of query 0 among keys);
//   frame window:  with tokens_per_frame F, query frame fq = (q_pos0 + i) / F
//                  sees key frame fk = j / F when fk < sink_frames or
//                  fq - window_frames < fk <= fq (window_frames 0: all frames).
// A workgroup owns BQ = 2 QG queries of one (batch, head) (workgroup_id.y =
// b * heads + h) and has WG = QG * DS invocations. Invocation (qi, s) handles
// queries qi and qi + QG and, for both, the channels c = s + DS * t
// (t < DPT, so d <= DMAX = DS * DPT) of q (pre-scaled) and of the output
// accumulator, in registers. The keys the block needs form at most two
// ranges (the sink frames, the window of its frames, clipped by causality);
// tiles outside them are never loaded. Per tile of BKV = 8 keys:
//   1. the K tile [d][BKV] is staged in workgroup memory (int8: dequantised
//      here, tile by tile; the cache is never expanded);
//   2. each invocation dots its channel slices of its queries with the tile's
//      keys (every shared vec4 load feeds 8 FMAs) into `partial`;
//   3. the DS partials of each (query, key) are summed into `scores`; keys past
//      the range, and (only in tiles not fully visible to the whole block)
//      masked keys get -BIG; the V tile replaces the K tile;
//   4. each invocation updates its queries' running max / sum (the online
//      softmax state, computed redundantly by the DS invocations of a query)
//      and rescales + accumulates its channel slices of the outputs.
// Wide heads (WIDE, d > DMAX): the output channels are split into chunks of
// DMAX over workgroup_id.z; each such workgroup computes the full scores
// (the K tile staged chunk by chunk, q read from memory, QK^T recomputed by
// every chunk) and stages only its own chunk of each V tile. Its (max, sum)
// rows in `stats` are its own (chunk z after the z = 0 rows): the chunks of
// one dispatch run in any order, so sharing rows would race.
// Only the tiles and the BQ x BKV scores are ever in memory; accumulation is
// f32. The running max starts at FLOOR (not -BIG), so a tile whose keys are
// all masked for a query contributes exp(-BIG - FLOOR) == 0, never exp(0).
// All storage is read_write: pooled tensors share buffers (see BindingKind).
//
// Split key ranges. Software rasterisers cap the loop iterations of one
// invocation (llvmpipe: 65535 in total over all loops, after which loops
// silently exit), so on CPU adapters the keys are processed in shares
// [kv_begin, kv_end) by consecutive dispatches: a share that is not the last
// leaves the unnormalised accumulator in `out` and the running (max, sum) of
// each query in `stats` ([batch * heads, n_q, 2]); the next share resumes
// from them. GPUs run one share (kv_begin = 0, kv_end = n_kv; `stats` is
// then never touched).

#ifdef ATTENTION
struct Params {
    d: u32,
    n_q: u32,
    n_kv: u32,
    heads: u32,
    q_sb: u32,
    q_sh: u32,
    q_st: u32,
    q_sc: u32,
    kv_sb: u32,
    kv_sh: u32,
    kv_st: u32,
    kv_sc: u32,
    scale: f32,
    causal: u32,
    q_pos0: u32,
    frame_tokens: u32,
    sink_frames: u32,
    window_frames: u32,
    // This dispatch's share of the keys (see "Split key ranges" above).
    kv_begin: u32,
    kv_end: u32,
    // Bit 0: first share (start from an empty state); bit 1: last share
    // (normalise and write the output).
    phase: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
#ifdef KV_INT8
@group(0) @binding(2) var<storage, read_write> k_codes: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_scales: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_codes: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_scales: array<f32>;
@group(0) @binding(6) var<storage, read_write> stats: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
#else
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
#endif

#ifdef COOP
// ---------------------------------------------------------------------------
// The cooperative variant: the cooperative-matrix (tensor-core) entry `attention_coop`, for
// unmasked attention with f32 K/V in f16 models (kernels/attention/matrix.rs
// picks it; the entry is generated there: accumulators must be named
// variables). f16 operands staged in workgroup memory, f32 accumulation in
// S x S matrices. A workgroup owns BR queries of one (batch, head) and runs
// NSUB = (BR / S) * (BC / S) subgroups; subgroup sg owns query row block
// rb = sg / CS (rows r0 = rb * S ..) and column block cj = sg % CS (CS = BC / S).
// Per tile of BC keys:
//   1. S = Q K^T: each subgroup accumulates its S x S block of the BR x BC
//      scores over the (zero-padded) head dimension DM in chunks of DC
//      channels (Q chunk [c][i] and K chunk [c][j] staged as f16), then stores
//      it to `sc` (f32, row-major [i][j]);
//   2. one invocation per query row: scale, mask keys past the range, running
//      max m, P = exp(s - m) as f16 into `p_sh`, running sum l (of the f16 P),
//      the rescale factor alpha = exp(m_old - m) into `al_sh`;
//   3. O = alpha O: the output block (BR x DM, f32) lives in the subgroups'
//      accumulators, NT = DM / BC per subgroup (columns (cj + t CS) S ..);
//      matrices cannot be scaled per row, so each goes through the
//      subgroup's S x S scratch in `sc` (lanes scale the rows, the matrix is
//      loaded back); skipped when no row's max moved;
//   4. O += P V: V staged per DC-channel chunk ([c][j], f16) like K.
// The end (or a later share of split key ranges, see above) goes through the
// scratch too: lanes normalise by l and store with bounds checks (or keep
// the unnormalised O in `out` and (m, l) in `stats`). Coop ops and barriers
// stay in workgroup-uniform control flow: a device running smaller subgroups
// than planned gets extra subgroups (sgid >= NSUB) that repeat subgroup
// sgid % NSUB's work and store the same values; each has its own scratch.
const SS = S * S;
const NSUB = (BR / S) * (BC / S);
const CS = BC / S;
const WG = NSUB * LANES;
const BIG = 3.0e38;
const FLOOR = -1.0e30;

var<workgroup> q_sh: array<f16, BR * DC>;   // [c][i]
var<workgroup> kv_sh: array<f16, DC * BC>;  // [c][j]
var<workgroup> sc: array<f32, SCR>;         // scores [i][j]; then the subgroups' scratch
var<workgroup> p_sh: array<f16, BR * BC>;   // [i][j]
var<workgroup> m_sh: array<f32, BR>;
var<workgroup> l_sh: array<f32, BR>;
var<workgroup> al_sh: array<f32, BR>;
// 16 bytes like every workgroup variable here: drivers place them by natural alignment,
// and cooperative loads and stores need 16-byte-aligned addresses (a 4-byte flag shifted
// every matrix by one element on NVIDIA).
var<workgroup> moved: vec4<u32>;

fn q_at(base: u32, i: u32, c: u32) -> f16 {
    if i < p.n_q && c < p.d {
        return f16(q[base + i * p.q_st + c * p.q_sc]);
    }
    return f16(0.0);
}

// Key (which = 0) or value (1) j, channel c; zero past `end` or d.
fn kv_at(which: u32, base: u32, j: u32, end: u32, c: u32) -> f16 {
    if j < end && c < p.d {
        let g = base + j * p.kv_st + c * p.kv_sc;
        if which == 0u {
            return f16(k[g]);
        }
        return f16(v[g]);
    }
    return f16(0.0);
}

// Queries i0 .. i0 + BR, channels c0 .. c0 + DC into q_sh[c][i], four
// elements per iteration along the contiguous axis.
fn coop_stage_q(li: u32, base: u32, i0: u32, c0: u32) {
    for (var e = li; e < BR * DC / 4u; e += WG) {
        if p.q_sc != 1u {
            let i = (e % (BR / 4u)) * 4u;
            let c = e / (BR / 4u);
            let o = c * BR + i;
            q_sh[o] = q_at(base, i0 + i, c0 + c);
            q_sh[o + 1u] = q_at(base, i0 + i + 1u, c0 + c);
            q_sh[o + 2u] = q_at(base, i0 + i + 2u, c0 + c);
            q_sh[o + 3u] = q_at(base, i0 + i + 3u, c0 + c);
        } else {
            let c = (e % (DC / 4u)) * 4u;
            let i = e / (DC / 4u);
            q_sh[c * BR + i] = q_at(base, i0 + i, c0 + c);
            q_sh[(c + 1u) * BR + i] = q_at(base, i0 + i, c0 + c + 1u);
            q_sh[(c + 2u) * BR + i] = q_at(base, i0 + i, c0 + c + 2u);
            q_sh[(c + 3u) * BR + i] = q_at(base, i0 + i, c0 + c + 3u);
        }
    }
}

// Keys / values j0 .. j0 + BC, channels c0 .. c0 + DC into kv_sh[c][j].
fn coop_stage_kv(li: u32, which: u32, base: u32, j0: u32, end: u32, c0: u32) {
    for (var e = li; e < BC * DC / 4u; e += WG) {
        if p.kv_sc != 1u {
            let j = (e % (BC / 4u)) * 4u;
            let c = e / (BC / 4u);
            let o = c * BC + j;
            kv_sh[o] = kv_at(which, base, j0 + j, end, c0 + c);
            kv_sh[o + 1u] = kv_at(which, base, j0 + j + 1u, end, c0 + c);
            kv_sh[o + 2u] = kv_at(which, base, j0 + j + 2u, end, c0 + c);
            kv_sh[o + 3u] = kv_at(which, base, j0 + j + 3u, end, c0 + c);
        } else {
            let c = (e % (DC / 4u)) * 4u;
            let j = e / (DC / 4u);
            kv_sh[c * BC + j] = kv_at(which, base, j0 + j, end, c0 + c);
            kv_sh[(c + 1u) * BC + j] = kv_at(which, base, j0 + j, end, c0 + c + 1u);
            kv_sh[(c + 2u) * BC + j] = kv_at(which, base, j0 + j, end, c0 + c + 2u);
            kv_sh[(c + 3u) * BC + j] = kv_at(which, base, j0 + j, end, c0 + c + 3u);
        }
    }
}

// Scores of row i, keys j .. j + 4 of the tile at j0: scaled, -BIG past end.
fn coop_score4(i: u32, j: u32, j0: u32, end: u32) -> vec4<f32> {
    let o = i * BC + j;
    let s = vec4<f32>(sc[o], sc[o + 1u], sc[o + 2u], sc[o + 3u]) * p.scale;
    let keys = vec4<u32>(j0 + j) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(-BIG), s, keys < vec4<u32>(end));
}

// Step 2: the online softmax of each row (one invocation per row).
fn coop_softmax(li: u32, j0: u32, end: u32) {
    for (var i = li; i < BR; i += WG) {
        let m_old = m_sh[i];
        var mx = m_old;
        for (var j = 0u; j < BC; j += 4u) {
            let s = coop_score4(i, j, j0, end);
            mx = max(mx, max(max(s.x, s.y), max(s.z, s.w)));
        }
        var sum = 0.0;
        for (var j = 0u; j < BC; j += 4u) {
            let e = vec4<f16>(exp(coop_score4(i, j, j0, end) - vec4<f32>(mx)));
            let o = i * BC + j;
            p_sh[o] = e.x;
            p_sh[o + 1u] = e.y;
            p_sh[o + 2u] = e.z;
            p_sh[o + 3u] = e.w;
            sum += dot(vec4<f32>(e), vec4<f32>(1.0));
        }
        let alpha = exp(m_old - mx);
        m_sh[i] = mx;
        l_sh[i] = l_sh[i] * alpha + sum;
        al_sh[i] = alpha;
        if alpha != 1.0 {
            moved.x = 1u;
        }
    }
}

// Step 3 for one matrix in the subgroup's scratch at cb: rows r0 .. r0 + S.
fn coop_scale_rows(cb: u32, lane: u32, lanes: u32, r0: u32) {
    for (var e = lane; e < SS; e += lanes) {
        sc[cb + e] *= al_sh[r0 + e / S];
    }
}

// The running state at the start: empty, or (a later share) the previous
// share's (m, l) for rows li ..
fn coop_init_stats(li: u32, head: u32, i0: u32, resume: bool) {
    for (var i = li; i < BR; i += WG) {
        var m = FLOOR;
        var l = 0.0;
        if resume && i0 + i < p.n_q {
            let st = 2u * (head * p.n_q + i0 + i);
            m = stats[st];
            l = stats[st + 1u];
        }
        m_sh[i] = m;
        l_sh[i] = l;
    }
}

fn coop_save_stats(li: u32, head: u32, i0: u32) {
    for (var i = li; i < BR; i += WG) {
        if i0 + i < p.n_q {
            let st = 2u * (head * p.n_q + i0 + i);
            stats[st] = m_sh[i];
            stats[st + 1u] = l_sh[i];
        }
    }
}

// A later share: the unnormalised output of queries i1 .., channels c1 ..
// into the scratch (zeros outside).
fn coop_read_out(cb: u32, lane: u32, lanes: u32, base: u32, i1: u32, c1: u32) {
    for (var e = lane; e < SS; e += lanes) {
        let i = i1 + e / S;
        let c = c1 + e % S;
        var x = 0.0;
        if i < p.n_q && c < p.d {
            x = out[base + i * p.q_st + c * p.q_sc];
        }
        sc[cb + e] = x;
    }
}

// The scratch matrix of rows r0 .. (queries i0 + r0 ..), channels c1 .. to
// `out`: divided by l on the last share.
fn coop_write_out(cb: u32, lane: u32, lanes: u32, base: u32, i0: u32, r0: u32, c1: u32, last: bool) {
    for (var e = lane; e < SS; e += lanes) {
        let r = r0 + e / S;
        let i = i0 + r;
        let c = c1 + e % S;
        if i < p.n_q && c < p.d {
            var x = sc[cb + e];
            if last {
                let l = l_sh[r];
                x = select(0.0, x / max(l, 1.0e-30), l > 0.0);
            }
            out[base + i * p.q_st + c * p.q_sc] = x;
        }
    }
}
#else
const WG = QG * DS;
const BQ = 2u * QG;
const BKV = 8u;
const KV4 = 2u;
const DMAX = DS * DPT;
// Masked score: exp(-BIG - max) == 0 without infinities.
const BIG = 3.0e38;
// Start of the running max: below any real score, far above -BIG.
const FLOOR = -1.0e30;

var<workgroup> kv_tile: array<vec4<f32>, DMAX * KV4>;     // [c][j / 4]
var<workgroup> partial: array<vec4<f32>, DS * BQ * KV4>;  // [s][query][j / 4]
var<workgroup> scores: array<vec4<f32>, BQ * KV4>;        // [query][j / 4]

#ifdef KV_INT8
// Sign-extends the four int8 codes of a word to f32.
fn unpack_codes(w: u32) -> vec4<f32> {
    let shifted = vec4<u32>(w << 24u, w << 16u, w << 8u, w);
    return vec4<f32>(bitcast<vec4<i32>>(shifted) >> vec4<u32>(24u));
}

// Dequantises channels ch0 .. ch0 + DMAX (clipped to d) of keys j0 .. j0 + BKV
// (zero at j >= end) into kv_tile: one
// invocation per (word of 4 channels, 4 keys) reads 4 words and 4 scales and
// writes 4 vec4 (one per channel, keys along the vec4).
fn load_tile_k(li: u32, base: u32, j0: u32, end: u32, ch0: u32) {
    let dw = p.d / 4u;
    // Dense layout: a row's scale index is its word offset / dw.
    let scale_base = base / dw;
    let scale_stride = p.kv_st / dw;
    // This chunk's words (ch0 and DMAX are multiples of 4).
    let cw = min(p.d - ch0, DMAX) / 4u;
    let w0 = ch0 / 4u;
    for (var e = li; e < cw * KV4; e += WG) {
        let w4 = e % cw;
        let jq = e / cw;
        let j = j0 + jq * 4u;
        var c0 = vec4<f32>(0.0);
        var c1 = vec4<f32>(0.0);
        var c2 = vec4<f32>(0.0);
        var c3 = vec4<f32>(0.0);
        for (var u = 0u; u < 4u; u++) {
            if j + u < end {
                let x = unpack_codes(k_codes[base + (j + u) * p.kv_st + w0 + w4])
                    * k_scales[scale_base + (j + u) * scale_stride];
                c0[u] = x.x;
                c1[u] = x.y;
                c2[u] = x.z;
                c3[u] = x.w;
            }
        }
        let c = 4u * w4;
        kv_tile[c * KV4 + jq] = c0;
        kv_tile[(c + 1u) * KV4 + jq] = c1;
        kv_tile[(c + 2u) * KV4 + jq] = c2;
        kv_tile[(c + 3u) * KV4 + jq] = c3;
    }
}

fn load_tile_v(li: u32, base: u32, j0: u32, end: u32, ch0: u32) {
    let dw = p.d / 4u;
    // Dense layout: a row's scale index is its word offset / dw.
    let scale_base = base / dw;
    let scale_stride = p.kv_st / dw;
    // This chunk's words (ch0 and DMAX are multiples of 4).
    let cw = min(p.d - ch0, DMAX) / 4u;
    let w0 = ch0 / 4u;
    for (var e = li; e < cw * KV4; e += WG) {
        let w4 = e % cw;
        let jq = e / cw;
        let j = j0 + jq * 4u;
        var c0 = vec4<f32>(0.0);
        var c1 = vec4<f32>(0.0);
        var c2 = vec4<f32>(0.0);
        var c3 = vec4<f32>(0.0);
        for (var u = 0u; u < 4u; u++) {
            if j + u < end {
                let x = unpack_codes(v_codes[base + (j + u) * p.kv_st + w0 + w4])
                    * v_scales[scale_base + (j + u) * scale_stride];
                c0[u] = x.x;
                c1[u] = x.y;
                c2[u] = x.z;
                c3[u] = x.w;
            }
        }
        let c = 4u * w4;
        kv_tile[c * KV4 + jq] = c0;
        kv_tile[(c + 1u) * KV4 + jq] = c1;
        kv_tile[(c + 2u) * KV4 + jq] = c2;
        kv_tile[(c + 3u) * KV4 + jq] = c3;
    }
}
#else
// Element e of the tile: channel c and key quad jq, ordered so neighbouring
// invocations read neighbouring addresses (channels when the channel stride
// is 1, keys when the token stride is 1).
fn tile_element(e: u32, dc: u32) -> vec2<u32> {
    if p.kv_sc == 1u {
        return vec2<u32>(e % dc, e / dc);
    }
    return vec2<u32>(e / KV4, e % KV4);
}

// Stages channels c0 .. c0 + DMAX (clipped to d) of keys j0 .. j0 + BKV
// (zero at j >= end); c0 = 0 unless WIDE.
fn load_tile_k(li: u32, base: u32, j0: u32, end: u32, c0: u32) {
    let dc = min(p.d - c0, DMAX);
    for (var e = li; e < dc * KV4; e += WG) {
        let cj = tile_element(e, dc);
        let j = j0 + cj.y * 4u;
        let g = base + j * p.kv_st + (c0 + cj.x) * p.kv_sc;
        var val = vec4<f32>(0.0);
        if j + 3u < end {
            val = vec4<f32>(k[g], k[g + p.kv_st], k[g + 2u * p.kv_st], k[g + 3u * p.kv_st]);
        } else {
            for (var u = 0u; u < 4u; u++) {
                if j + u < end { val[u] = k[g + u * p.kv_st]; }
            }
        }
        kv_tile[cj.x * KV4 + cj.y] = val;
    }
}

fn load_tile_v(li: u32, base: u32, j0: u32, end: u32, c0: u32) {
    let dc = min(p.d - c0, DMAX);
    for (var e = li; e < dc * KV4; e += WG) {
        let cj = tile_element(e, dc);
        let j = j0 + cj.y * 4u;
        let g = base + j * p.kv_st + (c0 + cj.x) * p.kv_sc;
        var val = vec4<f32>(0.0);
        if j + 3u < end {
            val = vec4<f32>(v[g], v[g + p.kv_st], v[g + 2u * p.kv_st], v[g + 3u * p.kv_st]);
        } else {
            for (var u = 0u; u < 4u; u++) {
                if j + u < end { val[u] = v[g + u * p.kv_st]; }
            }
        }
        kv_tile[cj.x * KV4 + cj.y] = val;
    }
}
#endif

// Which of keys j (4 of them) query i sees under the causal / frame masks.
fn visible4(i: u32, j: vec4<u32>) -> vec4<bool> {
    let pos = p.q_pos0 + i;
    var ok = vec4<bool>(true);
    if p.causal != 0u {
        ok = j <= vec4<u32>(pos);
    }
    if p.window_frames != 0u {
        let fq = vec4<u32>(pos / p.frame_tokens);
        let fk = j / vec4<u32>(p.frame_tokens);
        let in_window = (fk <= fq) & (fk + vec4<u32>(p.window_frames) > fq);
        ok = ok & ((fk < vec4<u32>(p.sink_frames)) | in_window);
    }
    return ok;
}

// True when every key of the tile at j0 is below `end` and visible to every
// query i_lo ..= i_hi of the block (then no per-element mask is needed).
fn tile_is_full(j0: u32, end: u32, i_lo: u32, i_hi: u32) -> bool {
    let j_last = j0 + BKV - 1u;
    if j_last >= end {
        return false;
    }
    if p.causal != 0u && j_last > p.q_pos0 + i_lo {
        return false;
    }
    if p.window_frames != 0u {
        let fq_lo = (p.q_pos0 + i_lo) / p.frame_tokens;
        let fq_hi = (p.q_pos0 + i_hi) / p.frame_tokens;
        let fk_lo = j0 / p.frame_tokens;
        let fk_hi = j_last / p.frame_tokens;
        let all_sink = fk_hi < p.sink_frames;
        let all_window = fk_hi <= fq_lo && fk_lo + p.window_frames > fq_hi;
        if !(all_sink || all_window) {
            return false;
        }
    }
    return true;
}

#ifdef WIDE
// Channel c of queries i0 (.x) and i1 (.y), pre-scaled; zero past n_q.
fn q_pair(base: u32, i0: u32, i1: u32, c: u32) -> vec2<f32> {
    var val = vec2<f32>(0.0);
    if i0 < p.n_q { val.x = q[base + i0 * p.q_st + c * p.q_sc] * p.scale; }
    if i1 < p.n_q { val.y = q[base + i1 * p.q_st + c * p.q_sc] * p.scale; }
    return val;
}
#endif

@compute @workgroup_size(WG)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
#ifdef WIDE
    // Output channels c_out .. c_out + DMAX (see "Wide heads"); the chunk's
    // own (max, sum) rows in `stats`.
    let c_out = wg.z * DMAX;
    let srow = wg.z * nwg.y + wg.y;
#else
    const c_out = 0u;
    let srow = wg.y;
#endif
    let qi = li % QG;
    let s = li / QG;
    let b = wg.y / p.heads;
    let h = wg.y % p.heads;
    let q_base = b * p.q_sb + h * p.q_sh;
    let kv_base = b * p.kv_sb + h * p.kv_sh;
    let i_lo = wg.x * BQ;
    let i_hi = min(i_lo + BQ, p.n_q) - 1u;
    let i0 = i_lo + qi;
    let i1 = i0 + QG;

    // .x: query i0, .y: query i1. A later share of the keys resumes from
    // the unnormalised accumulator in `out` and (max, sum) in `stats`.
    let resume = (p.phase & 1u) == 0u;
    var q_reg: array<vec2<f32>, DPT>;
    var acc: array<vec2<f32>, DPT>;
    for (var t = 0u; t < DPT; t++) {
        let c = c_out + s + t * DS;
        var val = vec2<f32>(0.0);
        var a = vec2<f32>(0.0);
        if c < p.d {
            let o0 = q_base + i0 * p.q_st + c * p.q_sc;
            let o1 = q_base + i1 * p.q_st + c * p.q_sc;
            if i0 < p.n_q {
                val.x = q[o0] * p.scale;
                if resume { a.x = out[o0]; }
            }
            if i1 < p.n_q {
                val.y = q[o1] * p.scale;
                if resume { a.y = out[o1]; }
            }
        }
        q_reg[t] = val;
        acc[t] = a;
    }
    var run_max = vec2<f32>(FLOOR);
    var run_sum = vec2<f32>(0.0);
    let stat0 = 2u * (srow * p.n_q + i0);
    let stat1 = 2u * (srow * p.n_q + i1);
    if resume {
        if i0 < p.n_q { run_max.x = stats[stat0]; run_sum.x = stats[stat0 + 1u]; }
        if i1 < p.n_q { run_max.y = stats[stat1]; run_sum.y = stats[stat1 + 1u]; }
    }

    // The key ranges this block needs: [start0, end0) and [start1, end1).
    var last = p.n_kv;
    if p.causal != 0u {
        last = min(last, p.q_pos0 + i_hi + 1u);
    }
    var end0 = last;
    var start1 = last;
    var end1 = last;
    if p.window_frames != 0u {
        let fq_lo = (p.q_pos0 + i_lo) / p.frame_tokens;
        let fq_hi = (p.q_pos0 + i_hi) / p.frame_tokens;
        var first_frame = 0u;
        if fq_lo + 1u > p.window_frames {
            first_frame = fq_lo + 1u - p.window_frames;
        }
        let window_start = min(first_frame * p.frame_tokens, last);
        let window_end = min((fq_hi + 1u) * p.frame_tokens, last);
        let sink_end = min(p.sink_frames * p.frame_tokens, last);
        if sink_end >= window_start {
            end0 = max(sink_end, window_end);
        } else {
            end0 = sink_end;
            start1 = window_start;
            end1 = window_end;
        }
    }

    for (var r = 0u; r < 2u; r++) {
        let start = max(select(start1, 0u, r == 0u), p.kv_begin);
        let end = min(select(end1, end0, r == 0u), p.kv_end);
        for (var j0 = start; j0 < end; j0 += BKV) {
            let full = tile_is_full(j0, end, i_lo, i_hi);

            // 1. K tile, 2. partial dot products over this invocation's
            //    channels: pXY = query X (0: i0, 1: i1), keys 4Y .. 4Y + 3.
            //    WIDE: over chunks of DMAX channels, q read from memory.
            var p00 = vec4<f32>(0.0);
            var p01 = vec4<f32>(0.0);
            var p10 = vec4<f32>(0.0);
            var p11 = vec4<f32>(0.0);
#ifdef WIDE
            for (var c0 = 0u; c0 < p.d; c0 += DMAX) {
                if c0 > 0u {
                    // Every invocation is done reading the previous chunk.
                    workgroupBarrier();
                }
#else
            {
                const c0 = 0u;
#endif
                load_tile_k(li, kv_base, j0, end, c0);
                workgroupBarrier();
                for (var t = 0u; t < DPT; t++) {
                    let c = s + t * DS;
                    if c0 + c < p.d {
                        let k0 = kv_tile[c * KV4];
                        let k1 = kv_tile[c * KV4 + 1u];
#ifdef WIDE
                        let qv = q_pair(q_base, i0, i1, c0 + c);
#else
                        let qv = q_reg[t];
#endif
                        p00 = fma(vec4<f32>(qv.x), k0, p00);
                        p01 = fma(vec4<f32>(qv.x), k1, p01);
                        p10 = fma(vec4<f32>(qv.y), k0, p10);
                        p11 = fma(vec4<f32>(qv.y), k1, p11);
                    }
                }
            }
            let row0 = (s * BQ + qi) * KV4;
            let row1 = (s * BQ + qi + QG) * KV4;
            partial[row0] = p00;
            partial[row0 + 1u] = p01;
            partial[row1] = p10;
            partial[row1 + 1u] = p11;
            workgroupBarrier();

            // 3. Reduce partials into scores (masking where needed); stage
            //    the V tile over the K tile.
            for (var e = li; e < BQ * KV4; e += WG) {
                var sum = vec4<f32>(0.0);
                for (var ss = 0u; ss < DS; ss++) {
                    sum += partial[ss * BQ * KV4 + e];
                }
                let j = j0 + (e % KV4) * 4u;
                let keys = vec4<u32>(j, j + 1u, j + 2u, j + 3u);
                var valid = keys < vec4<u32>(end);
                if !full {
                    valid = valid & visible4(i_lo + e / KV4, keys);
                }
                scores[e] = select(vec4<f32>(-BIG), sum, valid);
            }
            load_tile_v(li, kv_base, j0, end, c_out);
            workgroupBarrier();

            // 4. Online softmax update, then P @ V for this invocation's channels.
            let s00 = scores[qi * KV4];
            let s01 = scores[qi * KV4 + 1u];
            let s10 = scores[(qi + QG) * KV4];
            let s11 = scores[(qi + QG) * KV4 + 1u];
            let m0 = max(max(s00, s01), vec4<f32>(run_max.x));
            let m1 = max(max(s10, s11), vec4<f32>(run_max.y));
            let tile_max = vec2<f32>(max(max(m0.x, m0.y), max(m0.z, m0.w)),
                                     max(max(m1.x, m1.y), max(m1.z, m1.w)));
            let correction = exp(run_max - tile_max);
            let pr00 = exp(s00 - vec4<f32>(tile_max.x));
            let pr01 = exp(s01 - vec4<f32>(tile_max.x));
            let pr10 = exp(s10 - vec4<f32>(tile_max.y));
            let pr11 = exp(s11 - vec4<f32>(tile_max.y));
            let ones = vec4<f32>(1.0);
            run_sum = run_sum * correction + vec2<f32>(dot(pr00 + pr01, ones), dot(pr10 + pr11, ones));
            run_max = tile_max;
            for (var t = 0u; t < DPT; t++) {
                let c = s + t * DS;
                if c_out + c < p.d {
                    let v0 = kv_tile[c * KV4];
                    let v1 = kv_tile[c * KV4 + 1u];
                    acc[t] = acc[t] * correction
                        + vec2<f32>(dot(pr00, v0) + dot(pr01, v1), dot(pr10, v0) + dot(pr11, v1));
                }
            }
            workgroupBarrier();
        }
    }

    // A query that sees no key at all gets zeros, not 0 / 0.
    let last_share = (p.phase & 2u) != 0u;
    var inv = vec2<f32>(1.0);
    if last_share {
        inv = select(vec2<f32>(0.0), 1.0 / max(run_sum, vec2<f32>(1.0e-30)), run_sum > vec2<f32>(0.0));
    } else if s == 0u {
        if i0 < p.n_q { stats[stat0] = run_max.x; stats[stat0 + 1u] = run_sum.x; }
        if i1 < p.n_q { stats[stat1] = run_max.y; stats[stat1 + 1u] = run_sum.y; }
    }
    for (var t = 0u; t < DPT; t++) {
        let c = c_out + s + t * DS;
        if c < p.d {
            if i0 < p.n_q { out[q_base + i0 * p.q_st + c * p.q_sc] = acc[t].x * inv.x; }
            if i1 < p.n_q { out[q_base + i1 * p.q_st + c * p.q_sc] = acc[t].y * inv.y; }
        }
    }
}
#endif // COOP
#endif

// ---------------------------------------------------------------------------
// KV append: one invocation per (batch, token, head) of the new keys or
// values `src` (strided [batch, head, token, channel] view, tokens
// src_t0 ..) writes the cache row at token dst_t0 + t. f32: a copy. int8
// (KV_INT8): absmax over the d channels, scale = absmax / 127, codes =
// round(x * 127 / absmax) in [-127, 127], four per word; the scale goes to
// scales[dst_row / (d / 4)].
#ifdef KV_APPEND
struct AppendParams {
    d: u32,
    heads: u32,
    tokens: u32,
    batch: u32,
    src_sb: u32,
    src_sh: u32,
    src_st: u32,
    src_sc: u32,
    dst_sb: u32,
    dst_sh: u32,
    dst_st: u32,
    src_t0: u32,
    dst_t0: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: AppendParams;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
#ifdef KV_INT8
@group(0) @binding(2) var<storage, read_write> codes: array<u32>;
@group(0) @binding(3) var<storage, read_write> scales: array<f32>;
#else
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
#endif

@compute @workgroup_size(APPEND_WG)
fn kv_append(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let idx = (wg.x + wg.y * nwg.x) * APPEND_WG + li;
    if idx >= p.batch * p.tokens * p.heads {
        return;
    }
    let h = idx % p.heads;
    let t = (idx / p.heads) % p.tokens;
    let b = idx / (p.heads * p.tokens);
    let src_row = b * p.src_sb + h * p.src_sh + (p.src_t0 + t) * p.src_st;
    let dst_row = b * p.dst_sb + h * p.dst_sh + (p.dst_t0 + t) * p.dst_st;
#ifdef KV_INT8
    var absmax = 0.0;
    for (var c = 0u; c < p.d; c++) {
        absmax = max(absmax, abs(src[src_row + c * p.src_sc]));
    }
    let inv = select(0.0, 127.0 / absmax, absmax > 0.0);
    let dw = p.d / 4u;
    for (var w = 0u; w < dw; w++) {
        var word = 0u;
        for (var u = 0u; u < 4u; u++) {
            let x = src[src_row + (4u * w + u) * p.src_sc];
            let code = i32(clamp(round(x * inv), -127.0, 127.0));
            word |= (bitcast<u32>(code) & 0xffu) << (8u * u);
        }
        codes[dst_row + w] = word;
    }
    scales[dst_row / dw] = absmax / 127.0;
#else
    for (var c = 0u; c < p.d; c++) {
        dst[dst_row + c] = src[src_row + c * p.src_sc];
    }
#endif
}
#endif
