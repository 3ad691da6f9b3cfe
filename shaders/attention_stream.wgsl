// Streaming single-head attention for tiled decoding: one block of keys and
// values updates the online-softmax state of a tile of queries, so global
// attention over all tokens runs block by block with K/V parked anywhere.
//   q [N, d, TQ] (a query tile), k, v [N, d, TK] (a key/value block),
//   acc [N, d, TQ] running sum of exp(score - max) * v (unnormalised),
//   ml  [N, TQ] vec2 (running max, running sum of exp(score - max)).
// FIRST: the state starts empty (acc and ml are not read).
// LAST:  acc receives the normalised output acc / sum (ml is not written).
// Same algorithm and tiling as attention.wgsl (see there): workgroups of
// QG * DS invocations own 2 QG queries; the DS invocations of a query split
// its channels; keys are staged BKV = 8 at a time in workgroup memory.
// Combining blocks in any order gives the softmax over all keys up to f32
// rounding (the online softmax is exactly associative in real arithmetic).
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    d: u32,
    tq: u32,
    tk: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> acc_buf: array<f32>;
@group(0) @binding(5) var<storage, read_write> ml: array<vec2<f32>>;

const WG = QG * DS;
const BQ = 2u * QG;
const BKV = 8u;
const KV4 = 2u;
const DMAX = DS * DPT;
// Masked score: exp(-BIG - max) == 0 without infinities.
const BIG = 3.0e38;

var<workgroup> kv_tile: array<vec4<f32>, DMAX * KV4>;     // [c][j / 4]
var<workgroup> partial: array<vec4<f32>, DS * BQ * KV4>;  // [s][query][j / 4]
var<workgroup> scores: array<vec4<f32>, BQ * KV4>;        // [query][j / 4]

// Stages rows c < d, keys j0 .. j0 + BKV of src [d, T] (zero beyond T).
fn load_tile_k(li: u32, base: u32, j0: u32) {
    for (var e = li; e < p.d * KV4; e += WG) {
        let c = e / KV4;
        let j = j0 + (e % KV4) * 4u;
        let g = base + c * p.tk + j;
        var val = vec4<f32>(0.0);
        if j + 3u < p.tk {
            val = vec4<f32>(k[g], k[g + 1u], k[g + 2u], k[g + 3u]);
        } else {
            for (var u = 0u; u < 4u; u++) {
                if j + u < p.tk { val[u] = k[g + u]; }
            }
        }
        kv_tile[e] = val;
    }
}

fn load_tile_v(li: u32, base: u32, j0: u32) {
    for (var e = li; e < p.d * KV4; e += WG) {
        let c = e / KV4;
        let j = j0 + (e % KV4) * 4u;
        let g = base + c * p.tk + j;
        var val = vec4<f32>(0.0);
        if j + 3u < p.tk {
            val = vec4<f32>(v[g], v[g + 1u], v[g + 2u], v[g + 3u]);
        } else {
            for (var u = 0u; u < 4u; u++) {
                if j + u < p.tk { val[u] = v[g + u]; }
            }
        }
        kv_tile[e] = val;
    }
}

@compute @workgroup_size(WG)
fn attention_block(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let qi = li % QG;
    let s = li / QG;
    let qbase = wg.y * p.d * p.tq;
    let base = wg.y * p.d * p.tk;
    let i0 = wg.x * BQ + qi;
    let i1 = i0 + QG;

    // .x: query i0, .y: query i1.
    var q_reg: array<vec2<f32>, DPT>;
    var acc: array<vec2<f32>, DPT>;
    for (var t = 0u; t < DPT; t++) {
        let c = s + t * DS;
        var val = vec2<f32>(0.0);
        if c < p.d {
            if i0 < p.tq { val.x = q[qbase + c * p.tq + i0] * p.scale; }
            if i1 < p.tq { val.y = q[qbase + c * p.tq + i1] * p.scale; }
        }
        q_reg[t] = val;
        var a = vec2<f32>(0.0);
#ifndef FIRST
        if c < p.d {
            if i0 < p.tq { a.x = acc_buf[qbase + c * p.tq + i0]; }
            if i1 < p.tq { a.y = acc_buf[qbase + c * p.tq + i1]; }
        }
#endif
        acc[t] = a;
    }
    var run_max = vec2<f32>(-BIG);
    var run_sum = vec2<f32>(0.0);
#ifndef FIRST
    let qrow = wg.y * p.tq;
    if i0 < p.tq {
        let s0 = ml[qrow + i0];
        run_max.x = s0.x;
        run_sum.x = s0.y;
    }
    if i1 < p.tq {
        let s1 = ml[qrow + i1];
        run_max.y = s1.x;
        run_sum.y = s1.y;
    }
#endif

    for (var j0 = 0u; j0 < p.tk; j0 += BKV) {
        // 1. K tile.
        load_tile_k(li, base, j0);
        workgroupBarrier();

        // 2. Partial dot products over this invocation's channels:
        //    pXY = query X (0: i0, 1: i1), keys 4Y .. 4Y + 3.
        var p00 = vec4<f32>(0.0);
        var p01 = vec4<f32>(0.0);
        var p10 = vec4<f32>(0.0);
        var p11 = vec4<f32>(0.0);
        for (var t = 0u; t < DPT; t++) {
            let c = s + t * DS;
            if c < p.d {
                let k0 = kv_tile[c * KV4];
                let k1 = kv_tile[c * KV4 + 1u];
                let qv = q_reg[t];
                p00 = fma(vec4<f32>(qv.x), k0, p00);
                p01 = fma(vec4<f32>(qv.x), k1, p01);
                p10 = fma(vec4<f32>(qv.y), k0, p10);
                p11 = fma(vec4<f32>(qv.y), k1, p11);
            }
        }
        let row0 = (s * BQ + qi) * KV4;
        let row1 = (s * BQ + qi + QG) * KV4;
        partial[row0] = p00;
        partial[row0 + 1u] = p01;
        partial[row1] = p10;
        partial[row1 + 1u] = p11;
        workgroupBarrier();

        // 3. Reduce partials into scores; stage the V tile over the K tile.
        for (var e = li; e < BQ * KV4; e += WG) {
            var sum = vec4<f32>(0.0);
            for (var ss = 0u; ss < DS; ss++) {
                sum += partial[ss * BQ * KV4 + e];
            }
            let j = j0 + (e % KV4) * 4u;
            let valid = vec4<u32>(j, j + 1u, j + 2u, j + 3u) < vec4<u32>(p.tk);
            scores[e] = select(vec4<f32>(-BIG), sum, valid);
        }
        load_tile_v(li, base, j0);
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
            if c < p.d {
                let v0 = kv_tile[c * KV4];
                let v1 = kv_tile[c * KV4 + 1u];
                acc[t] = acc[t] * correction
                    + vec2<f32>(dot(pr00, v0) + dot(pr01, v1), dot(pr10, v0) + dot(pr11, v1));
            }
        }
        workgroupBarrier();
    }

#ifdef LAST
    let inv = 1.0 / run_sum;
    for (var t = 0u; t < DPT; t++) {
        let c = s + t * DS;
        if c < p.d {
            if i0 < p.tq { acc_buf[qbase + c * p.tq + i0] = acc[t].x * inv.x; }
            if i1 < p.tq { acc_buf[qbase + c * p.tq + i1] = acc[t].y * inv.y; }
        }
    }
#else
    for (var t = 0u; t < DPT; t++) {
        let c = s + t * DS;
        if c < p.d {
            if i0 < p.tq { acc_buf[qbase + c * p.tq + i0] = acc[t].x; }
            if i1 < p.tq { acc_buf[qbase + c * p.tq + i1] = acc[t].y; }
        }
    }
    // Every invocation of a query holds the same state; one writes it.
    if s == 0u {
        let qrow = wg.y * p.tq;
        if i0 < p.tq { ml[qrow + i0] = vec2<f32>(run_max.x, run_sum.x); }
        if i1 < p.tq { ml[qrow + i1] = vec2<f32>(run_max.y, run_sum.y); }
    }
#endif
}
