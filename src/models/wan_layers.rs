//! The layers Wan-family VAE decoders share (Wan 2.1, Qwen-Image, the
//! residual Wan 2.2 / Qwen-Image 2.1 decoders): RMS norms, causal convs (or
//! their current-frame taps), residual blocks, per-frame attention, each
//! read from diffusers-named weights into a graph [`Builder`].

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::{Conv2dWeights, PytorchConv};
use crate::models::graph::{Builder, CausalWeights, Conv, Geometry, Op, Residual, TensorId};
use crate::models::wan_config::WanConfig;
use crate::models::weights::WeightStore;
use crate::tensor::Tensor;

/// A Wan decoder's stage widths, `base · [mult[-1]] + reversed(mult)`, and
/// its up blocks' time up-sampling flags (reversed `temperal_downsample`),
/// once `cfg` is checked to have n ≥ 1 stages and n − 1 flags (`network`
/// names the decoder in the error).
pub(crate) fn decoder_stages(
    cfg: &WanConfig,
    store: &WeightStore,
    network: &str,
) -> Result<(Vec<usize>, Vec<bool>)> {
    let stages = cfg.dim_mult.len();
    if stages == 0 || cfg.temperal_downsample.len() + 1 != stages || cfg.base_dim == 0 {
        return Err(Error::BadFile {
            path: store.origin().into(),
            message: format!(
                "{network} config needs dim_mult of n ≥ 1 stages and n − 1 temperal_downsample flags; got {:?} and {:?}",
                cfg.dim_mult, cfg.temperal_downsample
            ),
        });
    }
    let mut dims: Vec<usize> = cfg
        .dim_mult
        .iter()
        .rev()
        .map(|m| m * cfg.base_dim)
        .collect();
    let first = dims.first().copied().unwrap_or(0);
    dims.insert(0, first);
    let up_time = cfg.temperal_downsample.iter().rev().copied().collect();
    Ok((dims, up_time))
}

/// Loads a causal conv `{prefix}` `[cout, cin, kt, k, k]` as `kt` taps.
pub(crate) fn load_causal(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    [cout, cin, kt, k]: [usize; 4],
) -> Result<CausalWeights> {
    let w = store.take(&format!("{prefix}.weight"), &[cout, cin, kt, k, k])?;
    let b = store.take(&format!("{prefix}.bias"), &[cout])?;
    causal_from_host(ctx, store, prefix, (&w, &b), [cout, cin, kt, k])
}

/// The causal conv of host weights `w` `[cout, cin, kt, k, k]` and bias
/// `b` as `kt` taps (`prefix` names it).
pub(crate) fn causal_from_host(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    (w, b): (&[f32], &[f32]),
    [cout, cin, kt, k]: [usize; 4],
) -> Result<CausalWeights> {
    let taps = (0..kt)
        .map(|j| {
            let bias = (j + 1 == kt).then_some(b);
            upload_tap(ctx, store, prefix, w, [cout, cin, kt, k], j, bias)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(CausalWeights {
        taps,
        replicate: false,
        repeat_first: false,
        reflect: false,
        centered: false,
    })
}

/// Tap `j` of the causal conv weights `w` `[cout, cin, kt, k, k]` as a 2-D
/// conv with `bias`, uploaded.
fn upload_tap(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    w: &[f32],
    [cout, cin, kt, k]: [usize; 4],
    j: usize,
    bias: Option<&[f32]>,
) -> Result<Conv2dWeights> {
    let tap: Vec<f32> = w
        .chunks(k * k)
        .skip(j)
        .step_by(kt.max(1))
        .flatten()
        .copied()
        .collect();
    let host = PytorchConv {
        weight: &tap,
        cout,
        cin,
        k,
        bias,
    };
    Conv2dWeights::upload(ctx, &host, None, store.dtype(), prefix)
}

/// A conv's weights `w` and bias `b` whose output channels come in
/// diffusers' unpatchify order `(c, q_x, q_y)` (Wan 2.2, LTX-2) reordered
/// to a pixel shuffle's `(c, q_y, q_x)` for patch size `p`, so that
/// [`crate::models::graph::Op::PixelShuffle`] unpacks them.
pub(crate) fn pixel_shuffle_order(w: &[f32], b: &[f32], p: usize) -> (Vec<f32>, Vec<f32>) {
    let co = b.len();
    let row = w.len() / co.max(1);
    let rows: Vec<&[f32]> = w.chunks(row.max(1)).collect();
    let from = |o: usize| {
        let (c, q) = (o / (p * p), o % (p * p));
        c * p * p + (q % p) * p + q / p
    };
    let w = (0..co)
        .flat_map(|o| {
            rows.get(from(o))
                .copied()
                .unwrap_or_default()
                .iter()
                .copied()
        })
        .collect();
    let b = (0..co)
        .map(|o| b.get(from(o)).copied().unwrap_or(0.0))
        .collect();
    (w, b)
}

/// A 1×1(×1) conv `{prefix}` (weights of any rank with trailing 1s).
pub(crate) fn load_pointwise(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    cout: usize,
    cin: usize,
    rank5: bool,
) -> Result<Conv2dWeights> {
    let shape: &[usize] = if rank5 {
        &[cout, cin, 1, 1, 1]
    } else {
        &[cout, cin, 1, 1]
    };
    let w = store.take(&format!("{prefix}.weight"), shape)?;
    let b = store.take(&format!("{prefix}.bias"), &[cout])?;
    let host = PytorchConv {
        weight: &w,
        cout,
        cin,
        k: 1,
        bias: Some(&b),
    };
    Conv2dWeights::upload(ctx, &host, None, store.dtype(), prefix)
}

/// Builds a Wan-family decoder graph layer by layer.
pub(crate) struct GraphBuilder<'a> {
    pub ctx: &'a Context,
    pub store: &'a WeightStore,
    pub b: Builder,
    pub slot: usize,
    /// One frame alone (an image decoder): see [`WanDecoder::load_frame`].
    pub image: bool,
    /// The causal convs are stored as 2-D convs `[cout, cin, k, k]`
    /// (Qwen-Image 2.1's image specialisation), not `[cout, cin, kt, k, k]`.
    pub planar: bool,
}

impl<'a> GraphBuilder<'a> {
    /// An empty graph of weights in `store`, and its input (see the fields
    /// for `image` and `planar`).
    pub(crate) fn new(
        ctx: &'a Context,
        store: &'a WeightStore,
        image: bool,
        planar: bool,
    ) -> (Self, TensorId) {
        let (b, z) = Builder::new();
        let g = GraphBuilder {
            ctx,
            store,
            b,
            slot: 0,
            image,
            planar,
        };
        (g, z)
    }

    pub(crate) fn next_slot(&mut self) -> usize {
        self.slot += 1;
        self.slot - 1
    }

    pub(crate) fn rms(
        &mut self,
        x: TensorId,
        key: &str,
        c: usize,
        image: bool,
        silu: bool,
    ) -> Result<TensorId> {
        let shape: &[usize] = if image { &[c, 1, 1] } else { &[c, 1, 1, 1] };
        let g = self.store.take(key, shape)?;
        let scale = (c as f32).sqrt();
        let g: Vec<f32> = g.iter().map(|v| v * scale).collect();
        let t = Tensor::from_f32(self.ctx, &[c], &g, key)?;
        let id = self.b.rms_gamma(t);
        Ok(self.b.rms_norm(x, id, silu))
    }

    pub(crate) fn causal(
        &mut self,
        x: TensorId,
        prefix: &str,
        dims: [usize; 4],
        residual: Residual,
    ) -> Result<TensorId> {
        if self.image {
            // One frame after two zero frames: only the current frame's tap.
            let [cout, cin, kt, k] = dims;
            let kt = if self.planar { 1 } else { kt };
            let w = self
                .store
                .take(&format!("{prefix}.weight"), &[cout, cin, kt, k, k])?;
            let b = self.store.take(&format!("{prefix}.bias"), &[cout])?;
            let dims = [cout, cin, kt, k];
            let last = kt.saturating_sub(1);
            let w = upload_tap(self.ctx, self.store, prefix, &w, dims, last, Some(&b))?;
            let w = self.b.weights(w);
            let conv = Conv::new(x, w, Geometry::Same).residual(residual);
            return Ok(self.b.conv(conv));
        }
        let w = load_causal(self.ctx, self.store, prefix, dims)?;
        let w = self.b.causal_weights(w);
        let slot = self.next_slot();
        Ok(self.b.causal_conv(x, w, slot, residual))
    }

    /// `conv_in` from `z_dim` latent channels to `width`, then the mid
    /// block: residual block, per-frame attention, residual block.
    pub(crate) fn conv_in_and_mid(
        &mut self,
        x: TensorId,
        z_dim: usize,
        width: usize,
    ) -> Result<TensorId> {
        let x = self.causal(x, "decoder.conv_in", [width, z_dim, 3, 3], Residual::None)?;
        let x = self.resblock(x, "decoder.mid_block.resnets.0", width, width)?;
        let x = self.attention(x, "decoder.mid_block.attentions.0", width)?;
        self.resblock(x, "decoder.mid_block.resnets.1", width, width)
    }

    pub(crate) fn resblock(
        &mut self,
        x: TensorId,
        prefix: &str,
        cin: usize,
        cout: usize,
    ) -> Result<TensorId> {
        let n1 = self.rms(x, &format!("{prefix}.norm1.gamma"), cin, false, true)?;
        let c1 = self.causal(
            n1,
            &format!("{prefix}.conv1"),
            [cout, cin, 3, 3],
            Residual::None,
        )?;
        let n2 = self.rms(c1, &format!("{prefix}.norm2.gamma"), cout, false, true)?;
        let residual = if cin != cout {
            let sc = load_pointwise(
                self.ctx,
                self.store,
                &format!("{prefix}.conv_shortcut"),
                cout,
                cin,
                true,
            )?;
            Residual::Shortcut(x, self.b.weights(sc))
        } else {
            Residual::InPlace(x)
        };
        self.causal(n2, &format!("{prefix}.conv2"), [cout, cout, 3, 3], residual)
    }

    pub(crate) fn attention(&mut self, x: TensorId, prefix: &str, c: usize) -> Result<TensorId> {
        let normed = self.rms(x, &format!("{prefix}.norm.gamma"), c, true, false)?;
        let w = self
            .store
            .take(&format!("{prefix}.to_qkv.weight"), &[3 * c, c, 1, 1])?;
        let bias = self
            .store
            .take(&format!("{prefix}.to_qkv.bias"), &[3 * c])?;
        let mut ids = Vec::new();
        for (i, (w, b)) in w.chunks(c * c).zip(bias.chunks(c)).enumerate() {
            let host = PytorchConv {
                weight: w,
                cout: c,
                cin: c,
                k: 1,
                bias: Some(b),
            };
            let label = format!("{prefix}.to_qkv[{i}]");
            let conv = Conv2dWeights::upload(self.ctx, &host, None, self.store.dtype(), &label)?;
            ids.push(self.b.weights(conv));
        }
        let [q, k, v] = ids[..] else {
            return Err(Error::Internal("to_qkv split".into()));
        };
        let out = load_pointwise(self.ctx, self.store, &format!("{prefix}.proj"), c, c, false)?;
        let out = self.b.weights(out);
        Ok(self.b.frame_attention(Op::FrameAttention {
            x,
            normed,
            q,
            k,
            v,
            out,
            causal: None,
        }))
    }
}
