//! `shaders/tokens.wgsl`: the token ops of transformer decoders (MiniMax-H3's
//! ViT decoder) on channel-major tokens `[1, C, rows, w]` (token `l` is
//! element `l` of each channel's plane, a latent grid's `T·h·w` tokens
//! first): frames to tokens and back, register tokens, RoPE, SwiGLU, and the
//! cross-fade between the clips of a chunked video decode.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, KernelSpec, PipelineKey, Recorder, StorageType};
use crate::kernels::elementwise::storage_of;
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/tokens.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 256;

/// Uniforms of every entry (mirrors `Params` in the shader).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, Default)]
pub struct Params {
    total: u32,
    c: u32,
    t: u32,
    h: u32,
    w: u32,
    plane: u32,
    first: u32,
    extra: u32,
    half: u32,
    nf: u32,
    fade: u32,
    frame: u32,
    oh: u32,
    ow: u32,
    ch: u32,
    cw: u32,
    y0: u32,
    x0: u32,
    eh: u32,
    ew: u32,
}

const TOKENS: KernelSpec = spec::<Params>("tokens", SOURCE, "tokens", &[Read, ReadWrite]);
const UNPATCHIFY: KernelSpec = spec::<Params>("tokens", SOURCE, "unpatchify", &[Read, ReadWrite]);
const SET_TOKENS: KernelSpec = spec::<Params>("tokens", SOURCE, "set_tokens", &[ReadWrite, Read]);
const ROPE: KernelSpec = spec::<Params>("tokens", SOURCE, "rope", &[ReadWrite, Read]);
const GLU: KernelSpec = spec::<Params>("tokens", SOURCE, "glu", &[Read, ReadWrite]);
const CROSSFADE: KernelSpec =
    spec::<Params>("tokens", SOURCE, "crossfade", &[Read, Read, ReadWrite]);

const STITCH: KernelSpec =
    spec::<Params>("tokens", SOURCE, "stitch", &[Read, Read, Read, ReadWrite]);

const OP: &str = "tokens";

fn u(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(OP, format!("{v} exceeds u32")))
}

fn key(
    spec: &KernelSpec,
    flag: &'static str,
    storage: &[(&'static str, StorageType)],
) -> PipelineKey {
    let mut k = PipelineKey::new(spec)
        .flag(flag)
        .constant("WG", format!("{WG}u"));
    for &(name, ty) in storage {
        k = k.storage(name, ty);
    }
    k
}

fn run(
    rec: &mut Recorder,
    (spec, key): (&KernelSpec, PipelineKey),
    params: Params,
    tensors: &[&Tensor],
) -> Result<()> {
    if params.total == 0 {
        return Ok(());
    }
    let groups = linear_groups(rec.ctx(), u64::from(params.total).div_ceil(u64::from(WG)))?;
    rec.dispatch(spec, &key, &params, tensors, groups, 0)
}

fn dims4(op: &str, t: &Tensor) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::shape(op, format!("{t:?} is not 4-D")))
}

/// Tokens per channel of `[1, C, rows, w]` tokens.
fn plane_of(t: &Tensor) -> Result<(usize, usize)> {
    match dims4(OP, t)? {
        [1, c, rows, w] => Ok((c, rows * w)),
        _ => Err(Error::shape(
            OP,
            format!("tokens {t:?} are not [1, C, rows, w]"),
        )),
    }
}

/// Frames `[T, C, h, w]` to tokens `[1, C, rows, w']` (`back`: the
/// reverse); tokens past `T·h·w` are zeroed going to tokens.
pub fn tokens(rec: &mut Recorder, x: &Tensor, out: &Tensor, back: bool) -> Result<()> {
    let (frames, toks) = if back { (out, x) } else { (x, out) };
    let [t, c, h, w] = dims4(OP, frames)?;
    let (tc, plane) = plane_of(toks)?;
    if tc != c || plane < t * h * w || x.dtype() != out.dtype() || x.overlaps(out) {
        return Err(Error::shape(
            OP,
            format!("frames {frames:?} and tokens {toks:?}: the same channels and dtype, room for every frame token, not aliased"),
        ));
    }
    let st = storage_of(rec, &[("x", x), ("out", out)])?;
    let mut k = key(&TOKENS, "TOKENS", &st);
    if back {
        k = k.flag("BACK");
    }
    let params = Params {
        total: u(out.numel())?,
        c: u(c)?,
        t: u(t)?,
        h: u(h)?,
        w: u(w)?,
        plane: u(plane)?,
        ..Params::default()
    };
    u(x.numel())?;
    run(rec, (&TOKENS, k), params, &[x, out])
}

/// The frame tokens of `grid` in `x` `[1, C·ft·f², rows, w']` (each
/// token's channels in `(c, dt, dy, dx)` order) unpacked into `out`
/// `[T·ft, C, h·f, w·f]` in one pass.
pub fn unpatchify(
    rec: &mut Recorder,
    x: &Tensor,
    grid: Grid,
    (ft, f): (usize, usize),
    out: &Tensor,
) -> Result<()> {
    let (cin, plane) = plane_of(x)?;
    let (t, h, w) = grid;
    let [of, c, oh, ow] = dims4(OP, out)?;
    if [of, oh, ow] != [t * ft, h * f, w * f]
        || cin != c * ft * f * f
        || plane < t * h * w
        || x.dtype() != out.dtype()
        || x.overlaps(out)
    {
        return Err(Error::shape(
            OP,
            format!("unpatchify of {x:?} over a {grid:?} grid by ({ft}, {f}) into {out:?}"),
        ));
    }
    let st = storage_of(rec, &[("x", x), ("out", out)])?;
    let params = Params {
        total: u(out.numel() / f.max(1))?,
        c: u(c)?,
        h: u(h)?,
        w: u(w)?,
        plane: u(plane)?,
        half: u(ft)?,
        nf: u(f)?,
        ..Params::default()
    };
    u(x.numel())?;
    run(
        rec,
        (&UNPATCHIFY, key(&UNPATCHIFY, "UNPATCHIFY", &st)),
        params,
        &[x, out],
    )
}

/// Tokens `first..` of `x` `[1, C, rows, w]` set in place: the register
/// tokens `reg` (f32 `[R, C]`) first, zeros after.
pub fn set_tokens(rec: &mut Recorder, x: &Tensor, first: usize, reg: &Tensor) -> Result<()> {
    let (c, plane) = plane_of(x)?;
    let r = reg.numel() / c.max(1);
    if reg.dtype() != DType::F32 || reg.numel() != r * c || first + r > plane {
        return Err(Error::shape(
            OP,
            format!("register tokens {reg:?} (f32 [R, {c}]) at token {first} of {x:?}"),
        ));
    }
    let st = storage_of(rec, &[("x", x)])?;
    let params = Params {
        total: u(c * (plane - first))?,
        c: u(c)?,
        plane: u(plane)?,
        first: u(first)?,
        extra: u(r)?,
        ..Params::default()
    };
    run(
        rec,
        (&SET_TOKENS, key(&SET_TOKENS, "SET_TOKENS", &st)),
        params,
        &[x, reg],
    )
}

/// The grid of a token sequence's frame tokens: frames, rows, columns.
pub type Grid = (usize, usize, usize);

/// MiniMax-H3's 3-axis rotary table for `grid`: per axis coordinate
/// (`T + h + w` of them) and frequency `f < nf`, `(cos, sin)` of
/// `2π · pos · inv_freq[f]`, `pos = 2 (i + ½) / size − 1`, `inv_freq[f] =
/// theta^(−2·3 f / rot)`, each step rounded to f32 as PyTorch computes it.
pub fn rope_table((t, h, w): Grid, nf: usize, theta: f32) -> Vec<f32> {
    let step = 1.0 / nf as f32;
    let inv: Vec<f32> = (0..nf).map(|f| 1.0 / theta.powf(f as f32 * step)).collect();
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let mut out = Vec::with_capacity((t + h + w) * nf * 2);
    for size in [t, h, w] {
        for i in 0..size {
            let pos = 2.0 * ((i as f32 + 0.5) / size as f32) - 1.0;
            for &fr in &inv {
                let a = (two_pi * pos) * fr;
                out.push((a as f64).cos() as f32);
                out.push((a as f64).sin() as f32);
            }
        }
    }
    out
}

/// Rotary embedding in place on f32 `x` `[heads, d, rows, w]` (q or k):
/// the first `2·half` channels of each head, pairs `(j, j + half)`, for the
/// frame tokens of `grid`, from `table` ([`rope_table`], `nf = half / 3`).
pub fn rope(rec: &mut Recorder, x: &Tensor, table: &Tensor, grid: Grid, half: usize) -> Result<()> {
    let [heads, d, rows, w] = dims4(OP, x)?;
    let plane = rows * w;
    let (t, gh, gw) = grid;
    let nf = half / 3;
    if x.dtype() != DType::F32
        || table.dtype() != DType::F32
        || half == 0
        || !half.is_multiple_of(3)
        || 2 * half > d
        || t * gh * gw > plane
        || table.numel() != (t + gh + gw) * nf * 2
    {
        return Err(Error::shape(
            OP,
            format!("rope of {half} pairs on f32 {x:?} over a {grid:?} grid, table {table:?}"),
        ));
    }
    let params = Params {
        total: u(heads * t * gh * gw * half)?,
        c: u(d)?,
        t: u(t)?,
        h: u(gh)?,
        w: u(gw)?,
        plane: u(plane)?,
        half: u(half)?,
        nf: u(nf)?,
        ..Params::default()
    };
    u(x.numel())?;
    run(rec, (&ROPE, key(&ROPE, "ROPE", &[])), params, &[x, table])
}

/// SwiGLU: `out[c] = x[c] · silu(x[C + c])` of `x` `[1, 2C, rows, w]` into
/// `out` `[1, C, rows, w]`.
pub fn glu(rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
    let (c2, plane) = plane_of(x)?;
    let (c, oplane) = plane_of(out)?;
    if c2 != 2 * c || plane != oplane || x.overlaps(out) {
        return Err(Error::shape(OP, format!("glu of {x:?} into {out:?}")));
    }
    let st = storage_of(rec, &[("x", x), ("out", out)])?;
    let params = Params {
        total: u(out.numel())?,
        c: u(c)?,
        plane: u(plane)?,
        ..Params::default()
    };
    u(x.numel())?;
    run(rec, (&GLU, key(&GLU, "GLU", &st)), params, &[x, out])
}

/// Frames `src0 .. src0 + n` of `x` `[F, …]` into `out` from frame `dst0`,
/// the first `fade` of them blended with `prev`'s frames (`prev · (1 −
/// j/fade) + x · j/fade`, diffusers' `_blend` over time) when given.
pub fn crossfade(
    rec: &mut Recorder,
    x: &Tensor,
    (src0, n): (usize, usize),
    out: &Tensor,
    dst0: usize,
    prev: Option<(&Tensor, usize)>,
) -> Result<()> {
    let [xf, xc, xh, xw] = dims4(OP, x)?;
    let [of, oc, oh, ow] = dims4(OP, out)?;
    let frame = xc * xh * xw;
    let fade = prev.map_or(0, |p| p.1.min(n));
    let prev_ok = prev.is_none_or(|(p, _)| {
        p.dtype() == x.dtype() && p.numel() >= fade * frame && !p.overlaps(out)
    });
    if [xc, xh, xw] != [oc, oh, ow]
        || src0 + n > xf
        || dst0 + n > of
        || x.dtype() != out.dtype()
        || x.overlaps(out)
        || !prev_ok
    {
        return Err(Error::shape(
            OP,
            format!(
                "crossfade of frames {src0}..{} of {x:?} into {out:?} at {dst0}",
                src0 + n
            ),
        ));
    }
    let p = prev.map_or(x, |p| p.0);
    let st = storage_of(rec, &[("x", x), ("prev", p), ("out", out)])?;
    let mut k = key(&CROSSFADE, "CROSSFADE", &st);
    if prev.is_some() {
        k = k.flag("PREV");
    }
    let params = Params {
        total: u(n * frame)?,
        first: u(src0)?,
        extra: u(dst0)?,
        fade: u(fade.max(1))?,
        frame: u(frame)?,
        ..Params::default()
    };
    u(x.numel())?;
    u(out.numel())?;
    run(rec, (&CROSSFADE, k), params, &[x, p, out])
}

/// A tile's place in a stitched frame: where it goes and how much of it,
/// and how many of its first rows / columns blend with the tile above /
/// to the left (`(neighbour, extent)`).
pub struct Stitch<'a> {
    /// Output row and column of the tile's corner.
    pub at: (usize, usize),
    /// Rows and columns written (the tile cropped).
    pub crop: (usize, usize),
    /// The tile above and the rows blended with its last ones.
    pub above: Option<(&'a Tensor, usize)>,
    /// The tile to the left and the columns blended with its last ones.
    pub left: Option<(&'a Tensor, usize)>,
}

/// One tile `x` `[F, C, th, tw]` of a tiled decode into `out` `[F, C, H,
/// W]`, blended with its neighbours as decoded (diffusers' MiniMax-H3
/// `_stitch_tiles`: vertical blend first, then horizontal).
pub fn stitch(rec: &mut Recorder, x: &Tensor, s: &Stitch, out: &Tensor) -> Result<()> {
    let [f, c, th, tw] = dims4(OP, x)?;
    let [of, oc, oh, ow] = dims4(OP, out)?;
    let (y0, x0) = s.at;
    let (ch, cw) = s.crop;
    let (eh, ew) = (s.above.map_or(0, |a| a.1), s.left.map_or(0, |l| l.1));
    let same = |t: Option<(&Tensor, usize)>| {
        t.is_none_or(|(t, _)| t.shape() == x.shape() && t.dtype() == x.dtype() && !t.overlaps(out))
    };
    if [f, c] != [of, oc]
        || ch > th
        || cw > tw
        || y0 + ch > oh
        || x0 + cw > ow
        || eh > th
        || ew > tw
        || x.dtype() != out.dtype()
        || x.overlaps(out)
        || !same(s.above)
        || !same(s.left)
    {
        return Err(Error::shape(
            OP,
            format!(
                "stitch of tile {x:?} at {:?} cropped to {:?} into {out:?}, blends {eh}/{ew}",
                s.at, s.crop
            ),
        ));
    }
    let above = s.above.map_or(x, |a| a.0);
    let left = s.left.map_or(x, |l| l.0);
    let st = storage_of(
        rec,
        &[("x", x), ("above", above), ("left", left), ("out", out)],
    )?;
    let params = Params {
        total: u(f * c * ch * cw)?,
        h: u(th)?,
        w: u(tw)?,
        y0: u(y0)?,
        x0: u(x0)?,
        eh: u(eh)?,
        ew: u(ew)?,
        oh: u(oh)?,
        ow: u(ow)?,
        ch: u(ch)?,
        cw: u(cw)?,
        ..Params::default()
    };
    u(out.numel())?;
    run(
        rec,
        (&STITCH, key(&STITCH, "STITCH", &st)),
        params,
        &[x, above, left, out],
    )
}

/// CPU reference of [`tokens`] to tokens: `[t, c, hw]` → `[c, plane]`.
#[cfg(test)]
pub fn cpu_to_tokens(x: &[f32], (t, c, hw): (usize, usize, usize), plane: usize) -> Vec<f32> {
    let mut out = vec![0.0; c * plane];
    for ti in 0..t {
        for ch in 0..c {
            for r in 0..hw {
                out[ch * plane + ti * hw + r] = x[(ti * c + ch) * hw + r];
            }
        }
    }
    out
}

/// CPU reference of [`rope`] on `[heads, d, plane]`, written as diffusers
/// writes it: `cat(x_rot · cos + cat(−second, first) · sin, x_pass)` per
/// token, the angle of channel `j` that of axis `(j mod half) / nf`.
#[cfg(test)]
pub fn cpu_rope(
    x: &[f32],
    (heads, d, plane): (usize, usize, usize),
    grid: Grid,
    half: usize,
    theta: f32,
) -> Vec<f32> {
    let nf = half / 3;
    let table = rope_table(grid, nf, theta);
    let (t, h, w) = grid;
    let mut out = x.to_vec();
    for b in 0..heads {
        for l in 0..t * h * w {
            let coords = [l / (h * w), (l / w) % h, l % w];
            let offs = [0, t, t + h];
            let at = |ch: usize| (b * d + ch) * plane + l;
            let rot: Vec<f32> = (0..2 * half)
                .map(|ch| {
                    let j = ch % half;
                    let (axis, f) = (j / nf, j % nf);
                    let i = ((offs[axis] + coords[axis]) * nf + f) * 2;
                    let (cos, sin) = (table[i], table[i + 1]);
                    let rotated = if ch < half {
                        -x[at(ch + half)]
                    } else {
                        x[at(ch - half)]
                    };
                    x[at(ch)] * cos + rotated * sin
                })
                .collect();
            for (ch, v) in rot.into_iter().enumerate() {
                out[at(ch)] = v;
            }
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = vec![(ROPE, key(&ROPE, "ROPE", &[]))];
    for t in StorageType::ALL {
        for back in [false, true] {
            let k = key(&TOKENS, "TOKENS", &[("x", t), ("out", t)]);
            v.push((TOKENS, if back { k.flag("BACK") } else { k }));
        }
        v.push((SET_TOKENS, key(&SET_TOKENS, "SET_TOKENS", &[("x", t)])));
        let two = [("x", t), ("out", t)];
        v.push((UNPATCHIFY, key(&UNPATCHIFY, "UNPATCHIFY", &two)));
        v.push((GLU, key(&GLU, "GLU", &[("x", t), ("out", t)])));
        for prev in [false, true] {
            let k = key(
                &CROSSFADE,
                "CROSSFADE",
                &[("x", t), ("prev", t), ("out", t)],
            );
            v.push((CROSSFADE, if prev { k.flag("PREV") } else { k }));
        }
        let four = [("x", t), ("above", t), ("left", t), ("out", t)];
        v.push((STITCH, key(&STITCH, "STITCH", &four)));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    /// Frames → tokens → frames on odd shapes, every storage type; tokens
    /// past the grid are zero.
    #[test]
    fn tokens_round_trip_matches_cpu() {
        let (t, c, h, w) = (3, 5, 3, 7);
        let (rows, rw) = (t * h + 2, w);
        let plane = rows * rw;
        let data: Vec<f32> = rand_vec(t * c * h * w, 3, 2.0)
            .iter()
            .map(|v| (v * 64.0).round() / 64.0)
            .collect();
        for (ctx, dtype) in crate::testing::dtype_contexts() {
            let x = Tensor::from_f32_as(&ctx, &[t, c, h, w], &data, dtype, "x").unwrap();
            let tok = Tensor::empty(&ctx, &[1, c, rows, rw], dtype, "tok").unwrap();
            let back = Tensor::empty(&ctx, &[t, c, h, w], dtype, "back").unwrap();
            let mut rec = Recorder::new(&ctx);
            tokens(&mut rec, &x, &tok, false).unwrap();
            tokens(&mut rec, &tok, &back, true).unwrap();
            rec.submit().unwrap();
            let want = cpu_to_tokens(&data, (t, c, h * w), plane);
            assert_close(&tok.to_f32(&ctx).unwrap(), &want, 0.0, 0.0, "to tokens");
            assert_close(&back.to_f32(&ctx).unwrap(), &data, 0.0, 0.0, "from tokens");
        }
        // Too few tokens for the grid is refused.
        let ctx = test_context();
        let x = Tensor::empty(&ctx, &[t, c, h, w], DType::F32, "x").unwrap();
        let small = Tensor::empty(&ctx, &[1, c, t * h - 1, w], DType::F32, "s").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(tokens(&mut rec, &x, &small, false).is_err());
    }

    /// Tokens back to frames by (ft, f) against the view / permute diffusers
    /// writes (`[T, h, w, C, ft, f, f]` → `[T, ft, C, h, f, w, f]`), odd sizes.
    #[test]
    fn unpatchify_matches_diffusers_permute() {
        let ctx = test_context();
        let (t, h, w, c, ft, f) = (2, 3, 5, 3, 2, 4);
        let (rows, rw) = (t * h + 1, w);
        let plane = rows * rw;
        let fc = c * ft * f * f;
        let data = rand_vec(fc * plane, 13, 1.0);
        let x = Tensor::from_f32(&ctx, &[1, fc, rows, rw], &data, "tok").unwrap();
        let out = Tensor::empty(&ctx, &[t * ft, c, h * f, w * f], DType::F32, "o").unwrap();
        let mut rec = Recorder::new(&ctx);
        unpatchify(&mut rec, &x, (t, h, w), (ft, f), &out).unwrap();
        rec.submit().unwrap();
        let mut want = vec![0.0; out.numel()];
        for ti in 0..t {
            for y in 0..h {
                for xx in 0..w {
                    let l = (ti * h + y) * w + xx;
                    for ci in 0..c {
                        for dt in 0..ft {
                            for dy in 0..f {
                                for dx in 0..f {
                                    let ch = ((ci * ft + dt) * f + dy) * f + dx;
                                    let o =
                                        (((ti * ft + dt) * c + ci) * h * f + y * f + dy) * w * f
                                            + xx * f
                                            + dx;
                                    want[o] = data[ch * plane + l];
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_close(&out.to_f32(&ctx).unwrap(), &want, 0.0, 0.0, "unpatchify");
    }

    #[test]
    fn set_tokens_writes_registers_then_zeros() {
        let ctx = test_context();
        let (c, rows, w, first, r) = (6, 4, 5, 13, 4);
        let plane = rows * w;
        let base = rand_vec(c * plane, 1, 1.0);
        let reg = rand_vec(r * c, 2, 1.0);
        let x = Tensor::from_f32(&ctx, &[1, c, rows, w], &base, "x").unwrap();
        let rt = Tensor::from_f32(&ctx, &[r, c], &reg, "reg").unwrap();
        let mut rec = Recorder::new(&ctx);
        set_tokens(&mut rec, &x, first, &rt).unwrap();
        rec.submit().unwrap();
        let mut want = base.clone();
        for ch in 0..c {
            for l in first..plane {
                let k = l - first;
                want[ch * plane + l] = if k < r { reg[k * c + ch] } else { 0.0 };
            }
        }
        assert_close(&x.to_f32(&ctx).unwrap(), &want, 0.0, 0.0, "set_tokens");
        let mut rec = Recorder::new(&ctx);
        assert!(set_tokens(&mut rec, &x, plane - 2, &rt).is_err());
    }

    /// RoPE against diffusers' formulation, an odd grid, padding tokens and
    /// pass-through channels untouched.
    #[test]
    fn rope_matches_cpu() {
        let ctx = test_context();
        let (heads, d, half) = (3, 20, 6);
        let grid = (3, 2, 5);
        let (rows, w) = (7, 5);
        let plane = rows * w;
        let data = rand_vec(heads * d * plane, 9, 2.0);
        let x = Tensor::from_f32(&ctx, &[heads, d, rows, w], &data, "q").unwrap();
        let tab = rope_table(grid, half / 3, 100.0);
        let table = Tensor::from_f32(&ctx, &[tab.len()], &tab, "rope").unwrap();
        let mut rec = Recorder::new(&ctx);
        rope(&mut rec, &x, &table, grid, half).unwrap();
        rec.submit().unwrap();
        let want = cpu_rope(&data, (heads, d, plane), grid, half, 100.0);
        assert_close(&x.to_f32(&ctx).unwrap(), &want, 1e-6, 1e-6, "rope");
        let mut rec = Recorder::new(&ctx);
        assert!(rope(&mut rec, &x, &table, grid, 4).is_err());
    }

    #[test]
    fn glu_matches_cpu() {
        let ctx = test_context();
        let (c, rows, w) = (7, 3, 5);
        let plane = rows * w;
        let data = rand_vec(2 * c * plane, 4, 3.0);
        let x = Tensor::from_f32(&ctx, &[1, 2 * c, rows, w], &data, "x").unwrap();
        let out = Tensor::empty(&ctx, &[1, c, rows, w], DType::F32, "o").unwrap();
        let mut rec = Recorder::new(&ctx);
        glu(&mut rec, &x, &out).unwrap();
        rec.submit().unwrap();
        let want: Vec<f32> = (0..c * plane)
            .map(|i| {
                let g = data[i + c * plane];
                data[i] * (g / (1.0 + (-g).exp()))
            })
            .collect();
        assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-6, 1e-6, "glu");
    }

    /// Two rows of two tiles stitched as diffusers' `_stitch_tiles` does
    /// (vertical blend with the tile above, then horizontal with the left
    /// one, both as decoded), cropped by the overlaps.
    #[test]
    fn stitch_matches_diffusers_order() {
        let ctx = test_context();
        let (f, c, th, tw) = (2, 3, 6, 5);
        let (ov_h, ov_w) = (3, 2);
        let (oh, ow) = (2 * th - ov_h, 2 * tw - ov_w);
        let tiles: Vec<Vec<f32>> = (0..4)
            .map(|i| rand_vec(f * c * th * tw, 20 + i, 1.0))
            .collect();
        let gpu: Vec<Tensor> = tiles
            .iter()
            .map(|d| Tensor::from_f32(&ctx, &[f, c, th, tw], d, "tile").unwrap())
            .collect();
        let out = Tensor::empty(&ctx, &[f, c, oh, ow], DType::F32, "out").unwrap();
        let crop = |i: usize, j: usize| {
            (
                if i == 0 { th - ov_h } else { th },
                if j == 0 { tw - ov_w } else { tw },
            )
        };
        let mut rec = Recorder::new(&ctx);
        for i in 0..2 {
            for j in 0..2 {
                let s = Stitch {
                    at: (i * (th - ov_h), j * (tw - ov_w)),
                    crop: crop(i, j),
                    above: (i > 0).then(|| (&gpu[j], ov_h)),
                    left: (j > 0).then(|| (&gpu[2 * i], ov_w)),
                };
                stitch(&mut rec, &gpu[2 * i + j], &s, &out).unwrap();
            }
        }
        rec.submit().unwrap();
        // The reference, element by element as `_blend` / `_stitch_tiles` compute it.
        let at = |t: &[f32], p: usize, y: usize, x: usize| t[(p * th + y) * tw + x];
        let mut want = vec![0.0; f * c * oh * ow];
        for i in 0..2 {
            for j in 0..2 {
                let t = &tiles[2 * i + j];
                let (ch, cw) = crop(i, j);
                for p in 0..f * c {
                    for y in 0..ch {
                        for x in 0..cw {
                            let mut v = at(t, p, y, x);
                            if i > 0 && y < ov_h {
                                let wb = y as f32 / ov_h as f32;
                                v = at(&tiles[j], p, th - ov_h + y, x) * (1.0 - wb) + v * wb;
                            }
                            if j > 0 && x < ov_w {
                                let wb = x as f32 / ov_w as f32;
                                v = at(&tiles[2 * i], p, y, tw - ov_w + x) * (1.0 - wb) + v * wb;
                            }
                            let (oy, ox) = (i * (th - ov_h) + y, j * (tw - ov_w) + x);
                            want[(p * oh + oy) * ow + ox] = v;
                        }
                    }
                }
            }
        }
        assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-6, 1e-6, "stitch");
    }

    #[test]
    fn crossfade_matches_cpu() {
        let ctx = test_context();
        let (f, c, h, w) = (9, 3, 2, 5);
        let frame = c * h * w;
        let xs = rand_vec(f * frame, 5, 1.0);
        let ps = rand_vec(4 * frame, 6, 1.0);
        let x = Tensor::from_f32(&ctx, &[f, c, h, w], &xs, "x").unwrap();
        let prev = Tensor::from_f32(&ctx, &[4, c, h, w], &ps, "p").unwrap();
        let out = Tensor::empty(&ctx, &[8, c, h, w], DType::F32, "o").unwrap();
        let mut rec = Recorder::new(&ctx);
        crossfade(&mut rec, &x, (3, 5), &out, 1, Some((&prev, 4))).unwrap();
        crossfade(&mut rec, &x, (0, 1), &out, 0, None).unwrap();
        crossfade(&mut rec, &x, (7, 2), &out, 6, None).unwrap();
        rec.submit().unwrap();
        let mut want = vec![0.0; 8 * frame];
        want[..frame].copy_from_slice(&xs[..frame]);
        for j in 0..5 {
            for e in 0..frame {
                let v = xs[(3 + j) * frame + e];
                want[(1 + j) * frame + e] = if j < 4 {
                    let wb = j as f32 / 4.0;
                    ps[j * frame + e] * (1.0 - wb) + v * wb
                } else {
                    v
                };
            }
        }
        want[6 * frame..].copy_from_slice(&xs[7 * frame..9 * frame]);
        assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-6, 1e-6, "crossfade");
        let mut rec = Recorder::new(&ctx);
        assert!(crossfade(&mut rec, &x, (5, 5), &out, 0, None).is_err());
    }
}
