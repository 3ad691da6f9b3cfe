//! Building blocks shared by the models: convolutions and GroupNorms loaded
//! from a [`WeightStore`], run through the kernels with outputs from the pool.

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::conv2d::{self, Conv2dOptions, Conv2dWeights, Prologue, PytorchConv};
use crate::kernels::group_norm;
use crate::models::weights::WeightStore;
use crate::tensor::{DType, Tensor};

/// `[N, C, H, W]` of a rank-4 tensor.
pub(crate) fn dims4(t: &Tensor) -> Result<[usize; 4]> {
    dims4_of(t.shape())
}

/// `shape` as N×C×H×W, or an error.
pub(crate) fn dims4_of(shape: &[usize]) -> Result<[usize; 4]> {
    match shape {
        &[n, c, h, w] => Ok([n, c, h, w]),
        s => Err(Error::shape(
            "model",
            format!("expected an N×C×H×W tensor, got {s:?}"),
        )),
    }
}

/// Loads `{prefix}.weight` `[cout, cin, k, k]` and (if `bias`) `{prefix}.bias` `[cout]`.
pub(crate) fn load_conv(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    cout: usize,
    cin: usize,
    k: usize,
    bias: bool,
) -> Result<Conv2dWeights> {
    let w = store.take(&format!("{prefix}.weight"), &[cout, cin, k, k])?;
    let b = bias
        .then(|| store.take(&format!("{prefix}.bias"), &[cout]))
        .transpose()?;
    let host = PytorchConv {
        weight: &w,
        cout,
        cin,
        k,
        bias: b.as_deref(),
    };
    Conv2dWeights::upload(ctx, &host, None, store.dtype(), prefix)
}

/// Runs a conv into a fresh pool tensor of the weights' dtype (the model's
/// activation dtype).
pub fn conv(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Conv2dWeights,
    prologue: Option<Prologue>,
    opts: &Conv2dOptions,
) -> Result<Tensor> {
    conv_as(rec, x, w, prologue, opts, w.dtype())
}

/// [`conv`] into a tensor of `dtype`.
pub(crate) fn conv_as(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Conv2dWeights,
    prologue: Option<Prologue>,
    opts: &Conv2dOptions,
    dtype: DType,
) -> Result<Tensor> {
    let [n, _, h, wd] = dims4(x)?;
    let (ho, wo) = conv2d::output_size(h, wd, w.k(), opts);
    let out = Tensor::empty(rec.ctx(), &[n, w.cout(), ho, wo], dtype, "conv out")?;
    conv2d::conv2d(rec, x, w, prologue, None, &out, opts)?;
    Ok(out)
}

/// Like [`conv`] but adds `residual` (the output is written in place into it).
pub(crate) fn conv_add(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Conv2dWeights,
    prologue: Option<Prologue>,
    residual: Tensor,
    opts: &Conv2dOptions,
) -> Result<Tensor> {
    conv2d::conv2d(rec, x, w, prologue, Some(&residual), &residual, opts)?;
    Ok(residual)
}

/// A GroupNorm's parameters; applied by computing per-(n, c) affine
/// coefficients that the next conv folds into its input load.
pub struct Norm {
    gamma: Tensor,
    beta: Tensor,
    groups: usize,
    eps: f32,
}

impl Norm {
    /// Loads `{prefix}.weight` / `{prefix}.bias` (`channels` each) from `store`.
    pub fn load(
        ctx: &Context,
        store: &WeightStore,
        prefix: &str,
        channels: usize,
        groups: usize,
        eps: f32,
    ) -> Result<Norm> {
        let g = store.take(&format!("{prefix}.weight"), &[channels])?;
        let b = store.take(&format!("{prefix}.bias"), &[channels])?;
        Ok(Norm {
            gamma: Tensor::from_f32(ctx, &[channels], &g, prefix)?,
            beta: Tensor::from_f32(ctx, &[channels], &b, prefix)?,
            groups,
            eps,
        })
    }

    /// Groups.
    pub fn groups(&self) -> usize {
        self.groups
    }
    /// Channels.
    pub fn channels(&self) -> usize {
        self.gamma.numel()
    }
    /// Variance epsilon.
    pub fn eps(&self) -> f32 {
        self.eps
    }
    /// The layer's parameters as the kernels take them.
    pub(crate) fn params(&self) -> group_norm::GroupNormParams<'_> {
        group_norm::GroupNormParams::new(self.groups, &self.gamma, &self.beta, self.eps)
    }

    /// Statistics of `x` [N, C, H, W] as affine coefficients [N, C, 2].
    pub fn affine(&self, rec: &mut Recorder, x: &Tensor) -> Result<Tensor> {
        let [n, c, h, w] = dims4(x)?;
        let ctx = rec.ctx().clone();
        let scratch_len = group_norm::stats_scratch_len(n, c, h, w, self.groups);
        let scratch = Tensor::empty(&ctx, &[scratch_len], DType::F32, "groupnorm partials")?;
        let affine = Tensor::empty(&ctx, &[n, c, 2], DType::F32, "groupnorm affine")?;
        group_norm::group_norm_stats(rec, x, &self.params(), &scratch, &affine)?;
        Ok(affine)
    }
}

/// Identity affine coefficients [N, C, 2] (scale 1, shift 0), for a conv
/// prologue that applies only an activation.
pub(crate) fn identity_affine(rec: &mut Recorder, n: usize, c: usize) -> Result<Tensor> {
    let data: Vec<f32> = (0..n * c).flat_map(|_| [1.0, 0.0]).collect();
    Tensor::from_f32_in(rec, &[n, c, 2], &data, "identity affine")
}

/// Records copies of intermediate activations (for checks against goldens).
#[derive(Default)]
pub struct Taps {
    enabled: bool,
    /// Tapped activations, labelled by stage, in recording order.
    pub tensors: Vec<(String, Tensor)>,
}

impl Taps {
    /// Taps that record.
    pub fn enabled() -> Self {
        Taps {
            enabled: true,
            tensors: Vec::new(),
        }
    }

    /// True when taps record.
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Copies `x` (later kernels may update it in place).
    pub fn tap(&mut self, rec: &mut Recorder, name: &str, x: &Tensor) -> Result<()> {
        if self.enabled {
            let copy = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), name)?;
            rec.copy(x, &copy)?;
            self.tensors.push((name.to_string(), copy));
        }
        Ok(())
    }
}
