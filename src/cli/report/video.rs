//! `wgvae bench video`: a causal video decoder (TAEHV, Wan 2.1) streamed
//! through [`VideoDecoder`] chunk by chunk: frames/s, latency per latent
//! chunk and peak pool memory per video length (flat when the time caches
//! are all that outlives a chunk).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::bench::{columns_csv, Column, Metadata, Timing};
use super::frames::{cpu_ms_since, median, process_cpu_seconds};
use super::{create_dir, line_chart, table, write, MIB};
use wgvae::error::{Error, Result};
use wgvae::frames::LatencySummary;
use wgvae::gpu::Context;
use wgvae::io::HostTensor;
use wgvae::models::{LoadOptions, Precision};
use wgvae::video::VideoModel;
use wgvae::VideoDecoder;

/// What to benchmark.
#[derive(Clone, Debug)]
pub struct VideoBench {
    /// Video VAE spec (TAEHV file, a diffusers video VAE folder or file, `preset:wan21|wan22|hunyuanvideo15|ltx2|minimax-h3`).
    pub vae: String,
    /// Seed of a preset's random weights.
    pub seed: u64,
    /// Square output size in pixels.
    pub size: usize,
    /// Video lengths in latent frames (one row each).
    pub latent_frames: Vec<usize>,
    /// Latent frames per streamed chunk.
    pub chunks: Vec<usize>,
    /// Storage precisions.
    pub dtypes: Vec<Precision>,
    /// Runs and memory policy.
    pub timing: Timing,
}

/// Latency of the chunks of all timed runs: submit → frames on the host.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ChunkLatency {
    /// Mean ms.
    pub mean_ms: f64,
    /// Median (nearest rank) ms.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank) ms.
    pub p99_ms: f64,
    /// Largest ms.
    pub max_ms: f64,
}

impl ChunkLatency {
    /// Summary of `samples` (NaN fields when empty).
    pub fn of(samples: &[f64]) -> Self {
        let s = LatencySummary::of(samples);
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let p50_ms = match sorted.len() {
            0 => f64::NAN,
            n => sorted[n.div_ceil(2) - 1],
        };
        ChunkLatency {
            mean_ms: s.mean_ms,
            p50_ms,
            p99_ms: s.p99_ms,
            max_ms: s.max_ms,
        }
    }
}

/// One measured configuration: a dtype, a chunk size, a video length.
#[derive(Clone, Debug, Serialize)]
pub struct VideoRow {
    /// The decoder's name.
    pub model: String,
    /// Storage dtype.
    pub dtype: &'static str,
    /// Latent frames per chunk.
    pub chunk: usize,
    /// Latent frames of the video.
    pub latent_frames: usize,
    /// Output frames of the video.
    pub frames: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Timed runs.
    pub runs: usize,
    /// Median over runs of the wall time of the whole video.
    pub median_total_ms: f64,
    /// `frames / median_total`.
    pub frames_per_s: f64,
    /// Per-chunk latency over all timed runs.
    pub latency: ChunkLatency,
    /// Peak allocated pool MiB during a run.
    pub peak_allocated_mib: f64,
    /// Peak reserved pool MiB during a run.
    pub peak_reserved_mib: f64,
    /// Pool MiB the time caches hold between chunks.
    pub cache_mib: f64,
    /// Read-back staging buffers (outside the pool).
    pub staging_mib: f64,
    /// CPU time of the whole process per output frame (Linux; NaN elsewhere):
    /// on a CPU adapter it includes the device's work and does not grow when
    /// other processes share the cores.
    pub cpu_ms_per_frame: f64,
    /// "ok" or why the configuration did not run.
    pub status: String,
}

/// One timed pass over a whole video.
struct Pass {
    total_ms: f64,
    latency_ms: Vec<f64>,
    frames: usize,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    cache_bytes: u64,
    staging_bytes: u64,
}

/// Streams `chunks` (one video) through a fresh [`VideoDecoder`]; every
/// returned value is touched, as a consumer would.
fn pass(ctx: &Context, model: VideoModel, chunks: &[HostTensor]) -> Result<Pass> {
    ctx.pool().empty_cache();
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let mut stream = VideoDecoder::of(ctx, model);
    let (mut latency_ms, mut frames, mut checksum) = (Vec::new(), 0, 0.0f32);
    let mut take = |got: Option<wgvae::VideoFrames>| {
        if let Some(f) = got {
            latency_ms.push(f.latency_ms);
            frames += f.frames.shape.first().copied().unwrap_or(0);
            checksum += f.frames.data.iter().sum::<f32>();
        }
    };
    for chunk in chunks {
        take(stream.push(chunk)?);
    }
    take(stream.finish()?);
    std::hint::black_box(checksum);
    let (cache_bytes, staging_bytes) = (stream.cache_bytes(), stream.staging_bytes());
    drop(stream);
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    let stats = ctx.pool().stats();
    Ok(Pass {
        total_ms,
        latency_ms,
        frames,
        peak_allocated_bytes: stats.allocated_bytes.peak,
        peak_reserved_bytes: stats.reserved_bytes.peak,
        cache_bytes,
        staging_bytes,
    })
}

/// Every chunk latency of every timed run, for `video_latency.csv`.
#[derive(Clone, Debug)]
pub struct ChunkSample {
    /// Storage dtype.
    pub dtype: &'static str,
    /// Latent frames per chunk.
    pub chunk: usize,
    /// Latent frames of the video.
    pub latent_frames: usize,
    /// Timed run index.
    pub run: usize,
    /// Chunk index in the video.
    pub index: usize,
    /// The chunk's latency in ms.
    pub latency_ms: f64,
}

/// One configuration's timed passes so far.
struct Cell {
    chunk: usize,
    latent_frames: usize,
    chunks: Vec<HostTensor>,
    passes: Vec<Pass>,
    cpu_ms_per_frame: Vec<f64>,
    status: String,
}

/// Runs the benchmark: per dtype, runs interleaved across chunk sizes and
/// lengths (run 1 of every configuration, then run 2, …) so load from other
/// processes spreads over them alike. One untimed chunk per chunk size
/// compiles the pipelines first. A configuration that fails is a row with
/// its reason.
pub fn run_video_bench(
    ctx: &Context,
    b: &VideoBench,
    mut progress: impl FnMut(&str),
) -> Result<(Vec<VideoRow>, Vec<ChunkSample>)> {
    if b.latent_frames.is_empty() || b.latent_frames.contains(&0) {
        return Err(Error::InvalidInput(
            "--latent-frames: give one or more positive counts".into(),
        ));
    }
    if b.chunks.is_empty() || b.chunks.contains(&0) {
        return Err(Error::InvalidInput(
            "--chunk: give one or more positive latent frame counts".into(),
        ));
    }
    let longest = b.latent_frames.iter().copied().max().unwrap_or(1);
    let max_frames = wgvae::estimate::MAX_VIDEO_FRAMES;
    if longest > max_frames {
        return Err(Error::InvalidInput(format!(
            "--latent-frames {longest}: expected at most {max_frames} latent frames"
        )));
    }
    if let Some(&c) = b.chunks.iter().find(|&&c| c > longest) {
        return Err(Error::InvalidInput(format!(
            "--chunk {c}: more latent frames per chunk than the longest video (--latent-frames {longest}); expected a chunk of at most {longest}"
        )));
    }
    if b.timing.runs == 0 {
        return Err(Error::InvalidInput(
            "--runs 0: expected at least 1 timed run".into(),
        ));
    }
    let ctx = ctx.with_pool(b.timing.policy.new_pool());
    let (mut rows, mut samples) = (Vec::new(), Vec::new());
    for &precision in &b.dtypes {
        let load = LoadOptions {
            precision,
            seed: b.seed,
            ..Default::default()
        };
        let loaded = wgvae::Vae::load(&ctx, &b.vae, &load)?;
        let dtype = loaded.dtype();
        let model = loaded.video_decoder("a video bench")?;
        let up = model.upscale();
        if b.size == 0 || !b.size.is_multiple_of(up) {
            return Err(Error::InvalidInput(format!(
                "--size {}: must be a positive multiple of {up}",
                b.size
            )));
        }
        let (c, l) = (model.latent_channels(), b.size / up);
        // Host memory of the random video and of every configuration's
        // chunks, checked before building any of it.
        let frame = c.checked_mul(l).and_then(|v| v.checked_mul(l));
        let copies = b.latent_frames.iter().try_fold(longest, |acc, &t| {
            acc.checked_add(t.checked_mul(b.chunks.len())?)
        });
        crate::cli::bench::check_host_f32(
            "--size/--latent-frames",
            "the random latents",
            frame.zip(copies).and_then(|(f, n)| f.checked_mul(n)),
        )?;
        let frame = c * l * l;
        if (frame as u64) * 4 > ctx.caps().max_buffer_size {
            return Err(Error::InvalidInput(format!(
                "--size {}: one latent frame ({frame} values) exceeds this device's largest buffer ({} bytes); use a smaller --size",
                b.size,
                ctx.caps().max_buffer_size
            )));
        }
        // Raw decoder input (TAEHV latents, Wan's raw z), the same video for all rows.
        let video = wgvae::seeded::uniform(longest * frame, b.size as u64, 1.0);
        let chunked = |t: usize, step: usize| -> Result<Vec<HostTensor>> {
            (0..t)
                .step_by(step)
                .map(|t0| {
                    let t1 = (t0 + step).min(t);
                    let data = video.get(t0 * frame..t1 * frame).unwrap_or_default();
                    HostTensor::new(vec![t1 - t0, c, l, l], data.to_vec())
                })
                .collect()
        };
        let mut cells = Vec::new();
        for &chunk in &b.chunks {
            progress(&format!(
                "{} {}: priming chunk {chunk}",
                model.name(),
                dtype.name()
            ));
            // A failure here shows up again in the rows' status.
            let prime = if model.whole_clip() { longest } else { chunk };
            if let Some(first) = chunked(prime, prime)?.first() {
                let _ = VideoDecoder::of(&ctx, model).decode(first);
            }
            for &t in &b.latent_frames {
                // A decoder that is not causal (LTX-2) takes each video whole.
                let chunk = if model.whole_clip() { t } else { chunk };
                cells.push(Cell {
                    chunk,
                    latent_frames: t,
                    chunks: chunked(t, chunk)?,
                    passes: Vec::new(),
                    cpu_ms_per_frame: Vec::new(),
                    status: "ok".into(),
                });
            }
        }
        let total_runs = b.timing.total();
        for run in 0..total_runs {
            for cell in cells.iter_mut().filter(|c| c.status == "ok") {
                progress(&format!(
                    "{} chunk {} × {} latent frames: run {}/{total_runs}",
                    dtype.name(),
                    cell.chunk,
                    cell.latent_frames,
                    run + 1
                ));
                let cpu0 = process_cpu_seconds();
                match pass(&ctx, model, &cell.chunks) {
                    Ok(p) if run >= b.timing.warmup => {
                        cell.cpu_ms_per_frame
                            .extend(cpu_ms_since(cpu0, p.frames.max(1)));
                        cell.passes.push(p);
                    }
                    Ok(_) => {}
                    Err(e) => cell.status = e.to_string(),
                }
            }
        }
        for cell in &mut cells {
            let mut totals: Vec<f64> = cell.passes.iter().map(|p| p.total_ms).collect();
            let median_ms = median(&mut totals);
            let latencies: Vec<f64> = cell
                .passes
                .iter()
                .flat_map(|p| p.latency_ms.iter().copied())
                .collect();
            for (run, p) in cell.passes.iter().enumerate() {
                samples.extend(
                    p.latency_ms
                        .iter()
                        .enumerate()
                        .map(|(index, &l)| ChunkSample {
                            dtype: dtype.name(),
                            chunk: cell.chunk,
                            latent_frames: cell.latent_frames,
                            run,
                            index,
                            latency_ms: l,
                        }),
                );
            }
            let last = cell.passes.last();
            let mib = |f: fn(&Pass) -> u64| last.map_or(f64::NAN, |p| f(p) as f64 / MIB);
            // Peaks: the largest over runs (each run starts from reset peaks).
            let peak = |f: fn(&Pass) -> u64| {
                cell.passes
                    .iter()
                    .map(f)
                    .max()
                    .map_or(f64::NAN, |v| v as f64 / MIB)
            };
            let frames = model.frames_for(cell.latent_frames);
            rows.push(VideoRow {
                model: model.name().to_string(),
                dtype: dtype.name(),
                chunk: cell.chunk,
                latent_frames: cell.latent_frames,
                frames,
                width: l * up,
                height: l * up,
                runs: cell.passes.len(),
                median_total_ms: median_ms,
                frames_per_s: frames as f64 / (median_ms / 1e3),
                latency: ChunkLatency::of(&latencies),
                peak_allocated_mib: peak(|p| p.peak_allocated_bytes),
                peak_reserved_mib: peak(|p| p.peak_reserved_bytes),
                cache_mib: mib(|p| p.cache_bytes),
                staging_mib: mib(|p| p.staging_bytes),
                cpu_ms_per_frame: median(&mut cell.cpu_ms_per_frame),
                status: cell.status.clone(),
            });
        }
    }
    check_finite(&rows)?;
    Ok((rows, samples))
}

/// A row marked "ok" must hold measured figures (see `report::check_measured`).
fn check_finite(rows: &[VideoRow]) -> Result<()> {
    for r in rows.iter().filter(|r| r.status == "ok") {
        super::check_measured(
            &format!(
                "bench video: chunk {} × {} latent frames",
                r.chunk, r.latent_frames
            ),
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
    Ok(())
}

/// The columns of `video.csv`.
const CSV_COLUMNS: &[Column<VideoRow>] = &[
    ("model", |r| format!("\"{}\"", r.model.replace('"', "'"))),
    ("dtype", |r| r.dtype.to_string()),
    ("chunk", |r| r.chunk.to_string()),
    ("latent_frames", |r| r.latent_frames.to_string()),
    ("frames", |r| r.frames.to_string()),
    ("width", |r| r.width.to_string()),
    ("height", |r| r.height.to_string()),
    ("runs", |r| r.runs.to_string()),
    ("median_total_ms", |r| format!("{:.2}", r.median_total_ms)),
    ("frames_per_s", |r| format!("{:.4}", r.frames_per_s)),
    ("chunk_latency_mean_ms", |r| {
        format!("{:.2}", r.latency.mean_ms)
    }),
    ("chunk_latency_p50_ms", |r| {
        format!("{:.2}", r.latency.p50_ms)
    }),
    ("chunk_latency_p99_ms", |r| {
        format!("{:.2}", r.latency.p99_ms)
    }),
    ("chunk_latency_max_ms", |r| {
        format!("{:.2}", r.latency.max_ms)
    }),
    ("peak_allocated_mib", |r| {
        format!("{:.2}", r.peak_allocated_mib)
    }),
    ("peak_reserved_mib", |r| {
        format!("{:.2}", r.peak_reserved_mib)
    }),
    ("cache_mib", |r| format!("{:.2}", r.cache_mib)),
    ("staging_mib", |r| format!("{:.2}", r.staging_mib)),
    ("cpu_ms_per_frame", |r| format!("{:.1}", r.cpu_ms_per_frame)),
    ("status", |r| format!("\"{}\"", r.status.replace('"', "'"))),
];

/// `video.csv`: the metadata as `# ` lines, a header, one line per row.
pub fn video_csv(rows: &[VideoRow], meta: &Metadata) -> String {
    columns_csv(meta, CSV_COLUMNS, rows)
}

/// Writes `video.csv`, `video.md`, `video_latency.csv` (every chunk of every
/// timed run), `video_memory.svg` (peak memory against the video's length)
/// and `video_throughput.svg` (frames/s against it) into `out`.
pub fn write_video_report(
    rows: &[VideoRow],
    samples: &[ChunkSample],
    meta: &Metadata,
    out: &Path,
) -> Result<()> {
    create_dir(out)?;
    write(&out.join("video.csv"), &video_csv(rows, meta))?;
    let lat = meta.csv(
        "dtype,chunk,latent_frames,run,chunk_index,latency_ms\n",
        samples,
        |s| {
            format!(
                "{},{},{},{},{},{:.3}\n",
                s.dtype, s.chunk, s.latent_frames, s.run, s.index, s.latency_ms
            )
        },
    );
    write(&out.join("video_latency.csv"), &lat)?;
    let mut md = meta.markdown("Video decode benchmark");
    md += "\nEach run streams one video through a fresh `VideoDecoder` (double-buffered read-back), \
           runs interleaved across configurations. Latency: a chunk's submit to its frames on the host. \
           Peak allocated / reserved: the pool's peaks during a run (time caches and one chunk's activations; \
           flat in the video's length). Cache: what the time caches hold between chunks. \
           Staging: the two read-back buffers, outside the pool. \
           `CPU ms/frame`: CPU time of the whole process per output frame (on a CPU adapter the device's work included).\n\n";
    md += &table(
        "| model | dtype | chunk | latent frames | frames | size | runs | median total ms | frames/s | chunk latency mean ms | P50 ms | P99 ms | max ms | peak allocated MiB | peak reserved MiB | cache MiB | staging MiB | CPU ms/frame | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        rows,
        |r| {
            format!(
                "| {} | {} | {} | {} | {} | {}×{} | {} | {:.1} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.0} | {} |\n",
                r.model, r.dtype, r.chunk, r.latent_frames, r.frames, r.width, r.height, r.runs,
                r.median_total_ms, r.frames_per_s, r.latency.mean_ms, r.latency.p50_ms,
                r.latency.p99_ms, r.latency.max_ms, r.peak_allocated_mib, r.peak_reserved_mib,
                r.cache_mib, r.staging_mib, r.cpu_ms_per_frame, r.status
            )
        },
    );
    write(&out.join("video.md"), &md)?;
    // One series per (dtype, chunk), x = latent frames.
    let mut keys: Vec<(&str, usize)> = Vec::new();
    for r in rows {
        if !keys.contains(&(r.dtype, r.chunk)) {
            keys.push((r.dtype, r.chunk));
        }
    }
    let series = |f: &dyn Fn(&VideoRow) -> f64, what: &str| -> Vec<(String, Vec<(f64, f64)>)> {
        keys.iter()
            .map(|&(d, c)| {
                let pts = rows
                    .iter()
                    .filter(|r| (r.dtype, r.chunk) == (d, c))
                    .map(|r| (r.latent_frames as f64, f(r)));
                (format!("{what} {d} chunk {c}"), pts.collect())
            })
            .collect()
    };
    let mut memory = series(&|r| r.peak_allocated_mib, "peak allocated");
    let allocated = memory.len();
    memory.extend(series(&|r| r.peak_reserved_mib, "peak reserved"));
    // Reserved often equals allocated (planned pool): dashed, so both show.
    let dashed: Vec<bool> = (0..memory.len()).map(|i| i >= allocated).collect();
    let model = rows.first().map_or("video decoder", |r| r.model.as_str());
    line_chart(
        &out.join("video_memory.svg"),
        &format!("peak memory of {model} on {}", meta.adapter),
        ("latent frames per video", "MiB"),
        &memory,
        &dashed,
    )?;
    line_chart(
        &out.join("video_throughput.svg"),
        &format!("{model} frames/s on {}", meta.adapter),
        ("latent frames per video", "frames/s"),
        &series(&|r| r.frames_per_s, "frames/s"),
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(latent_frames: usize, status: &str) -> VideoRow {
        VideoRow {
            model: "TAEW2.1".into(),
            dtype: "f32",
            chunk: 1,
            latent_frames,
            frames: 4 * latent_frames - 3,
            width: 64,
            height: 64,
            runs: 2,
            median_total_ms: 100.0,
            frames_per_s: 10.0,
            latency: ChunkLatency::of(&[1.0, 2.0, 3.0, 10.0]),
            peak_allocated_mib: 5.0,
            peak_reserved_mib: 6.0,
            cache_mib: 0.5,
            staging_mib: 0.25,
            cpu_ms_per_frame: 20.0,
            status: status.into(),
        }
    }

    #[test]
    fn latency_percentiles_are_nearest_rank() {
        let l = ChunkLatency::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(
            (l.p50_ms, l.p99_ms, l.max_ms, l.mean_ms),
            (2.0, 4.0, 4.0, 2.5)
        );
        assert!(ChunkLatency::of(&[]).p50_ms.is_nan());
    }

    #[test]
    fn report_rows_match_the_header_and_charts_name_the_series() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("video-report");
        let rows = [row(3, "ok"), row(6, "failed, \"x\"")];
        let meta = Metadata::for_test("s");
        write_video_report(&rows, &[], &meta, &dir).unwrap();
        let csv = std::fs::read_to_string(dir.join("video.csv")).unwrap();
        let lines: Vec<&str> = csv.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines.len(), 3, "{csv}");
        // No field holds a comma outside quotes in these rows but the status.
        assert!(lines[0].starts_with("model,dtype,chunk,latent_frames,frames,"));
        assert!(lines[1].contains(",3,9,64,64,2,100.00,10.0000,4.00,2.00,10.00,10.00,5.00,6.00,"));
        let svg = std::fs::read_to_string(dir.join("video_memory.svg")).unwrap();
        assert!(svg.contains("peak allocated f32 chunk 1"), "{svg}");
        assert!(dir.join("video_throughput.svg").exists());
    }
}
