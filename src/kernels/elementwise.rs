//! `shaders/elementwise.wgsl`: scale-shift, SiLU, ReLU, tanh clamp, clamp, add.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, KernelSpec, PipelineKey, Recorder, StorageType};
use crate::kernels::spec;
use crate::tensor::Tensor;

const SOURCE: &str = include_str!("../../shaders/elementwise.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
/// Uniforms of both entry points (mirrors `Params` in the shader).
pub struct Params {
    /// Elements.
    pub n: u32,
    /// ScaleShift multiplier / TanhClamp bound / Clamp lower bound.
    pub alpha: f32,
    /// ScaleShift offset / Clamp upper bound.
    pub beta: f32,
    /// Padding to 16 bytes.
    pub _pad: u32,
}

/// `out = f(x)` ([`unary`]).
pub const UNARY: KernelSpec = spec::<Params>("elementwise", SOURCE, "unary", &[Read, ReadWrite]);

/// `out = x + y` ([`add`]).
pub const BINARY: KernelSpec =
    spec::<Params>("elementwise", SOURCE, "binary", &[Read, Read, ReadWrite]);

/// A one-input elementwise function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    /// `x * alpha + beta`
    ScaleShift {
        /// Multiplier.
        alpha: f32,
        /// Offset.
        beta: f32,
    },
    /// `x · sigmoid(x)`.
    Silu,
    /// `max(x, 0)`.
    Relu,
    /// `tanh(x / k) * k`
    TanhClamp(f32),
    /// `x` clamped to `[lo, hi]` (Wan's output to [−1, 1]).
    Clamp {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
}

impl Unary {
    fn code(self) -> (u32, f32, f32) {
        match self {
            Unary::ScaleShift { alpha, beta } => (0, alpha, beta),
            Unary::Silu => (1, 1.0, 0.0),
            Unary::Relu => (2, 1.0, 0.0),
            Unary::TanhClamp(k) => (3, k, 0.0),
            Unary::Clamp { lo, hi } => (5, lo, hi),
        }
    }

    /// CPU reference.
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Unary::ScaleShift { alpha, beta } => v * alpha + beta,
            Unary::Silu => v / (1.0 + (-v).exp()),
            Unary::Relu => v.max(0.0),
            Unary::TanhClamp(k) => (v / k).tanh() * k,
            Unary::Clamp { lo, hi } => v.clamp(lo, hi),
        }
    }
}

fn key(spec: &KernelSpec, op: u32, storage: &[(&'static str, StorageType)]) -> PipelineKey {
    let mut key = PipelineKey::new(spec)
        .flag_if(spec.entry == "binary", "BINARY")
        .constant("WG", format!("{WG}u"))
        .constant("OP", format!("{op}u"));
    for &(name, ty) in storage {
        key = key.storage(name, ty);
    }
    key
}

/// The storage type of each named tensor on this recorder's device.
pub(crate) fn storage_of(
    rec: &Recorder,
    tensors: &[(&'static str, &Tensor)],
) -> Result<Vec<(&'static str, StorageType)>> {
    tensors
        .iter()
        .map(|&(n, t)| Ok((n, StorageType::of(t.dtype(), rec.ctx().caps())?)))
        .collect()
}

fn check_same(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.numel() != b.numel() || a.dtype() != b.dtype() {
        return Err(Error::shape(op, format!("{a:?} vs {b:?}")));
    }
    Ok(())
}

/// `out = f(x)`, any float dtypes (a conversion when they differ); `out`
/// may be `x` itself.
pub fn unary(rec: &mut Recorder, f: Unary, x: &Tensor, out: &Tensor) -> Result<()> {
    if x.numel() != out.numel() || (x.overlaps(out) && x.dtype() != out.dtype()) {
        return Err(Error::shape("elementwise", format!("{x:?} vs {out:?}")));
    }
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
        &key(&UNARY, op, &storage_of(rec, &[("x", x), ("out", out)])?),
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
        &key(
            &BINARY,
            4,
            &storage_of(rec, &[("x", x), ("y", y), ("out", out)])?,
        ),
        &params,
        &[x, y, out],
        groups,
        0,
    )
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for t in StorageType::ALL {
        for op in [0, 1, 2, 3, 5] {
            v.push((UNARY, key(&UNARY, op, &[("x", t), ("out", t)])));
        }
        for to in StorageType::ALL {
            v.push((UNARY, key(&UNARY, 0, &[("x", t), ("out", to)])));
        }
        v.push((BINARY, key(&BINARY, 4, &[("x", t), ("y", t), ("out", t)])));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::storage::round_through;
    use crate::tensor::DType;
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
            Unary::Clamp { lo: -1.0, hi: 1.0 },
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

    /// Every storage type (packed f16 forced by hiding shader-f16), in place
    /// and converting: results equal the CPU op on the stored inputs,
    /// rounded through the output dtype (≤ 1 ulp of that dtype).
    #[test]
    fn every_storage_type_matches_cpu() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            let n = 37 * 19 + 2;
            let data: Vec<f32> = rand_vec(n, 5, 4.0)
                .into_iter()
                .map(|v| round_through(v, dt))
                .collect();
            let x = Tensor::from_f32_as(&ctx, &[n], &data, dt, "x").unwrap();
            let y = Tensor::from_f32_as(&ctx, &[n], &data, dt, "y").unwrap();
            let wide = Tensor::empty(&ctx, &[n], DType::F32, "wide").unwrap();
            let mut rec = Recorder::new(&ctx);
            unary(&mut rec, Unary::Silu, &x, &x).unwrap();
            add(&mut rec, &x, &y, &x).unwrap();
            unary(
                &mut rec,
                Unary::ScaleShift {
                    alpha: 2.0,
                    beta: 0.5,
                },
                &x,
                &wide,
            )
            .unwrap();
            rec.submit().unwrap();
            let silu: Vec<f32> = data
                .iter()
                .map(|&v| round_through(Unary::Silu.apply(v), dt))
                .collect();
            let sum: Vec<f32> = silu
                .iter()
                .zip(&data)
                .map(|(a, b)| round_through(a + b, dt))
                .collect();
            let tol = if dt == DType::BF16 { 8e-3 } else { 1e-3 };
            let what = format!("{} ({})", dt.name(), ctx.caps().shader_f16);
            assert_close(&x.to_f32(&ctx).unwrap(), &sum, 0.0, tol, &what);
            let scaled: Vec<f32> = sum.iter().map(|v| v * 2.0 + 0.5).collect();
            assert_close(&wide.to_f32(&ctx).unwrap(), &scaled, 1e-6, 1e-6, &what);
        }
    }

    /// Stores into 16-bit storage, bit for bit, through a conversion
    /// (`x · 1 + 0` from f32 into the half dtype; exact in f32): bf16 rounds
    /// to nearest even (ties 0x3F808000 → 0x3F80 and 0x3F818000 → 0x3F82,
    /// negatives alike; truncation would give 0x3F81, 0x3F80 for the
    /// just-above-tie cases), overflows to infinity like PyTorch and keeps NaN
    /// a NaN; f16 (native and packed) rounds to nearest and saturates at
    /// ±65504 (infinity included). f16 ties are only printed: WGSL lets an
    /// f32 → f16 conversion that is not exact pick either neighbour.
    #[test]
    fn half_stores_round_bit_exactly() {
        let bf16_cases: [(u32, u16); 14] = [
            (0x3F80_0000, 0x3F80), // 1.0 exactly
            (0x3F80_8000, 0x3F80), // tie, even below
            (0x3F81_8000, 0x3F82), // tie, even above
            (0x3F80_8001, 0x3F81), // just above the tie
            (0x3F80_7FFF, 0x3F80), // just below the tie
            (0x3F80_FFFF, 0x3F81),
            (0xBF80_8000, 0xBF80), // negative ties
            (0xBF81_8000, 0xBF82),
            (0xBF80_8001, 0xBF81),
            (0x4049_0FDB, 0x4049), // pi
            (0x7F7F_FFFF, 0x7F80), // f32::MAX rounds to +inf
            (0x7F80_0000, 0x7F80), // +inf
            (0xFF80_0000, 0xFF80), // -inf
            (0x7FC0_0001, 0x7FC0), // NaN stays a (quiet) NaN
        ];
        let f16_cases: [(f32, u16); 9] = [
            (1.0, 0x3C00),
            (-2.5, 0xC100),
            (1.0 + 0.75 / 1024.0, 0x3C01), // nearest, not truncated
            (1.0 + 0.25 / 1024.0, 0x3C00),
            (65504.0, 0x7BFF),
            (70000.0, 0x7BFF), // saturated, not inf
            (-1.0e6, 0xFBFF),
            (f32::INFINITY, 0x7BFF),
            (f32::NEG_INFINITY, 0xFBFF),
        ];
        let f16_ties: [(f32, u16); 2] =
            [(1.0 + 0.5 / 1024.0, 0x3C00), (1.0 + 1.5 / 1024.0, 0x3C02)];
        let store = |ctx: &crate::gpu::Context, values: &[f32], dt: DType| -> Vec<u16> {
            let x = Tensor::from_f32(ctx, &[values.len()], values, "x").unwrap();
            let out = Tensor::empty(ctx, &[values.len()], dt, "out").unwrap();
            let mut rec = Recorder::new(ctx);
            let f = Unary::ScaleShift {
                alpha: 1.0,
                beta: 0.0,
            };
            unary(&mut rec, f, &x, &out).unwrap();
            rec.submit().unwrap();
            let bytes = out.to_bytes(ctx).unwrap();
            bytemuck::pod_collect_to_vec::<u8, u16>(&bytes)[..values.len()].to_vec()
        };
        let ctx = test_context();
        let inputs: Vec<f32> = bf16_cases.iter().map(|c| f32::from_bits(c.0)).collect();
        let got = store(&ctx, &inputs, DType::BF16);
        for ((bits, want), got) in bf16_cases.iter().zip(&got) {
            assert_eq!(
                *got, *want,
                "bf16 of {bits:#010x}: got {got:#06x}, want {want:#06x}"
            );
        }
        for (ctx, dt) in crate::testing::dtype_contexts() {
            if dt != DType::F16 {
                continue;
            }
            let how = if ctx.caps().shader_f16 {
                "native"
            } else {
                "packed"
            };
            let all: Vec<(f32, u16)> = f16_cases.iter().chain(&f16_ties).copied().collect();
            let inputs: Vec<f32> = all.iter().map(|c| c.0).collect();
            let got = store(&ctx, &inputs, DType::F16);
            for (i, ((v, want), got)) in all.iter().zip(&got).enumerate() {
                if i >= f16_cases.len() {
                    println!("f16 {how}: tie {v} → {got:#06x} (nearest even {want:#06x})");
                    continue;
                }
                assert_eq!(
                    *got, *want,
                    "f16 {how} of {v}: got {got:#06x}, want {want:#06x}"
                );
            }
        }
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
