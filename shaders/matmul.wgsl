// Batched GEMM: out[b] = alpha * op(a[b]) @ op(bm[b]) (+ bias[col]).
//   a   [B, M, K]   or [B, K, M] with TRANS_A
//   bm  [B, K, N]   or [B, N, K] with TRANS_B
//   out [B, M, N]
// A batch stride of 0 broadcasts one matrix over the batch.
//
// Each workgroup computes a BM x BN tile of out; BK-deep slices of op(a) and
// op(bm) are staged in workgroup memory as vec4 rows ([k][m / 4] and
// [k][n / 4]), and each invocation accumulates a 4 x 4 register block in f32
// from one vec4 of each per k step (two wide shared loads per 16 FMAs).
// Invocation (tx, ty) owns rows 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3
// of the tile (neighbouring invocations read neighbouring 16-byte words).
// Global loads are arranged so consecutive invocations read consecutive
// addresses for either transpose.
// Tile sizes are consts from the pipeline key (BM, BN multiples of 4;
// the workgroup is (BN / 4) x (BM / 4)).
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

const WG_X = BN / 4u;
const WG_Y = BM / 4u;
const WG = WG_X * WG_Y;

var<workgroup> a_tile: array<vec4<f32>, BK * BM / 4u>;  // [k][m / 4]
var<workgroup> b_tile: array<vec4<f32>, BK * BN / 4u>;  // [k][n / 4]

@compute @workgroup_size(WG_X, WG_Y)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * BM;
    let col0 = wg.x * BN;
    let a_base = wg.z * p.a_batch_stride;
    let b_base = wg.z * p.b_batch_stride;
    let tx = lid.x;
    let ty = lid.y;

    // acc[r] holds row 4 ty + r, columns 4 tx .. 4 tx + 3.
    var acc: array<vec4<f32>, 4>;
    for (var r = 0u; r < 4u; r++) {
        acc[r] = vec4<f32>(0.0);
    }

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
            a_tile[kk * (BM / 4u) + mm / 4u][mm % 4u] = v;
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
            b_tile[kk * (BN / 4u) + nn / 4u][nn % 4u] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let av = a_tile[kk * (BM / 4u) + ty];
            let bv = b_tile[kk * (BN / 4u) + tx];
            acc[0] = fma(vec4<f32>(av.x), bv, acc[0]);
            acc[1] = fma(vec4<f32>(av.y), bv, acc[1]);
            acc[2] = fma(vec4<f32>(av.z), bv, acc[2]);
            acc[3] = fma(vec4<f32>(av.w), bv, acc[3]);
        }
        workgroupBarrier();
    }

    let out_base = wg.z * p.out_batch_stride;
    for (var r = 0u; r < 4u; r++) {
        let gm = row0 + 4u * ty + r;
        if gm >= p.m { continue; }
        for (var c = 0u; c < 4u; c++) {
            let gn = col0 + 4u * tx + c;
            if gn >= p.n { continue; }
            var v = p.alpha * acc[r][c];
#ifdef BIAS
            v += bias[gn];
#endif
            out[out_base + gm * p.n + gn] = v;
        }
    }
}
