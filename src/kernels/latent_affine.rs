//! `shaders/latent_affine.wgsl`: pipeline latents → decoder input on the GPU
//! (per-channel affine map, optionally un-patchifying 2×2 patches), for
//! latents a host application leaves in a device buffer. The host path does
//! the same on the CPU ([`crate::latents::LatentBatchNorm::to_z`],
//! Qwen-Image's `unnormalize`); this kernel reproduces it exactly.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, KernelSpec, PipelineKey, Recorder};
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/latent_affine.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
/// Uniforms (mirrors `Params` in the shader).
pub struct Params {
    /// Output elements.
    pub n: u32,
    /// Output channels.
    pub c: u32,
    /// Output rows.
    pub h: u32,
    /// Output columns.
    pub w: u32,
    /// Patch side (1 or 2).
    pub r: u32,
    /// Input channels (`c · r²`).
    pub cin: u32,
    /// Padding to 16 bytes.
    pub _pad: [u32; 2],
}

/// The kernel ([`latent_affine`]).
pub const LATENT_AFFINE: KernelSpec = spec::<Params>(
    "latent_affine",
    SOURCE,
    "latent_affine",
    &[Read, Read, ReadWrite],
);

/// How each input channel's values map: `v · a + s` or `v / a + s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affine {
    /// `v · a + s` (FLUX.2's BatchNorm: `a = sqrt(var + eps)`, `s = mean`).
    Multiply,
    /// `v / a + s` (Qwen-Image: `a = 1 / latents_std`, `s = latents_mean`,
    /// divided as the pipeline does).
    Divide,
}

fn key(op: Affine) -> PipelineKey {
    PipelineKey::new(&LATENT_AFFINE)
        .flag_if(op == Affine::Divide, "DIVIDE")
        .constant("WG", format!("{WG}u"))
}

/// `z[b, c, Y, X] = f(x[b, c·r² + (Y % r)·r + X % r, Y / r, X / r])` with
/// `f` per input channel `pc` from `coef` = `[a_0 … a_{C_in−1}, s_0 … s_{C_in−1}]`:
/// x `[N, C·r², h, w]` f32 → z `[N, C, h·r, w·r]` f32.
pub fn latent_affine(
    rec: &mut Recorder,
    op: Affine,
    r: usize,
    x: &Tensor,
    coef: &Tensor,
    z: &Tensor,
) -> Result<()> {
    const OP: &str = "latent_affine";
    let (&[n, cin, h, w], &[zn, c, zh, zw]) = (x.shape(), z.shape()) else {
        return Err(Error::shape(OP, format!("x {x:?} and z {z:?} must be 4-D")));
    };
    if !(r == 1 || r == 2)
        || zn != n
        || c * r * r != cin
        || zh != h * r
        || zw != w * r
        || coef.numel() != 2 * cin
        || [x, coef, z].iter().any(|t| t.dtype() != DType::F32)
        || x.overlaps(z)
    {
        return Err(Error::shape(
            OP,
            format!("x {x:?} → z {z:?} with {r}×{r} patches and coefficients {coef:?}"),
        ));
    }
    let u = |v: usize| {
        u32::try_from(v).map_err(|_| Error::shape(OP, format!("{v} exceeds u32 indexing")))
    };
    let params = Params {
        n: u(z.numel())?,
        c: u(c)?,
        h: u(zh)?,
        w: u(zw)?,
        r: u(r)?,
        cin: u(cin)?,
        _pad: [0; 2],
    };
    let groups = linear_groups(rec.ctx(), (z.numel() as u64).div_ceil(WG as u64))?;
    rec.dispatch(&LATENT_AFFINE, &key(op), &params, &[x, coef, z], groups, 0)
}

/// CPU reference of [`latent_affine`] (x `[n, c·r², h, w]` → `[n, c, h·r, w·r]`).
#[allow(clippy::indexing_slicing)]
pub fn cpu_latent_affine(
    op: Affine,
    r: usize,
    [n, cin, h, w]: [usize; 4],
    x: &[f32],
    a: &[f32],
    s: &[f32],
) -> Vec<f32> {
    let c = cin / (r * r);
    let (zh, zw) = (h * r, w * r);
    let mut z = vec![0.0; n * c * zh * zw];
    for b in 0..n {
        for pc in 0..cin {
            let (ch, dy, dx) = (pc / (r * r), (pc / r) % r, pc % r);
            for y in 0..h {
                for xx in 0..w {
                    let v = x[((b * cin + pc) * h + y) * w + xx];
                    let v = match op {
                        Affine::Multiply => v * a[pc] + s[pc],
                        Affine::Divide => v / a[pc] + s[pc],
                    };
                    z[((b * c + ch) * zh + y * r + dy) * zw + xx * r + dx] = v;
                }
            }
        }
    }
    z
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    vec![
        (LATENT_AFFINE, key(Affine::Multiply)),
        (LATENT_AFFINE, key(Affine::Divide)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{rand_vec, test_context};

    /// Both maps, with and without the 2×2 un-patchify, on odd shapes: bit
    /// for bit what the CPU computes (one multiply-add or divide-add per
    /// value; a fused multiply-add may differ by an ulp, so 1e-6 relative).
    #[test]
    fn latent_affine_matches_cpu_on_odd_shapes() {
        let ctx = test_context();
        for (op, r, shape) in [
            (Affine::Multiply, 2, [2usize, 12, 5, 7]),
            (Affine::Multiply, 1, [1, 3, 9, 1]),
            (Affine::Divide, 1, [3, 16, 3, 5]),
            (Affine::Divide, 2, [1, 4, 1, 1]),
        ] {
            let [n, cin, h, w] = shape;
            let x = rand_vec(n * cin * h * w, 7, 3.0);
            let a: Vec<f32> = rand_vec(cin, 8, 1.0)
                .iter()
                .map(|v| 0.5 + v.abs())
                .collect();
            let s = rand_vec(cin, 9, 2.0);
            let want = cpu_latent_affine(op, r, shape, &x, &a, &s);
            let xt = Tensor::from_f32(&ctx, &shape, &x, "x").unwrap();
            let coef = Tensor::from_f32(&ctx, &[2 * cin], &[a, s].concat(), "coef").unwrap();
            let z =
                Tensor::empty(&ctx, &[n, cin / (r * r), h * r, w * r], DType::F32, "z").unwrap();
            let mut rec = Recorder::new(&ctx);
            latent_affine(&mut rec, op, r, &xt, &coef, &z).unwrap();
            rec.submit().unwrap();
            let got = z.to_f32(&ctx).unwrap();
            crate::testing::assert_close(
                &got,
                &want,
                0.0,
                1e-6,
                &format!("{op:?} r={r} {shape:?}"),
            );
        }
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let ctx = test_context();
        let x = Tensor::empty(&ctx, &[1, 8, 2, 2], DType::F32, "x").unwrap();
        let coef = Tensor::empty(&ctx, &[16], DType::F32, "coef").unwrap();
        let bad = Tensor::empty(&ctx, &[1, 2, 2, 2], DType::F32, "z").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(latent_affine(&mut rec, Affine::Multiply, 2, &x, &coef, &bad).is_err());
        let z = Tensor::empty(&ctx, &[1, 2, 4, 4], DType::F32, "z").unwrap();
        assert!(latent_affine(&mut rec, Affine::Multiply, 3, &x, &coef, &z).is_err());
        assert!(latent_affine(&mut rec, Affine::Multiply, 2, &x, &coef, &z).is_ok());
    }
}
