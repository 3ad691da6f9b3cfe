//! `shaders/elementwise.wgsl`: scale-shift, SiLU, ReLU, tanh clamp, add.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::{linear_groups, BindingKind, KernelSpec, PipelineKey, Recorder};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/elementwise.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Params {
    pub n: u32,
    pub alpha: f32,
    pub beta: f32,
    pub _pad: u32,
}

pub const UNARY: KernelSpec = KernelSpec {
    family: "elementwise",
    source: SOURCE,
    entry: "unary",
    bindings: &[BindingKind::Read, BindingKind::ReadWrite],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

pub const BINARY: KernelSpec = KernelSpec {
    family: "elementwise",
    source: SOURCE,
    entry: "binary",
    bindings: &[BindingKind::Read, BindingKind::Read, BindingKind::ReadWrite],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

/// A one-input elementwise function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    /// `x * alpha + beta`
    ScaleShift {
        alpha: f32,
        beta: f32,
    },
    Silu,
    Relu,
    /// `tanh(x / k) * k`
    TanhClamp(f32),
}

impl Unary {
    fn code(self) -> (u32, f32, f32) {
        match self {
            Unary::ScaleShift { alpha, beta } => (0, alpha, beta),
            Unary::Silu => (1, 1.0, 0.0),
            Unary::Relu => (2, 1.0, 0.0),
            Unary::TanhClamp(k) => (3, k, 0.0),
        }
    }

    /// CPU reference.
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Unary::ScaleShift { alpha, beta } => v * alpha + beta,
            Unary::Silu => v / (1.0 + (-v).exp()),
            Unary::Relu => v.max(0.0),
            Unary::TanhClamp(k) => (v / k).tanh() * k,
        }
    }
}

/// WGSL storage type for a dtype the elementwise kernels support.
pub(crate) fn storage_type(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F16 => Ok("f16"),
        d => Err(Error::Unsupported(format!(
            "{} tensors in elementwise kernels",
            d.name()
        ))),
    }
}

fn key(spec: &KernelSpec, op: u32, dtype: DType, binary: bool) -> Result<PipelineKey> {
    Ok(PipelineKey::new(spec)
        .flag_if(dtype == DType::F16, "F16")
        .flag_if(binary, "BINARY")
        .alias("T", storage_type(dtype)?)
        .constant("WG", format!("{WG}u"))
        .constant("OP", format!("{op}u")))
}

fn check_same(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.numel() != b.numel() || a.dtype() != b.dtype() {
        return Err(Error::shape(op, format!("{a:?} vs {b:?}")));
    }
    Ok(())
}

/// `out = f(x)`; `out` may be `x` itself.
pub fn unary(rec: &mut Recorder, f: Unary, x: &Tensor, out: &Tensor) -> Result<()> {
    check_same("elementwise", x, out)?;
    let (op, alpha, beta) = f.code();
    let n = x.numel() as u32;
    let params = Params {
        n,
        alpha,
        beta,
        _pad: 0,
    };
    let groups = linear_groups(rec.ctx(), (n as u64).div_ceil(WG as u64))?;
    rec.dispatch(
        &UNARY,
        &key(&UNARY, op, x.dtype(), false)?,
        &params,
        &[x, out],
        groups,
        0,
    )
}

/// `out = x + y`; `out` may be `x` or `y`.
pub fn add(rec: &mut Recorder, x: &Tensor, y: &Tensor, out: &Tensor) -> Result<()> {
    check_same("add", x, y)?;
    check_same("add", x, out)?;
    let n = x.numel() as u32;
    let params = Params {
        n,
        alpha: 1.0,
        beta: 0.0,
        _pad: 0,
    };
    let groups = linear_groups(rec.ctx(), (n as u64).div_ceil(WG as u64))?;
    rec.dispatch(
        &BINARY,
        &key(&BINARY, 4, x.dtype(), true)?,
        &params,
        &[x, y, out],
        groups,
        0,
    )
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for dtype in [DType::F32, DType::F16] {
        for op in 0..4 {
            v.push((
                UNARY,
                key(&UNARY, op, dtype, false).expect("supported dtype"),
            ));
        }
        v.push((
            BINARY,
            key(&BINARY, 4, dtype, true).expect("supported dtype"),
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    #[test]
    fn unary_ops_match_cpu_on_odd_sizes() {
        let ctx = test_context();
        for (i, f) in [
            Unary::ScaleShift {
                alpha: 1.0 / 0.18215,
                beta: 0.1159,
            },
            Unary::Silu,
            Unary::Relu,
            Unary::TanhClamp(3.0),
        ]
        .into_iter()
        .enumerate()
        {
            for n in [1usize, 7 * 5 * 3, 37 * 19 * 23 * 2 + 1] {
                let data = rand_vec(n, 100 + i as u64, 8.0);
                let x = Tensor::from_f32(&ctx, &[n], &data, "x").unwrap();
                let out = Tensor::empty(&ctx, &[n], DType::F32, "out").unwrap();
                let mut rec = Recorder::new(&ctx);
                unary(&mut rec, f, &x, &out).unwrap();
                rec.submit().unwrap();
                let want: Vec<f32> = data.iter().map(|&v| f.apply(v)).collect();
                assert_close(
                    &out.to_f32(&ctx).unwrap(),
                    &want,
                    1e-5,
                    1e-5,
                    &format!("{f:?} n={n}"),
                );
            }
        }
    }

    #[test]
    fn add_in_place_matches_cpu() {
        let ctx = test_context();
        let n = 2 * 37 * 19 * 23;
        let a = rand_vec(n, 1, 1.0);
        let b = rand_vec(n, 2, 1.0);
        let x = Tensor::from_f32(&ctx, &[n], &a, "x").unwrap();
        let y = Tensor::from_f32(&ctx, &[n], &b, "y").unwrap();
        let mut rec = Recorder::new(&ctx);
        add(&mut rec, &x, &y, &x).unwrap();
        rec.submit().unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
        assert_close(&x.to_f32(&ctx).unwrap(), &want, 1e-6, 1e-6, "add");
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let ctx = test_context();
        let x = Tensor::empty(&ctx, &[5], DType::F32, "x").unwrap();
        let y = Tensor::empty(&ctx, &[6], DType::F32, "y").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(matches!(
            add(&mut rec, &x, &y, &x),
            Err(Error::Shape { .. })
        ));
    }
}
