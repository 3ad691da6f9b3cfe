//! `shaders/matmul.wgsl`: batched tiled GEMM with workgroup-shared tiles,
//! 4x4 register blocking (vec4 shared loads) and f32 accumulation; or, as an explicit
//! option ([`MatmulPrecision`]), f16 operands on cooperative matrices (tensor cores) with
//! f32 accumulation (`coop.rs`: `matmul_coop`).

mod coop;
#[cfg(test)]
mod coop_tests;

pub use coop::CoopTiles;

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{KernelSpec, PipelineKey, Recorder};
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/matmul.wgsl");

/// Output tile rows / columns per workgroup, K depth per shared-memory stage.
pub const BM: u32 = 64;
/// Output tile columns per workgroup.
pub const BN: u32 = 64;
/// K depth per workgroup-memory stage.
pub const BK: u32 = 16;
/// Each invocation accumulates a 4 x 4 block (one vec4 of each operand per k).
pub const REGISTER_BLOCK: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
/// Uniforms of `matmul` (mirrors `Params` in the shader).
pub struct Params {
    /// Rows of A and of the output.
    pub m: u32,
    /// Columns of B and of the output.
    pub n: u32,
    /// Columns of A = rows of B.
    pub k: u32,
    /// Padding.
    pub _pad: u32,
    /// Elements between batches of A (0: shared).
    pub a_batch_stride: u32,
    /// Elements between batches of B (0: shared).
    pub b_batch_stride: u32,
    /// Elements between batches of the output.
    pub out_batch_stride: u32,
    /// Scale applied to `A · B`.
    pub alpha: f32,
}

/// `out = alpha · A · B`.
pub const MATMUL: KernelSpec = spec::<Params>("matmul", SOURCE, "matmul", &[Read, Read, ReadWrite]);

/// `out = alpha · A · B + bias` (bias per column).
pub const MATMUL_BIAS: KernelSpec =
    spec::<Params>("matmul", SOURCE, "matmul", &[Read, Read, Read, ReadWrite]);

/// The arithmetic of a matmul. f16 operands change an f32 GEMM's result (each input is
/// rounded to f16: about 3 significant decimal digits, magnitudes above 65504 become
/// infinite), so they are only used when asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// f32 operands and accumulation (the scalar kernel): the default.
    #[default]
    F32,
    /// Operands rounded to f16 while staged, products accumulated in f32, on cooperative
    /// matrices (tensor cores: `matmul_coop`). A device without a usable
    /// cooperative-matrix configuration ([`crate::gpu::Capabilities::cooperative_matrix`])
    /// makes the call an [`Error::Unsupported`] naming the reason.
    F16Operands,
    /// [`MatmulPrecision::F16Operands`] where the device has a usable configuration, the
    /// f32 kernel elsewhere (for models that accept f16 operands).
    F16OperandsOrF32,
}

/// How the operands are read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulOptions {
    /// a is `[B, K, M]` (use its transpose).
    pub trans_a: bool,
    /// bm is `[B, N, K]` (use its transpose).
    pub trans_b: bool,
    /// Scale applied to the product (before the bias).
    pub alpha: f32,
    /// f32, or f16 operands on cooperative matrices.
    pub precision: MatmulPrecision,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        MatmulOptions {
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            precision: MatmulPrecision::F32,
        }
    }
}

fn key(opts: &MatmulOptions, bias: bool) -> PipelineKey {
    let spec = if bias { &MATMUL_BIAS } else { &MATMUL };
    PipelineKey::new(spec)
        .flag_if(opts.trans_a, "TRANS_A")
        .flag_if(opts.trans_b, "TRANS_B")
        .flag_if(bias, "BIAS")
        .constant("BM", format!("{BM}u"))
        .constant("BN", format!("{BN}u"))
        .constant("BK", format!("{BK}u"))
}

/// `(batch, rows, cols)` of a rank-2 (batch 1) or rank-3 f32 tensor.
fn dims3(what: &str, t: &Tensor) -> Result<(usize, usize, usize)> {
    if t.dtype() != DType::F32 {
        return Err(Error::shape(
            "matmul",
            format!("{what} must be f32, got {t:?}"),
        ));
    }
    match *t.shape() {
        [r, c] => Ok((1, r, c)),
        [b, r, c] => Ok((b, r, c)),
        _ => Err(Error::shape(
            "matmul",
            format!("{what} must be [B, rows, cols] or [rows, cols], got {t:?}"),
        )),
    }
}

/// `out[b] = alpha * op(a[b]) @ op(bm[b]) (+ bias[col] if given)`, batched over b
/// (batch 1 allowed); a `[B, M, K]` (or `[B, K, M]` when `trans_a`), bm `[B, K, N]`
/// (or `[B, N, K]` when `trans_b`), bias `[N]`, out `[B, M, N]`. Rank-2
/// operands are batch 1, and an operand with batch 1 is broadcast over the
/// batch of `out`. All tensors f32; `out` must not alias `a` or `bm`.
/// `opts.precision` picks the f32 kernel or f16 operands on cooperative matrices (the
/// device's [`CoopTiles::for_device`]).
pub fn matmul(
    rec: &mut Recorder,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    opts: &MatmulOptions,
) -> Result<()> {
    let coop = match opts.precision {
        MatmulPrecision::F32 => None,
        MatmulPrecision::F16Operands => Some(CoopTiles::for_device(rec.ctx().caps())?),
        MatmulPrecision::F16OperandsOrF32 => CoopTiles::for_device(rec.ctx().caps()).ok(),
    };
    matmul_with(rec, a, b, bias, out, opts, coop)
}

/// [`matmul`] with the cooperative tiles given (`None`: the f32 kernel; `opts.precision`
/// is not consulted): tests and tuning.
pub fn matmul_with(
    rec: &mut Recorder,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    opts: &MatmulOptions,
    coop: Option<CoopTiles>,
) -> Result<()> {
    if let Some(t) = &coop {
        t.check(rec.ctx().caps())?;
    }
    let (ab, ar, ac) = dims3("a", a)?;
    let (bb, br, bc) = dims3("bm", b)?;
    let (ob, m, n) = dims3("out", out)?;
    let (am, ak) = if opts.trans_a { (ac, ar) } else { (ar, ac) };
    let (bk, bn) = if opts.trans_b { (bc, br) } else { (br, bc) };
    let k = ak;
    if am != m || bn != n || bk != k || (ab != ob && ab != 1) || (bb != ob && bb != 1) {
        return Err(Error::shape(
            "matmul",
            format!(
                "a {a:?}, bm {b:?} (trans {}, {}) do not make out {out:?}",
                opts.trans_a, opts.trans_b
            ),
        ));
    }
    if let Some(bias) = bias {
        if bias.dtype() != DType::F32 || bias.numel() != n {
            return Err(Error::shape(
                "matmul",
                format!("bias must be f32 [{n}], got {bias:?}"),
            ));
        }
    }
    for t in [a, b, out] {
        if t.numel() > u32::MAX as usize {
            return Err(Error::shape(
                "matmul",
                format!("{t:?} exceeds u32 indexing"),
            ));
        }
    }
    let params = Params {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        _pad: 0,
        a_batch_stride: if ab == 1 { 0 } else { (m * k) as u32 },
        b_batch_stride: if bb == 1 { 0 } else { (k * n) as u32 },
        out_batch_stride: (m * n) as u32,
        alpha: opts.alpha,
    };
    let macs = (ob * m * n * k) as u64;
    if let Some(t) = coop {
        let groups = [
            (n as u32).div_ceil(t.tn),
            (m as u32).div_ceil(t.tm),
            ob as u32,
        ];
        let spec = t.spec(bias.is_some());
        let key = t.key(opts, bias.is_some());
        return match bias {
            Some(bias) => rec.dispatch(&spec, &key, &params, &[a, b, bias, out], groups, macs),
            None => rec.dispatch(&spec, &key, &params, &[a, b, out], groups, macs),
        };
    }
    let groups = [(n as u32).div_ceil(BN), (m as u32).div_ceil(BM), ob as u32];
    match bias {
        Some(bias) => rec.dispatch(
            &MATMUL_BIAS,
            &key(opts, true),
            &params,
            &[a, b, bias, out],
            groups,
            macs,
        ),
        None => rec.dispatch(
            &MATMUL,
            &key(opts, false),
            &params,
            &[a, b, out],
            groups,
            macs,
        ),
    }
}

/// CPU reference (f64 accumulation). `a` holds `a_batch` (1 or `batch`)
/// matrices `[M, K]` (`[K, M]` when `trans_a`), `b` likewise `[K, N]` (`[N, K]`
/// when `trans_b`); returns `[batch, M, N]`.
#[allow(clippy::too_many_arguments)]
pub fn cpu_matmul(
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    opts: &MatmulOptions,
) -> Vec<f32> {
    let a_stride = if a.len() == m * k { 0 } else { m * k };
    let b_stride = if b.len() == k * n { 0 } else { k * n };
    let mut out = vec![0.0; batch * m * n];
    for z in 0..batch {
        let (ao, bo) = (z * a_stride, z * b_stride);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for l in 0..k {
                    let av = if opts.trans_a {
                        a[ao + l * m + i]
                    } else {
                        a[ao + i * k + l]
                    };
                    let bv = if opts.trans_b {
                        b[bo + j * k + l]
                    } else {
                        b[bo + l * n + j]
                    };
                    s += av as f64 * bv as f64;
                }
                let mut v = opts.alpha as f64 * s;
                if let Some(bias) = bias {
                    v += bias[j] as f64;
                }
                out[(z * m + i) * n + j] = v as f32;
            }
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            for bias in [false, true] {
                let spec = if bias { MATMUL_BIAS } else { MATMUL };
                let opts = MatmulOptions {
                    trans_a,
                    trans_b,
                    ..Default::default()
                };
                v.push((spec, key(&opts, bias)));
            }
        }
    }
    v.extend(coop::variants());
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    /// Every transpose / bias / broadcast combination on shapes that are not
    /// multiples of the 64x64x16 tiles. Tolerance: 1e-4 relative + 1e-5 absolute
    /// (inputs in [-1, 1], K <= 130) against an f64 reference.
    #[test]
    fn matmul_matches_cpu_for_all_layouts() {
        let ctx = test_context();
        let shapes = [
            (1, 1, 1, 1),
            (2, 37, 19, 23),
            (1, 67, 64, 130),
            (3, 5, 70, 3),
        ];
        let mut seed = 0;
        for &(batch, m, n, k) in &shapes {
            for trans_a in [false, true] {
                for trans_b in [false, true] {
                    for (with_bias, broadcast_a) in [(false, false), (true, batch > 1)] {
                        seed += 1;
                        let opts = MatmulOptions {
                            trans_a,
                            trans_b,
                            alpha: 0.75,
                            ..Default::default()
                        };
                        let a_batch = if broadcast_a { 1 } else { batch };
                        let a_data = rand_vec(a_batch * m * k, seed, 1.0);
                        let b_data = rand_vec(batch * k * n, seed + 1000, 1.0);
                        let bias_data = rand_vec(n, seed + 2000, 1.0);
                        let a_shape = if trans_a {
                            [a_batch, k, m]
                        } else {
                            [a_batch, m, k]
                        };
                        let b_shape = if trans_b {
                            [batch, n, k]
                        } else {
                            [batch, k, n]
                        };
                        let a = Tensor::from_f32(&ctx, &a_shape, &a_data, "a").unwrap();
                        let b = Tensor::from_f32(&ctx, &b_shape, &b_data, "b").unwrap();
                        let bias = Tensor::from_f32(&ctx, &[n], &bias_data, "bias").unwrap();
                        let out = Tensor::empty(&ctx, &[batch, m, n], DType::F32, "out").unwrap();
                        let mut rec = Recorder::new(&ctx);
                        matmul(&mut rec, &a, &b, with_bias.then_some(&bias), &out, &opts).unwrap();
                        rec.submit().unwrap();
                        let want = cpu_matmul(
                            &a_data,
                            &b_data,
                            with_bias.then_some(&bias_data[..]),
                            batch,
                            m,
                            n,
                            k,
                            &opts,
                        );
                        let what = format!(
                            "{batch}x{m}x{n}x{k} {opts:?} bias={with_bias} bcast={broadcast_a}"
                        );
                        assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-5, 1e-4, &what);
                    }
                }
            }
        }
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let ctx = test_context();
        let a = Tensor::empty(&ctx, &[2, 4, 5], DType::F32, "a").unwrap();
        let b = Tensor::empty(&ctx, &[2, 6, 3], DType::F32, "b").unwrap();
        let out = Tensor::empty(&ctx, &[2, 4, 3], DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&ctx);
        let o = MatmulOptions::default();
        assert!(matches!(
            matmul(&mut rec, &a, &b, None, &out, &o),
            Err(Error::Shape { .. })
        ));
        let b = Tensor::empty(&ctx, &[3, 5, 3], DType::F32, "b").unwrap();
        assert!(matches!(
            matmul(&mut rec, &a, &b, None, &out, &o),
            Err(Error::Shape { .. })
        ));
        let b = Tensor::empty(&ctx, &[2, 5, 3], DType::F32, "b").unwrap();
        let bias = Tensor::empty(&ctx, &[4], DType::F32, "bias").unwrap();
        assert!(matches!(
            matmul(&mut rec, &a, &b, Some(&bias), &out, &o),
            Err(Error::Shape { .. })
        ));
        let a16 = Tensor::empty(&ctx, &[2, 4, 5], DType::F16, "a16").unwrap();
        assert!(matches!(
            matmul(&mut rec, &a16, &b, None, &out, &o),
            Err(Error::Shape { .. })
        ));
        assert!(matmul(&mut rec, &a, &b, None, &out, &o).is_ok());
    }

    /// Rough throughput: `cargo test --lib matmul_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn matmul_throughput() {
        let ctx = test_context();
        let (m, n, k) = (1024, 1024, 512);
        let a = Tensor::from_f32(&ctx, &[m, k], &rand_vec(m * k, 1, 1.0), "a").unwrap();
        let b = Tensor::from_f32(&ctx, &[k, n], &rand_vec(k * n, 2, 1.0), "b").unwrap();
        let out = Tensor::empty(&ctx, &[m, n], DType::F32, "out").unwrap();
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            let t = std::time::Instant::now();
            let mut rec = Recorder::new(&ctx);
            matmul(&mut rec, &a, &b, None, &out, &MatmulOptions::default()).unwrap();
            rec.submit().unwrap();
            ctx.wait_idle().unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 2.0 * (m * n * k) as f64;
        println!(
            "matmul {m}x{n}x{k}: {:.1} ms, {:.2} GFLOP/s",
            best * 1e3,
            flops / best / 1e9
        );
    }
}
