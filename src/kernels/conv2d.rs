//! `shaders/conv2d.wgsl`: 2-D convolution (k = 1 or 3, stride 1 or 2, any padding) as a
//! tiled implicit GEMM, with a nearest-2x upsample, a GroupNorm-style affine + activation
//! prologue, bias and a residual add fused in.
//!
//! GEMM view: M = Cout, N = output pixels of one image, K = Cin * k * k. Each workgroup
//! computes a TM x TN output tile and each invocation accumulates an RM x RN register block
//! in f32. On GPUs both operand tiles are staged in workgroup memory TK reduction steps at a
//! time (the input one built im2col-style while loading); on CPU adapters (lavapipe) the
//! invocations read their operands directly (see [`ConvTiles::direct`] for why).
//! The register block is unrolled on the host (`micro_kernel_source`).

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::{
    linear_groups, BindingKind, Capabilities, Context, KernelSpec, PipelineKey, Recorder,
    StorageType,
};
use crate::kernels::Activation;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/conv2d.wgsl");

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
const TILED: KernelSpec = KernelSpec {
    family: "conv2d",
    source: SOURCE,
    entry: "conv2d",
    bindings: BINDINGS,
    uniform_size: std::mem::size_of::<Params>() as u64,
};

/// The naive kernel (one output per invocation), for benchmarks.
const NAIVE: KernelSpec = KernelSpec {
    family: "conv2d",
    source: SOURCE,
    entry: "naive",
    bindings: BINDINGS,
    uniform_size: std::mem::size_of::<Params>() as u64,
};

/// Geometry options of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dOptions {
    /// 1 or 2.
    pub stride: u32,
    /// Zero padding: top, left, bottom, right.
    pub pad: [u32; 4],
    /// Nearest-2x upsample of the input, fused into the load.
    pub upsample: bool,
}

impl Conv2dOptions {
    /// Stride 1, padding k/2 on all sides, no upsample ("same" size for odd k).
    pub fn same(k: u32) -> Self {
        Conv2dOptions {
            stride: 1,
            pad: [k / 2; 4],
            upsample: false,
        }
    }
}

/// Tile shape of the implicit GEMM: pipeline-key constants a device may choose.
/// A workgroup computes `tm` output channels x `tn` output pixels (a `tn / tw` x `tw` patch),
/// with `(tm / rm) * (tn / rn)` invocations each holding an `rm` x `rn` register block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvTiles {
    /// Output channels per workgroup tile.
    pub tm: u32,
    /// Output pixels per workgroup tile.
    pub tn: u32,
    /// Width of the pixel patch (a power of two dividing `tn`).
    pub tw: u32,
    /// Reduction (Cin * k * k) step per workgroup-memory stage (even; unused when `direct`).
    pub tk: u32,
    /// Output channels per invocation (multiple of 4).
    pub rm: u32,
    /// Output pixels per invocation, along one output row (multiple of 4 dividing `tw`).
    pub rn: u32,
    /// Invocations read their operands straight from the buffers instead of workgroup-memory
    /// tiles (for CPU adapters, where workgroup memory is no faster and barriers are costly).
    pub direct: bool,
}

impl ConvTiles {
    /// Invocations per workgroup.
    pub fn workgroup_size(&self) -> u32 {
        (self.tm / self.rm.max(1)) * (self.tn / self.rn.max(1))
    }

    /// Bytes of workgroup memory the tiles use.
    pub fn shared_bytes(&self) -> u32 {
        if self.direct {
            0
        } else {
            self.tk * (self.tm + self.tn) * 4
        }
    }

    /// Checks the divisibility rules of the shader and the device limits.
    pub fn check(&self, caps: &Capabilities) -> Result<()> {
        let ConvTiles {
            tm,
            tn,
            tw,
            tk,
            rm,
            rn,
            direct,
        } = *self;
        let bad = |why: &str| Err(Error::Unsupported(format!("conv2d tiles {self:?}: {why}")));
        if rm == 0 || rn == 0 || rm % 4 != 0 || rn % 4 != 0 {
            return bad("rm and rn must be positive multiples of 4");
        }
        if !direct && (tk == 0 || tk % 2 != 0) {
            return bad("tk must be positive and even");
        }
        if tm % rm != 0 || tn % rn != 0 {
            return bad("tm must be a multiple of rm and tn of rn");
        }
        if !tw.is_power_of_two() || tn % tw != 0 || tw % rn != 0 {
            return bad("tw must be a power of two dividing tn, and a multiple of rn");
        }
        if !direct && (!(tm / 4).is_power_of_two() || !(tn / 4).is_power_of_two()) {
            return bad("tm / 4 and tn / 4 must be powers of two");
        }
        let wg = self.workgroup_size();
        if wg > caps.max_compute_invocations_per_workgroup {
            return bad("workgroup larger than the device allows");
        }
        if self.shared_bytes() > caps.max_compute_workgroup_storage_size {
            return bad("tiles exceed the device's workgroup memory");
        }
        Ok(())
    }

    /// The default tiles for a layer on a device.
    pub fn for_layer(caps: &Capabilities, cout: usize, _k: usize) -> ConvTiles {
        let small = cout <= 16;
        if caps.is_cpu() {
            // CPU adapters (lavapipe): a workgroup runs on one CPU thread, invocations are
            // SIMD lanes, and every workgroup-memory access is a scalar loop over the lanes;
            // large register blocks fed directly from the (cached) buffers do best.
            // Measured on lavapipe (Mesa 22.3, LLVM 15, AVX-512 Xeon), 3x3, GFLOP per CPU
            // second / cold pipeline compile: 16 x 16: ~13 / ~2.5 s; 16 x 32: ~14.7 / ~9 s;
            // 8 x 64: ~15.6 / ~27 s. Compile time grows fast with the block: 16 x 16.
            if small {
                ConvTiles {
                    tm: 4,
                    tn: 256,
                    tw: 32,
                    tk: 0,
                    rm: 4,
                    rn: 32,
                    direct: true,
                }
            } else {
                ConvTiles {
                    tm: 64,
                    tn: 64,
                    tw: 32,
                    tk: 0,
                    rm: 16,
                    rn: 16,
                    direct: true,
                }
            }
        } else if small {
            // conv_out (Cout = 3): narrow in M so few padded rows are computed.
            ConvTiles {
                tm: 4,
                tn: 256,
                tw: 32,
                tk: 16,
                rm: 4,
                rn: 4,
                direct: false,
            }
        } else if cout <= 64 {
            ConvTiles {
                tm: 64,
                tn: 128,
                tw: 32,
                tk: 8,
                rm: 8,
                rn: 8,
                direct: false,
            }
        } else {
            ConvTiles {
                tm: 128,
                tn: 128,
                tw: 32,
                tk: 8,
                rm: 8,
                rn: 8,
                direct: false,
            }
        }
    }
}

/// The host-unrolled part of the tiled shader for a register block: `alias Acc`, the
/// per-step body (`micro_step`: one reduction step from the workgroup tiles, or `row_step`:
/// one kernel row (ci, ky) straight from the buffers) and `store_block` (the epilogue).
/// Written out because WGSL compilers keep accumulators in registers only under constant
/// indices, and several do not unroll loops this large.
fn micro_kernel_source(tiles: &ConvTiles, ks: u32, stride: u32) -> String {
    use std::fmt::Write;
    let (rm, rn) = (tiles.rm, tiles.rn);
    let (rm4, rn4) = (rm / 4, rn / 4);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n// Generated by conv2d.rs: {rm} x {rn} register block."
    );
    let _ = writeln!(s, "alias Acc = array<vec4<f32>, {}>;", rm * rn4);
    if tiles.direct {
        // The input row segment the RN pixels' KS taps read, loaded once for all taps.
        let span = (rn - 1) * stride + ks;
        s.push_str(
            "fn row_step(acc: ptr<function, Acc>, w0: u32, rowbase: u32, ok: bool, ix: i32, ss: vec2<f32>) {\n",
        );
        for c in 0..span {
            let _ = writeln!(s, "    let v{c} = xrow(rowbase, ix + {c}, ok, ss);");
        }
        for kx in 0..ks {
            for i in 0..rm4 {
                let _ = writeln!(
                    s,
                    "    let a{kx}_{i} = wt_ld4(w0 + {kx}u * (p.mpad >> 2u) + {i}u);"
                );
            }
        }
        for i in 0..rm4 {
            for (c, cc) in ["x", "y", "z", "w"].iter().enumerate() {
                for j in 0..rn4 {
                    let terms: Vec<String> = (0..ks)
                        .map(|kx| {
                            let col = |q: u32| (4 * j + q) * stride + kx;
                            format!(
                                "a{kx}_{i}.{cc} * vec4<f32>(v{}, v{}, v{}, v{})",
                                col(0),
                                col(1),
                                col(2),
                                col(3)
                            )
                        })
                        .collect();
                    let o = (i * 4 + c as u32) * rn4 + j;
                    let _ = writeln!(s, "    (*acc)[{o}] += {};", terms.join(" + "));
                }
            }
        }
    } else {
        s.push_str("fn micro_step(acc: ptr<function, Acc>, ai: u32, bi: u32) {\n");
        for i in 0..rm4 {
            let _ = writeln!(s, "    let a{i} = a_tile[ai + {i}u];");
        }
        // The pixel groups of an invocation are WGN groups apart: neighbouring invocations
        // read neighbouring vec4s (no bank conflicts).
        for j in 0..rn4 {
            let _ = writeln!(s, "    let b{j} = b_tile[bi + {j}u * WGN];");
        }
        for i in 0..rm4 {
            for j in 0..rn4 {
                let _ = writeln!(s, "    outer4(acc, {}u, a{i}, b{j});", i * 4 * rn4 + j);
            }
        }
    }
    s.push_str("}\n");
    // Pixel group j of the block starts at tile pixel first + j * nstep.
    s.push_str(
        "fn store_block(acc: ptr<function, Acc>, nb: u32, m: u32, ty: u32, tx: u32, first: u32, nstep: u32) {\n",
    );
    for j in 0..rn4 {
        let _ = writeln!(s, "    let g{j} = first + {j}u * nstep;");
        let _ = writeln!(s, "    let oy{j} = ty + (g{j} >> TW_SHIFT);");
        let _ = writeln!(s, "    let ox{j} = tx + (g{j} & (TW - 1u));");
    }
    for r in 0..rm {
        for j in 0..rn4 {
            let o = r * rn4 + j;
            let _ = writeln!(s, "    store4(nb, m + {r}u, oy{j}, ox{j}, (*acc)[{o}]);");
        }
    }
    s.push_str("}\n");
    s
}

/// One specialisation of the kernel: everything the pipeline key and the generated part of
/// the source depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Variant {
    /// `None`: the naive kernel.
    tiles: Option<ConvTiles>,
    k: usize,
    stride: u32,
    upsample: bool,
    act: Option<Activation>,
    bias: bool,
    residual: bool,
    /// Storage of x, wt, res, out.
    storage: [StorageType; 4],
    /// Count stores outside f16's range (f16 outputs under a recorder with a range flag).
    check_range: bool,
}

impl Variant {
    /// The variant a call needs: the weights' tiles (or `None` for the naive kernel).
    #[allow(clippy::too_many_arguments)]
    fn for_call(
        caps: &Capabilities,
        tiles: Option<ConvTiles>,
        input: &Tensor,
        w: &Conv2dWeights,
        prologue: Option<&Prologue>,
        residual: Option<&Tensor>,
        out: &Tensor,
        opts: &Conv2dOptions,
    ) -> Result<Self> {
        let st = |t: &Tensor| StorageType::of(t.dtype(), caps);
        Ok(Variant {
            tiles,
            k: w.k,
            stride: opts.stride,
            upsample: opts.upsample,
            act: prologue.map(|p| p.act),
            bias: w.bias.is_some(),
            residual: residual.is_some(),
            storage: [
                st(input)?,
                st(&w.weight)?,
                residual.map(st).transpose()?.unwrap_or(StorageType::F32),
                st(out)?,
            ],
            check_range: false,
        })
    }

    fn spec(&self) -> KernelSpec {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        type Sources = HashMap<(ConvTiles, usize, u32), &'static str>;
        static SOURCES: OnceLock<Mutex<Sources>> = OnceLock::new();
        let Some(tiles) = self.tiles else {
            return NAIVE;
        };
        let mut map = SOURCES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let shape = (tiles, self.k, self.stride);
        let source = *map.entry(shape).or_insert_with(|| {
            // Leaked once per distinct key (`KernelSpec` sources are
            // `&'static str`): process-global but pure text, a handful per
            // process (see the `embed` module docs).
            let block = micro_kernel_source(&tiles, self.k as u32, self.stride);
            Box::leak(format!("{SOURCE}{block}").into_boxed_str())
        });
        KernelSpec { source, ..TILED }
    }

    fn key(&self) -> PipelineKey {
        let [x, wt, res, out] = self.storage;
        let key = PipelineKey::new(&self.spec())
            .storage("x", x)
            .storage("wt", wt)
            .storage("res", res)
            .storage("out", out)
            .constant("KS", format!("{}u", self.k))
            .constant("STRIDE", format!("{}u", self.stride))
            .constant("ACT", format!("{}u", self.act.unwrap_or_default().code()))
            .flag_if(self.upsample, "UPSAMPLE")
            .flag_if(self.act.is_some(), "PROLOGUE")
            .flag_if(self.bias, "HAS_BIAS")
            .flag_if(self.residual, "HAS_RESIDUAL")
            .flag_if(self.check_range, "CHECK_RANGE");
        match self.tiles {
            None => key.flag("NAIVE").constant("WG", format!("{NAIVE_WG}u")),
            Some(t) => key
                .constant("TM", format!("{}u", t.tm))
                .constant("TN", format!("{}u", t.tn))
                .constant("TW", format!("{}u", t.tw))
                .constant("TK", format!("{}u", t.tk))
                .constant("RM", format!("{}u", t.rm))
                .constant("RN", format!("{}u", t.rn))
                .flag_if(t.direct, "DIRECT"),
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

impl Conv2dWeights {
    /// weight: PyTorch layout `[Cout, Cin, k, k]` (k = 1 or 3) as f32; bias `[Cout]`.
    pub fn from_pytorch(
        ctx: &Context,
        weight: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
        label: &str,
    ) -> Result<Conv2dWeights> {
        let tiles = ConvTiles::for_layer(ctx.caps(), cout, k);
        Self::from_pytorch_with_tiles(ctx, weight, cout, cin, k, bias, tiles, DType::F32, label)
    }

    /// [`Conv2dWeights::from_pytorch`] with the weights stored in `dtype`
    /// (f16/bf16 halve their memory; the bias stays f32).
    #[allow(clippy::too_many_arguments)]
    pub fn from_pytorch_as(
        ctx: &Context,
        weight: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
        dtype: DType,
        label: &str,
    ) -> Result<Conv2dWeights> {
        let tiles = ConvTiles::for_layer(ctx.caps(), cout, k);
        Self::from_pytorch_with_tiles(ctx, weight, cout, cin, k, bias, tiles, dtype, label)
    }

    /// Like [`Conv2dWeights::from_pytorch`] with explicit tiles (tuning, benchmarks).
    #[allow(clippy::too_many_arguments)]
    pub fn from_pytorch_with_tiles(
        ctx: &Context,
        weight: &[f32],
        cout: usize,
        cin: usize,
        k: usize,
        bias: Option<&[f32]>,
        tiles: ConvTiles,
        dtype: DType,
        label: &str,
    ) -> Result<Conv2dWeights> {
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
        let ktot = cin * k * k;
        let tk = tiles.tk.max(1) as usize;
        let kpad = ktot.div_ceil(tk) * tk;
        let mpad = cout.div_ceil(tiles.tm as usize) * tiles.tm as usize;
        // [Cout, K] -> [Kp, Mp]: K-major so a tile row is Cout-contiguous (vec4 loads).
        let mut packed = vec![0.0f32; kpad * mpad];
        for m in 0..cout {
            for kg in 0..ktot {
                packed[kg * mpad + m] = weight[m * ktot + kg];
            }
        }
        let weight = Tensor::from_f32_as(ctx, &[kpad, mpad], &packed, dtype, label)?;
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

fn plan(
    input: &Tensor,
    w: &Conv2dWeights,
    prologue: Option<&Prologue>,
    residual: Option<&Tensor>,
    out: &Tensor,
    opts: &Conv2dOptions,
) -> Result<Plan> {
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
    let want = [n, w.cout, ho, wo];
    if out.shape() != want {
        return shape_err(format!("out is {:?}, expected {want:?}", out.shape()));
    }
    if let Some(r) = residual {
        if r.shape() != want {
            return shape_err(format!("residual is {:?}, expected {want:?}", r.shape()));
        }
    }
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
    };
    Ok(Plan {
        params,
        n,
        macs: macs(n, cin, w.cout, ho, wo, w.k),
    })
}

fn bindings<'t>(
    input: &'t Tensor,
    w: &'t Conv2dWeights,
    prologue: Option<&Prologue<'t>>,
    residual: Option<&'t Tensor>,
    out: &'t Tensor,
    range_flag: Option<&'t Tensor>,
) -> [&'t Tensor; 7] {
    let placeholder = &w.weight;
    [
        input,
        &w.weight,
        w.bias.as_ref().unwrap_or(placeholder),
        prologue.map(|p| p.affine).unwrap_or(placeholder),
        residual.unwrap_or(placeholder),
        out,
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
    let plan = plan(input, w, prologue.as_ref(), residual, out, opts)?;
    let mut variant = Variant::for_call(
        rec.ctx().caps(),
        Some(w.tiles),
        input,
        w,
        prologue.as_ref(),
        residual,
        out,
        opts,
    )?;
    let groups_xy = linear_groups(rec.ctx(), plan.params.ntiles as u64)?;
    let gz = plan.n as u64 * plan.params.mtiles as u64;
    let gz = u32::try_from(gz).map_err(|_| Error::DispatchTooLarge {
        what: "conv2d (batch x Cout tiles)".into(),
        groups: gz,
        limit: rec.ctx().caps().max_compute_workgroups_per_dimension,
    })?;
    let flag = range_flag_for(rec, &mut variant);
    let tensors = bindings(input, w, prologue.as_ref(), residual, out, flag.as_ref());
    rec.dispatch(
        &variant.spec(),
        &variant.key(),
        &plan.params,
        &tensors,
        [groups_xy[0], groups_xy[1], gz],
        plan.macs,
    )
}

/// The same convolution with one output per invocation and no workgroup-memory reuse.
/// Only for benchmarks (the speed-up ratio of the tiled kernel) and cross-checks.
pub fn conv2d_naive(
    rec: &mut Recorder,
    input: &Tensor,
    w: &Conv2dWeights,
    prologue: Option<Prologue>,
    residual: Option<&Tensor>,
    out: &Tensor,
    opts: &Conv2dOptions,
) -> Result<()> {
    let plan = plan(input, w, prologue.as_ref(), residual, out, opts)?;
    let mut variant = Variant::for_call(
        rec.ctx().caps(),
        None,
        input,
        w,
        prologue.as_ref(),
        residual,
        out,
        opts,
    )?;
    let per_image = w.cout as u64 * plan.params.npix as u64;
    let groups = linear_groups(rec.ctx(), per_image.div_ceil(NAIVE_WG as u64))?;
    let flag = range_flag_for(rec, &mut variant);
    let tensors = bindings(input, w, prologue.as_ref(), residual, out, flag.as_ref());
    rec.dispatch(
        &variant.spec(),
        &variant.key(),
        &plan.params,
        &tensors,
        [groups[0], groups[1], plan.n as u32],
        plan.macs,
    )
}

/// Plain CPU reference with the semantics of [`conv2d`].
///
/// input `[N, Cin, H, W]` (`in_shape`), weight PyTorch `[Cout, Cin, k, k]`, bias `[Cout]`,
/// prologue `([N, Cin, 2] scale/shift, activation)`, residual `[N, Cout, Ho, Wo]`.
#[allow(clippy::too_many_arguments)]
pub fn cpu_conv2d(
    input: &[f32],
    in_shape: [usize; 4],
    weight: &[f32],
    cout: usize,
    k: usize,
    bias: Option<&[f32]>,
    prologue: Option<(&[f32], Activation)>,
    residual: Option<&[f32]>,
    opts: &Conv2dOptions,
) -> Vec<f32> {
    let [n, cin, h, w] = in_shape;
    let up = if opts.upsample { 2 } else { 1 };
    let (hu, wu) = (h * up, w * up);
    let (ho, wo) = output_size(h, w, k, opts);
    // Transformed (prologue) and upsampled input, so padding stays exactly zero.
    let mut xin = vec![0.0f32; n * cin * hu * wu];
    for b in 0..n {
        for c in 0..cin {
            let (scale, shift, act) = match prologue {
                Some((aff, act)) => (aff[(b * cin + c) * 2], aff[(b * cin + c) * 2 + 1], act),
                None => (1.0, 0.0, Activation::None),
            };
            for y in 0..hu {
                for xx in 0..wu {
                    let v = input[((b * cin + c) * h + y / up) * w + xx / up];
                    xin[((b * cin + c) * hu + y) * wu + xx] = act.apply(v * scale + shift);
                }
            }
        }
    }
    let s = opts.stride as i64;
    let (pt, pl) = (opts.pad[0] as i64, opts.pad[1] as i64);
    let mut out = vec![0.0f32; n * cout * ho * wo];
    for b in 0..n {
        for m in 0..cout {
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut acc = 0.0f64;
                    for c in 0..cin {
                        for ky in 0..k {
                            let iy = oy as i64 * s - pt + ky as i64;
                            if iy < 0 || iy >= hu as i64 {
                                continue;
                            }
                            for kx in 0..k {
                                let ix = ox as i64 * s - pl + kx as i64;
                                if ix < 0 || ix >= wu as i64 {
                                    continue;
                                }
                                let xv = xin[((b * cin + c) * hu + iy as usize) * wu + ix as usize];
                                acc += (weight[((m * cin + c) * k + ky) * k + kx] * xv) as f64;
                            }
                        }
                    }
                    let o = ((b * cout + m) * ho + oy) * wo + ox;
                    let mut v = acc as f32 + bias.map_or(0.0, |bv| bv[m]);
                    if let Some(r) = residual {
                        v += r[o];
                    }
                    out[o] = v;
                }
            }
        }
    }
    out
}

/// Capabilities of a typical device of a kind (GPU or CPU adapter), for listing the
/// defaults [`ConvTiles::for_layer`] picks without such a device at hand.
fn typical_caps(cpu: bool) -> Capabilities {
    Capabilities {
        adapter_name: String::new(),
        backend: wgpu::Backend::Vulkan,
        device_type: if cpu {
            wgpu::DeviceType::Cpu
        } else {
            wgpu::DeviceType::DiscreteGpu
        },
        driver: String::new(),
        driver_info: String::new(),
        shader_f16: false,
        timestamp_query: false,
        timestamp_inside_passes: false,
        subgroup: false,
        max_storage_buffer_binding_size: 1 << 27,
        max_buffer_size: 1 << 30,
        max_compute_workgroup_storage_size: 32 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroups_per_dimension: 65535,
        max_storage_buffers_per_shader_stage: 8,
        min_storage_buffer_offset_alignment: 256,
        min_uniform_buffer_offset_alignment: 256,
        max_uniform_buffer_binding_size: 1 << 16,
    }
}

/// Every tile set [`ConvTiles::for_layer`] picks, on GPUs and on CPU adapters.
fn default_tile_sets() -> Vec<ConvTiles> {
    let mut sets = Vec::new();
    for cpu in [false, true] {
        for cout in [3, 64, 512] {
            for k in [1, 3] {
                let t = ConvTiles::for_layer(&typical_caps(cpu), cout, k);
                if !sets.contains(&t) {
                    sets.push(t);
                }
            }
        }
    }
    sets
}

/// Storage of `[x, wt, res, out]` and the f16 range check, for every call the engine's
/// layers make, per weight storage `wt` (one device has either native or packed f16):
/// - x is in the model's storage, or f32 (latents into conv_in / post_quant_conv, the f32
///   attention output into its projection, the image into the encoder's conv_in);
/// - out is in the model's storage, or f32 (attention q, k, v);
/// - a residual is always added in place, so it is stored like `out` (f32 when absent);
/// - f16 outputs are range-checked when the recorder carries a counter, and not otherwise.
fn storage_configs(residual: bool) -> Vec<([StorageType; 4], bool)> {
    let mut v = Vec::new();
    for wt in StorageType::ALL {
        let mut xs = vec![wt];
        let mut outs = vec![wt];
        if wt != StorageType::F32 {
            xs.push(StorageType::F32);
            outs.push(StorageType::F32);
        }
        for &x in &xs {
            for &out in &outs {
                let res = if residual { out } else { StorageType::F32 };
                let half_out = matches!(out, StorageType::F16 | StorageType::F16Packed);
                for check_range in [false, true] {
                    if check_range && !half_out {
                        continue;
                    }
                    v.push(([x, wt, res, out], check_range));
                }
            }
        }
    }
    v
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    // The naive kernel and every default tile set, with every option combination and
    // every storage combination the engine's layers use.
    let tile_sets: Vec<Option<ConvTiles>> = std::iter::once(None)
        .chain(default_tile_sets().into_iter().map(Some))
        .collect();
    let acts = [
        None,
        Some(Activation::None),
        Some(Activation::Silu),
        Some(Activation::Relu),
    ];
    for &tiles in &tile_sets {
        for k in [1, 3] {
            for stride in [1, 2] {
                for upsample in [false, true] {
                    for act in acts {
                        for bias in [false, true] {
                            for residual in [false, true] {
                                for (storage, check_range) in storage_configs(residual) {
                                    let var = Variant {
                                        tiles,
                                        k,
                                        stride,
                                        upsample,
                                        act,
                                        bias,
                                        residual,
                                        storage,
                                        check_range,
                                    };
                                    v.push((var.spec(), var.key()));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    /// Small tiles of both kinds: they compile fast on lavapipe and put tile edges everywhere.
    const SMALL_DIRECT: ConvTiles = ConvTiles {
        tm: 8,
        tn: 16,
        tw: 8,
        tk: 0,
        rm: 4,
        rn: 4,
        direct: true,
    };
    const SMALL_SHARED: ConvTiles = ConvTiles {
        tm: 8,
        tn: 32,
        tw: 8,
        tk: 4,
        rm: 4,
        rn: 4,
        direct: false,
    };

    /// One GPU-vs-CPU comparison. Tolerance: |got - want| <= 1e-5 + 1e-4 |want| (f32).
    #[derive(Clone, Copy)]
    struct Case {
        n: usize,
        cin: usize,
        h: usize,
        w: usize,
        cout: usize,
        k: usize,
        opts: Conv2dOptions,
        bias: bool,
        act: Option<Activation>,
        residual: bool,
        in_place: bool,
        naive: bool,
        /// `None`: the tiles the engine picks for the test device.
        tiles: Option<ConvTiles>,
    }

    impl Case {
        fn new(n: usize, cin: usize, h: usize, w: usize, cout: usize, k: usize) -> Case {
            Case {
                n,
                cin,
                h,
                w,
                cout,
                k,
                opts: Conv2dOptions::same(k as u32),
                bias: true,
                act: None,
                residual: false,
                in_place: false,
                naive: false,
                tiles: None,
            }
        }

        /// Runs the case with the small tiles of both kinds.
        fn run_small(self, seed: u64) {
            for tiles in [SMALL_DIRECT, SMALL_SHARED] {
                Case {
                    tiles: Some(tiles),
                    ..self
                }
                .run(seed);
            }
        }

        fn run(&self, seed: u64) {
            self.run_in(&test_context(), DType::F32, seed);
        }

        /// Runs with activations, weights and residual stored in `dt`; the CPU
        /// reference sees the same rounded inputs, so the error is the output's
        /// rounding (plus f32 summation order).
        fn run_in(&self, ctx: &Context, dt: DType, seed: u64) {
            let ctx = ctx.clone();
            let Case {
                n,
                cin,
                h,
                w,
                cout,
                k,
                ..
            } = *self;
            let what = format!(
                "[{n},{cin},{h},{w}]->{cout} k{k} {:?} bias {} act {:?} res {} in-place {} naive {} tiles {:?}",
                self.opts, self.bias, self.act, self.residual, self.in_place, self.naive, self.tiles
            );
            let round = |v: Vec<f32>| -> Vec<f32> {
                v.into_iter()
                    .map(|x| crate::gpu::storage::round_through(x, dt))
                    .collect()
            };
            let x = round(rand_vec(n * cin * h * w, seed, 1.0));
            // Weights scaled like a trained layer's so sums stay O(1).
            let wscale = 1.0 / ((cin * k * k) as f32).sqrt();
            let wv = round(rand_vec(cout * cin * k * k, seed + 1, wscale));
            let bv = rand_vec(cout, seed + 2, 0.5);
            let aff: Vec<f32> = rand_vec(n * cin * 2, seed + 3, 1.0)
                .chunks(2)
                .flat_map(|s| [1.0 + 0.5 * s[0], s[1]])
                .collect();
            let (ho, wo) = output_size(h, w, k, &self.opts);
            let rv = round(rand_vec(n * cout * ho * wo, seed + 4, 1.0));
            let want = cpu_conv2d(
                &x,
                [n, cin, h, w],
                &wv,
                cout,
                k,
                self.bias.then_some(&bv[..]),
                self.act.map(|a| (&aff[..], a)),
                self.residual.then_some(&rv[..]),
                &self.opts,
            );

            let xt = Tensor::from_f32_as(&ctx, &[n, cin, h, w], &x, dt, "x").unwrap();
            let bias = self.bias.then_some(&bv[..]);
            let weights = match self.tiles {
                Some(t) => Conv2dWeights::from_pytorch_with_tiles(
                    &ctx, &wv, cout, cin, k, bias, t, dt, "w",
                ),
                None => Conv2dWeights::from_pytorch_as(&ctx, &wv, cout, cin, k, bias, dt, "w"),
            }
            .unwrap();
            let at = Tensor::from_f32(&ctx, &[n, cin, 2], &aff, "affine").unwrap();
            let rt = Tensor::from_f32_as(&ctx, &[n, cout, ho, wo], &rv, dt, "res").unwrap();
            let out = if self.in_place {
                rt.clone()
            } else {
                Tensor::empty(&ctx, &[n, cout, ho, wo], dt, "out").unwrap()
            };
            let prologue = self.act.map(|act| Prologue { affine: &at, act });
            let residual = self.residual.then_some(&rt);
            let mut rec = Recorder::new(&ctx);
            let f = if self.naive { conv2d_naive } else { conv2d };
            f(
                &mut rec, &xt, &weights, prologue, residual, &out, &self.opts,
            )
            .unwrap();
            assert_eq!(rec.labels()[0].macs, macs(n, cin, cout, ho, wo, k));
            rec.submit().unwrap();
            // (atol, rtol): f32 1e-5 + 1e-4 relative; half storage adds the output's rounding.
            let (atol, rtol) = match dt {
                DType::F32 => (1e-5, 1e-4),
                DType::F16 => (2e-3, 2e-3),
                _ => (1e-2, 1e-2),
            };
            let what = format!(
                "{what} {} (shader-f16 {})",
                dt.name(),
                ctx.caps().shader_f16
            );
            assert_close(&out.to_f32(&ctx).unwrap(), &want, atol, rtol, &what);
        }
    }

    /// Every storage path (native f16, packed f16, packed bf16) through both
    /// tile kinds, the naive kernel and a fused upsample + prologue +
    /// in-place residual block, on odd shapes.
    #[test]
    fn half_storage_matches_cpu() {
        let up = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        let block = Case {
            act: Some(Activation::Silu),
            residual: true,
            in_place: true,
            opts: up,
            ..Case::new(1, 37, 9, 11, 67, 3)
        };
        for (ctx, dt) in crate::testing::dtype_contexts() {
            if dt == DType::F32 {
                continue;
            }
            for tiles in [SMALL_DIRECT, SMALL_SHARED] {
                let tiles = Some(tiles);
                Case {
                    tiles,
                    ..Case::new(2, 37, 19, 23, 67, 3)
                }
                .run_in(&ctx, dt, 50);
                Case { tiles, ..block }.run_in(&ctx, dt, 51);
            }
            Case {
                naive: true,
                ..Case::new(1, 5, 7, 9, 3, 1)
            }
            .run_in(&ctx, dt, 52);
            block.run_in(&ctx, dt, 53);
        }
    }

    #[test]
    fn conv3x3_odd_shapes_match_cpu() {
        Case::new(1, 3, 7, 5, 4, 3).run_small(1);
        Case::new(2, 37, 19, 23, 67, 3).run_small(2);
        Case {
            bias: false,
            ..Case::new(1, 64, 9, 11, 67, 3)
        }
        .run_small(3);
    }

    #[test]
    fn conv1x1_odd_shapes_match_cpu() {
        Case::new(1, 64, 9, 11, 67, 1).run_small(4);
        Case {
            bias: false,
            ..Case::new(2, 37, 19, 23, 5, 1)
        }
        .run_small(5);
        Case::new(1, 3, 7, 5, 4, 1).run_small(6);
    }

    #[test]
    fn stride2_and_asymmetric_padding_match_cpu() {
        // The VAE encoder's downsampling conv: pad (top 0, left 0, bottom 1, right 1), stride 2.
        let enc = Conv2dOptions {
            stride: 2,
            pad: [0, 0, 1, 1],
            upsample: false,
        };
        Case {
            opts: enc,
            ..Case::new(2, 37, 19, 23, 67, 3)
        }
        .run_small(7);
        let sym = Conv2dOptions {
            stride: 2,
            pad: [1; 4],
            upsample: false,
        };
        Case {
            opts: sym,
            bias: false,
            ..Case::new(1, 5, 9, 12, 7, 3)
        }
        .run_small(9);
        let one = Conv2dOptions {
            stride: 2,
            pad: [0; 4],
            upsample: false,
        };
        Case {
            opts: one,
            ..Case::new(1, 6, 9, 11, 10, 1)
        }
        .run_small(10);
        // Asymmetric padding at stride 1 (wider on the left and bottom).
        let asym = Conv2dOptions {
            stride: 1,
            pad: [0, 2, 1, 0],
            upsample: false,
        };
        Case {
            opts: asym,
            ..Case::new(1, 6, 8, 9, 5, 3)
        }
        .run_small(8);
    }

    #[test]
    fn upsample_matches_cpu() {
        let up = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        Case {
            opts: up,
            ..Case::new(2, 37, 7, 9, 67, 3)
        }
        .run_small(11);
        let up1 = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(1)
        };
        Case {
            opts: up1,
            ..Case::new(1, 6, 5, 3, 9, 1)
        }
        .run_small(12);
    }

    #[test]
    fn prologue_silu_relu_match_cpu() {
        for (i, act) in [Activation::Silu, Activation::Relu, Activation::None]
            .into_iter()
            .enumerate()
        {
            Case {
                act: Some(act),
                ..Case::new(2, 37, 9, 13, 67, 3)
            }
            .run_small(20 + i as u64);
        }
        // With upsample and padding: padded taps stay exactly 0 after the transform.
        let up = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        Case {
            act: Some(Activation::Silu),
            opts: up,
            ..Case::new(1, 8, 5, 6, 12, 3)
        }
        .run_small(24);
    }

    #[test]
    fn residual_and_in_place_match_cpu() {
        Case {
            residual: true,
            ..Case::new(2, 37, 19, 23, 67, 3)
        }
        .run_small(30);
        let in_place = Case {
            residual: true,
            in_place: true,
            ..Case::new(1, 64, 9, 11, 67, 3)
        };
        Case {
            act: Some(Activation::Silu),
            ..in_place
        }
        .run_small(31);
        Case {
            bias: false,
            k: 1,
            opts: Conv2dOptions::same(1),
            ..in_place
        }
        .run_small(32);
    }

    #[test]
    fn engine_default_tiles_match_cpu() {
        // What the engine picks for the test device (lavapipe: direct, 16 x 16 blocks).
        Case::new(2, 37, 19, 23, 67, 3).run(40);
        Case {
            bias: false,
            ..Case::new(1, 64, 9, 11, 67, 1)
        }
        .run(41);
        let up = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        let block = Case {
            act: Some(Activation::Silu),
            residual: true,
            in_place: true,
            opts: up,
            ..Case::new(1, 40, 9, 21, 36, 3)
        };
        block.run(42);
    }

    #[test]
    fn gpu_default_tiles_match_cpu() {
        // What the engine picks on GPUs (workgroup-memory tiles), run here too.
        let gpu = typical_caps(false);
        let big = ConvTiles::for_layer(&gpu, 512, 3);
        Case {
            tiles: Some(big),
            ..Case::new(2, 37, 19, 23, 67, 3)
        }
        .run(43);
        let enc = Conv2dOptions {
            stride: 2,
            pad: [0, 0, 1, 1],
            upsample: false,
        };
        let mid = ConvTiles::for_layer(&gpu, 64, 3);
        Case {
            tiles: Some(mid),
            opts: enc,
            act: Some(Activation::Relu),
            residual: true,
            ..Case::new(1, 20, 33, 35, 40, 3)
        }
        .run(44);
        let small = ConvTiles::for_layer(&gpu, 3, 3);
        Case {
            tiles: Some(small),
            act: Some(Activation::Silu),
            ..Case::new(1, 64, 17, 19, 3, 3)
        }
        .run(45);
    }

    #[test]
    fn conv_out_three_channels_matches_cpu() {
        // The VAE's conv_out: Cout = 3 after a GroupNorm + SiLU prologue.
        Case {
            act: Some(Activation::Silu),
            ..Case::new(1, 64, 17, 19, 3, 3)
        }
        .run(46);
        Case::new(2, 16, 9, 7, 3, 3).run_small(47);
    }

    #[test]
    fn naive_kernel_matches_cpu() {
        Case {
            naive: true,
            ..Case::new(2, 37, 9, 13, 67, 3)
        }
        .run(50);
        let enc = Conv2dOptions {
            stride: 2,
            pad: [0, 0, 1, 1],
            upsample: false,
        };
        Case {
            naive: true,
            opts: enc,
            residual: true,
            act: Some(Activation::Relu),
            ..Case::new(1, 6, 9, 11, 10, 3)
        }
        .run(51);
        let up = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        Case {
            naive: true,
            opts: up,
            act: Some(Activation::Silu),
            ..Case::new(1, 5, 4, 6, 7, 3)
        }
        .run(52);
    }

    #[test]
    fn output_size_and_macs() {
        assert_eq!(output_size(64, 64, 3, &Conv2dOptions::same(3)), (64, 64));
        let enc = Conv2dOptions {
            stride: 2,
            pad: [0, 0, 1, 1],
            upsample: false,
        };
        assert_eq!(output_size(512, 512, 3, &enc), (256, 256));
        let up = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        assert_eq!(output_size(64, 32, 3, &up), (128, 64));
        assert_eq!(output_size(7, 5, 1, &Conv2dOptions::same(1)), (7, 5));
        assert_eq!(macs(1, 512, 512, 64, 64, 3), 512 * 512 * 64 * 64 * 9);
    }

    #[test]
    fn bad_tiles_are_rejected() {
        let caps = typical_caps(false);
        for t in default_tile_sets() {
            t.check(&caps).unwrap();
        }
        let ok = SMALL_SHARED;
        for bad in [
            ConvTiles { rm: 6, ..ok },
            ConvTiles { tk: 3, ..ok },
            ConvTiles { tw: 12, ..ok },
            ConvTiles { tm: 12, ..ok },
            ConvTiles {
                tm: 4096,
                rm: 4,
                ..ok
            },
        ] {
            assert!(
                matches!(bad.check(&caps), Err(Error::Unsupported(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let ctx = test_context();
        let w =
            Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 9], 4, 3, 3, None, "w").unwrap();
        let x = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::F32, "x").unwrap();
        let out = Tensor::empty(&ctx, &[1, 4, 7, 5], DType::F32, "out").unwrap();
        let opts = Conv2dOptions::same(3);
        let is_shape = |r: Result<()>| matches!(r, Err(Error::Shape { .. }));
        let mut rec = Recorder::new(&ctx);
        // Wrong channel count.
        let x4 = Tensor::empty(&ctx, &[1, 4, 7, 5], DType::F32, "x4").unwrap();
        assert!(is_shape(conv2d(&mut rec, &x4, &w, None, None, &out, &opts)));
        // Wrong output size.
        let bad_out = Tensor::empty(&ctx, &[1, 4, 7, 6], DType::F32, "o").unwrap();
        assert!(is_shape(conv2d(
            &mut rec, &x, &w, None, None, &bad_out, &opts
        )));
        // Not 4-D.
        let x3 = Tensor::empty(&ctx, &[3, 7, 5], DType::F32, "x3").unwrap();
        assert!(is_shape(conv2d(&mut rec, &x3, &w, None, None, &out, &opts)));
        // Residual of another shape.
        assert!(is_shape(conv2d(
            &mut rec,
            &x,
            &w,
            None,
            Some(&bad_out),
            &out,
            &opts
        )));
        // Affine of another shape.
        let aff = Tensor::empty(&ctx, &[1, 4, 2], DType::F32, "aff").unwrap();
        let pro = Prologue {
            affine: &aff,
            act: Activation::Silu,
        };
        assert!(is_shape(conv2d(
            &mut rec,
            &x,
            &w,
            Some(pro),
            None,
            &out,
            &opts
        )));
        // Stride 3.
        let s3 = Conv2dOptions { stride: 3, ..opts };
        assert!(is_shape(conv2d(&mut rec, &x, &w, None, None, &out, &s3)));
        // Output aliasing the input.
        let w33 =
            Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 3 * 3 * 9], 3, 3, 3, None, "w").unwrap();
        let x33 = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::F32, "x33").unwrap();
        assert!(is_shape(conv2d(
            &mut rec, &x33, &w33, None, None, &x33, &opts
        )));
        // Bad weights.
        assert!(matches!(
            Conv2dWeights::from_pytorch(&ctx, &[0.0; 10], 4, 3, 3, None, "w"),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 25], 4, 3, 5, None, "w"),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 9], 4, 3, 3, Some(&[0.0; 3]), "w"),
            Err(Error::Shape { .. })
        ));
        assert!(rec.labels().is_empty());
    }
}
