//! The model's layer lists, read from the decoders' graphs: each op's
//! output shape is propagated from the input (conv output sizes, fused
//! up-samples, Wan's time up-sampling), and each conv, causal-conv tap,
//! attention projection and matmul, and bandwidth-only pass becomes a
//! [`Layer`]. The presets load on the null device ([`Context::null`]):
//! zero-valued host weights, no device memory, no kernels.

use super::{Gemm, InputReads, Layer, LayerKind, Pass, Work};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context};
use crate::kernels::conv2d::output_size;
use crate::memory::Policy;
use crate::models::graph::{Graph, Op, Residual};
use crate::models::{ImageDecoder, LoadOptions, Precision, WanDecoder};
use crate::tensor::DType;

/// Which decoder a workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderKind {
    /// An AutoencoderKL preset (`sd15`, `sdxl`, `flux1`, …).
    Image(&'static str),
    /// The Wan 2.1 video VAE (`preset:wan21`).
    Wan21,
}

/// One decode the model covers: a model at an output size.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Model label (`SD1.5`, `SDXL`, `FLUX.1`, `Wan 2.1`).
    pub model: &'static str,
    /// Output height, pixels.
    pub height: usize,
    /// Output width, pixels.
    pub width: usize,
    /// Output frames (1 for images).
    pub frames: usize,
    /// Its rows.
    pub layers: Vec<Layer>,
}

impl Workload {
    /// `512x512`, or `480x832x81f` for a video.
    pub fn size(&self) -> String {
        if self.frames > 1 {
            format!("{}x{}x{}f", self.height, self.width, self.frames)
        } else {
            format!("{}x{}", self.height, self.width)
        }
    }
}

/// The decodes of the report: SD1.5, SDXL and FLUX.1 at 512² and 1024², Wan
/// 2.1 at 480×832 with 21 latent frames (81 output frames).
pub fn workloads() -> Result<Vec<Workload>> {
    let mut out = Vec::new();
    for (label, preset) in [("SD1.5", "sd15"), ("SDXL", "sdxl"), ("FLUX.1", "flux1")] {
        for size in [512, 1024] {
            out.push(workload(
                label,
                DecoderKind::Image(preset),
                (size, size),
                1,
            )?);
        }
    }
    out.push(workload("Wan 2.1", DecoderKind::Wan21, (480, 832), 21)?);
    Ok(out)
}

/// The layers of `decoder` producing `(height, width)` outputs from
/// `latent_frames` latent frames (images: the batch, 1 in the report).
pub fn workload(
    model: &'static str,
    decoder: DecoderKind,
    (height, width): (usize, usize),
    latent_frames: usize,
) -> Result<Workload> {
    let null = Context::null(Capabilities::reference_gpu(), Policy::Exact.new_pool());
    let (layers, frames) = match decoder {
        DecoderKind::Image(preset) => {
            let load = LoadOptions {
                precision: Precision::F16,
                ..Default::default()
            };
            let vae = ImageDecoder::load(&null, &format!("preset:{preset}"), &load)?;
            let up = vae.upscale();
            let input = [
                latent_frames,
                vae.latent_channels(),
                height / up,
                width / up,
            ];
            (layers(vae.graph(), input)?, 1)
        }
        DecoderKind::Wan21 => {
            let wan = WanDecoder::open(&null, "preset:wan21", DType::F16, 0)?;
            let up = wan.upscale();
            let input = [
                latent_frames,
                wan.latent_channels(),
                height / up,
                width / up,
            ];
            (layers(wan.graph(), input)?, wan.frames_out(latent_frames))
        }
    };
    Ok(Workload {
        model,
        height,
        width,
        frames,
        layers,
    })
}

/// The rows of `graph` run on an input of `[N, C, h, w]` (`N`: the batch,
/// or a video's latent frames with time as the batch, decoded whole).
pub(crate) fn layers(graph: &Graph, input: [usize; 4]) -> Result<Vec<Layer>> {
    let ops = graph.ops();
    // The section of an op: the name of the next golden tap (AutoencoderKL
    // decoders name their sections so), `decoder.` dropped.
    let mut sections = vec![String::new(); ops.len()];
    let mut next = String::new();
    for (i, op) in ops.iter().enumerate().rev() {
        if let Op::Tap { name, .. } = op {
            next = name.strip_prefix("decoder.").unwrap_or(name).to_string();
        }
        sections[i] = next.clone();
    }
    let mut shapes: Vec<Option<[usize; 4]>> = vec![None; graph.tensors()];
    shapes[graph.input().0] = Some(input);
    let mut rows = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let shape = |t: crate::models::graph::TensorId| {
            shapes[t.0].ok_or_else(|| {
                Error::Internal(format!("perf model: op {i} reads {t:?} of unknown shape"))
            })
        };
        let mut push = |kind: LayerKind, work: Work| {
            rows.push(Layer {
                op: i,
                section: sections[i].clone(),
                kind,
                work,
            })
        };
        let pass = |name, [n, c, h, w]: [usize; 4], reads: u32, writes: u32| {
            Work::Pass(Pass {
                name,
                elements: (n * c * h * w) as u64,
                reads,
                writes,
            })
        };
        let out: Option<[usize; 4]> = match op {
            Op::Identity { .. } | Op::Tap { .. } => None,
            Op::PixelUnshuffle { x, factor } => {
                let [n, c, h, w] = shape(*x)?;
                let f = (*factor).max(1);
                let s = [n, c * f * f, h / f, w / f];
                push(LayerKind::Pass, pass("pixel_unshuffle", s, 1, 1));
                Some(s)
            }
            Op::Tokens(_) => {
                return Err(Error::Unsupported(
                    "the paper GPU model covers convolutional decoders, not transformer decoders (MiniMax-H3)".into(),
                ))
            }
            Op::Map { x, .. } | Op::TimeShift { x, .. } => {
                let s = shape(*x)?;
                let name = if matches!(op, Op::Map { .. }) {
                    "map"
                } else {
                    "time_shift"
                };
                push(LayerKind::Pass, pass(name, s, 1, 1));
                Some(s)
            }
            Op::Stats { x, .. } => {
                push(LayerKind::Pass, pass("gn_stats", shape(*x)?, 1, 0));
                None
            }
            Op::RmsNorm { x, .. } => {
                let s = shape(*x)?;
                push(LayerKind::Pass, pass("rms_norm", s, 1, 1));
                Some(s)
            }
            Op::DupUp { x, .. } | Op::PixelShuffle { x, .. } => {
                let [n, c, h, w] = shape(*x)?;
                let (channels, (ft, f)) = op.space_factors(c)?;
                // The whole video at once: its first frame is a first chunk.
                let lead = match op {
                    Op::DupUp {
                        first_of: Some(_), ..
                    } => n.min(1),
                    _ => n,
                };
                let frames = crate::kernels::dup_up::frames_out(n, ft, lead);
                let s = [frames, channels, f * h, f * w];
                let name = if matches!(op, Op::DupUp { .. }) {
                    "dup_up"
                } else {
                    "pixel_shuffle"
                };
                push(LayerKind::Pass, pass(name, s, 1, 1));
                Some(s)
            }
            Op::TimeGrow { x, stride } => {
                let [t, c, h, w] = shape(*x)?;
                Some([t * stride, c / stride, h, w])
            }
            Op::TimePool { x, stride } => {
                let [t, c, h, w] = shape(*x)?;
                Some([t / stride, c * stride, h, w])
            }
            Op::Conv(c) => {
                let [n, cin, h, w] = shape(c.x)?;
                if let Residual::Shortcut(s, sc) = c.residual {
                    let [_, scin, sh, sw] = shape(s)?;
                    let mut g = Gemm::conv(scin, graph.conv(sc).cout(), 1, (sh, sw));
                    g.frames = n;
                    push(LayerKind::Shortcut, Work::Gemm(g));
                }
                let wt = graph.conv(c.w);
                let k = wt.k();
                let opts = c.geometry.options(k);
                let (ho, wo) = output_size(h, w, k, &opts);
                let mut g = Gemm::conv(cin, wt.cout(), k, (h, w));
                g.stride = opts.stride as usize;
                g.upsample = opts.upsample;
                (g.ho, g.wo, g.frames) = (ho, wo, n);
                g.residual = c.residual != Residual::None;
                g.prologue = c.prologue.is_some();
                push(LayerKind::Conv, Work::Gemm(g));
                Some([n, wt.cout(), ho, wo])
            }
            Op::CausalConv { x, w, residual, .. } => {
                let [n, cin, h, wd] = shape(*x)?;
                if let Residual::Shortcut(s, sc) = residual {
                    let [_, scin, sh, sw] = shape(*s)?;
                    let mut g = Gemm::conv(scin, graph.conv(*sc).cout(), 1, (sh, sw));
                    g.frames = n;
                    push(LayerKind::Shortcut, Work::Gemm(g));
                }
                let taps = &graph.causal(*w).taps;
                let cout = taps.first().map_or(0, |t| t.cout());
                // The current frame's tap first (with the residual, if
                // any), then each earlier tap accumulating into the output.
                for (j, tap) in taps.iter().rev().enumerate() {
                    let mut g = Gemm::conv(cin, tap.cout(), tap.k(), (h, wd));
                    g.frames = n;
                    g.residual = j > 0 || *residual != Residual::None;
                    push(LayerKind::CausalTap, Work::Gemm(g));
                }
                Some([n, cout, h, wd])
            }
            Op::TimeUpsample {
                x, w, up, residual, ..
            } => {
                // The whole video at once: the first frame skips the time
                // conv; every other frame gives two.
                let [t, c, h, wd] = shape(*x)?;
                let later = t.saturating_sub(1);
                for (j, tap) in graph.causal(*w).taps.iter().rev().enumerate() {
                    let mut g = Gemm::conv(c, tap.cout(), tap.k(), (h, wd));
                    g.frames = later;
                    g.residual = j > 0;
                    if later > 0 {
                        push(LayerKind::TimeConv, Work::Gemm(g));
                    }
                }
                let upw = graph.conv(*up);
                let frames = t.min(1) + 2 * later;
                let mut g = Gemm::conv(c, upw.cout(), upw.k(), (h, wd));
                g.upsample = true;
                g.residual = residual.is_some();
                (g.ho, g.wo, g.frames) = (2 * h, 2 * wd, frames);
                push(LayerKind::Conv, Work::Gemm(g));
                Some([frames, upw.cout(), 2 * h, 2 * wd])
            }
            Op::Attention {
                x, q, k, v, out, ..
            } => {
                let s = shape(*x)?;
                attention(graph, s, [*q, *k, *v, *out], true, &mut push);
                Some(s)
            }
            Op::FrameAttention {
                x, q, k, v, out, ..
            } => {
                let s = shape(*x)?;
                attention(graph, s, [*q, *k, *v, *out], false, &mut push);
                Some(s)
            }
        };
        if let (Some(t), Some(s)) = (graph.out(i), out) {
            shapes[t.0] = Some(s);
        } else if let Some(t) = graph.out(i) {
            // Affines and statistics: small, never read by a modelled row.
            shapes[t.0] = Some([0; 4]);
        }
    }
    Ok(rows)
}

/// The rows of one single-head attention over each plane's tokens: q, k, v
/// 1×1 convs (`prologue`: the GroupNorm affine applied on load), QKᵀ, PV,
/// and the output projection added into the residual.
fn attention(
    graph: &Graph,
    [n, c, h, w]: [usize; 4],
    [q, k, v, out]: [crate::models::graph::ConvId; 4],
    prologue: bool,
    push: &mut impl FnMut(LayerKind, Work),
) {
    for id in [q, k, v] {
        let wt = graph.conv(id);
        let mut g = Gemm::conv(wt.cin(), wt.cout(), 1, (h, w));
        g.frames = n;
        g.prologue = prologue;
        push(LayerKind::AttnProj, Work::Gemm(g));
    }
    let tokens = h * w;
    // QKᵀ: M = keys, N = queries (the token grid), K = C; scores on chip.
    let mut qk = Gemm::conv(c, tokens, 1, (h, w));
    qk.frames = n;
    qk.input = InputReads::PerColumn;
    qk.writes_output = false;
    qk.a_per_frame = true;
    push(LayerKind::AttnQk, Work::Gemm(qk));
    // PV: M = C, N = queries, K = keys; P on chip, V streamed.
    let mut pv = Gemm::conv(tokens, c, 1, (h, w));
    pv.frames = n;
    pv.input = InputReads::None;
    pv.a_per_frame = true;
    push(LayerKind::AttnPv, Work::Gemm(pv));
    let wt = graph.conv(out);
    let mut g = Gemm::conv(wt.cin(), wt.cout(), 1, (h, w));
    g.frames = n;
    g.residual = true;
    push(LayerKind::AttnProj, Work::Gemm(g));
}
