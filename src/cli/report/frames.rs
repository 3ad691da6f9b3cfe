//! `wgvae bench frames`: frames/s and per-frame latency of the streaming
//! frame decoder ([`wgvae::frames`]) per chunk size, against decoding the same
//! frames one at a time in a loop with [`wgvae::decode()`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::bench::{Metadata, Timing};
use super::{create_dir, table, write, MIB};
use wgvae::decode::{decode, DecodeOptions};
use wgvae::error::{Error, Result};
use wgvae::frames::{decode_frames, FramesOptions, LatencySummary};
use wgvae::gpu::Context;
use wgvae::io::HostTensor;
use wgvae::models::{LoadOptions, Vae};

/// What to benchmark.
#[derive(Clone, Debug)]
pub struct FramesBench {
    /// VAE spec (file, folder or `preset:NAME`).
    pub vae: String,
    /// Frames per decode (`N`).
    pub frames: usize,
    /// Latents file whose frames are used (cycled, with a small seeded
    /// perturbation on repeats, when it holds fewer than `frames`).
    pub latents: Option<PathBuf>,
    /// Square output size in pixels of random latents (when no file is given).
    pub size: usize,
    /// Chunk sizes to measure; `None` is the automatic choice.
    pub chunks: Vec<Option<usize>>,
    /// Also measure the one-frame-at-a-time loop (the baseline of the ratio).
    pub baseline: bool,
    /// Runs and memory policy.
    pub timing: Timing,
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct FramesRow {
    /// `streamed` (chunks, double-buffered readback) or `loop` (decode() per frame).
    pub mode: &'static str,
    /// `auto` or the chunk size asked for.
    pub chunk_setting: String,
    /// Frames per batched forward used (1 for the loop).
    pub chunk: usize,
    /// Frames decoded.
    pub frames: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Timed runs.
    pub runs: usize,
    /// Median over runs of the wall time for all frames.
    pub median_total_ms: f64,
    /// `frames / median_total`.
    pub frames_per_s: f64,
    /// Per-frame latency over all runs' frames.
    pub latency: LatencySummary,
    /// Peak allocated MiB.
    pub peak_allocated_mib: f64,
    /// Peak reserved MiB.
    pub peak_reserved_mib: f64,
    /// Readback staging buffers (outside the pool).
    pub staging_mib: f64,
    /// Host time blocked on the device, share of the total (streamed only).
    pub wait_share: f64,
    /// CPU time of the whole process per frame (median over runs; Linux,
    /// NaN elsewhere). On a CPU adapter (lavapipe) this includes the
    /// "device", and unlike wall time it does not grow when other processes
    /// share the cores.
    pub cpu_ms_per_frame: f64,
    /// frames/s divided by the loop's (NaN without the baseline).
    pub vs_loop: f64,
    /// The loop's CPU time per frame divided by this one's (NaN without
    /// the baseline or off Linux): the ratio contention does not distort.
    pub vs_loop_cpu: f64,
    /// "ok" or why the configuration did not run.
    pub status: String,
}

impl FramesRow {
    /// The figures both tables show, from the median total time to the
    /// staging MiB: CSV fields (`csv`) or Markdown cells, with fewer digits.
    fn figures(&self, csv: bool) -> String {
        let figures = [
            (self.median_total_ms, 2),
            (self.frames_per_s, 4),
            (self.latency.mean_ms, 2),
            (self.latency.p99_ms, 2),
            (self.latency.max_ms, 2),
            (self.peak_allocated_mib, 2),
            (self.peak_reserved_mib, 2),
            (self.staging_mib, 2),
        ];
        let cells: Vec<String> = figures
            .iter()
            .map(|&(v, digits)| {
                let digits = if csv { digits } else { digits - 1 };
                format!("{v:.digits$}")
            })
            .collect();
        cells.join(if csv { "," } else { " | " })
    }
}

/// Per-frame latencies of every timed run, for the latency CSV.
#[derive(Clone, Debug)]
pub struct LatencySample {
    /// Decoding mode.
    pub mode: &'static str,
    /// Chunk setting (`auto` or a number).
    pub chunk_setting: String,
    /// Run index.
    pub run: usize,
    /// Frame index.
    pub frame: usize,
    /// The frame's latency in ms.
    pub latency_ms: f64,
}

/// The benchmark's frames `[N, C, h, w]` and whether they are pipeline
/// latents (a file) or decoder input (random).
fn bench_latents(vae: &Vae, b: &FramesBench) -> Result<(HostTensor, bool)> {
    let c = vae.latent_channels();
    if b.frames == 0 {
        return Err(Error::InvalidInput("--frames 0: nothing to decode".into()));
    }
    let Some(path) = &b.latents else {
        let up = vae.upscale();
        if b.size == 0 || !b.size.is_multiple_of(up) {
            return Err(Error::InvalidInput(format!(
                "--size {}: must be a positive multiple of {up}",
                b.size
            )));
        }
        let l = b.size / up;
        // The frames and their one-frame copies for the loop, checked before building them.
        let elements = [b.frames, c, l, l, 2]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d));
        crate::cli::bench::check_host_f32("--size/--frames", "the random latents", elements)?;
        let n = b.frames * c * l * l;
        let data = wgvae::seeded::uniform(n, b.size as u64, 1.0);
        return Ok((HostTensor::new(vec![b.frames, c, l, l], data)?, true));
    };
    let file = wgvae::io::load_latents(path, None, c)?;
    let per: usize = file.shape[1..].iter().product();
    crate::cli::bench::check_host_f32(
        "--frames",
        "the latents cycled to --frames",
        b.frames.checked_mul(per).and_then(|v| v.checked_mul(2)),
    )?;
    let have = file.shape[0];
    let mut data = Vec::with_capacity(b.frames * per);
    for i in 0..b.frames {
        let src = &file.data[(i % have) * per..(i % have + 1) * per];
        if i < have {
            data.extend_from_slice(src);
        } else {
            // A repeat: perturb it so frames differ, as video frames do.
            let noise = wgvae::seeded::uniform(per, i as u64, 0.05);
            data.extend(src.iter().zip(noise).map(|(v, r)| v + r));
        }
    }
    let mut shape = file.shape.clone();
    shape[0] = b.frames;
    Ok((HostTensor::new(shape, data)?, false))
}

/// One timed pass of a configuration over all frames.
struct Pass {
    total_ms: f64,
    latency_ms: Vec<f64>,
    /// Host time blocked on the device (streamed only).
    wait_ms: f64,
    chunk: usize,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    staging_bytes: u64,
}

/// The baseline: one [`decode()`] per frame; a frame's latency is its call.
fn loop_pass(
    ctx: &Context,
    vae: &Vae,
    singles: &[HostTensor],
    opts: &DecodeOptions,
) -> Result<Pass> {
    let start = Instant::now();
    let mut latency_ms = Vec::with_capacity(singles.len());
    let (mut allocated, mut reserved) = (0, 0);
    for single in singles {
        let t = Instant::now();
        let out = decode(ctx, vae, single, opts)?;
        latency_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // decode() resets the peaks per call: keep the largest.
        allocated = allocated.max(out.memory.allocated_bytes.peak);
        reserved = reserved.max(out.memory.reserved_bytes.peak);
    }
    Ok(Pass {
        total_ms: start.elapsed().as_secs_f64() * 1e3,
        latency_ms,
        wait_ms: f64::NAN,
        chunk: 1,
        peak_allocated_bytes: allocated,
        peak_reserved_bytes: reserved,
        staging_bytes: 0,
    })
}

/// All frames through [`decode_frames`]; the callback touches every byte
/// as a consumer would, without copying it.
fn streamed_pass(ctx: &Context, vae: &Vae, z: &HostTensor, opts: &FramesOptions) -> Result<Pass> {
    let mut checksum = 0u64;
    let r = decode_frames(ctx, vae, z, opts, |f| {
        checksum = f
            .rgba
            .iter()
            .fold(checksum, |s, &v| s.wrapping_add(v as u64));
        Ok(())
    })?;
    std::hint::black_box(checksum);
    Ok(Pass {
        total_ms: r.total_ms,
        latency_ms: r.latency_ms,
        wait_ms: r.wait_ms,
        chunk: r.chunk,
        peak_allocated_bytes: r.peak_allocated_bytes,
        peak_reserved_bytes: r.peak_reserved_bytes,
        staging_bytes: r.staging_bytes,
    })
}

/// One configuration's timed passes so far.
struct Cell {
    mode: &'static str,
    setting: String,
    /// `None` for the loop.
    frames_options: Option<FramesOptions>,
    passes: Vec<Pass>,
    cpu_ms_per_frame: Vec<f64>,
    status: String,
}

/// Runs the benchmark. Runs are interleaved (run 1 of every configuration,
/// then run 2, …) so that load from other processes, which lavapipe feels
/// directly, spreads over all configurations alike. A single untimed frame
/// compiles the pipelines first. Configurations the device cannot run are
/// rows with a status.
pub fn run_frames_bench(
    ctx: &Context,
    b: &FramesBench,
    mut progress: impl FnMut(&str),
) -> Result<(Vec<FramesRow>, Vec<LatencySample>)> {
    if b.timing.runs == 0 {
        return Err(Error::InvalidInput(
            "--runs 0: expected at least 1 timed run".into(),
        ));
    }
    let ctx = ctx.with_pool(b.timing.policy.new_pool());
    let vae = Vae::load_image_decoder(&ctx, &b.vae, &LoadOptions::default())?;
    let (z, pipeline_latents) = bench_latents(&vae, b)?;
    let n = z.shape[0];
    let up = vae.upscale();
    let (height, width) = (z.shape[2] * up, z.shape[3] * up);
    let per: usize = z.shape[1..].iter().product();
    let mut one_shape = z.shape.clone();
    one_shape[0] = 1;
    let singles: Vec<HostTensor> = (0..n)
        .map(|i| HostTensor::new(one_shape.clone(), z.data[i * per..(i + 1) * per].to_vec()))
        .collect::<Result<_>>()?;
    let decode_options = DecodeOptions {
        raw_latents: !pipeline_latents,
        ..Default::default()
    };
    progress("priming: one frame");
    // A failure here shows up again in the rows' status.
    let _ = decode(&ctx, &vae, &singles[0], &decode_options);

    let mut cells: Vec<Cell> = Vec::new();
    let cell = |mode, setting: String, frames_options| Cell {
        mode,
        setting,
        frames_options,
        passes: Vec::new(),
        cpu_ms_per_frame: Vec::new(),
        status: "ok".into(),
    };
    if b.baseline {
        cells.push(cell("loop", "1".into(), None));
    }
    for &chunk in &b.chunks {
        let setting = chunk.map_or("auto".to_string(), |c| c.to_string());
        let opts = FramesOptions {
            raw_latents: !pipeline_latents,
            chunk,
            ..Default::default()
        };
        cells.push(cell("streamed", setting, Some(opts)));
    }
    let total_runs = b.timing.total();
    for run in 0..total_runs {
        for c in cells.iter_mut().filter(|c| c.status == "ok") {
            progress(&format!(
                "{} chunk {}: run {}/{total_runs}",
                c.mode,
                c.setting,
                run + 1
            ));
            // Each pass starts from an empty cache, so its reserved peak is
            // its own (a planned pool keeps the last plan's arenas).
            ctx.pool().empty_cache();
            let cpu0 = process_cpu_seconds();
            let pass = match &c.frames_options {
                None => loop_pass(&ctx, &vae, &singles, &decode_options),
                Some(opts) => streamed_pass(&ctx, &vae, &z, opts),
            };
            match pass {
                Ok(p) if run >= b.timing.warmup => {
                    c.cpu_ms_per_frame.extend(cpu_ms_since(cpu0, n));
                    c.passes.push(p);
                }
                Ok(_) => {}
                Err(e) => c.status = e.to_string(),
            }
        }
    }

    let mut rows = Vec::new();
    let mut samples = Vec::new();
    for c in &mut cells {
        let mut totals: Vec<f64> = c.passes.iter().map(|p| p.total_ms).collect();
        let median_ms = median(&mut totals);
        let latencies: Vec<f64> = c.passes.iter().flat_map(|p| p.latency_ms.clone()).collect();
        for (run, p) in c.passes.iter().enumerate() {
            samples.extend(
                p.latency_ms
                    .iter()
                    .enumerate()
                    .map(|(frame, &l)| LatencySample {
                        mode: c.mode,
                        chunk_setting: c.setting.clone(),
                        run,
                        frame,
                        latency_ms: l,
                    }),
            );
        }
        let last = c.passes.last();
        let mib = |f: fn(&Pass) -> u64| last.map_or(f64::NAN, |p| f(p) as f64 / MIB);
        let wait: Vec<f64> = c.passes.iter().map(|p| p.wait_ms / p.total_ms).collect();
        rows.push(FramesRow {
            mode: c.mode,
            chunk_setting: c.setting.clone(),
            chunk: last.map_or(0, |p| p.chunk),
            frames: n,
            width,
            height,
            runs: c.passes.len(),
            median_total_ms: median_ms,
            frames_per_s: n as f64 / (median_ms / 1e3),
            latency: LatencySummary::of(&latencies),
            peak_allocated_mib: mib(|p| p.peak_allocated_bytes),
            peak_reserved_mib: mib(|p| p.peak_reserved_bytes),
            staging_mib: mib(|p| p.staging_bytes),
            wait_share: wait.iter().sum::<f64>() / wait.len().max(1) as f64,
            cpu_ms_per_frame: median(&mut c.cpu_ms_per_frame),
            vs_loop: f64::NAN,
            vs_loop_cpu: f64::NAN,
            status: c.status.clone(),
        });
    }
    if let Some(base) = rows.iter().find(|r| r.mode == "loop").cloned() {
        for r in &mut rows {
            r.vs_loop = r.frames_per_s / base.frames_per_s;
            r.vs_loop_cpu = base.cpu_ms_per_frame / r.cpu_ms_per_frame;
        }
    }
    for r in rows.iter().filter(|r| r.status == "ok") {
        super::check_measured(
            &format!("bench frames: {} chunk {}", r.mode, r.chunk_setting),
            r.runs,
            &[
                r.median_total_ms,
                r.frames_per_s,
                r.latency.mean_ms,
                r.peak_allocated_mib,
                r.peak_reserved_mib,
            ],
        )?;
    }
    Ok((rows, samples))
}

/// CPU time of this process's threads (Linux): the sum of
/// `/proc/self/task/*/schedstat` run times (lavapipe's threads persist).
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        if let Ok(stat) = std::fs::read_to_string(path) {
            ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(ns as f64 * 1e-9)
}

/// Process CPU milliseconds per frame since `start` (none off Linux).
pub(crate) fn cpu_ms_since(start: Option<f64>, frames: usize) -> Option<f64> {
    Some((process_cpu_seconds()? - start?) * 1e3 / frames as f64)
}

/// Median of `v` (NaN when empty); sorts `v`.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        k => v[k / 2],
    }
}

/// Writes `frames.csv`, `frames.md` and `frames_latency.csv` (every frame's
/// latency in every timed run) into `out`.
pub fn write_frames_report(
    rows: &[FramesRow],
    samples: &[LatencySample],
    meta: &Metadata,
    out: &Path,
) -> Result<()> {
    create_dir(out)?;
    let csv = meta.csv(
        "mode,chunk_setting,chunk,frames,width,height,runs,median_total_ms,frames_per_s,latency_mean_ms,latency_p99_ms,latency_max_ms,peak_allocated_mib,peak_reserved_mib,staging_mib,wait_share,cpu_ms_per_frame,vs_loop,vs_loop_cpu,status\n",
        rows,
        |r| format!(
            "{},{},{},{},{},{},{},{},{:.3},{:.1},{:.3},{:.3},\"{}\"\n",
            r.mode,
            r.chunk_setting,
            r.chunk,
            r.frames,
            r.width,
            r.height,
            r.runs,
            r.figures(true),
            r.wait_share,
            r.cpu_ms_per_frame,
            r.vs_loop,
            r.vs_loop_cpu,
            r.status.replace('"', "'")
        ),
    );
    write(&out.join("frames.csv"), &csv)?;
    let lat = meta.csv("mode,chunk_setting,run,frame,latency_ms\n", samples, |s| {
        format!(
            "{},{},{},{},{:.3}\n",
            s.mode, s.chunk_setting, s.run, s.frame, s.latency_ms
        )
    });
    write(&out.join("frames_latency.csv"), &lat)?;
    let mut md = meta.markdown("Frame streaming benchmark");
    md += "\nLatency: from a chunk's submit (the first chunk: from the call) to its frames mapped on the host; \
           the loop's: one `decode()` call. `vs loop`: frames/s over the one-frame-at-a-time loop's; `vs loop (CPU)`: the loop's CPU ms/frame over this one's. \
           Runs are interleaved across configurations. \
           `host waits`: share of the wall time the host was blocked on the device. \
           `CPU ms/frame`: CPU time of the whole process per frame (on a CPU adapter the device's work included; \
           robust to other processes sharing the cores, unlike wall time).\n\n";
    md += &table("| mode | chunk | frames | size | runs | median total ms | frames/s | latency mean ms | P99 ms | max ms | peak allocated MiB | peak reserved MiB | staging MiB | host waits | CPU ms/frame | vs loop | vs loop (CPU) | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", rows, |r| {
        let chunk = if r.chunk_setting == "auto" {
            format!("auto ({})", r.chunk)
        } else {
            r.chunk.to_string()
        };
        format!(
            "| {} | {} | {} | {}×{} | {} | {} | {:.0} % | {:.0} | {:.2}× | {:.2}× | {} |\n",
            r.mode,
            chunk,
            r.frames,
            r.width,
            r.height,
            r.runs,
            r.figures(false),
            r.wait_share * 100.0,
            r.cpu_ms_per_frame,
            r.vs_loop,
            r.vs_loop_cpu,
            r.status
        )
    });
    write(&out.join("frames.md"), &md)
}
