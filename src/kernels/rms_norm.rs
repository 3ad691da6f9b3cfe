//! `shaders/rms_norm.wgsl`: norms over channels per position, SiLU fused:
//! Wan 2.1's `WanRMS_norm` (`normalize(x, dim=C) · √C · gamma`), PyTorch's
//! `nn.RMSNorm` and `nn.LayerNorm` (without its bias) — per token when the
//! positions are a transformer's channel-major tokens.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, KernelSpec, PipelineKey, Recorder, StorageType};
use crate::kernels::elementwise::storage_of;
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/rms_norm.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 64;

/// Uniforms (mirrors `Params` in the shader).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Params {
    /// `N · H · W`.
    pub positions: u32,
    /// Channels.
    pub c: u32,
    /// `H · W`.
    pub hw: u32,
    /// The epsilon of [`NormKind::Rms`] and [`NormKind::Layer`].
    pub eps: f32,
}

/// Which norm over channels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormKind {
    /// `x / max(‖x‖, 1e-12)` (`F.normalize`, Wan's RMS_norm; `√C` in gamma).
    Wan,
    /// `x / sqrt(mean(x²) + eps)` (`nn.RMSNorm`).
    Rms(f32),
    /// `(x − mean) / sqrt(var + eps)` (`nn.LayerNorm`'s scale only).
    Layer(f32),
}

impl NormKind {
    fn eps(self) -> f32 {
        match self {
            NormKind::Wan => 0.0,
            NormKind::Rms(e) | NormKind::Layer(e) => e,
        }
    }
}

/// The kernel.
pub const RMS_NORM: KernelSpec =
    spec::<Params>("rms_norm", SOURCE, "rms_norm", &[Read, Read, ReadWrite]);

fn key(x: StorageType, out: StorageType, silu: bool, kind: NormKind) -> PipelineKey {
    PipelineKey::new(&RMS_NORM)
        .flag_if(silu, "SILU")
        .flag_if(matches!(kind, NormKind::Rms(_)), "MEAN_EPS")
        .flag_if(matches!(kind, NormKind::Layer(_)), "CENTER")
        .constant("WG", format!("{WG}u"))
        .storage("x", x)
        .storage("out", out)
}

/// `out = normalize(x, dim=C) · gamma` (SiLU after when `silu`); `gamma`
/// f32 `[C]` with `√C` folded in. x and out `[N, C, H, W]`, not aliased.
pub fn rms_norm(
    rec: &mut Recorder,
    x: &Tensor,
    gamma: &Tensor,
    silu: bool,
    out: &Tensor,
) -> Result<()> {
    norm(rec, x, (gamma, NormKind::Wan), silu, out)
}

/// The norm `kind` over channels at each position of `x`, times `gamma`
/// (f32 `[C]`), SiLU after when `silu`, into `out` (same shape, not aliased).
pub fn norm(
    rec: &mut Recorder,
    x: &Tensor,
    (gamma, kind): (&Tensor, NormKind),
    silu: bool,
    out: &Tensor,
) -> Result<()> {
    let [n, c, h, w] = match *x.shape() {
        [n, c, h, w] => [n, c, h, w],
        _ => return Err(Error::shape("rms_norm", format!("x {x:?} is not N×C×H×W"))),
    };
    if out.shape() != x.shape() || x.overlaps(out) {
        return Err(Error::shape("rms_norm", format!("x {x:?} vs out {out:?}")));
    }
    if gamma.dtype() != DType::F32 || gamma.numel() != c {
        return Err(Error::shape(
            "rms_norm",
            format!("gamma {gamma:?} for {c} channels"),
        ));
    }
    let positions = n * h * w;
    let u = |v: usize| {
        u32::try_from(v).map_err(|_| Error::shape("rms_norm", format!("{v} exceeds u32")))
    };
    u(x.numel())?;
    let params = Params {
        positions: u(positions)?,
        c: u(c)?,
        hw: u(h * w)?,
        eps: kind.eps(),
    };
    let groups = linear_groups(rec.ctx(), (positions as u64).div_ceil(WG as u64))?;
    let st = storage_of(rec, &[("x", x), ("out", out)])?;
    let ty = |i: usize| st.get(i).map(|s| s.1).unwrap_or(StorageType::F32);
    rec.dispatch(
        &RMS_NORM,
        &key(ty(0), ty(1), silu, kind),
        &params,
        &[x, gamma, out],
        groups,
        0,
    )
}

/// CPU reference of [`rms_norm`] on `[n, c, hw]` data.
pub fn cpu_rms_norm(
    x: &[f32],
    n: usize,
    c: usize,
    hw: usize,
    gamma: &[f32],
    silu: bool,
) -> Vec<f32> {
    cpu_norm(x, [n, c, hw], gamma, NormKind::Wan, silu)
}

/// CPU reference of [`norm`] on `[n, c, hw]` data.
pub fn cpu_norm(
    x: &[f32],
    [n, c, hw]: [usize; 3],
    gamma: &[f32],
    kind: NormKind,
    silu: bool,
) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for b in 0..n {
        for i in 0..hw {
            let at = |ch: usize| (b * c + ch) * hw + i;
            let mean = match kind {
                NormKind::Layer(_) => (0..c).map(|ch| x[at(ch)]).sum::<f32>() / c as f32,
                _ => 0.0,
            };
            let ss: f32 = (0..c).map(|ch| (x[at(ch)] - mean).powi(2)).sum();
            let inv = match kind {
                NormKind::Wan => 1.0 / ss.sqrt().max(1e-12),
                NormKind::Rms(e) | NormKind::Layer(e) => 1.0 / (ss / c as f32 + e).sqrt(),
            };
            for ch in 0..c {
                let v = (x[at(ch)] - mean) * inv * gamma[ch];
                out[at(ch)] = if silu { v / (1.0 + (-v).exp()) } else { v };
            }
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for t in StorageType::ALL {
        for silu in [false, true] {
            for kind in [NormKind::Wan, NormKind::Rms(0.0), NormKind::Layer(0.0)] {
                v.push((RMS_NORM, key(t, t, silu, kind)));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    #[test]
    fn rms_norm_matches_cpu() {
        let ctx = test_context();
        let [n, c, h, w] = [2, 7, 3, 5];
        let data = rand_vec(n * c * h * w, 5, 2.0);
        let g = rand_vec(c, 6, 1.0);
        for silu in [false, true] {
            let x = Tensor::from_f32(&ctx, &[n, c, h, w], &data, "x").unwrap();
            let gamma = Tensor::from_f32(&ctx, &[c], &g, "g").unwrap();
            let out = Tensor::empty(&ctx, &[n, c, h, w], DType::F32, "out").unwrap();
            let mut rec = Recorder::new(&ctx);
            rms_norm(&mut rec, &x, &gamma, silu, &out).unwrap();
            rec.submit().unwrap();
            let want = cpu_rms_norm(&data, n, c, h * w, &g, silu);
            assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-5, 1e-5, "rms_norm");
        }
    }

    /// `nn.RMSNorm` and `nn.LayerNorm` (scale only) on odd shapes, data off
    /// centre so the mean matters.
    #[test]
    fn rms_and_layer_norms_match_cpu() {
        let ctx = test_context();
        let [n, c, h, w] = [3, 13, 5, 3];
        let data: Vec<f32> = rand_vec(n * c * h * w, 8, 2.0)
            .iter()
            .map(|v| v + 0.7)
            .collect();
        let g = rand_vec(c, 9, 1.0);
        for kind in [
            NormKind::Rms(1e-5),
            NormKind::Layer(1e-5),
            NormKind::Layer(0.5),
        ] {
            let x = Tensor::from_f32(&ctx, &[n, c, h, w], &data, "x").unwrap();
            let gamma = Tensor::from_f32(&ctx, &[c], &g, "g").unwrap();
            let out = Tensor::empty(&ctx, &[n, c, h, w], DType::F32, "out").unwrap();
            let mut rec = Recorder::new(&ctx);
            norm(&mut rec, &x, (&gamma, kind), false, &out).unwrap();
            rec.submit().unwrap();
            let want = cpu_norm(&data, [n, c, h * w], &g, kind, false);
            assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-5, 1e-5, "norm");
        }
    }
}
