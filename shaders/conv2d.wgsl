// 2-D convolution as an implicit GEMM:  out[M = Cout, N = pixels] = W[M, K] * X[K, N]
// with K = Cin * KS * KS ordered k = ci * KS*KS + ky * KS + kx (PyTorch's order), the X
// operand being im2col computed on the fly while tiles are loaded into workgroup memory.
//
// Fused on load:  nearest-2x upsample (UPSAMPLE), GroupNorm-style affine + activation
// (PROLOGUE, ACT), zero padding (applied after the prologue: padded taps contribute 0).
// Fused on store: bias (HAS_BIAS), residual add (HAS_RESIDUAL; `res` may alias `out`).
//
// Keys (from the pipeline key): tile sizes TM (Cout rows), TN (pixels), TK (reduction step),
// per-invocation register block RM x RN (RN a multiple of 4), KS (1 | 3), STRIDE (1 | 2),
// ACT (0 none, 1 SiLU, 2 ReLU), storage type T. Workgroup size WG = (TM/RM) * (TN/RN).
// Entry `naive` (flag NAIVE) is one output per invocation, for benchmarks only.
//
// Weights arrive re-laid-out by the host as Wt[kp][mp] (K-major, Cout contiguous), zero padded
// to multiples of TK and TM: tile loads of W need no bounds checks and are vec4 wide.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    cin: u32,
    h: u32,        // input height (before upsample)
    w: u32,        // input width (before upsample)
    cout: u32,
    wo: u32,       // output width
    hin: u32,      // height the taps see (2h with upsample)
    win: u32,      // width the taps see (2w with upsample)
    pad_top: u32,
    pad_left: u32,
    ktot: u32,     // Cin * KS * KS
    mpad: u32,     // row length of Wt (a multiple of TM)
    npix: u32,     // Ho * Wo
    ntiles: u32,   // pixel tiles per image
    mtiles: u32,   // Cout tiles
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<T>;
@group(0) @binding(2) var<storage, read_write> wt: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> affine: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> res: array<T>;
@group(0) @binding(6) var<storage, read_write> out: array<T>;

const KK = KS * KS;

fn activate(v: f32) -> f32 {
    switch ACT {
        case 1u: { return v / (1.0 + exp(-v)); }
        case 2u: { return max(v, 0.0); }
        default: { return v; }
    }
}

// One input value of the im2col matrix: channel `ci` of image `nb` at tap position
// (iy, ix) in the (upsampled) input frame; 0 outside the frame (zero padding).
fn load_x(nb: u32, ci: u32, iy: i32, ix: i32, row_ok: bool) -> f32 {
    let inside = row_ok && u32(iy) < p.hin && u32(ix) < p.win;
#ifdef UPSAMPLE
    let sy = u32(iy) >> 1u;
    let sx = u32(ix) >> 1u;
#else
    let sy = u32(iy);
    let sx = u32(ix);
#endif
    // Clamped index: always a valid load, the select zeroes padded taps.
    let idx = select(0u, ((nb * p.cin + ci) * p.h + sy) * p.w + sx, inside);
    var v = f32(x[idx]);
#ifdef PROLOGUE
    let ss = affine[select(0u, nb * p.cin + ci, inside)];
    v = activate(v * ss.x + ss.y);
#endif
    return select(0.0, v, inside);
}

fn epilogue(nb: u32, m: u32, pix: u32, acc: f32) -> f32 {
    var v = acc;
#ifdef HAS_BIAS
    v += bias[m];
#endif
#ifdef HAS_RESIDUAL
    v += f32(res[(nb * p.cout + m) * p.npix + pix]);
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
    let m = i / p.npix;
    let pix = i % p.npix;
    if m >= p.cout { return; }
    let oy = pix / p.wo;
    let ox = pix % p.wo;
    let iy0 = i32(oy * STRIDE) - i32(p.pad_top);
    let ix0 = i32(ox * STRIDE) - i32(p.pad_left);
    var acc = 0.0;
    for (var ci = 0u; ci < p.cin; ci++) {
        for (var t = 0u; t < KK; t++) {
            let kg = ci * KK + t;
            let wv = wt[(kg * p.mpad + m) / 4u][m % 4u];
            acc += wv * load_x(nb, ci, iy0 + i32(t / KS), ix0 + i32(t % KS), true);
        }
    }
    out[(nb * p.cout + m) * p.npix + pix] = T(epilogue(nb, m, pix, acc));
}
#else

const TM4 = TM / 4u;
const TN4 = TN / 4u;
const RM4 = RM / 4u;
const RN4 = RN / 4u;
const WG = (TM / RM) * (TN / RN);
// Invocations along the pixel dimension of the output tile.
const WGN = TN / RN;
// Rows of the X tile one pass of the whole workgroup loads (4 pixels per invocation).
const XROWS = WG / TN4;

var<workgroup> a_tile: array<vec4<f32>, TK * TM4>;   // [k][m / 4]
var<workgroup> b_tile: array<vec4<f32>, TK * TN4>;   // [k][n / 4]

@compute @workgroup_size(WG)
fn conv2d(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let tile = wg.x + wg.y * nwg.x;
    if tile >= p.ntiles { return; }   // uniform over the workgroup
    let nb = wg.z / p.mtiles;
    let m0 = (wg.z % p.mtiles) * TM;
    let p0 = tile * TN;

    // This invocation's output block: RM rows x RN pixels.
    let tm = li / WGN;
    let tn = li % WGN;

    // This invocation's share of the X tile: 4 consecutive pixels, rows xr, xr + XROWS, ...
    // Their positions are fixed for the whole K loop: decode them once.
    let xn4 = li % TN4;
    let xr = li / TN4;
    var iy0: array<i32, 4>;
    var ix0: array<i32, 4>;
    for (var j = 0u; j < 4u; j++) {
        let pix = p0 + xn4 * 4u + j;
        let oy = pix / p.wo;
        let ox = pix % p.wo;
        // Pixels past the end get a position outside every tap window.
        iy0[j] = select(-0x4000000, i32(oy * STRIDE) - i32(p.pad_top), pix < p.npix);
        ix0[j] = i32(ox * STRIDE) - i32(p.pad_left);
    }

    var acc: array<vec4<f32>, RM * RN4>;
    for (var i = 0u; i < RM * RN4; i++) { acc[i] = vec4<f32>(0.0); }

    let mpad4 = p.mpad / 4u;
    for (var k0 = 0u; k0 < p.ktot; k0 += TK) {
        // W tile: contiguous vec4 rows of the padded weights (no bounds checks needed).
        for (var r = 0u; r < (TK * TM4 + WG - 1u) / WG; r++) {
            let idx = li + r * WG;
            if idx < TK * TM4 {
                let row = idx / TM4;
                let col = idx % TM4;
                a_tile[idx] = wt[(k0 + row) * mpad4 + m0 / 4u + col];
            }
        }
        // X tile: im2col on the fly.
        for (var r = 0u; r < TK / XROWS; r++) {
            let row = xr + r * XROWS;
            let kg = k0 + row;
            let ci = kg / KK;
            let t = kg % KK;
            let ky = i32(t / KS);
            let kx = i32(t % KS);
            let row_ok = kg < p.ktot;
            var v: vec4<f32>;
            for (var j = 0u; j < 4u; j++) {
                v[j] = load_x(nb, ci, iy0[j] + ky, ix0[j] + kx, row_ok);
            }
            b_tile[row * TN4 + xn4] = v;
        }
        workgroupBarrier();

        for (var kk = 0u; kk < TK; kk++) {
            var a: array<vec4<f32>, RM4>;
            var b: array<vec4<f32>, RN4>;
            for (var i = 0u; i < RM4; i++) { a[i] = a_tile[kk * TM4 + tm * RM4 + i]; }
            for (var j = 0u; j < RN4; j++) { b[j] = b_tile[kk * TN4 + tn * RN4 + j]; }
            for (var i = 0u; i < RM4; i++) {
                for (var c = 0u; c < 4u; c++) {
                    for (var j = 0u; j < RN4; j++) {
                        let o = (i * 4u + c) * RN4 + j;
                        acc[o] = fma(vec4<f32>(a[i][c]), b[j], acc[o]);
                    }
                }
            }
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < RM; i++) {
        let m = m0 + tm * RM + i;
        if m >= p.cout { break; }
        let obase = (nb * p.cout + m) * p.npix;
        for (var j = 0u; j < RN4; j++) {
            for (var c = 0u; c < 4u; c++) {
                let pix = p0 + tn * RN + j * 4u + c;
                if pix < p.npix {
                    out[obase + pix] = T(epilogue(nb, m, pix, acc[i * RN4 + j][c]));
                }
            }
        }
    }
}
#endif
