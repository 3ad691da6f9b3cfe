//! The layers Wan-family VAE decoders share (Wan 2.1, Qwen-Image, the
//! residual Wan 2.2 / Qwen-Image 2.1 decoders): RMS norms, causal convs (or
//! their current-frame taps), residual blocks, per-frame attention, each
//! read from diffusers-named weights into a graph [`Builder`].

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::{Conv2dWeights, PytorchConv};
use crate::models::graph::{Builder, CausalWeights, Conv, Geometry, Op, Residual, TensorId};
use crate::models::weights::WeightStore;
use crate::tensor::Tensor;

/// Loads a causal conv `{prefix}` `[cout, cin, kt, k, k]` as `kt` taps.
pub(crate) fn load_causal(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    [cout, cin, kt, k]: [usize; 4],
) -> Result<CausalWeights> {
    let w = store.take(&format!("{prefix}.weight"), &[cout, cin, kt, k, k])?;
    let b = store.take(&format!("{prefix}.bias"), &[cout])?;
    let taps = (0..kt)
        .map(|j| {
            let tap: Vec<f32> = w
                .chunks(k * k)
                .skip(j)
                .step_by(kt)
                .flatten()
                .copied()
                .collect();
            let host = PytorchConv {
                weight: &tap,
                cout,
                cin,
                k,
                bias: (j + 1 == kt).then_some(b.as_slice()),
            };
            Conv2dWeights::upload(ctx, &host, None, store.dtype(), prefix)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(CausalWeights { taps })
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

impl GraphBuilder<'_> {
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
            let tap: Vec<f32> = w
                .chunks(k * k)
                .skip(kt.saturating_sub(1))
                .step_by(kt.max(1))
                .flatten()
                .copied()
                .collect();
            let host = PytorchConv {
                weight: &tap,
                cout,
                cin,
                k,
                bias: Some(b.as_slice()),
            };
            let w = Conv2dWeights::upload(self.ctx, &host, None, self.store.dtype(), prefix)?;
            let w = self.b.weights(w);
            let conv = Conv::new(x, w, Geometry::Same).residual(residual);
            return Ok(self.b.conv(conv));
        }
        let w = load_causal(self.ctx, self.store, prefix, dims)?;
        let w = self.b.causal_weights(w);
        let slot = self.next_slot();
        Ok(self.b.causal_conv(x, w, slot, residual))
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
        }))
    }
}
