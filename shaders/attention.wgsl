// Single-head softmax attention, flash style (online softmax, O(T) memory),
// channel-major (NCHW-native) layout:
//   q, k, v, out [N, d, T];  out[:, :, i] = sum_j softmax_j(q_i . k_j * scale) v_j
//
// A workgroup owns BQ queries of one batch element (workgroup_id.y) and has
// WG = BQ * DS invocations: invocation (qi, s) holds, for query qi, the
// channels c = s + DS * t (t < DPT, so d <= DMAX = DS * DPT) of q (pre-scaled)
// and of the output accumulator, in registers. Per tile of BKV keys:
//   1. the K tile [d][BKV] is staged in workgroup memory;
//   2. each invocation dots its channel slice of q with the tile's keys,
//      writing BKV partial dot products to `partial`;
//   3. the DS partials of each (query, key) are summed into `scores`
//      (out-of-range keys get -BIG), and the V tile replaces the K tile;
//   4. each invocation updates its query's running max / sum (the online
//      softmax state, computed redundantly by the DS invocations of a query)
//      and rescales + accumulates its channel slice of the output.
// Only the tiles and the BQ x BKV scores are ever in memory; accumulation is
// f32. Keys are stored as vec4 groups along j (BKV is a multiple of 4).
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    d: u32,
    t: u32,
    scale: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const WG = BQ * DS;
const KV4 = BKV / 4u;
const DMAX = DS * DPT;
// Masked score: exp(-BIG - max) == 0 without infinities.
const BIG = 3.0e38;

var<workgroup> kv_tile: array<vec4<f32>, DMAX * KV4>;     // [c][j / 4]
var<workgroup> partial: array<vec4<f32>, DS * BQ * KV4>;  // [s][qi][j / 4]
var<workgroup> scores: array<vec4<f32>, BQ * KV4>;        // [qi][j / 4]

@compute @workgroup_size(WG)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let qi = li % BQ;
    let s = li / BQ;
    let i = wg.x * BQ + qi;
    let base = wg.y * p.d * p.t;
    let query_ok = i < p.t;

    var q_reg: array<f32, DPT>;
    var acc: array<f32, DPT>;
    for (var t = 0u; t < DPT; t++) {
        let c = s + t * DS;
        var val = 0.0;
        if query_ok && c < p.d {
            val = q[base + c * p.t + i] * p.scale;
        }
        q_reg[t] = val;
        acc[t] = 0.0;
    }
    var run_max = -BIG;
    var run_sum = 0.0;

    for (var j0 = 0u; j0 < p.t; j0 += BKV) {
        // 1. K tile.
        for (var e = li; e < p.d * KV4; e += WG) {
            let c = e / KV4;
            let j = j0 + (e % KV4) * 4u;
            let g = base + c * p.t + j;
            var val = vec4<f32>(0.0);
            for (var u = 0u; u < 4u; u++) {
                if j + u < p.t { val[u] = k[g + u]; }
            }
            kv_tile[e] = val;
        }
        workgroupBarrier();

        // 2. Partial dot products over this invocation's channels.
        var part: array<vec4<f32>, KV4>;
        for (var j4 = 0u; j4 < KV4; j4++) { part[j4] = vec4<f32>(0.0); }
        for (var t = 0u; t < DPT; t++) {
            let c = s + t * DS;
            if c < p.d {
                let qv = vec4<f32>(q_reg[t]);
                for (var j4 = 0u; j4 < KV4; j4++) {
                    part[j4] = fma(qv, kv_tile[c * KV4 + j4], part[j4]);
                }
            }
        }
        for (var j4 = 0u; j4 < KV4; j4++) {
            partial[(s * BQ + qi) * KV4 + j4] = part[j4];
        }
        workgroupBarrier();

        // 3. Reduce partials into scores; stage the V tile over the K tile.
        for (var e = li; e < BQ * KV4; e += WG) {
            var sum = vec4<f32>(0.0);
            for (var ss = 0u; ss < DS; ss++) {
                sum += partial[ss * BQ * KV4 + e];
            }
            let j = j0 + (e % KV4) * 4u;
            let valid = vec4<u32>(j, j + 1u, j + 2u, j + 3u) < vec4<u32>(p.t);
            scores[e] = select(vec4<f32>(-BIG), sum, valid);
        }
        for (var e = li; e < p.d * KV4; e += WG) {
            let c = e / KV4;
            let j = j0 + (e % KV4) * 4u;
            let g = base + c * p.t + j;
            var val = vec4<f32>(0.0);
            for (var u = 0u; u < 4u; u++) {
                if j + u < p.t { val[u] = v[g + u]; }
            }
            kv_tile[e] = val;
        }
        workgroupBarrier();

        // 4. Online softmax update and P @ V for this channel slice.
        var tile_max = run_max;
        for (var j4 = 0u; j4 < KV4; j4++) {
            let sc = scores[qi * KV4 + j4];
            tile_max = max(tile_max, max(max(sc.x, sc.y), max(sc.z, sc.w)));
        }
        let correction = exp(run_max - tile_max);
        var probs: array<vec4<f32>, KV4>;
        var tile_sum = 0.0;
        for (var j4 = 0u; j4 < KV4; j4++) {
            let pr = exp(scores[qi * KV4 + j4] - vec4<f32>(tile_max));
            probs[j4] = pr;
            tile_sum += (pr.x + pr.y) + (pr.z + pr.w);
        }
        run_sum = run_sum * correction + tile_sum;
        run_max = tile_max;
        for (var t = 0u; t < DPT; t++) {
            let c = s + t * DS;
            if c < p.d {
                var a = acc[t] * correction;
                for (var j4 = 0u; j4 < KV4; j4++) {
                    a += dot(probs[j4], kv_tile[c * KV4 + j4]);
                }
                acc[t] = a;
            }
        }
        workgroupBarrier();
    }

    if query_ok {
        let inv = 1.0 / run_sum;
        for (var t = 0u; t < DPT; t++) {
            let c = s + t * DS;
            if c < p.d {
                out[base + c * p.t + i] = acc[t] * inv;
            }
        }
    }
}
