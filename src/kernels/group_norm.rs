//! `shaders/group_norm.wgsl`: GroupNorm with PyTorch semantics (biased
//! variance, `eps` inside the square root), split into a statistics pass and
//! an apply pass so the statistics can be gathered across tiles.
//!
//! Statistics are f32 and numerically stable: each workgroup reduces one
//! chunk of [`CHUNK`] elements of a group to a partial `(count, mean, M2)`
//! (exact two-pass over batches of registers, then Chan's parallel
//! combination across batches and invocations), and a second pass merges a
//! group's partials with Chan's formula. Large images therefore use many
//! workgroups: `[1, 128, 512, 512]` with 32 groups is 2048 chunk workgroups
//! of 256 invocations, not 32. (Large chunks because software adapters pay
//! heavily per workgroup; GPUs still get thousands of workgroups on big images.)
//!
//! # Scratch layout (partials)
//! The scratch is f32 `[N, G, S, 4]`: for batch `n`, group `g` and slot `s`,
//! `scratch[((n * G + g) * S + s) * 4 ..][..4] = (count, mean, M2, 0)` of a
//! disjoint subset of that group's elements (`count` is an exact integer,
//! at most [`CHUNK`]). A full-tensor statistics pass fills all
//! `S = partial_slots(c, h, w, groups)` slots. Tiled decoding gives every
//! tile its own slot range: with `S = Σ partial_slots(c, tile_h, tile_w, groups)`
//! over the tiles, tile `t` calls [`group_norm_partials`] on its own (core,
//! halo-free) region with `slot_offset = Σ_{u<t} partial_slots(..tile u..)`,
//! and one [`group_norm_combine`] over all `S` slots then yields exactly the
//! full image's statistics (up to f32 rounding of the merge order).

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, DrySignature, KernelSpec, PipelineKey, Recorder, StorageType};
use crate::kernels::spec;
use crate::kernels::Activation;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/group_norm.wgsl");
/// Invocations per workgroup (a power of two: the reduction is a tree).
pub const WG: u32 = 256;
/// Values per invocation in the statistics pass.
pub const ITEMS: u32 = 64;
/// Values per register batch (two-pass exact) inside the statistics pass.
pub const SUB: u32 = 8;
/// Elements of a group one statistics workgroup reduces (one scratch slot).
pub const CHUNK: usize = (WG * ITEMS) as usize;
/// Values per invocation in the apply pass.
pub const APPLY_ITEMS: u32 = 16;

/// Uniform block shared by the three entry points (16 words).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    /// Groups over the batch (`N · groups`).
    pub groups_total: u32,
    /// Groups per sample.
    pub groups: u32,
    /// Channels.
    pub channels: u32,
    /// Channels per group.
    pub cpg: u32,
    /// Elements per channel plane (`H · W`).
    pub plane: u32,
    /// Plane width.
    pub width: u32,
    /// First row of the region the statistics cover.
    pub y0: u32,
    /// First column of that region.
    pub x0: u32,
    /// Rows of that region.
    pub rh: u32,
    /// Columns of that region.
    pub rw: u32,
    /// Elements of one (sample, group) this dispatch covers.
    pub group_len: u32,
    /// Partial-sum slots per (sample, group) this dispatch writes.
    pub slots: u32,
    /// First slot this pass writes (tiles accumulate into one buffer).
    pub slot_offset: u32,
    /// Slots per group in the partials buffer.
    pub slot_capacity: u32,
    /// Variance epsilon.
    pub eps: f32,
    /// Channel planes (`N · C`).
    pub planes: u32,
}

/// Pass 1: partial sums per group and slot.
pub const PARTIALS: KernelSpec =
    spec::<Params>("group_norm", SOURCE, "partials", &[Read, ReadWrite]);

/// Pass 2: combines partials into per-(sample, channel) scale and shift.
pub const COMBINE: KernelSpec = spec::<Params>(
    "group_norm",
    SOURCE,
    "combine",
    &[Read, Read, Read, ReadWrite],
);

/// Between passes 1 and 2: merges a row's partials into its first slot.
pub const FOLD: KernelSpec = spec::<Params>("group_norm", SOURCE, "fold", &[ReadWrite]);

/// Pass 3: applies scale, shift and the activation.
pub const APPLY: KernelSpec =
    spec::<Params>("group_norm", SOURCE, "apply", &[Read, Read, ReadWrite]);

/// The part of each `H x W` plane a statistics pass covers (a tile's own
/// pixels, excluding the halo it shares with neighbours).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatsRegion {
    /// First row.
    pub y0: usize,
    /// First column.
    pub x0: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

fn partials_key(x: StorageType, region: bool) -> PipelineKey {
    PipelineKey::new(&PARTIALS)
        .flag("PARTIALS")
        .flag_if(region, "REGION")
        .storage("x", x)
        .constant("WG", format!("{WG}u"))
        .constant("ITEMS", format!("{ITEMS}u"))
        .constant("SUB", format!("{SUB}u"))
}

fn combine_key() -> PipelineKey {
    PipelineKey::new(&COMBINE)
        .flag("COMBINE")
        .constant("WG", format!("{WG}u"))
}

fn fold_key() -> PipelineKey {
    PipelineKey::new(&FOLD)
        .flag("FOLD")
        .constant("WG", format!("{WG}u"))
}

fn apply_key(x: StorageType, out: StorageType, act: Activation) -> PipelineKey {
    PipelineKey::new(&APPLY)
        .flag("APPLY")
        .storage("x", x)
        .storage("out", out)
        .constant("WG", format!("{WG}u"))
        .constant("ITEMS", format!("{APPLY_ITEMS}u"))
        .constant("ACT", format!("{}u", act.code()))
}

/// Scratch slots one `(n, g)` needs for an `h x w` region of `c` channels.
pub fn partial_slots(c: usize, h: usize, w: usize, groups: usize) -> usize {
    if groups == 0 {
        return 0;
    }
    ((c / groups) * h * w).div_ceil(CHUNK)
}

/// f32 elements of scratch [`group_norm_stats`] needs for x `[n, c, h, w]`:
/// `n * groups * partial_slots(c, h, w, groups) * 4`.
pub fn stats_scratch_len(n: usize, c: usize, h: usize, w: usize, groups: usize) -> usize {
    n * groups * partial_slots(c, h, w, groups) * 4
}

fn dims4(op: &str, t: &Tensor) -> Result<[usize; 4]> {
    match *t.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::shape(
            op,
            format!("expected an [N, C, H, W] tensor, got {t:?}"),
        )),
    }
}

/// The storage type of an activation tensor (f32, f16 or bf16) on this
/// recorder's device; other dtypes are shape errors.
pub(crate) fn activation_storage(rec: &Recorder, op: &str, t: &Tensor) -> Result<StorageType> {
    StorageType::of(t.dtype(), rec.ctx().caps()).map_err(|_| {
        Error::shape(
            op,
            format!("expected an f32, f16 or bf16 tensor, got {t:?}"),
        )
    })
}

fn check_f32(op: &str, what: &str, t: &Tensor, min_len: usize) -> Result<()> {
    if t.dtype() != DType::F32 || t.numel() < min_len {
        return Err(Error::shape(
            op,
            format!("{what} must be f32 with at least {min_len} elements, got {t:?}"),
        ));
    }
    Ok(())
}

/// [`check_f32`] with exactly `len` elements (gamma / beta `[C]`, affines `[N, C, 2]`).
fn check_f32_exact(op: &str, what: &str, t: &Tensor, len: usize) -> Result<()> {
    if t.numel() != len {
        return Err(Error::shape(
            op,
            format!("{what} must have {len} elements, got {t:?}"),
        ));
    }
    check_f32(op, what, t, len)
}

fn check_groups(op: &str, c: usize, groups: usize) -> Result<()> {
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(Error::shape(
            op,
            format!("{groups} groups do not divide {c} channels"),
        ));
    }
    Ok(())
}

fn u32_of(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, format!("{v} exceeds u32 indexing")))
}

/// Partial statistics pass: writes `(count, mean, M2, 0)` partials of
/// `region` of x `[N, C, H, W]` (whole planes when `None`) into slots
/// `[slot_offset, slot_offset + partial_slots(C, rh, rw, groups))` of every
/// `(n, g)` row of `scratch` (f32 `[N, groups, slot_capacity, 4]`, see the
/// module docs). x is f32 or f16.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_partials(
    rec: &mut Recorder,
    x: &Tensor,
    groups: usize,
    region: Option<StatsRegion>,
    scratch: &Tensor,
    slot_offset: usize,
    slot_capacity: usize,
) -> Result<()> {
    // Dry runs: tiles of one shape make the same checks and dispatch (the
    // slot offset only moves the partials and must keep them in capacity).
    let signature = || {
        let [n, c, h, w] = x.shape().try_into().ok()?;
        let r = region.unwrap_or(StatsRegion { y0: 0, x0: 0, h, w });
        let fits = groups > 0 && slot_offset + partial_slots(c, r.h, r.w, groups) <= slot_capacity;
        let mut v = DrySignature::new(u64::from_le_bytes(*b"gnpart\0\0"));
        for word in [
            x.dtype() as u64,
            n as u64,
            c as u64,
            h as u64,
            w as u64,
            groups as u64,
            region.is_some() as u64,
            r.y0 as u64,
            r.x0 as u64,
            r.h as u64,
            r.w as u64,
            fits as u64,
            slot_capacity as u64,
            scratch.dtype() as u64,
            scratch.numel() as u64,
        ] {
            v.push(word);
        }
        v.push_overlaps(&[Some(x), Some(scratch)]);
        Some(v)
    };
    rec.memoised(signature, |rec| {
        const OP: &str = "group_norm_partials";
        let [n, c, h, w] = dims4(OP, x)?;
        let x_storage = activation_storage(rec, OP, x)?;
        check_groups(OP, c, groups)?;
        let r = region.unwrap_or(StatsRegion { y0: 0, x0: 0, h, w });
        if r.y0 + r.h > h || r.x0 + r.w > w {
            return Err(Error::shape(
                OP,
                format!("region {r:?} outside a {h}x{w} plane"),
            ));
        }
        let slots = partial_slots(c, r.h, r.w, groups);
        if slot_offset + slots > slot_capacity {
            return Err(Error::shape(
                OP,
                format!(
                    "slots {slot_offset}..{} exceed the capacity {slot_capacity}",
                    slot_offset + slots
                ),
            ));
        }
        check_f32(OP, "scratch", scratch, n * groups * slot_capacity * 4)?;
        let cpg = c / groups;
        let params = Params {
            groups_total: u32_of(OP, n * groups)?,
            groups: groups as u32,
            channels: c as u32,
            cpg: cpg as u32,
            plane: u32_of(OP, h * w)?,
            width: w as u32,
            y0: r.y0 as u32,
            x0: r.x0 as u32,
            rh: r.h as u32,
            rw: r.w as u32,
            group_len: u32_of(OP, cpg * r.h * r.w)?,
            slots: slots as u32,
            slot_offset: slot_offset as u32,
            slot_capacity: u32_of(OP, slot_capacity)?,
            eps: 0.0,
            planes: u32_of(OP, n * c)?,
        };
        u32_of(OP, x.numel())?;
        let full = region.is_none() || (r.h == h && r.w == w);
        let key = partials_key(x_storage, !full);
        let groups_xy = linear_groups(rec.ctx(), (n * groups * slots) as u64)?;
        rec.dispatch(&PARTIALS, &key, &params, &[x, scratch], groups_xy, 0)
    })
}

/// A GroupNorm layer's parameters: `groups` groups over the channels,
/// `gamma` and `beta` f32 `[C]`, and `eps`.
#[derive(Clone, Copy, Debug)]
pub struct GroupNormParams<'a> {
    /// Number of groups (dividing the channels).
    pub groups: usize,
    /// Per-channel scale, f32 `[C]`.
    pub gamma: &'a Tensor,
    /// Per-channel shift, f32 `[C]`.
    pub beta: &'a Tensor,
    /// Added to the variance.
    pub eps: f32,
}

impl<'a> GroupNormParams<'a> {
    /// The parameters of a layer.
    pub fn new(groups: usize, gamma: &'a Tensor, beta: &'a Tensor, eps: f32) -> Self {
        GroupNormParams {
            groups,
            gamma,
            beta,
            eps,
        }
    }
}

/// Combine pass: merges the first `used` of the `slot_capacity` partials of
/// every `(n, g)` in `scratch` (f32 `[N, groups, slot_capacity, 4]`, those
/// slots written) and writes `affine_out` f32 `[N, C, 2]` =
/// `(gamma[c] * rstd, beta[c] - mean * gamma[c] * rstd)`.
pub fn group_norm_combine(
    rec: &mut Recorder,
    scratch: &Tensor,
    n: usize,
    (used, slot_capacity): (usize, usize),
    norm: &GroupNormParams,
    affine_out: &Tensor,
) -> Result<()> {
    const OP: &str = "group_norm_combine";
    check_used(OP, used, slot_capacity)?;
    let GroupNormParams {
        groups,
        gamma,
        beta,
        eps,
    } = *norm;
    let c = gamma.numel();
    check_groups(OP, c, groups)?;
    check_f32(OP, "gamma", gamma, c)?;
    check_f32_exact(OP, "beta", beta, c)?;
    check_f32(OP, "scratch", scratch, n * groups * slot_capacity * 4)?;
    check_f32_exact(OP, "affine_out", affine_out, n * c * 2)?;
    let params = Params {
        groups_total: u32_of(OP, n * groups)?,
        groups: groups as u32,
        channels: c as u32,
        cpg: (c / groups) as u32,
        slots: used as u32,
        slot_capacity: u32_of(OP, slot_capacity)?,
        eps,
        planes: u32_of(OP, n * c)?,
        ..Params::default()
    };
    let groups_xy = linear_groups(rec.ctx(), (n * groups) as u64)?;
    rec.dispatch(
        &COMBINE,
        &combine_key(),
        &params,
        &[scratch, gamma, beta, affine_out],
        groups_xy,
        0,
    )
}

/// Fold pass: merges the first `used` partials of every row of `scratch`
/// (f32 `[rows, slot_capacity, 4]`, `rows` = N · groups) into the row's
/// slot 0, freeing slots `1..` for more partials: a scratch of a few tiles'
/// slots takes the statistics of any number of tiles.
pub fn group_norm_fold(
    rec: &mut Recorder,
    scratch: &Tensor,
    rows: usize,
    (used, slot_capacity): (usize, usize),
) -> Result<()> {
    const OP: &str = "group_norm_fold";
    check_used(OP, used, slot_capacity)?;
    check_f32(OP, "scratch", scratch, rows * slot_capacity * 4)?;
    let params = Params {
        groups_total: u32_of(OP, rows)?,
        slots: used as u32,
        slot_capacity: u32_of(OP, slot_capacity)?,
        ..Params::default()
    };
    let groups_xy = linear_groups(rec.ctx(), rows as u64)?;
    rec.dispatch(&FOLD, &fold_key(), &params, &[scratch], groups_xy, 0)
}

fn check_used(op: &str, used: usize, capacity: usize) -> Result<()> {
    if used > capacity {
        return Err(Error::shape(
            op,
            format!("{used} slots used of a capacity of {capacity}"),
        ));
    }
    u32_of(op, capacity).map(|_| ())
}

/// Statistics pass: writes per-(n, channel) affine coefficients so that
/// `groupnorm(x)[n,c,..] == x[n,c,..] * affine[n,c,0] + affine[n,c,1]`
/// (scale = gamma\[c\] * rstd\[n,g\], shift = beta\[c\] - mean\[n,g\] * scale).
/// x `[N, C, H, W]` (f32 or f16); gamma, beta `[C]` f32; affine_out `[N, C, 2]` f32;
/// scratch: f32 tensor of at least [`stats_scratch_len`] elements, laid out
/// `[N, G, S, 4]` partials (see the module docs).
pub fn group_norm_stats(
    rec: &mut Recorder,
    x: &Tensor,
    norm: &GroupNormParams,
    scratch: &Tensor,
    affine_out: &Tensor,
) -> Result<()> {
    let [n, c, h, w] = dims4("group_norm_stats", x)?;
    check_groups("group_norm_stats", c, norm.groups)?;
    if norm.gamma.numel() != c {
        return Err(Error::shape(
            "group_norm_stats",
            format!("x {x:?} with gamma {:?}", norm.gamma),
        ));
    }
    let slots = partial_slots(c, h, w, norm.groups);
    group_norm_partials(rec, x, norm.groups, None, scratch, 0, slots)?;
    group_norm_combine(rec, scratch, n, (slots, slots), norm, affine_out)
}

/// Apply pass: `out = act(x * affine[n,c,0] + affine[n,c,1])`; x, out
/// `[N, C, H, W]` (same dtype, f32 or f16), affine `[N, C, 2]` f32.
/// `out` may alias `x` (in place).
pub fn group_norm_apply(
    rec: &mut Recorder,
    x: &Tensor,
    affine: &Tensor,
    act: Activation,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "group_norm_apply";
    let [n, c, h, w] = dims4(OP, x)?;
    let x_storage = activation_storage(rec, OP, x)?;
    if out.shape() != x.shape() || (out.overlaps(x) && out.dtype() != x.dtype()) {
        return Err(Error::shape(OP, format!("x {x:?} vs out {out:?}")));
    }
    check_f32_exact(OP, "affine", affine, n * c * 2)?;
    u32_of(OP, x.numel())?;
    let planes = n * c;
    let params = Params {
        channels: c as u32,
        plane: (h * w) as u32,
        width: w as u32,
        planes: planes as u32,
        ..Params::default()
    };
    let max = rec.ctx().caps().max_compute_workgroups_per_dimension as usize;
    let gx = (h * w).div_ceil((WG * APPLY_ITEMS) as usize);
    let gz = planes.div_ceil(max.max(1));
    let gy = planes.div_ceil(gz.max(1));
    let key = apply_key(x_storage, activation_storage(rec, OP, out)?, act);
    let dims = [u32_of(OP, gx)?, gy as u32, gz as u32];
    rec.dispatch(&APPLY, &key, &params, &[x, affine, out], dims, 0)
}

/// Statistics + apply: `out = act(groupnorm(x))`. `scratch` as for
/// [`group_norm_stats`], `affine_scratch` f32 `[N, C, 2]`; `out` may alias `x`.
pub fn group_norm(
    rec: &mut Recorder,
    x: &Tensor,
    norm: &GroupNormParams,
    act: Activation,
    scratch: &Tensor,
    affine_scratch: &Tensor,
    out: &Tensor,
) -> Result<()> {
    group_norm_stats(rec, x, norm, scratch, affine_scratch)?;
    group_norm_apply(rec, x, affine_scratch, act, out)
}

/// CPU reference (f64 statistics): x `[N, C, H, W]` with `shape = [N, C, H, W]`.
pub fn cpu_group_norm(
    x: &[f32],
    shape: [usize; 4],
    groups: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    act: Activation,
) -> Vec<f32> {
    let [n, c, h, w] = shape;
    let mean_rstd = cpu_group_stats(x, shape, groups, eps);
    let plane = h * w;
    let cpg = c / groups;
    let mut out = vec![0.0; x.len()];
    for b in 0..n {
        for ch in 0..c {
            let (mean, rstd) = mean_rstd[b * groups + ch / cpg];
            let base = (b * c + ch) * plane;
            for i in base..base + plane {
                let v = (x[i] as f64 - mean) * rstd * gamma[ch] as f64 + beta[ch] as f64;
                out[i] = act.apply(v as f32);
            }
        }
    }
    out
}

/// f64 `(mean, rstd)` per `(n, g)`.
fn cpu_group_stats(x: &[f32], shape: [usize; 4], groups: usize, eps: f32) -> Vec<(f64, f64)> {
    let [n, c, h, w] = shape;
    let len = c / groups * h * w;
    let mut stats = Vec::with_capacity(n * groups);
    for ng in 0..n * groups {
        let span = &x[ng * len..(ng + 1) * len];
        let mean = span.iter().map(|&v| v as f64).sum::<f64>() / len as f64;
        let var = span.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / len as f64;
        stats.push((mean, 1.0 / (var + eps as f64).sqrt()));
    }
    stats
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for t in StorageType::ALL {
        for region in [false, true] {
            v.push((PARTIALS, partials_key(t, region)));
        }
        for act in [Activation::None, Activation::Silu, Activation::Relu] {
            v.push((APPLY, apply_key(t, t, act)));
        }
        v.push((APPLY, apply_key(t, StorageType::F32, Activation::None)));
    }
    v.push((COMBINE, combine_key()));
    v
}

#[cfg(test)]
#[path = "group_norm_tests.rs"]
mod tests;
