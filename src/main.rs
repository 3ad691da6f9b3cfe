//! The `wgvae` command line: thin — parses, calls the library, prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::json;
use wgvae::gpu::{AdapterChoice, Context, ContextOptions};
use wgvae::memory::Policy;
use wgvae::tiling::{Progress, TileMode, Tiling};
use wgvae::{DecodeOptions, LoadOptions, Vae};

#[derive(Parser)]
#[command(
    name = "wgvae",
    version,
    about = "Decode diffusion-model latents into images on any GPU wgpu runs on"
)]
struct Cli {
    /// Adapter to use: an index from `wgvae info` or part of its name
    /// (default: best GPU; also WGPU_ADAPTER_NAME / WGPU_BACKEND).
    #[arg(long, global = true)]
    adapter: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List adapters, the chosen one, its features and limits.
    Info {
        #[arg(long)]
        json: bool,
    },
    /// Decode latents (.npy / .safetensors) to PNG.
    Decode(DecodeArgs),
    /// Encode an image to latents (.npy / .safetensors).
    Encode(EncodeArgs),
    /// Predict a decode's (or with --encode an encode's) memory without running it (weights, peak allocated, peak reserved).
    Memory(MemoryArgs),
    /// Benchmarks with metadata, CSV + Markdown + SVG.
    Bench {
        #[command(subcommand)]
        which: BenchKind,
    },
    /// Write reports (CSV + Markdown + SVG).
    Report {
        #[command(subcommand)]
        which: ReportKind,
    },
}

#[derive(Subcommand)]
enum BenchKind {
    /// Warm-up then timed decodes per size: ms, images/s, MP/s, GFLOP/s, peak memory.
    Decode(DecodeBenchArgs),
    /// Process start → first image in a fresh child process, with an empty and then a
    /// warm pipeline cache directory, beside the steady-state decode time.
    ColdStart(ColdStartArgs),
    /// Streamed frame decoding (batched chunks, double-buffered RGBA8 readback) against a
    /// one-frame-at-a-time loop: frames/s, per-frame latency mean / P99 / max, peak memory.
    Frames(FramesBenchArgs),
    /// Attention: a VGGT-shaped frame sweep and a LongLive-shaped streaming benchmark.
    Attention {
        #[command(subcommand)]
        which: AttentionBenchKind,
    },
}

#[derive(clap::Args)]
struct DecodeBenchArgs {
    #[arg(long)]
    vae: String,
    /// Output sizes in pixels (square), comma-separated.
    #[arg(long, default_value = "128,256", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Storage dtypes, comma-separated: f32, f16, bf16, auto.
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    dtypes: Vec<String>,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Tiling of every decode (default: off, so sizes compare untiled kernels).
    #[command(flatten)]
    tiles: BenchTileArgs,
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

/// `--tile` for benchmarks: as [`TileArgs`], default off.
#[derive(clap::Args, Clone)]
struct BenchTileArgs {
    /// off, auto, exact or fast (see `wgvae decode --help`).
    #[arg(long, default_value = "off")]
    tile: String,
    /// Tile side in image pixels (multiple of 8).
    #[arg(long)]
    tile_size: Option<usize>,
    /// fast: overlap of neighbouring tiles in image pixels.
    #[arg(long)]
    tile_overlap: Option<usize>,
    /// Peak device memory (as `wgvae decode --max-memory`).
    #[arg(long)]
    max_memory: Option<String>,
}

impl BenchTileArgs {
    fn tiling(&self) -> wgvae::Result<Tiling> {
        TileArgs {
            tile: self.tile.clone(),
            tile_size: self.tile_size,
            tile_overlap: self.tile_overlap,
            max_memory: self.max_memory.clone(),
            max_host_memory: None,
            tile_mid_block: false,
        }
        .tiling()
    }

    /// The settings as given, for report headers.
    fn describe(&self) -> String {
        let mut s = format!("tile {}", self.tile);
        if let Some(px) = self.tile_size {
            s += &format!(", tile size {px}");
        }
        if let Some(o) = self.tile_overlap {
            s += &format!(", overlap {o}");
        }
        if let Some(m) = &self.max_memory {
            s += &format!(", max memory {m}");
        }
        s
    }
}

#[derive(clap::Args)]
struct ColdStartArgs {
    #[arg(long)]
    vae: String,
    /// Square output size in pixels.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Storage dtype: f32, f16, bf16 or auto.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Steady-state decodes in the warm process (median reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Pipeline cache directory the children use (emptied first; default: a fresh
    /// directory under the system's temporary folder, removed afterwards).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The driver's own shader cache (Mesa's, in a fresh temporary directory) in the
    /// children: off (wgvae's pipeline cache alone), on, or both pairs.
    #[arg(long, default_value = "both", value_parser = ["off", "on", "both"])]
    driver_cache: String,
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

#[derive(Subcommand)]
enum AttentionBenchKind {
    /// Frames × tokens per frame, global vs windowed (sink + window) vs windowed through a ring
    /// KV cache: time, GFLOP/s, peak allocated / reserved (dry-run predictions beyond the budget), KV bytes.
    Sweep {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        #[arg(long, default_value = "2,4,8,16,32,64,128,256", value_delimiter = ',')]
        frames: Vec<usize>,
        #[arg(long, default_value = "64,256,1024,1369", value_delimiter = ',')]
        tokens_per_frame: Vec<usize>,
        /// Modes, comma-separated: global, window, window-ring.
        #[arg(
            long,
            default_value = "global,window,window-ring",
            value_delimiter = ','
        )]
        modes: Vec<String>,
        #[arg(long, default_value_t = 128)]
        embed: usize,
        #[arg(long, default_value_t = 16)]
        heads: usize,
        #[arg(long, default_value_t = 1)]
        sink: usize,
        #[arg(long, default_value_t = 8)]
        window: usize,
        /// Seconds a cell may take (all runs); longer cells are predicted, not run.
        #[arg(long, default_value_t = 10.0)]
        budget: f64,
        #[arg(long, default_value_t = 2)]
        runs: usize,
        #[arg(long, default_value = "caching")]
        policy: String,
        /// The published VGGT sweep (read, never copied).
        #[arg(long, default_value = "../shared/reference/vggt_vram_sweep.csv")]
        reference: PathBuf,
    },
    /// Chunks of 3 frames attending to 3 sink + 9 window frames (12 heads × 128) through a KV cache.
    Stream {
        /// baseline (growing, copying cache), static-kv (ring), int8-kv (ring + int8), or all.
        #[arg(long)]
        preset: String,
        #[arg(long, default_value_t = 100)]
        chunks: usize,
        /// Tokens per frame = 1560 × scale (default: 1 on a GPU, 0.02 on a CPU adapter).
        #[arg(long)]
        scale: Option<f64>,
        /// Warm-up chunks reported separately (default: until the cache is full, plus one).
        #[arg(long)]
        warmup: Option<usize>,
        #[arg(long, default_value = "caching")]
        policy: String,
        /// Also write attention_stream.{csv,md}, per-chunk CSV and SVGs here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print one JSON object on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// VAE mid-block attention (one head, d = 512) at T = h·w tokens: time, GFLOP/s, memory.
    Midblock {
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// Token counts (1024, 4096, 16384 = 256², 512², 1024² decodes).
        #[arg(long, default_value = "1024,4096,16384", value_delimiter = ',')]
        tokens: Vec<usize>,
        #[arg(long, default_value_t = 512)]
        head_dim: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Seconds a size may take (warm-up + runs); longer sizes are marked not run.
        #[arg(long, default_value_t = 300.0)]
        budget: f64,
        #[arg(long, default_value = "planned")]
        policy: String,
    },
}

#[derive(Subcommand)]
enum ReportKind {
    /// Decode memory of the FLUX.1 / SD1.5 / SDXL presets under every pool policy, beside PyTorch's.
    Memory {
        #[arg(long, default_value = "report")]
        out: PathBuf,
        /// The published PyTorch measurements (read, never copied).
        #[arg(
            long,
            default_value = "../shared/reference/pytorch_vae_memory_rtx4090.csv"
        )]
        reference: PathBuf,
        /// Predict for this machine's adapter instead of a 24 GB reference GPU.
        #[arg(long)]
        this_device: bool,
        /// Also decode the presets at 128² for real on this machine's adapter (f32, f16,
        /// each policy) and add those measured rows beside their predictions.
        #[arg(long)]
        measure: bool,
    },
}

#[derive(clap::Args, Clone)]
struct TileArgs {
    /// Tiling: auto (untiled when the run fits --max-memory and the device's limits,
    /// else exact), off, exact (equals the untiled run up to rounding; global GroupNorm
    /// statistics) or fast (independent overlapping tiles blended like diffusers).
    #[arg(long, default_value = "auto")]
    tile: String,
    /// Tile side in image pixels (decode output, encode input; multiple of 8). Default:
    /// the largest that fits --max-memory (exact/auto), 512 (fast).
    #[arg(long)]
    tile_size: Option<usize>,
    /// fast: overlap of neighbouring tiles in image pixels (default: a quarter tile).
    #[arg(long)]
    tile_overlap: Option<usize>,
    /// Peak device memory of the decode or encode, weights included: bytes, or with a
    /// K/M/G/KiB/MiB/GiB suffix. Default: 3/4 of the device's max_buffer_size
    /// clamped to [1 GiB, 16 GiB] (wgpu reports no VRAM size).
    #[arg(long)]
    max_memory: Option<String>,
    /// exact: most host memory for tiles parked off the device (bytes or K/M/G/KiB/MiB/GiB).
    /// Default: MemAvailable of /proc/meminfo; a run that needs more fails before decoding.
    #[arg(long)]
    max_host_memory: Option<String>,
    /// exact: tile the mid-block even when it fits whole.
    #[arg(long, hide = true)]
    tile_mid_block: bool,
}

impl TileArgs {
    fn tiling(&self) -> wgvae::Result<Tiling> {
        let mode = self.tile.parse::<TileMode>()?;
        if self.tile_overlap.is_some() && mode != TileMode::Fast {
            return Err(wgvae::Error::InvalidInput(format!(
                "--tile-overlap applies to --tile fast only (exact tiles need no overlap: their halos are exact), not --tile {}",
                mode.name()
            )));
        }
        Ok(Tiling {
            mode,
            tile_size: self.tile_size,
            overlap: self.tile_overlap,
            max_memory: self
                .max_memory
                .as_deref()
                .map(|s| parse_bytes("--max-memory", s))
                .transpose()?,
            tile_mid_block: self.tile_mid_block,
            max_host_memory: self
                .max_host_memory
                .as_deref()
                .map(|s| parse_bytes("--max-host-memory", s))
                .transpose()?,
        })
    }
}

/// `1073741824`, `1GiB`, `1.5G`, `512MiB`, `800M` (K/M/G are powers of 1024).
fn parse_bytes(option: &str, s: &str) -> wgvae::Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => 0,
    };
    match num.trim().parse::<f64>() {
        Ok(v) if scale > 0 && v > 0.0 => Ok((v * scale as f64) as u64),
        _ => Err(wgvae::Error::InvalidInput(format!(
            "{option} `{s}`: expected bytes, e.g. 1073741824, 1GiB or 800MiB"
        ))),
    }
}

/// A progress bar on a terminal (nothing otherwise). Exact tiling counts
/// tile steps (one layer on one tile, so far more than the tiles); fast
/// tiling counts tiles. The label says which.
fn progress_bar(quiet: bool) -> Option<Progress> {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {prefix} {bar:40} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(Progress(std::sync::Arc::new(move |u| {
        bar.set_prefix(if u.stage == "fast tile" {
            "tiles"
        } else {
            "tile steps (layer × tile)"
        });
        bar.set_length(u.total as u64);
        bar.set_position(u.done as u64);
        bar.set_message(u.stage);
        if u.done >= u.total {
            bar.finish_and_clear();
        }
    })))
}

#[derive(clap::Args)]
struct FramesBenchArgs {
    #[arg(long)]
    vae: String,
    /// Frames per decode (N).
    #[arg(long, default_value_t = 16)]
    frames: usize,
    /// Square output size in pixels of random latents (ignored with --latents).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Take the frames from this latent file (cycled and perturbed when it holds fewer).
    #[arg(long)]
    latents: Option<PathBuf>,
    /// Chunk sizes to measure, comma-separated: numbers or `auto`.
    #[arg(long, default_value = "auto", value_delimiter = ',')]
    chunk: Vec<String>,
    /// Skip the one-frame-at-a-time loop baseline.
    #[arg(long)]
    no_baseline: bool,
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value = "planned")]
    policy: String,
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

#[derive(clap::Args)]
struct MemoryArgs {
    /// VAE: folder, .safetensors file or preset:NAME.
    #[arg(long)]
    vae: String,
    /// Output image size in pixels, HxW (latent = pixels / 8).
    #[arg(long)]
    size: String,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Storage precision: f32, f16, bf16 or auto (as `wgvae decode --dtype`).
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Predict for a 24 GB reference GPU's limits instead of this machine's adapter.
    #[arg(long)]
    reference_gpu: bool,
    /// Predict encoding an HxW image instead of decoding to one.
    #[arg(long)]
    encode: bool,
    #[command(flatten)]
    tiles: TileArgs,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct EncodeArgs {
    image: PathBuf,
    /// VAE: a diffusers folder, a .safetensors file (AutoencoderKL or a TAE *encoder*) or preset:NAME.
    #[arg(long)]
    vae: String,
    #[arg(short, long)]
    output: PathBuf,
    /// Sample from the latent distribution with this seed instead of taking its mean.
    #[arg(long)]
    sample: Option<u64>,
    /// Write raw latents (skip `(z − shift_factor) · scaling_factor`).
    #[arg(long)]
    raw_latents: bool,
    /// Extend images whose sides are not multiples of 8 by replicating the right/bottom edges.
    #[arg(long)]
    pad: bool,
    #[arg(long)]
    config: Option<PathBuf>,
    /// Storage precision: f32, f16, bf16 or auto (arithmetic stays f32).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Tiling as for decode; tile sizes count input image pixels.
    #[command(flatten)]
    tiles: TileArgs,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct DecodeArgs {
    /// Latents: .npy (f32/f16) or .safetensors, N×C×h×w or C×h×w.
    latents: PathBuf,
    /// VAE: a diffusers folder, a .safetensors file (diffusers, LDM or TAE layout) or preset:NAME
    /// (sd15, sdxl, sd3, flux1 with seeded random weights).
    #[arg(long)]
    vae: String,
    /// Output PNG (a batch writes OUT_0.png, OUT_1.png, …).
    #[arg(short, long, default_value = "out.png")]
    output: PathBuf,
    /// Also write the raw float32 decoder output N×3×H×W as .npy.
    #[arg(long)]
    save_raw: Option<PathBuf>,
    /// Latents are decoder input already: skip `/ scaling_factor + shift_factor`.
    #[arg(long)]
    raw_latents: bool,
    /// Tensor name inside a .safetensors latent file with several tensors.
    #[arg(long)]
    key: Option<String>,
    /// diffusers config.json for a weight file without one beside it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    scaling_factor: Option<f32>,
    #[arg(long)]
    shift_factor: Option<f32>,
    /// Seed of preset:NAME random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Memory pool policy: caching (PyTorch-like), planned or exact.
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Storage of weights and activations: f32, f16, bf16 or auto (f16 for models known to fit
    /// f16, else bf16). Arithmetic stays f32; an f16 overflow is detected and re-decoded in bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Per-kernel GPU time table (timestamp queries) and the record / GPU / readback split.
    #[arg(long)]
    profile: bool,
    /// Write the pool's segments and blocks after the decode as JSON.
    #[arg(long)]
    memory_snapshot: Option<PathBuf>,
    #[command(flatten)]
    tiles: TileArgs,
    /// Stream the frames of N×C×h×w latents (e.g. a video's) in batched chunks with
    /// double-buffered readback and write DIR/frame_00000.png, … (DIR is created).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["save_raw"])]
    frames_out: Option<PathBuf>,
    /// Frames per batched forward with --frames-out (default: the largest of at most
    /// ceil(N/4) that fits --max-memory and the device's limits).
    #[arg(long, value_name = "B", requires = "frames_out")]
    chunk: Option<usize>,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

fn context(adapter: &Option<String>) -> wgvae::Result<Context> {
    let choice = match adapter {
        None => AdapterChoice::Auto,
        Some(s) => match s.parse::<usize>() {
            Ok(i) => AdapterChoice::Index(i),
            Err(_) => AdapterChoice::Name(s.clone()),
        },
    };
    let ctx = Context::new(&ContextOptions {
        adapter: choice,
        backends: None,
        pipeline_cache_dir: wgvae::gpu::default_cache_dir(),
    })?;
    // The CPU fallback (slow) is said on stderr whatever the log level (once:
    // the library already logs it as a warning when warnings are shown).
    if let Some(n) = ctx.notice() {
        if !log::log_enabled!(log::Level::Warn) {
            eprintln!("wgvae: warning: {n}");
        }
    }
    Ok(ctx)
}

fn info(cli_adapter: &Option<String>, as_json: bool) -> wgvae::Result<()> {
    let adapters: Vec<_> = Context::adapters(None)
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let info = a.get_info();
            json!({"index": i, "name": info.name, "backend": format!("{:?}", info.backend),
                   "type": format!("{:?}", info.device_type), "driver": info.driver,
                   "driver_info": info.driver_info,
                   "shader_f16": a.features().contains(wgpu::Features::SHADER_F16)})
        })
        .collect();
    let ctx = context(cli_adapter)?;
    let c = ctx.caps();
    let chosen = json!({
        "name": c.adapter_name, "backend": format!("{:?}", c.backend), "type": format!("{:?}", c.device_type),
        "driver": c.driver, "driver_info": c.driver_info,
        "features": {"shader_f16": c.shader_f16, "timestamp_query": c.timestamp_query,
                     "timestamp_query_inside_passes": c.timestamp_inside_passes, "subgroup": c.subgroup},
        "limits": {"max_storage_buffer_binding_size": c.max_storage_buffer_binding_size,
                   "max_buffer_size": c.max_buffer_size,
                   "max_compute_workgroup_storage_size": c.max_compute_workgroup_storage_size,
                   "max_compute_invocations_per_workgroup": c.max_compute_invocations_per_workgroup,
                   "max_compute_workgroups_per_dimension": c.max_compute_workgroups_per_dimension,
                   "min_storage_buffer_offset_alignment": c.min_storage_buffer_offset_alignment},
    });
    if as_json {
        println!(
            "{}",
            json!({"wgvae": env!("CARGO_PKG_VERSION"), "adapters": adapters, "chosen": chosen,
                   "notice": ctx.notice()})
        );
        return Ok(());
    }
    println!("wgvae {}", env!("CARGO_PKG_VERSION"));
    println!("adapters:");
    for a in &adapters {
        println!(
            "  [{}] {} ({}, {}) driver {} {}{}",
            a["index"],
            a["name"].as_str().unwrap_or(""),
            a["backend"].as_str().unwrap_or(""),
            a["type"].as_str().unwrap_or(""),
            a["driver"].as_str().unwrap_or(""),
            a["driver_info"].as_str().unwrap_or(""),
            if a["shader_f16"] == true { ", f16" } else { "" }
        );
    }
    println!(
        "chosen: {} ({:?}, {:?})",
        c.adapter_name, c.backend, c.device_type
    );
    if let Some(n) = ctx.notice() {
        println!("notice: {n}");
    }
    println!(
        "features: shader_f16={} timestamp_query={} timestamp_inside_passes={} subgroup={}",
        c.shader_f16, c.timestamp_query, c.timestamp_inside_passes, c.subgroup
    );
    println!("limits:");
    for (k, v) in chosen["limits"].as_object().into_iter().flatten() {
        println!("  {k}: {v}");
    }
    Ok(())
}

fn decode(cli_adapter: &Option<String>, a: &DecodeArgs) -> wgvae::Result<()> {
    let policy: Policy = a.policy.parse()?;
    let ctx = context(cli_adapter)?.with_pool(policy.new_pool());
    let load = LoadOptions {
        config: a.config.clone(),
        scaling_factor: a.scaling_factor,
        shift_factor: a.shift_factor,
        seed: a.seed,
        precision: a.dtype.parse()?,
    };
    let vae = Vae::load(&ctx, &a.vae, &load)?;
    if vae.random_weights && !a.json {
        eprintln!("note: {} — the image shows noise, not a picture", vae.name);
    }
    let latents = wgvae::io::load_latents(&a.latents, a.key.as_deref(), vae.latent_channels())?;
    if let Some(dir) = &a.frames_out {
        return decode_frames(&ctx, &vae, &latents, a, dir);
    }
    let opts = DecodeOptions {
        raw_latents: a.raw_latents,
        keep_raw: a.save_raw.is_some(),
        profile: a.profile,
        tiling: a.tiles.tiling()?,
        progress: progress_bar(a.json),
        keep_f16_overflow: false,
    };
    let out = wgvae::decode(&ctx, &vae, &latents, &opts)?;
    ctx.save_pipeline_cache();
    let paths = wgvae::io::batch_paths(&a.output, out.rgba.len());
    for (p, img) in paths.iter().zip(&out.rgba) {
        wgvae::io::write_png_rgb(p, out.width, out.height, img)?;
    }
    if let (Some(p), Some(raw)) = (&a.save_raw, &out.raw) {
        wgvae::io::write_npy(p, &raw.shape, &raw.data)?;
    }
    if let Some(p) = &a.memory_snapshot {
        std::fs::write(p, ctx.pool().snapshot().to_json()).map_err(|source| wgvae::Error::Io {
            path: p.clone(),
            source,
        })?;
    }
    let n = out.rgba.len();
    if a.json {
        println!(
            "{}",
            json!({
                "adapter": ctx.caps().adapter_name,
                "backend": format!("{:?}", ctx.caps().backend),
                "model": vae.name,
                "random_weights": vae.random_weights,
                "latents_shape": latents.shape,
                "image_shape": [n, 3, out.height, out.width],
                "dtype": out.dtype.name(),
                "f16_overflows": out.f16_overflows,
                "precision_note": out.precision_note,
                "decode_ms": out.decode_ms,
                "weights_bytes": vae.weights_bytes,
                "peak_allocated_bytes": out.memory.allocated_bytes.peak,
                "peak_reserved_bytes": out.memory.reserved_bytes.peak,
                "policy": ctx.pool().policy_name(),
                "tiling": out.tiling,
                "outputs": paths,
                "raw": a.save_raw,
                "timings": out.timings,
                "macs": out.macs,
                "profile": out.profile,
            })
        );
    } else {
        for p in &paths {
            println!("wrote {}", p.display());
        }
        println!(
            "{}: {}×{} ×{n} in {:.1} ms on {} ({:?}); peak allocated {:.1} MiB, reserved {:.1} MiB",
            vae.name,
            out.width,
            out.height,
            out.decode_ms,
            ctx.caps().adapter_name,
            ctx.caps().backend,
            out.memory.allocated_bytes.peak as f64 / 1048576.0,
            out.memory.reserved_bytes.peak as f64 / 1048576.0
        );
        if a.profile {
            let t = &out.timings;
            println!(
                "record {:.1} ms, submit → GPU done {:.1} ms, readback {:.1} ms",
                t.record_ms, t.gpu_wait_ms, t.readback_ms
            );
            print_profile(out.profile.as_ref(), &ctx);
        }
        print_tiling(&out.tiling);
        if let Some(note) = &out.precision_note {
            println!("precision: {note}");
        } else if out.dtype != wgvae::tensor::DType::F32 {
            println!("precision: {} storage, f32 arithmetic", out.dtype.name());
        }
    }
    Ok(())
}

/// `decode --frames-out DIR`: streams the frames through `wgvae::frames` and
/// writes one PNG per frame as it arrives.
fn decode_frames(
    ctx: &Context,
    vae: &Vae,
    latents: &wgvae::io::HostTensor,
    a: &DecodeArgs,
    dir: &std::path::Path,
) -> wgvae::Result<()> {
    let tiling = a.tiles.tiling()?;
    if !matches!(tiling.mode, TileMode::Auto | TileMode::Off)
        || tiling.tile_size.is_some()
        || tiling.overlap.is_some()
    {
        return Err(wgvae::Error::InvalidInput(
            "--frames-out decodes whole frames in batched chunks; it takes no --tile exact/fast, --tile-size or --tile-overlap (decode without --frames-out to tile)".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|source| wgvae::Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let opts = wgvae::FramesOptions {
        raw_latents: a.raw_latents,
        chunk: a.chunk,
        max_memory: tiling.max_memory,
    };
    let mut paths = Vec::with_capacity(latents.shape[0]);
    let on_frame = |f: wgvae::FrameOut<'_>| {
        let path = dir.join(format!("frame_{:05}.png", f.index));
        wgvae::io::write_png_rgb(&path, f.width, f.height, f.rgba)?;
        paths.push(path);
        Ok(())
    };
    let report = if a.profile {
        wgvae::decode_frames_profiled(ctx, vae, latents, &opts, on_frame)?
    } else {
        wgvae::decode_frames(ctx, vae, latents, &opts, on_frame)?
    };
    ctx.save_pipeline_cache();
    if let Some(p) = &a.memory_snapshot {
        std::fs::write(p, ctx.pool().snapshot().to_json()).map_err(|source| wgvae::Error::Io {
            path: p.clone(),
            source,
        })?;
    }
    let r = &report;
    if a.json {
        println!(
            "{}",
            json!({
                "adapter": ctx.caps().adapter_name,
                "backend": format!("{:?}", ctx.caps().backend),
                "model": vae.name,
                "random_weights": vae.random_weights,
                "latents_shape": latents.shape,
                "image_shape": [r.frames, 3, r.height, r.width],
                "dtype": vae.dtype.name(),
                "f16_overflows": r.f16_overflows,
                "decode_ms": r.total_ms,
                "weights_bytes": vae.weights_bytes,
                "peak_allocated_bytes": r.peak_allocated_bytes,
                "peak_reserved_bytes": r.peak_reserved_bytes,
                "policy": ctx.pool().policy_name(),
                "outputs": paths,
                "frames": report,
            })
        );
    } else {
        println!(
            "wrote {} frames to {} (frame_00000.png … frame_{:05}.png)",
            r.frames,
            dir.display(),
            r.frames - 1
        );
        println!(
            "{}: {} frames of {}×{} in chunks of {} ({} chunks) in {:.1} ms on {} ({:?}): {:.3} frames/s",
            vae.name,
            r.frames,
            r.width,
            r.height,
            r.chunk,
            r.chunks,
            r.total_ms,
            ctx.caps().adapter_name,
            ctx.caps().backend,
            r.frames_per_s
        );
        println!(
            "latency per frame: mean {:.1} ms, P99 {:.1} ms, max {:.1} ms; host: recording {:.1} ms, in submit {:.1} ms, blocked on the device {:.1} ms, writing PNGs {:.1} ms",
            r.latency.mean_ms, r.latency.p99_ms, r.latency.max_ms, r.record_ms, r.submit_ms, r.wait_ms, r.callback_ms
        );
        if r.f16_overflows > 0 {
            println!(
                "f16 overflow: {} values beyond ±65504 (or NaN); {} of {} frames re-decoded in bf16",
                r.f16_overflows, r.redone_frames, r.frames
            );
        }
        println!(
            "peak allocated {:.1} MiB, reserved {:.1} MiB, readback staging {:.1} MiB",
            r.peak_allocated_bytes as f64 / 1048576.0,
            r.peak_reserved_bytes as f64 / 1048576.0,
            r.staging_bytes as f64 / 1048576.0
        );
        if a.profile {
            print_profile(r.profile.as_ref(), ctx);
        }
    }
    Ok(())
}

/// The per-kernel table, or why there is none.
fn print_profile(profile: Option<&wgvae::gpu::Profile>, ctx: &Context) {
    match profile {
        Some(p) if !p.kernels.is_empty() => print!("{}", p.table()),
        Some(_) => println!("(profile empty: no kernel was timed)"),
        None if !ctx.caps().timestamp_inside_passes => {
            println!("(no per-kernel times: the adapter cannot write timestamps inside passes)")
        }
        None => println!("(no per-kernel times recorded)"),
    }
}

fn print_tiling(t: &wgvae::tiling::TilingReport) {
    let mib = |b: u64| b as f64 / 1048576.0;
    match t.mode.as_str() {
        "exact" => println!(
            "tiling: exact, {}-pixel tiles ({} tiles; per level {:?}{}), budget {:.0} MiB, device parking {:.1} MiB peak, host parking {:.1} MiB peak, {:.1} MiB uploaded, {} syncs, {} steps",
            t.tile_size.unwrap_or(0),
            t.tiles,
            t.level_tiles,
            if t.mid_block_tiled { ", mid-block tiled" } else { ", mid-block whole" },
            mib(t.max_memory),
            mib(t.device_parked_peak_bytes),
            mib(t.host_parked_peak_bytes),
            mib(t.uploaded_bytes),
            t.syncs,
            t.steps
        ),
        "fast" => println!(
            "tiling: fast, {}-pixel tiles, overlap {} ({} tiles), budget {:.0} MiB",
            t.tile_size.unwrap_or(0),
            t.overlap.unwrap_or(0),
            t.tiles,
            mib(t.max_memory)
        ),
        _ => println!("tiling: none (fits the budget of {:.0} MiB)", mib(t.max_memory)),
    }
}

fn parse_size(s: &str) -> wgvae::Result<(usize, usize)> {
    let bad = || {
        wgvae::Error::InvalidInput(format!(
            "--size `{s}`: expected HxW in pixels, multiples of 8 (e.g. 1024x1024)"
        ))
    };
    let (h, w) = s.split_once(['x', 'X']).unwrap_or((s, s));
    let (h, w): (usize, usize) = (
        h.trim().parse().map_err(|_| bad())?,
        w.trim().parse().map_err(|_| bad())?,
    );
    if h == 0 || w == 0 || h % 8 != 0 || w % 8 != 0 {
        return Err(bad());
    }
    Ok((h, w))
}

fn memory(cli_adapter: &Option<String>, a: &MemoryArgs) -> wgvae::Result<()> {
    let policy: Policy = a.policy.parse()?;
    let load = LoadOptions {
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let (h, w) = parse_size(&a.size)?;
    let caps = if a.reference_gpu {
        wgvae::gpu::Capabilities::reference_gpu()
    } else {
        context(cli_adapter)?.caps().clone()
    };
    let tiling = a.tiles.tiling()?;
    let (e, dtype) = if a.encode {
        let shape = [a.batch, 3, h, w];
        let e = wgvae::encode::estimate_encode_with(&caps, policy, &a.vae, &load, shape, &tiling)?;
        (e, a.dtype.clone())
    } else {
        // The latent channel count comes from the model: load it once in a dry run.
        let probe = Context::dry_run(caps.clone(), Policy::Exact.new_pool());
        let probe = Vae::load(&probe, &a.vae, &load)?;
        let (channels, dtype) = (probe.latent_channels(), probe.dtype.name().to_string());
        let shape = [a.batch, channels, h / 8, w / 8];
        let e = wgvae::decode::estimate_decode_with(&caps, policy, &a.vae, &load, shape, &tiling)?;
        (e, dtype)
    };
    let op = if a.encode { "encode" } else { "decode" };
    if a.json {
        let mut v = serde_json::to_value(&e).unwrap_or_default();
        v["device"] = json!(caps.adapter_name);
        v["dtype"] = json!(dtype);
        v["op"] = json!(op);
        println!("{v}");
    } else {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{} {op} {}x{} ×{} ({}, {} policy) on {}:",
            e.model, h, w, a.batch, dtype, e.policy, caps.adapter_name
        );
        println!("  weights        {:10.1} MiB", mib(e.weights_bytes));
        println!(
            "  peak allocated {:10.1} MiB (working {:.1} MiB)",
            mib(e.peak_allocated_bytes),
            mib(e.peak_allocated_bytes - e.weights_bytes)
        );
        println!(
            "  peak reserved  {:10.1} MiB (reserved/allocated {:.3})",
            mib(e.peak_reserved_bytes),
            e.peak_reserved_bytes as f64 / e.peak_allocated_bytes as f64
        );
        print_tiling(&e.tiling);
    }
    Ok(())
}

fn report_memory(
    cli_adapter: &Option<String>,
    out: &Path,
    reference: &Path,
    this_device: bool,
    measure: bool,
) -> wgvae::Result<()> {
    let device = if measure || this_device {
        Some(context(cli_adapter)?)
    } else {
        None
    };
    let caps = match (&device, this_device) {
        (Some(d), true) => d.caps().clone(),
        _ => wgvae::gpu::Capabilities::reference_gpu(),
    };
    let reference = reference.exists().then_some(reference);
    let header = format!(
        "Predicted for: {} (max binding {} MiB, max buffer {} MiB). wgvae {} ({}), {}.",
        caps.adapter_name,
        caps.max_storage_buffer_binding_size >> 20,
        caps.max_buffer_size >> 20,
        env!("CARGO_PKG_VERSION"),
        env!("WGVAE_GIT_COMMIT"),
        std::env::consts::OS
    );
    let measure_on = device.as_ref().filter(|_| measure);
    let rows = wgvae::report::memory::write_report(&caps, reference, &header, out, measure_on)?;
    println!(
        "wrote {} rows to {}/memory.csv, memory.md and memory_*.svg",
        rows.len(),
        out.display()
    );
    Ok(())
}

fn bench_decode(cli_adapter: &Option<String>, a: &DecodeBenchArgs) -> wgvae::Result<()> {
    let precisions = a
        .dtypes
        .iter()
        .map(|d| d.parse())
        .collect::<wgvae::Result<Vec<wgvae::models::Precision>>>()?;
    let ctx = context(cli_adapter)?;
    let b = wgvae::report::bench::DecodeBench {
        vae: a.vae.clone(),
        sizes: a.sizes.clone(),
        batch: a.batch,
        warmup: a.warmup,
        runs: a.runs,
        policy: a.policy.parse()?,
        dtypes: precisions,
        tiling: a.tiles.tiling()?,
    };
    let settings = format!(
        "vae {}, sizes {:?}, dtypes {:?}, batch {}, warm-up {}, runs {}, policy {}, {}{}",
        a.vae,
        a.sizes,
        a.dtypes,
        a.batch,
        a.warmup,
        a.runs,
        a.policy,
        a.tiles.describe(),
        load_average()
    );
    let bar = indicatif::ProgressBar::new_spinner();
    let rows =
        wgvae::report::bench::run_decode_bench(&ctx, &b, |m| bar.set_message(m.to_string()))?;
    bar.finish_and_clear();
    ctx.save_pipeline_cache();
    let meta = wgvae::report::bench::Metadata::of(&ctx, settings);
    wgvae::report::bench::write_decode_report(&rows, &meta, &a.out)?;
    for r in &rows {
        println!(
            "{}² {} ({}): first {:.1} ms, median {:.1} ms (min {:.1}, max {:.1}), {:.3} images/s, {:.2} GFLOP/s, peak allocated {:.1} MiB, reserved {:.1} MiB [{}]",
            r.size, r.dtype, r.tiling, r.first_ms, r.median_ms, r.min_ms, r.max_ms, r.images_per_s, r.gflops, r.peak_allocated_mib, r.peak_reserved_mib, r.status
        );
    }
    println!(
        "wrote {}/decode.csv, decode.md, decode_time.svg, decode_memory.svg",
        a.out.display()
    );
    Ok(())
}

/// `, load average at start A B C` (Linux; empty elsewhere): lavapipe shares
/// the CPU with everything else, so reports record the load.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| {
            format!(
                ", load average at start {}",
                l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
            )
        })
        .unwrap_or_default()
}

/// Bytes of the files under `dir`, recursively (0 when absent).
fn dir_bytes_deep(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes_deep(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Bytes of the files in `dir` (0 when absent).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn bench_cold_start(cli_adapter: &Option<String>, a: &ColdStartArgs) -> wgvae::Result<()> {
    use wgvae::report::bench::ColdStartRow;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| wgvae::Error::Io { path, source }
    };
    std::fs::create_dir_all(&a.out).map_err(io_err(&a.out))?;
    let ctx = context(cli_adapter)?;
    let load = LoadOptions {
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let vae = Vae::load(&ctx, &a.vae, &load)?;
    if !a.size.is_multiple_of(vae.upscale()) {
        return Err(wgvae::Error::InvalidInput(format!(
            "--size {}: not a multiple of {}",
            a.size,
            vae.upscale()
        )));
    }
    let l = a.size / vae.upscale();
    let shape = [1, vae.latent_channels(), l, l];
    let n: usize = shape.iter().product();
    // Latents, images and caches of the children: scratch, not report files.
    let scratch = std::env::temp_dir().join(format!("wgvae-cold-start-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(io_err(&scratch))?;
    let latents = scratch.join("latents.npy");
    wgvae::io::write_npy(&latents, &shape, &wgvae::testing::rand_vec(n, 7, 1.0))?;
    let cache = a
        .cache_dir
        .clone()
        .unwrap_or_else(|| scratch.join("pipeline_cache"));
    // Mesa's own on-disk shader cache (lavapipe, RADV, ANV), in a directory of ours.
    let driver_cache = scratch.join("driver_cache");
    let _ = std::fs::remove_dir_all(&driver_cache);
    std::fs::create_dir_all(&driver_cache).map_err(io_err(&driver_cache))?;
    let exe = std::env::current_exe().map_err(io_err(Path::new("wgvae")))?;
    let mut rows = Vec::new();
    // Each pair: an emptied pipeline cache, then the one the first process saved;
    // first with the driver's shader cache off (wgvae's cache alone), then on.
    let cases = [
        ("cold: empty pipeline cache; driver cache off", false),
        ("warm pipeline cache; driver cache off", false),
        ("cold: empty pipeline and driver caches", true),
        ("warm pipeline and driver caches", true),
    ];
    let wanted = |driver: bool| match a.driver_cache.as_str() {
        "off" => !driver,
        "on" => driver,
        _ => true,
    };
    for (i, (case, driver)) in cases.into_iter().enumerate() {
        if !wanted(driver) {
            continue;
        }
        if i % 2 == 0 {
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache).map_err(io_err(&cache))?;
        }
        eprintln!("{case}: a fresh `wgvae decode` process");
        let mut cmd = std::process::Command::new(&exe);
        if let Some(ad) = cli_adapter {
            cmd.args(["--adapter", ad]);
        }
        cmd.arg("decode")
            .arg(&latents)
            .args(["--vae", &a.vae, "--dtype", &a.dtype, "--raw-latents"])
            .args(["--tile", "off", "--json", "-o"])
            .arg(scratch.join("first.png"))
            .env("WGVAE_CACHE_DIR", &cache)
            .env_remove("WGVAE_PIPELINE_CACHE");
        if driver {
            cmd.env("MESA_SHADER_CACHE_DIR", &driver_cache)
                .env_remove("MESA_SHADER_CACHE_DISABLE");
        } else {
            cmd.env("MESA_SHADER_CACHE_DISABLE", "true");
        }
        let start = std::time::Instant::now();
        let out = cmd.output().map_err(io_err(&exe))?;
        let process_ms = start.elapsed().as_secs_f64() * 1e3;
        let (decode_ms, status) = if out.status.success() {
            let v: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            match v["decode_ms"].as_f64() {
                Some(ms) => (ms, "ok".to_string()),
                None => (f64::NAN, "no decode_ms in the child's output".into()),
            }
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            (f64::NAN, format!("child failed: {}", err.trim()))
        };
        rows.push(ColdStartRow {
            case: case.into(),
            process_ms,
            decode_ms,
            cache_bytes: dir_bytes(&cache),
            driver_cache_bytes: driver.then(|| dir_bytes_deep(&driver_cache)),
            status,
        });
    }
    eprintln!(
        "steady state: {} decodes in this process after one warm-up",
        a.runs
    );
    let z = wgvae::io::read_npy(&latents)?;
    let opts = DecodeOptions {
        raw_latents: true,
        tiling: Tiling::off(),
        ..Default::default()
    };
    let mut times = Vec::new();
    for i in 0..=a.runs.max(1) {
        let out = wgvae::decode(&ctx, &vae, &z, &opts)?;
        if i > 0 {
            times.push(out.decode_ms);
        }
    }
    times.sort_by(f64::total_cmp);
    rows.push(ColdStartRow {
        case: "steady state".into(),
        process_ms: f64::NAN,
        decode_ms: times[times.len() / 2],
        cache_bytes: dir_bytes(&cache),
        driver_cache_bytes: None,
        status: "ok".into(),
    });
    let settings = format!(
        "vae {}, {}², dtype {}, untiled, steady-state median of {} after 1 warm-up, pipeline cache dir {} (emptied before each cold run), driver cache: MESA_SHADER_CACHE_DISABLE=true or MESA_SHADER_CACHE_DIR={} (emptied first; other drivers keep their defaults){}",
        a.vae,
        a.size,
        a.dtype,
        a.runs.max(1),
        cache.display(),
        driver_cache.display(),
        load_average()
    );
    let meta = wgvae::report::bench::Metadata::of(&ctx, settings);
    wgvae::report::bench::write_cold_start_report(&rows, &meta, &a.out)?;
    let _ = std::fs::remove_dir_all(&scratch);
    for r in &rows {
        println!(
            "{}: process start → first image {:.0} ms, decode {:.0} ms, pipeline cache {} bytes, driver cache {} [{}]",
            r.case,
            r.process_ms,
            r.decode_ms,
            r.cache_bytes,
            r.driver_cache_bytes
                .map_or("off".into(), |b| format!("{b} bytes")),
            r.status
        );
    }
    println!("wrote {}/cold_start.csv, cold_start.md", a.out.display());
    Ok(())
}

fn bench_frames(cli_adapter: &Option<String>, a: &FramesBenchArgs) -> wgvae::Result<()> {
    let chunks = a
        .chunk
        .iter()
        .map(|c| match c.trim() {
            "auto" => Ok(None),
            s => match s.parse::<usize>() {
                Ok(v) if v > 0 => Ok(Some(v)),
                _ => Err(wgvae::Error::InvalidInput(format!(
                    "--chunk {s}: expected a positive number or auto"
                ))),
            },
        })
        .collect::<wgvae::Result<_>>()?;
    let b = wgvae::report::frames::FramesBench {
        vae: a.vae.clone(),
        frames: a.frames,
        latents: a.latents.clone(),
        size: a.size,
        chunks,
        baseline: !a.no_baseline,
        warmup: a.warmup,
        runs: a.runs,
        policy: a.policy.parse()?,
    };
    let ctx = context(cli_adapter)?;
    let load = load_average();
    let source = match &b.latents {
        Some(p) => format!("latents {}", p.display()),
        None => format!("random latents {}²", b.size),
    };
    let settings = format!(
        "vae {}, {} frames, {source}, chunks {:?}, baseline {}, warm-up {}, runs {}, policy {}, f32{load}",
        b.vae, b.frames, a.chunk, b.baseline, b.warmup, b.runs, a.policy
    );
    let (rows, samples) = wgvae::report::frames::run_frames_bench(&ctx, &b, |m| eprintln!("{m}"))?;
    let meta = wgvae::report::bench::Metadata::of(&ctx, settings);
    wgvae::report::frames::write_frames_report(&rows, &samples, &meta, &a.out)?;
    for r in &rows {
        println!(
            "{} chunk {} ({}): {} frames of {}×{}: {:.3} frames/s (median {:.1} ms of {} runs), latency mean {:.1} / P99 {:.1} / max {:.1} ms, peak allocated {:.1} MiB, reserved {:.1} MiB, process CPU {:.0} ms/frame, {:.2}× the loop ({:.2}× in CPU time) [{}]",
            r.mode, r.chunk_setting, r.chunk, r.frames, r.width, r.height, r.frames_per_s, r.median_total_ms, r.runs,
            r.latency.mean_ms, r.latency.p99_ms, r.latency.max_ms, r.peak_allocated_mib, r.peak_reserved_mib,
            r.cpu_ms_per_frame, r.vs_loop, r.vs_loop_cpu, r.status
        );
    }
    println!(
        "wrote {}/frames.csv, frames.md, frames_latency.csv",
        a.out.display()
    );
    Ok(())
}

fn encode(cli_adapter: &Option<String>, a: &EncodeArgs) -> wgvae::Result<()> {
    // Before any work: a wrong output name should not cost an encode.
    wgvae::io::latent_format(&a.output)?;
    let ctx = context(cli_adapter)?;
    let opts = LoadOptions {
        config: a.config.clone(),
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let enc = wgvae::encode::VaeEncoder::load(&ctx, &a.vae, &opts)?;
    if a.raw_latents && matches!(enc.encoder, wgvae::encode::EncoderKind::Tae(_)) {
        return Err(wgvae::Error::InvalidInput(
            "--raw-latents: TAE latents carry no scaling or shift (they are the decoder's input as they are); the flag applies to AutoencoderKL encoders".into(),
        ));
    }
    let pixels = wgvae::encode::load_image(&a.image, a.pad)?;
    let start = std::time::Instant::now();
    let out = wgvae::encode::encode(
        &ctx,
        &enc,
        &pixels,
        &wgvae::encode::EncodeOptions {
            sample: a.sample,
            raw_latents: a.raw_latents,
            tiling: a.tiles.tiling()?,
            progress: progress_bar(a.json),
        },
    )?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    wgvae::io::write_latents(&a.output, &out.latents)?;
    ctx.save_pipeline_cache();
    if a.json {
        println!(
            "{}",
            json!({"adapter": ctx.caps().adapter_name, "backend": format!("{:?}", ctx.caps().backend),
                   "model": enc.name, "image_shape": pixels.shape, "latents_shape": out.latents.shape,
                   "encode_ms": ms, "sampled": a.sample.is_some(), "raw_latents": a.raw_latents,
                   "weights_bytes": enc.weights_bytes,
                   "dtype": out.dtype.name(), "f16_overflows": out.f16_overflows,
                   "precision_note": out.precision_note,
                   "peak_allocated_bytes": out.memory.allocated_bytes.peak,
                   "peak_reserved_bytes": out.memory.reserved_bytes.peak,
                   "tiling": out.tiling, "output": a.output})
        );
    } else {
        println!(
            "wrote {} ({:?}) — {} in {ms:.1} ms; peak allocated {:.1} MiB, reserved {:.1} MiB",
            a.output.display(),
            out.latents.shape,
            enc.name,
            out.memory.allocated_bytes.peak as f64 / 1048576.0,
            out.memory.reserved_bytes.peak as f64 / 1048576.0
        );
        print_tiling(&out.tiling);
        if let Some(note) = &out.precision_note {
            println!("{note}");
        }
    }
    Ok(())
}

fn bench_attention(cli_adapter: &Option<String>, which: &AttentionBenchKind) -> wgvae::Result<()> {
    use wgvae::report::attention as ra;
    let ctx = context(cli_adapter)?;
    match which {
        AttentionBenchKind::Sweep {
            out,
            frames,
            tokens_per_frame,
            modes,
            embed,
            heads,
            sink,
            window,
            budget,
            runs,
            policy,
            reference,
        } => {
            let modes = modes
                .iter()
                .map(|m| {
                    ra::SweepMode::ALL
                        .into_iter()
                        .find(|x| x.name() == m.as_str())
                        .ok_or_else(|| {
                            wgvae::Error::InvalidInput(format!(
                                "--modes {m}: use global, window or window-ring"
                            ))
                        })
                })
                .collect::<wgvae::Result<Vec<_>>>()?;
            let cfg = ra::SweepConfig {
                frames: frames.clone(),
                tokens_per_frame: tokens_per_frame.clone(),
                modes,
                embed: *embed,
                heads: *heads,
                sink_frames: *sink,
                window_frames: *window,
                budget_s: *budget,
                runs: *runs,
                policy: policy.parse()?,
            };
            let reference = if reference.exists() {
                Some(ra::read_vggt(reference)?)
            } else {
                eprintln!(
                    "note: {} not found; the report omits the published sweep",
                    reference.display()
                );
                None
            };
            let settings = format!(
                "frames {frames:?}, tokens/frame {tokens_per_frame:?}, embed {embed}, {heads} heads, sink {sink}, window {window}, budget {budget} s/cell, runs {runs}, policy {policy}, f32"
            );
            let rows = ra::run_sweep(&ctx, &cfg, |m| eprintln!("{m}"))?;
            let meta = wgvae::report::bench::Metadata::of(&ctx, settings);
            ra::write_sweep_report(&rows, &cfg, &meta, reference.as_deref(), out)?;
            let ran = rows.iter().filter(|r| r.status == "ok").count();
            println!(
                "{ran} of {} cells run; wrote {}/attention_sweep.csv, attention_sweep.md, attention_sweep_time.svg, attention_sweep_memory.svg",
                rows.len(),
                out.display()
            );
        }
        AttentionBenchKind::Midblock {
            out,
            tokens,
            head_dim,
            runs,
            budget,
            policy,
        } => {
            let cfg = ra::MidBlockConfig {
                tokens: tokens.clone(),
                head_dim: *head_dim,
                runs: *runs,
                budget_s: *budget,
                policy: policy.parse()?,
            };
            let rows = ra::run_mid_block(&ctx, &cfg, |m| eprintln!("{m}"))?;
            let settings = format!(
                "mid-block attention: tokens {tokens:?}, head_dim {head_dim}, runs {runs}, budget {budget} s, policy {policy}, f32"
            );
            let meta = wgvae::report::bench::Metadata::of(&ctx, settings);
            ra::write_mid_block_report(&rows, &cfg, &meta, out)?;
            for r in &rows {
                println!(
                    "T={} (d={}): {} median {:.1} ms, {:.2} GFLOP/s, peak allocated {:.1} MiB (a T×T score matrix would be {:.0} MiB)",
                    r.tokens, r.head_dim, r.status, r.ms_median, r.gflops,
                    r.peak_allocated_bytes as f64 / 1048576.0, r.score_matrix_bytes as f64 / 1048576.0
                );
            }
            println!(
                "wrote {}/attention_midblock.csv, attention_midblock.md",
                out.display()
            );
        }
        AttentionBenchKind::Stream {
            preset,
            chunks,
            scale,
            warmup,
            policy,
            out,
            json: as_json,
        } => {
            let presets: Vec<ra::StreamPreset> = if preset == "all" {
                ra::StreamPreset::ALL.to_vec()
            } else {
                vec![preset.parse()?]
            };
            let scale = scale.unwrap_or(if ctx.caps().is_cpu() { 0.02 } else { 1.0 });
            let mut results = Vec::new();
            for p in presets {
                let mut cfg = ra::StreamConfig::longlive(p, *chunks, scale);
                cfg.warmup = *warmup;
                cfg.policy = policy.parse()?;
                let r = ra::run_stream(&ctx, &cfg, |m| {
                    if !as_json {
                        eprintln!("{m}")
                    }
                })?;
                if !as_json {
                    println!(
                        "{}: {} chunks of 3×{} tokens: mean {:.2} ms, P99 {:.2} ms, max {:.2} ms (warm-up {:?} ms), {:.2} chunks/s, {:.2} frames/s, peak allocated {:.2} MiB, KV {:.2} MiB",
                        r.preset, r.chunks, r.tokens_per_frame, r.mean_ms, r.p99_ms, r.max_ms,
                        r.warmup_ms.iter().map(|m| m.round()).collect::<Vec<_>>(),
                        r.chunks_per_s, r.frames_per_s,
                        r.peak_allocated_bytes as f64 / 1048576.0, r.kv_bytes as f64 / 1048576.0
                    );
                }
                results.push(r);
            }
            if let Some(out) = out {
                let settings = format!(
                    "presets {preset}, {chunks} chunks, scale {scale}, policy {policy}, f32 activations"
                );
                let meta = wgvae::report::bench::Metadata::of(&ctx, settings);
                ra::write_stream_report(&results, &meta, out)?;
                if !as_json {
                    println!(
                        "wrote {}/attention_stream.csv, attention_stream_chunks.csv, attention_stream.md, attention_stream_*.svg",
                        out.display()
                    );
                }
            }
            if *as_json {
                let mut v = if results.len() == 1 {
                    serde_json::to_value(&results[0]).unwrap_or_default()
                } else {
                    json!({ "presets": results })
                };
                v["adapter"] = json!(ctx.caps().adapter_name);
                v["backend"] = json!(format!("{:?}", ctx.caps().backend));
                println!("{v}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Info { json } => info(&cli.adapter, *json),
        Command::Decode(a) => decode(&cli.adapter, a),
        Command::Memory(a) => memory(&cli.adapter, a),
        Command::Encode(a) => encode(&cli.adapter, a),
        Command::Bench {
            which: BenchKind::Decode(a),
        } => bench_decode(&cli.adapter, a),
        Command::Bench {
            which: BenchKind::ColdStart(a),
        } => bench_cold_start(&cli.adapter, a),
        Command::Bench {
            which: BenchKind::Attention { which },
        } => bench_attention(&cli.adapter, which),
        Command::Bench {
            which: BenchKind::Frames(a),
        } => bench_frames(&cli.adapter, a),
        Command::Report {
            which:
                ReportKind::Memory {
                    out,
                    reference,
                    this_device,
                    measure,
                },
        } => report_memory(&cli.adapter, out, reference, *this_device, *measure),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_reads_plain_and_suffixed_sizes() {
        let p = |s| parse_bytes("--max-memory", s);
        assert_eq!(p("1073741824").unwrap(), 1 << 30);
        assert_eq!(p("1GiB").unwrap(), 1 << 30);
        assert_eq!(p("1.5G").unwrap(), 3 << 29);
        assert_eq!(p(" 512 MiB ").unwrap(), 512 << 20);
        assert_eq!(p("800m").unwrap(), 800 << 20);
        assert_eq!(p("64k").unwrap(), 64 << 10);
        assert_eq!(p("100b").unwrap(), 100);
        for bad in ["", "GiB", "-1G", "0", "1.5X", "lots"] {
            let e = p(bad).unwrap_err().to_string();
            assert!(
                e.contains("--max-memory") && e.contains("expected bytes"),
                "{bad}: {e}"
            );
        }
        let e = parse_bytes("--max-host-memory", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-host-memory"), "{e}");
    }
}
