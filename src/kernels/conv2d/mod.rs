//! `shaders/conv2d.wgsl`: 2-D convolution (k = 1 or 3, stride 1 or 2, any padding) as a
//! tiled implicit GEMM, with a nearest-2x upsample, a GroupNorm-style affine + activation
//! prologue, bias and a residual add fused in.
//!
//! GEMM view: M = Cout, N = output pixels of one image, K = Cin * k * k. Each workgroup
//! computes a TM x TN output tile and each invocation accumulates an RM x RN register block
//! in f32. On GPUs both operand tiles are staged in workgroup memory TK reduction steps at a
//! time (the input one built im2col-style while loading); on CPU adapters (lavapipe) the
//! invocations read their operands directly (see [`ConvTiles::direct`] for why).
//! The register block is unrolled on the host (`codegen`).
//!
//! Files: `tiles` (tile shapes, the defaults per device and the candidates a sweep times),
//! `codegen` (the generated shader text and the specialisations), `cpu` (the reference),
//! `sweep` (a decoder's layer classes and timing candidates on them: `wgvae bench conv`),
//! this file (weights, shape checks, bindings and dispatch).

mod codegen;
mod cpu;
#[cfg(test)]
mod matrix_tests;
pub mod sweep;
#[cfg(test)]
mod tests;
mod tiles;

pub(crate) use codegen::variants;
use codegen::Variant;
pub use cpu::cpu_conv2d;
pub use tiles::{ConvTiles, MatrixTiles};

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::{
    linear_groups, BindingKind, Context, DrySignature, KernelSpec, Recorder, StorageType,
};
use crate::kernels::spec;
use crate::kernels::Activation;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/conv2d.wgsl");

/// Invocations per workgroup of the naive kernel.
const NAIVE_WG: u32 = 64;

/// Uniform block of both entry points (WGSL `Params`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Params {
    /// Input channels.
    pub cin: u32,
    /// Stored input height (before the fused 2× upsample).
    pub h: u32,
    /// Stored input width (before the fused 2× upsample).
    pub w: u32,
    /// Output channels.
    pub cout: u32,
    /// Output height.
    pub ho: u32,
    /// Output width.
    pub wo: u32,
    /// Height the taps see (`2h` with the upsample).
    pub hin: u32,
    /// Width the taps see (`2w` with the upsample).
    pub win: u32,
    /// Zero padding above.
    pub pad_top: u32,
    /// Zero padding on the left.
    pub pad_left: u32,
    /// Reduction length `Cin · k · k`.
    pub ktot: u32,
    /// Row length of the transposed weights (a multiple of the channel tile and of 4).
    pub mpad: u32,
    /// Pixel tiles per output row.
    pub tiles_x: u32,
    /// Pixel tiles per image.
    pub ntiles: u32,
    /// Output-channel tiles.
    pub mtiles: u32,
    /// Output pixels per image (`Ho · Wo`).
    pub npix: u32,
    /// Input image read for dispatched image `nb`: `nb + in_frame`.
    pub in_frame: u32,
    /// Output (and residual) image written for `nb`: `nb + out_frame`.
    pub out_frame: u32,
    /// Padding to 16 bytes.
    pub _pad: [u32; 2],
}

// input, weights, bias, affine, residual, out, f16 range counter. Absent optional operands
// are bound to a placeholder (the weights) that the specialised shader never reads.
const BINDINGS: &[BindingKind] = &[
    BindingKind::Read,
    BindingKind::Read,
    BindingKind::Read,
    BindingKind::Read,
    BindingKind::Read,
    BindingKind::ReadWrite,
    BindingKind::ReadWrite,
];

/// The tiled kernel; its source gets the unrolled register block appended (`Variant::spec`).
const TILED: KernelSpec = spec::<Params>("conv2d", SOURCE, "conv2d", BINDINGS);

/// The cooperative-matrix kernel; its entry point is generated (`Variant::spec`).
const COOP: KernelSpec = spec::<Params>("conv2d", SOURCE, "conv2d_coop", BINDINGS);

/// The naive kernel (one output per invocation), for benchmarks.
const NAIVE: KernelSpec = spec::<Params>("conv2d", SOURCE, "naive", BINDINGS);

/// Geometry options of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dOptions {
    /// 1 or 2.
    pub stride: u32,
    /// Zero padding: top, left, bottom, right.
    pub pad: [u32; 4],
    /// Nearest-2x upsample of the input, fused into the load.
    pub upsample: bool,
    /// Replicate padding (the edge pixel repeated, PyTorch's
    /// `padding_mode="replicate"`) instead of zeros.
    pub replicate: bool,
    /// Reflect padding (PyTorch's `padding_mode="reflect"`) instead of
    /// zeros; pads must be smaller than the frame.
    pub reflect: bool,
}

impl Conv2dOptions {
    /// Stride 1, padding k/2 on all sides, no upsample ("same" size for odd k).
    pub fn same(k: u32) -> Self {
        Conv2dOptions {
            stride: 1,
            pad: [k / 2; 4],
            upsample: false,
            replicate: false,
            reflect: false,
        }
    }
}

/// Convolution weights on the device, re-laid-out once at load for the tiled kernel:
/// `weight` is `[Kp, Mp]` with K = Cin*k*k (PyTorch order ci, ky, kx) and M = Cout,
/// zero padded to multiples of the tiles' `tk` and `tm`; `bias` is `[Mp]`.
pub struct Conv2dWeights {
    weight: Tensor,
    bias: Option<Tensor>,
    cout: usize,
    cin: usize,
    k: usize,
    mpad: usize,
    tiles: ConvTiles,
}

impl std::fmt::Debug for Conv2dWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Conv2dWeights(cout {}, cin {}, k {}, bias {}, {:?})",
            self.cout,
            self.cin,
            self.k,
            self.bias.is_some(),
            self.tiles
        )
    }
}

/// A convolution's weights as PyTorch holds them, on the host: `weight`
/// `[cout, cin, k, k]` (k = 1 or 3) and `bias` `[cout]`, f32.
#[derive(Clone, Copy, Debug)]
pub struct PytorchConv<'a> {
    /// `[cout, cin, k, k]` values.
    pub weight: &'a [f32],
    /// Output channels.
    pub cout: usize,
    /// Input channels.
    pub cin: usize,
    /// Kernel side (1 or 3).
    pub k: usize,
    /// `[cout]` values, if the conv has a bias.
    pub bias: Option<&'a [f32]>,
}

impl Conv2dWeights {
    /// f32 weights in PyTorch layout `[Cout, Cin, k, k]` (k = 1 or 3); bias `[Cout]`.
    pub fn from_pytorch(
        ctx: &Context,
        weight: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
        label: &str,
    ) -> Result<Conv2dWeights> {
        let w = PytorchConv {
            weight,
            cout,
            cin,
            k,
            bias,
        };
        Self::upload(ctx, &w, None, DType::F32, label)
    }

    /// Uploads `w` with the weights stored in `dtype` (f16/bf16 halve their
    /// memory; the bias stays f32), in `tiles` (tuning, benchmarks) or the
    /// device's default for the layer ([`ConvTiles::for_layer`]).
    pub fn upload(
        ctx: &Context,
        w: &PytorchConv,
        tiles: Option<ConvTiles>,
        dtype: DType,
        label: &str,
    ) -> Result<Conv2dWeights> {
        let PytorchConv {
            weight,
            cout,
            cin,
            k,
            bias,
        } = *w;
        // Cooperative matrices take f16 operands: f16 models only (bf16 models exist because
        // their activations overflow f16; f32 ones ask for f32 arithmetic).
        let tiles = tiles
            .or_else(|| {
                (dtype == DType::F16)
                    .then(|| ConvTiles::matrix_for_layer(ctx.caps(), cout, k))
                    .flatten()
            })
            .unwrap_or_else(|| ConvTiles::for_layer(ctx.caps(), cout, k));
        let op = "Conv2dWeights::from_pytorch";
        if k != 1 && k != 3 {
            return Err(Error::shape(
                op,
                format!("kernel size {k}; only 1 and 3 are supported"),
            ));
        }
        if cout == 0 || cin == 0 {
            return Err(Error::shape(
                op,
                format!("empty weights (cout {cout}, cin {cin})"),
            ));
        }
        if weight.len() != cout * cin * k * k {
            return Err(Error::shape(
                op,
                format!(
                    "{} weight values for [{cout}, {cin}, {k}, {k}]",
                    weight.len()
                ),
            ));
        }
        if let Some(b) = bias {
            if b.len() != cout {
                return Err(Error::shape(
                    op,
                    format!("{} bias values for {cout} outputs", b.len()),
                ));
            }
        }
        tiles.check(ctx.caps())?;
        if tiles.matrix.is_some() && dtype != DType::F16 {
            return Err(Error::Unsupported(format!(
                "{op}: cooperative-matrix tiles take f16 weights, not {}; store the weights in f16 or pass scalar tiles (or None)",
                dtype.name()
            )));
        }
        let ktot = cin * k * k;
        let tk = tiles.tk.max(1) as usize;
        let kpad = ktot.div_ceil(tk) * tk;
        let mpad = cout.div_ceil(tiles.tm as usize) * tiles.tm as usize;
        // [Cout, K] -> [Kp, Mp]: K-major so a tile row is Cout-contiguous (vec4 loads).
        // A null device (estimates) holds no values: only the allocation counts.
        let weight = if ctx.is_null() {
            Tensor::empty(ctx, &[kpad, mpad], dtype, label)?
        } else {
            let mut packed = vec![0.0f32; kpad * mpad];
            for m in 0..cout {
                for kg in 0..ktot {
                    packed[kg * mpad + m] = weight[m * ktot + kg];
                }
            }
            Tensor::from_f32_as(ctx, &[kpad, mpad], &packed, dtype, label)?
        };
        let bias = match bias {
            Some(b) => {
                let mut padded = b.to_vec();
                padded.resize(mpad, 0.0);
                Some(Tensor::from_f32(
                    ctx,
                    &[mpad],
                    &padded,
                    &format!("{label}.bias"),
                )?)
            }
            None => None,
        };
        Ok(Conv2dWeights {
            weight,
            bias,
            cout,
            cin,
            k,
            mpad,
            tiles,
        })
    }

    /// Output channels.
    pub fn cout(&self) -> usize {
        self.cout
    }
    /// Input channels.
    pub fn cin(&self) -> usize {
        self.cin
    }
    /// Kernel size (1 or 3).
    pub fn k(&self) -> usize {
        self.k
    }
    /// True when the convolution adds a bias.
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }
    /// Storage dtype of the weight matrix.
    pub fn dtype(&self) -> DType {
        self.weight.dtype()
    }
    /// The tiles the weights were laid out for.
    pub fn tiles(&self) -> ConvTiles {
        self.tiles
    }
}

/// Optional fused prologue: the input is transformed on load as `act(x * scale[n, c] + shift[n, c])`
/// with `affine` an f32 tensor `[N, Cin, 2]` (`[.., 0]` = scale, `[.., 1]` = shift). Zero padding
/// applies after the transform.
#[derive(Clone, Copy, Debug)]
pub struct Prologue<'a> {
    /// Per-(sample, channel) scale and shift, f32 `[N, Cin, 2]`.
    pub affine: &'a Tensor,
    /// Activation after the affine transform.
    pub act: Activation,
}

/// Output spatial size for an input size (the upsample, if any, is applied first).
pub fn output_size(h: usize, w: usize, k: usize, opts: &Conv2dOptions) -> (usize, usize) {
    let up = if opts.upsample { 2 } else { 1 };
    let s = opts.stride.max(1) as usize;
    let hp = h * up + opts.pad[0] as usize + opts.pad[2] as usize;
    let wp = w * up + opts.pad[1] as usize + opts.pad[3] as usize;
    let ho = if hp >= k { (hp - k) / s + 1 } else { 0 };
    let wo = if wp >= k { (wp - k) / s + 1 } else { 0 };
    (ho, wo)
}

/// Multiply-accumulates of one call (GFLOP/s = 2 * MACs / time).
pub fn macs(n: usize, cin: usize, cout: usize, ho: usize, wo: usize, k: usize) -> u64 {
    (n * cout * ho * wo) as u64 * (cin * k * k) as u64
}

/// Everything a dispatch needs once the shapes are checked.
struct Plan {
    params: Params,
    n: usize,
    macs: u64,
}

fn same_memory(a: &Tensor, b: &Tensor) -> bool {
    a.overlaps(b)
}

/// The tensors and options of one convolution, as [`conv2d`] takes them
/// ([`conv2d_naive`] takes them together).
#[derive(Clone, Copy, Debug)]
pub struct Conv2dCall<'a> {
    /// `[N, Cin, H, W]`.
    pub input: &'a Tensor,
    /// The weights (and bias).
    pub w: &'a Conv2dWeights,
    /// Optional fused affine + activation on the input.
    pub prologue: Option<Prologue<'a>>,
    /// Optional `[N, Cout, Ho, Wo]` added after the bias; may alias `out`.
    pub residual: Option<&'a Tensor>,
    /// `[N, Cout, Ho, Wo]`; never aliases `input`.
    pub out: &'a Tensor,
    /// Stride, padding, upsample.
    pub opts: &'a Conv2dOptions,
}

/// Which images a conv computes: `count` outputs from image `out_frame` on,
/// reading inputs from image `in_frame` on (all of them when `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frames {
    /// First input image read.
    pub in_frame: usize,
    /// First output image written.
    pub out_frame: usize,
    /// Images computed.
    pub count: usize,
}

fn plan(call: &Conv2dCall, frames: Option<Frames>) -> Result<Plan> {
    let Conv2dCall {
        input,
        w,
        prologue,
        residual,
        out,
        opts,
    } = *call;
    let op = "conv2d";
    let shape_err = |msg: String| Err(Error::shape(op, msg));
    for t in [Some(input), Some(out), residual].into_iter().flatten() {
        if t.dtype() == DType::Rgba8 {
            return shape_err(format!("{t:?} is not a float tensor"));
        }
    }
    if let Some(pro) = prologue {
        if pro.affine.dtype() != DType::F32 {
            return shape_err(format!("prologue affine {:?} must be f32", pro.affine));
        }
        // The shader reads the affine by input image, not by frame count.
        if frames.is_some() {
            return shape_err("a prologue with frame offsets is not supported".into());
        }
    }
    if let Some(r) = residual {
        if r.overlaps(out) && r.dtype() != out.dtype() {
            return shape_err(format!(
                "in-place residual {r:?} differs in dtype from out {out:?}"
            ));
        }
    }
    if opts.stride != 1 && opts.stride != 2 {
        return shape_err(format!("stride {} (1 or 2 supported)", opts.stride));
    }
    let [n, cin, h, wd] = match *input.shape() {
        [a, b, c, d] => [a, b, c, d],
        _ => return shape_err(format!("input {:?} is not [N, Cin, H, W]", input.shape())),
    };
    if cin != w.cin {
        return shape_err(format!(
            "input {:?} has {cin} channels, weights expect {}",
            input.shape(),
            w.cin
        ));
    }
    let (ho, wo) = output_size(h, wd, w.k, opts);
    if n == 0 || ho == 0 || wo == 0 {
        return shape_err(format!(
            "input {:?} gives an empty output with {opts:?}",
            input.shape()
        ));
    }
    let out_n = out.shape().first().copied().unwrap_or(0);
    let f = frames.unwrap_or(Frames {
        in_frame: 0,
        out_frame: 0,
        count: n,
    });
    if f.count == 0 || f.in_frame + f.count > n || f.out_frame + f.count > out_n {
        return shape_err(format!(
            "{f:?} out of range of input {:?} and out {:?}",
            input.shape(),
            out.shape()
        ));
    }
    let want = [out_n, w.cout, ho, wo];
    if out.shape() != want || (frames.is_none() && out_n != n) {
        return shape_err(format!("out is {:?}, expected {want:?}", out.shape()));
    }
    if let Some(r) = residual {
        if r.shape() != want {
            return shape_err(format!("residual is {:?}, expected {want:?}", r.shape()));
        }
    }
    let n = f.count;
    if let Some(pro) = prologue {
        if pro.affine.shape() != [n, cin, 2] {
            return shape_err(format!(
                "prologue affine is {:?}, expected [{n}, {cin}, 2]",
                pro.affine.shape()
            ));
        }
    }
    if same_memory(out, input) {
        return shape_err("out aliases the input".into());
    }
    // The shader's multiply-shift division by k*k and its f32 division of workgroup indices
    // are exact only below these bounds.
    let mtiles = w.cout.div_ceil(w.tiles.tm as usize);
    if (cin * w.k * w.k >= 1 << 16 && !w.tiles.direct) || n * mtiles >= 1 << 22 {
        return Err(Error::Unsupported(format!(
            "conv2d with {cin} input channels, batch {n} x {} output channels",
            w.cout
        )));
    }
    let up = if opts.upsample { 2 } else { 1 };
    let npix = ho * wo;
    let t = w.tiles;
    let tiles_x = wo.div_ceil(t.tw as usize);
    let ntiles = tiles_x * ho.div_ceil((t.tn / t.tw) as usize);
    if ntiles >= 1 << 22 {
        return Err(Error::Unsupported(format!(
            "conv2d output {ho}x{wo} is too large for one dispatch"
        )));
    }
    let params = Params {
        cin: cin as u32,
        h: h as u32,
        w: wd as u32,
        cout: w.cout as u32,
        ho: ho as u32,
        wo: wo as u32,
        hin: (h * up) as u32,
        win: (wd * up) as u32,
        pad_top: opts.pad[0],
        pad_left: opts.pad[1],
        ktot: (cin * w.k * w.k) as u32,
        mpad: w.mpad as u32,
        tiles_x: tiles_x as u32,
        ntiles: ntiles as u32,
        mtiles: mtiles as u32,
        npix: npix as u32,
        in_frame: f.in_frame as u32,
        out_frame: f.out_frame as u32,
        _pad: [0; 2],
    };
    Ok(Plan {
        params,
        n,
        macs: macs(n, cin, w.cout, ho, wo, w.k),
    })
}

fn bindings<'t>(call: &Conv2dCall<'t>, range_flag: Option<&'t Tensor>) -> [&'t Tensor; 7] {
    let w = call.w;
    let placeholder = &w.weight;
    [
        call.input,
        &w.weight,
        w.bias.as_ref().unwrap_or(placeholder),
        call.prologue.map(|p| p.affine).unwrap_or(placeholder),
        call.residual.unwrap_or(placeholder),
        call.out,
        range_flag.unwrap_or(placeholder),
    ]
}

/// f16 outputs are range-checked when the recorder carries a range flag.
fn range_flag_for(rec: &Recorder, variant: &mut Variant) -> Option<Tensor> {
    let half = matches!(
        variant.storage[3],
        StorageType::F16 | StorageType::F16Packed
    );
    let flag = rec.range_flag().filter(|_| half).cloned();
    variant.check_range = flag.is_some();
    flag
}

/// `out = conv(prologue(upsample?(input))) + bias + residual`.
///
/// input `[N, Cin, H, W]`; out `[N, Cout, Ho, Wo]` (see [`output_size`]); residual (optional)
/// `[N, Cout, Ho, Wo]`, added after the bias. `out` may alias `residual` (in-place residual add)
/// but never `input`.
pub fn conv2d(
    rec: &mut Recorder,
    input: &Tensor,
    w: &Conv2dWeights,
    prologue: Option<Prologue>,
    residual: Option<&Tensor>,
    out: &Tensor,
    opts: &Conv2dOptions,
) -> Result<()> {
    let call = Conv2dCall {
        input,
        w,
        prologue,
        residual,
        out,
        opts,
    };
    // A dry run (null device) records nothing: a call whose checks already
    // passed with the same signature only repeats its dispatch labels
    // (exact tiles make the same call for every interior tile of a layer).
    let flag = rec.range_flag().is_some();
    rec.memoised(|| dry_signature(&call, flag), |rec| tiled(rec, &call))
}

/// Everything [`conv2d`]'s checks and dispatch depend on besides the
/// recorder's device: the weights' geometry and tiles, the options, the
/// prologue's activation, whether a range flag is set, each operand's
/// dtype and shape, which operands overlap (`None`: an operand of an odd
/// rank, left to the checks every time).
fn dry_signature(call: &Conv2dCall, range_flag: bool) -> Option<DrySignature> {
    let (w, o) = (call.w, call.opts);
    let mut v = DrySignature::new(u64::from_le_bytes(*b"conv2d\0\0"));
    let mut tiles = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&w.tiles, &mut tiles);
    // At most 1 + 10 + 6 operands × 6 + 15 overlaps = 62 words.
    for x in [
        w.cout as u64,
        w.cin as u64,
        w.k as u64,
        w.mpad as u64,
        std::hash::Hasher::finish(&tiles),
        o.stride as u64,
        ((o.pad[0] as u64) << 32) | o.pad[1] as u64,
        ((o.pad[2] as u64) << 32) | o.pad[3] as u64,
        o.upsample as u64 | (range_flag as u64) << 1,
        call.prologue.map_or(0, |p| 1 + p.act as u64),
    ] {
        v.push(x);
    }
    let operands = [
        Some(call.input),
        Some(call.out),
        call.residual,
        call.prologue.map(|p| p.affine),
        w.bias.as_ref(),
        Some(&w.weight),
    ];
    for t in operands.iter().flatten() {
        let shape = t.shape();
        if shape.len() > 5 {
            return None;
        }
        v.push(t.dtype() as u64 | (shape.len() as u64) << 8);
        shape.iter().for_each(|&d| v.push(d as u64));
    }
    v.push_overlaps(&operands);
    Some(v)
}

/// [`conv2d`] of `frames.count` images only: input images from
/// `frames.in_frame` on, output (and residual) images from
/// `frames.out_frame` on; `input` and `out` may hold different image counts.
/// A causal video conv adds its time taps this way, reading earlier frames
/// in place.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_frames(
    rec: &mut Recorder,
    input: &Tensor,
    w: &Conv2dWeights,
    residual: Option<&Tensor>,
    out: &Tensor,
    opts: &Conv2dOptions,
    frames: Frames,
) -> Result<()> {
    let call = Conv2dCall {
        input,
        w,
        prologue: None,
        residual,
        out,
        opts,
    };
    tiled_frames(rec, &call, Some(frames))
}

/// [`conv2d`] over a [`Conv2dCall`].
fn tiled(rec: &mut Recorder, call: &Conv2dCall) -> Result<()> {
    tiled_frames(rec, call, None)
}

/// [`tiled`] of some images only (see [`conv2d_frames`]).
fn tiled_frames(rec: &mut Recorder, call: &Conv2dCall, frames: Option<Frames>) -> Result<()> {
    record(rec, call, frames, Some(call.w.tiles), |ctx, plan| {
        let groups_xy = linear_groups(ctx, plan.params.ntiles as u64)?;
        let gz = plan.n as u64 * plan.params.mtiles as u64;
        let gz = u32::try_from(gz).map_err(|_| Error::DispatchTooLarge {
            what: "conv2d (batch x Cout tiles)".into(),
            groups: gz,
            limit: ctx.caps().max_compute_workgroups_per_dimension,
        })?;
        Ok([groups_xy[0], groups_xy[1], gz])
    })
}

/// The same convolution with one output per invocation and no workgroup-memory reuse.
/// Only for benchmarks (the speed-up ratio of the tiled kernel) and cross-checks.
pub fn conv2d_naive(rec: &mut Recorder, call: &Conv2dCall) -> Result<()> {
    record(rec, call, None, None, |ctx, plan| {
        let per_image = call.w.cout as u64 * plan.params.npix as u64;
        let groups = linear_groups(ctx, per_image.div_ceil(NAIVE_WG as u64))?;
        Ok([groups[0], groups[1], plan.n as u32])
    })
}

/// Checks `call`, picks its variant (`tiles`, or `None` for the naive kernel)
/// and records it over the workgroups `groups` gives for its plan.
fn record(
    rec: &mut Recorder,
    call: &Conv2dCall,
    frames: Option<Frames>,
    tiles: Option<ConvTiles>,
    groups: impl FnOnce(&Context, &Plan) -> Result<[u32; 3]>,
) -> Result<()> {
    let plan = plan(call, frames)?;
    let mut variant = Variant::for_call(rec.ctx().caps(), tiles, call)?;
    let groups = groups(rec.ctx(), &plan)?;
    let flag = range_flag_for(rec, &mut variant);
    let tensors = bindings(call, flag.as_ref());
    rec.dispatch(
        &variant.spec(),
        &variant.key(),
        &plan.params,
        &tensors,
        groups,
        plan.macs,
    )
}
