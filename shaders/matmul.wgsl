// Batched GEMM: out[b] = alpha * op(a[b]) @ op(bm[b]) (+ bias[col]).
//   a   [B, M, K]   or [B, K, M] with TRANS_A
//   bm  [B, K, N]   or [B, N, K] with TRANS_B
//   out [B, M, N]
// A batch stride of 0 broadcasts one matrix over the batch.
//
// Each workgroup computes a BM x BN tile of out; BK-deep slices of op(a) and
// op(bm) are staged in workgroup memory ([k][m] and [k][n], so the inner loop
// reads contiguous rows), and each invocation accumulates a TM x TN register
// block in f32. An invocation owns rows ty + r * WG_Y and columns
// tx + c * WG_X (strided), so neighbouring invocations read neighbouring
// shared words and write neighbouring output columns (coalesced).
// Global loads are arranged so consecutive invocations read consecutive
// addresses for either transpose.
// Tile sizes are consts from the pipeline key (WG_X = BN / TN, WG_Y = BM / TM).
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    _pad: u32,
    a_batch_stride: u32,
    b_batch_stride: u32,
    out_batch_stride: u32,
    alpha: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> bm: array<f32>;
#ifdef BIAS
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
#endif

const WG = WG_X * WG_Y;

var<workgroup> a_tile: array<f32, BK * BM>;
var<workgroup> b_tile: array<f32, BK * BN>;

@compute @workgroup_size(WG_X, WG_Y)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * BM;
    let col0 = wg.x * BN;
    let a_base = wg.z * p.a_batch_stride;
    let b_base = wg.z * p.b_batch_stride;
    let tx = lid.x;
    let ty = lid.y;

    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
    var a_reg: array<f32, TM>;
    var b_reg: array<f32, TN>;

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var e = li; e < BM * BK; e += WG) {
#ifdef TRANS_A
            let mm = e % BM;
            let kk = e / BM;
#else
            let kk = e % BK;
            let mm = e / BK;
#endif
            let gm = row0 + mm;
            let gk = k0 + kk;
            var v = 0.0;
            if gm < p.m && gk < p.k {
#ifdef TRANS_A
                v = a[a_base + gk * p.m + gm];
#else
                v = a[a_base + gm * p.k + gk];
#endif
            }
            a_tile[kk * BM + mm] = v;
        }
        for (var e = li; e < BN * BK; e += WG) {
#ifdef TRANS_B
            let kk = e % BK;
            let nn = e / BK;
#else
            let nn = e % BN;
            let kk = e / BN;
#endif
            let gn = col0 + nn;
            let gk = k0 + kk;
            var v = 0.0;
            if gn < p.n && gk < p.k {
#ifdef TRANS_B
                v = bm[b_base + gn * p.k + gk];
#else
                v = bm[b_base + gk * p.n + gn];
#endif
            }
            b_tile[kk * BN + nn] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            for (var r = 0u; r < TM; r++) {
                a_reg[r] = a_tile[kk * BM + ty + r * WG_Y];
            }
            for (var c = 0u; c < TN; c++) {
                b_reg[c] = b_tile[kk * BN + tx + c * WG_X];
            }
            for (var r = 0u; r < TM; r++) {
                for (var c = 0u; c < TN; c++) {
                    acc[r * TN + c] = fma(a_reg[r], b_reg[c], acc[r * TN + c]);
                }
            }
        }
        workgroupBarrier();
    }

    let out_base = wg.z * p.out_batch_stride;
    for (var r = 0u; r < TM; r++) {
        let gm = row0 + ty + r * WG_Y;
        if gm >= p.m { continue; }
        for (var c = 0u; c < TN; c++) {
            let gn = col0 + tx + c * WG_X;
            if gn >= p.n { continue; }
            var v = p.alpha * acc[r * TN + c];
#ifdef BIAS
            v += bias[gn];
#endif
            out[out_base + gm * p.n + gn] = v;
        }
    }
}
