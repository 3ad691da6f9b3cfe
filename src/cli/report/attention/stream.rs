//! LongLive-shaped streaming: chunks of frames through a KV cache.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use wgvae::attention::{ConcatKvCache, KvCacheConfig, KvDtype, RingKvCache};
use wgvae::error::Result;
use wgvae::gpu::{Context, Recorder};
use wgvae::memory::Policy;
use wgvae::seeded::uniform as rand_vec;
use wgvae::tensor::{DType, Tensor};

use super::mib;
use crate::cli::report::bench::Metadata;
use crate::cli::report::{create_dir, loglog_chart, table, write, MIB};

/// KV-cache strategy of the streaming benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamPreset {
    /// Naive concatenating cache: grows and copies every chunk.
    Baseline,
    /// Static ring cache, f32.
    StaticKv,
    /// Static ring cache, int8 K/V.
    Int8Kv,
}

impl StreamPreset {
    /// Every preset.
    pub const ALL: [StreamPreset; 3] = [
        StreamPreset::Baseline,
        StreamPreset::StaticKv,
        StreamPreset::Int8Kv,
    ];
    /// The preset's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            StreamPreset::Baseline => "baseline",
            StreamPreset::StaticKv => "static-kv",
            StreamPreset::Int8Kv => "int8-kv",
        }
    }
}

/// The LongLive shape: tokens per latent frame at scale 1.
pub const LONGLIVE_TOKENS_PER_FRAME: usize = 1560;

/// What the streaming benchmark runs.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// KV cache preset.
    pub preset: StreamPreset,
    /// Chunks streamed.
    pub chunks: usize,
    /// Tokens per frame = round(1560 · scale).
    pub scale: f64,
    /// Frames per chunk.
    pub frames_per_chunk: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Sink frames kept.
    pub sink_frames: usize,
    /// Window frames kept.
    pub window_frames: usize,
    /// Chunks reported separately as warm-up (default: until the cache is
    /// full, plus one).
    pub warmup: Option<usize>,
    /// Memory policy.
    pub policy: Policy,
}

impl StreamConfig {
    /// The LongLive-style configuration of `preset`, `chunks` long, token counts scaled by `scale`.
    pub fn longlive(preset: StreamPreset, chunks: usize, scale: f64) -> Self {
        StreamConfig {
            preset,
            chunks,
            scale,
            frames_per_chunk: 3,
            heads: 12,
            head_dim: 128,
            sink_frames: 3,
            window_frames: 9,
            warmup: None,
            policy: Policy::Caching,
        }
    }

    /// Tokens per frame.
    pub fn tokens_per_frame(&self) -> usize {
        ((LONGLIVE_TOKENS_PER_FRAME as f64 * self.scale).round() as usize).max(1)
    }

    /// Chunks excluded from the statistics (cache filling up).
    pub fn warmup_chunks(&self) -> usize {
        self.warmup.unwrap_or_else(|| {
            (self.sink_frames + self.window_frames).div_ceil(self.frames_per_chunk.max(1)) + 1
        })
    }

    fn cache(&self, dtype: KvDtype) -> KvCacheConfig {
        KvCacheConfig {
            batch: 1,
            heads: self.heads,
            head_dim: self.head_dim,
            tokens_per_frame: self.tokens_per_frame(),
            sink_frames: self.sink_frames,
            window_frames: self.window_frames,
            dtype,
        }
    }
}

/// One chunk of a stream.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkSample {
    /// Chunk index.
    pub chunk: usize,
    /// Wall time: record, submit, wait for the GPU.
    pub ms: f64,
    /// Sum of the chunk's dispatch times from GPU timestamps, when available.
    pub gpu_ms: Option<f64>,
    /// Pool bytes allocated after the chunk.
    pub allocated_bytes: u64,
    /// Pool bytes reserved after the chunk.
    pub reserved_bytes: u64,
    /// Bytes of the KV cache.
    pub kv_bytes: u64,
}

/// The result of one streaming run.
#[derive(Clone, Debug, Serialize)]
pub struct StreamResult {
    /// Preset name.
    pub preset: &'static str,
    /// Chunks streamed.
    pub chunks: usize,
    /// Token-count scale.
    pub scale: f64,
    /// Tokens per frame.
    pub tokens_per_frame: usize,
    /// Frames per chunk.
    pub frames_per_chunk: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Sink frames kept.
    pub sink_frames: usize,
    /// Window frames kept.
    pub window_frames: usize,
    /// Memory policy.
    pub policy: &'static str,
    /// Chunks excluded from the statistics.
    pub warmup_chunks: usize,
    /// Latency of each warm-up chunk (cache filling, pipelines compiling).
    pub warmup_ms: Vec<f64>,
    /// Steady state (after warm-up).
    pub mean_ms: f64,
    /// Median chunk time in ms.
    pub p50_ms: f64,
    /// 99th-percentile chunk time in ms.
    pub p99_ms: f64,
    /// Largest chunk time in ms.
    pub max_ms: f64,
    /// Mean GPU time per chunk (timestamp queries), when available.
    pub gpu_mean_ms: Option<f64>,
    /// Chunks per second.
    pub chunks_per_s: f64,
    /// Latent frames per second.
    pub frames_per_s: f64,
    /// Useful attention GFLOP/s in steady state (4 · queries · keys · d · heads / mean).
    pub attention_gflops: f64,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// KV bytes held at the end (the baseline: grown cache + window copies).
    pub kv_bytes: u64,
    /// Allocated bytes after 10 chunks.
    pub allocated_after_10: Option<u64>,
    /// Allocated bytes after 100 chunks.
    pub allocated_after_100: Option<u64>,
    /// Reserved bytes after 10 chunks.
    pub reserved_after_10: Option<u64>,
    /// Reserved bytes after 100 chunks.
    pub reserved_after_100: Option<u64>,
    /// int8-kv only: the last chunk's output against the same stream through
    /// an f32 ring cache — max abs error and cosine similarity.
    pub int8_max_abs_error: Option<f64>,
    /// int8-kv only: cosine similarity of that comparison.
    pub int8_cosine: Option<f64>,
    #[serde(skip)]
    /// Per-chunk samples.
    pub samples: Vec<ChunkSample>,
}

enum Cache {
    Concat(ConcatKvCache),
    Ring(RingKvCache),
}

/// Streams `cfg.chunks` chunks: each appends its keys / values to the cache
/// and attends its queries over the cache, in one submission, waited for.
pub fn run_stream(
    ctx: &Context,
    cfg: &StreamConfig,
    mut progress: impl FnMut(&str),
) -> Result<StreamResult> {
    let ctx = ctx.with_pool(cfg.policy.new_pool());
    let tpf = cfg.tokens_per_frame();
    let chunk_tokens = cfg.frames_per_chunk * tpf;
    let shape = [1, chunk_tokens, cfg.heads, cfg.head_dim];
    let n = chunk_tokens * cfg.heads * cfg.head_dim;
    let q = Tensor::from_f32(&ctx, &shape, &rand_vec(n, 1, 1.0), "chunk q")?;
    let k = Tensor::from_f32(&ctx, &shape, &rand_vec(n, 2, 1.0), "chunk k")?;
    let v = Tensor::from_f32(&ctx, &shape, &rand_vec(n, 3, 1.0), "chunk v")?;
    let out = Tensor::empty(&ctx, &shape, DType::F32, "chunk out")?;
    let mut cache = match cfg.preset {
        StreamPreset::Baseline => Cache::Concat(ConcatKvCache::new(cfg.cache(KvDtype::F32))?),
        StreamPreset::StaticKv => Cache::Ring(RingKvCache::new(&ctx, cfg.cache(KvDtype::F32))?),
        StreamPreset::Int8Kv => Cache::Ring(RingKvCache::new(&ctx, cfg.cache(KvDtype::Int8))?),
    };
    Recorder::new(&ctx).submit()?; // flush the uploads, untimed
    ctx.wait_idle()?;
    let mut samples = Vec::with_capacity(cfg.chunks);
    for chunk in 1..=cfg.chunks {
        let t0 = Instant::now();
        let mut rec = Recorder::new(&ctx);
        let profiling = rec.enable_profiling();
        let kv_bytes = match &mut cache {
            Cache::Concat(c) => {
                c.append(&mut rec, &k, &v)?;
                c.attend(&mut rec, &q, &out, None)?;
                c.kv_bytes() + c.window_bytes()
            }
            Cache::Ring(c) => {
                c.append(&mut rec, &k, &v)?;
                c.attend(&mut rec, &q, &out, None)?;
                c.kv_bytes()
            }
        };
        let (_, profile) = rec.submit_profiled()?;
        ctx.wait_idle()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let s = ctx.pool().stats();
        samples.push(ChunkSample {
            chunk,
            ms,
            gpu_ms: profile.filter(|_| profiling).map(|p| p.gpu_ms),
            allocated_bytes: s.allocated_bytes.current,
            reserved_bytes: s.reserved_bytes.current,
            kv_bytes,
        });
        if chunk % 10 == 0 || chunk == cfg.chunks {
            progress(&format!(
                "{} chunk {chunk}/{}: {ms:.1} ms",
                cfg.preset.name(),
                cfg.chunks
            ));
        }
    }
    let stats = ctx.pool().stats();
    let int8_error = match cfg.preset {
        StreamPreset::Int8Kv if cfg.chunks > 0 => Some(int8_vs_f32(&ctx, cfg, &q, &k, &v, &out)?),
        _ => None,
    };
    let warm = cfg.warmup_chunks().min(cfg.chunks.saturating_sub(1));
    let steady: Vec<&ChunkSample> = samples[warm..].iter().collect();
    let mut times: Vec<f64> = steady.iter().map(|s| s.ms).collect();
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if times.is_empty() {
            return f64::NAN;
        }
        let rank = ((p * times.len() as f64).ceil() as usize).clamp(1, times.len());
        times[rank - 1]
    };
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let gpu: Vec<f64> = steady.iter().filter_map(|s| s.gpu_ms).collect();
    let keys = (cfg.sink_frames + cfg.window_frames) * tpf;
    let flop = 4.0 * (chunk_tokens * keys * cfg.head_dim * cfg.heads) as f64;
    let at = |c: usize| samples.get(c - 1);
    Ok(StreamResult {
        preset: cfg.preset.name(),
        chunks: cfg.chunks,
        scale: cfg.scale,
        tokens_per_frame: tpf,
        frames_per_chunk: cfg.frames_per_chunk,
        heads: cfg.heads,
        head_dim: cfg.head_dim,
        sink_frames: cfg.sink_frames,
        window_frames: cfg.window_frames,
        policy: cfg.policy.name(),
        warmup_chunks: warm,
        warmup_ms: samples[..warm].iter().map(|s| s.ms).collect(),
        mean_ms: mean,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        max_ms: times.last().copied().unwrap_or(f64::NAN),
        gpu_mean_ms: (!gpu.is_empty()).then(|| gpu.iter().sum::<f64>() / gpu.len() as f64),
        chunks_per_s: 1e3 / mean,
        frames_per_s: 1e3 / mean * cfg.frames_per_chunk as f64,
        attention_gflops: flop / 1e9 / (mean / 1e3),
        peak_allocated_bytes: stats.allocated_bytes.peak,
        peak_reserved_bytes: stats.reserved_bytes.peak,
        kv_bytes: samples.last().map_or(0, |s| s.kv_bytes),
        allocated_after_10: at(10).map(|s| s.allocated_bytes),
        allocated_after_100: at(100).map(|s| s.allocated_bytes),
        reserved_after_10: at(10).map(|s| s.reserved_bytes),
        reserved_after_100: at(100).map(|s| s.reserved_bytes),
        int8_max_abs_error: int8_error.map(|e| e.0),
        int8_cosine: int8_error.map(|e| e.1),
        samples,
    })
}

/// The same stream through an f32 ring cache (its own pool, after the
/// measured run): max abs error and cosine of the int8 output `out` of the
/// last chunk against it.
fn int8_vs_f32(
    ctx: &Context,
    cfg: &StreamConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
) -> Result<(f64, f64)> {
    let side = ctx.with_pool(Policy::Exact.new_pool());
    let mut cache = RingKvCache::new(&side, cfg.cache(KvDtype::F32))?;
    let want = Tensor::empty(&side, out.shape(), DType::F32, "f32 reference out")?;
    let mut rec = Recorder::new(&side);
    for _ in 0..cfg.chunks {
        cache.append(&mut rec, k, v)?;
    }
    cache.attend(&mut rec, q, &want, None)?;
    rec.submit()?;
    let (got, want) = (out.to_f32(ctx)?, want.to_f32(&side)?);
    let max_err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs() as f64)
        .fold(0.0, f64::max);
    let dot: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum();
    let norm = |x: &[f32]| x.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    Ok((max_err, dot / (norm(&got) * norm(&want)).max(1e-30)))
}

fn opt_mib(b: Option<u64>) -> String {
    b.map_or("-".into(), mib)
}

/// Writes `attention_stream.csv` (one row per preset), `attention_stream_chunks.csv`
/// (one row per chunk), `attention_stream.md` and `attention_stream_memory.svg`.
pub fn write_stream_report(results: &[StreamResult], meta: &Metadata, out: &Path) -> Result<()> {
    create_dir(out)?;
    let csv = meta.csv("preset,chunks,scale,tokens_per_frame,frames_per_chunk,heads,head_dim,sink_frames,window_frames,warmup_chunks,warmup_ms,mean_ms,p50_ms,p99_ms,max_ms,gpu_mean_ms,chunks_per_s,frames_per_s,attention_gflops,peak_allocated_bytes,peak_reserved_bytes,kv_bytes,allocated_after_10,allocated_after_100,int8_max_abs_error,int8_cosine\n", results, |r| {
        format!(
            "{},{},{},{},{},{},{},{},{},{},\"{}\",{:.3},{:.3},{:.3},{:.3},{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{}\n",
            r.preset,
            r.chunks,
            r.scale,
            r.tokens_per_frame,
            r.frames_per_chunk,
            r.heads,
            r.head_dim,
            r.sink_frames,
            r.window_frames,
            r.warmup_chunks,
            r.warmup_ms.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(" "),
            r.mean_ms,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.gpu_mean_ms.map_or(String::new(), |g| format!("{g:.3}")),
            r.chunks_per_s,
            r.frames_per_s,
            r.attention_gflops,
            r.peak_allocated_bytes,
            r.peak_reserved_bytes,
            r.kv_bytes,
            r.allocated_after_10.map_or(String::new(), |b| b.to_string()),
            r.allocated_after_100.map_or(String::new(), |b| b.to_string()),
            r.int8_max_abs_error.map_or(String::new(), |e| format!("{e:.3e}")),
            r.int8_cosine.map_or(String::new(), |c| format!("{c:.6}")),
        )
    });
    write(&out.join("attention_stream.csv"), &csv)?;
    let samples = results
        .iter()
        .flat_map(|r| r.samples.iter().map(move |s| (r.preset, s)));
    let chunks = meta.csv(
        "preset,chunk,ms,gpu_ms,allocated_bytes,reserved_bytes,kv_bytes\n",
        samples,
        |(preset, s)| {
            format!(
                "{},{},{:.3},{},{},{},{}\n",
                preset,
                s.chunk,
                s.ms,
                s.gpu_ms.map_or(String::new(), |g| format!("{g:.3}")),
                s.allocated_bytes,
                s.reserved_bytes,
                s.kv_bytes
            )
        },
    );
    write(&out.join("attention_stream_chunks.csv"), &chunks)?;

    let mut md = meta.markdown("Streaming attention (LongLive-shaped)");
    if let Some(r) = results.first() {
        md += &format!(
            "\nChunks of {} latent frames × {} tokens (scale {} of {}), {} heads × {}, f32 activations; each chunk appends its K/V to the cache and its queries attend to {} sink frames + a {}-frame window ({} keys when full), one submission per chunk, waited for. Latency: wall time per chunk (record, submit, GPU done); the first {} chunks (cache filling, pipeline compilation) are warm-up. Memory: the pool ({} policy).\n",
            r.frames_per_chunk,
            r.tokens_per_frame,
            r.scale,
            LONGLIVE_TOKENS_PER_FRAME,
            r.heads,
            r.head_dim,
            r.sink_frames,
            r.window_frames,
            (r.sink_frames + r.window_frames) * r.tokens_per_frame,
            r.warmup_chunks,
            r.policy
        );
    }
    md += &table("\n| preset | chunks | mean ms | P50 ms | P99 ms | max ms | GPU ms (mean) | chunks/s | frames/s | attention GFLOP/s | peak allocated MiB | peak reserved MiB | KV MiB | allocated after 10 / 100 chunks MiB | warm-up ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", results, |r| {
        format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} / {} | {} |\n",
            r.preset,
            r.chunks,
            r.mean_ms,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.gpu_mean_ms.map_or("-".into(), |g| format!("{g:.2}")),
            r.chunks_per_s,
            r.frames_per_s,
            r.attention_gflops,
            mib(r.peak_allocated_bytes),
            mib(r.peak_reserved_bytes),
            mib(r.kv_bytes),
            opt_mib(r.allocated_after_10),
            opt_mib(r.allocated_after_100),
            r.warmup_ms.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(", ")
        )
    });
    let find = |name: &str| results.iter().find(|r| r.preset == name);
    if let (Some(s), Some(i)) = (find("static-kv"), find("int8-kv")) {
        md += &format!(
            "\nint8-kv vs static-kv: KV bytes {:.3}× of the f32 cache (measured; vs an f16 cache, computed at 2 bytes per element: {:.3}×); mean latency {:.3}×, P99 {:.3}×, mean GPU time {}.\n",
            i.kv_bytes as f64 / s.kv_bytes as f64,
            2.0 * i.kv_bytes as f64 / s.kv_bytes as f64,
            i.mean_ms / s.mean_ms,
            i.p99_ms / s.p99_ms,
            match (i.gpu_mean_ms, s.gpu_mean_ms) {
                (Some(a), Some(b)) => format!("{:.3}×", a / b),
                _ => "not available".into(),
            }
        );
    }
    if let Some(i) = find("int8-kv") {
        if let (Some(e), Some(c)) = (i.int8_max_abs_error, i.int8_cosine) {
            md += &format!(
                "\nint8-kv accuracy: the last chunk's output vs the same stream through an f32 ring cache: max abs error {e:.3e}, cosine similarity {c:.6}.\n"
            );
        }
    }
    for r in results {
        if let (Some(a), Some(b)) = (r.allocated_after_10, r.allocated_after_100) {
            md += &format!(
                "\n{}: allocated after 10 chunks {} B, after 100 chunks {} B ({}).",
                r.preset,
                a,
                b,
                if a == b { "identical" } else { "grows" }
            );
        }
    }
    md += "\n";
    write(&out.join("attention_stream.md"), &md)?;

    let mem: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            (
                format!("{} allocated", r.preset),
                r.samples
                    .iter()
                    .map(|s| (s.chunk as f64, s.allocated_bytes as f64 / MIB))
                    .collect(),
            )
        })
        .collect();
    loglog_chart(
        &out.join("attention_stream_memory.svg"),
        "allocated memory vs chunks streamed",
        ("chunks", "MiB"),
        &mem,
    )?;
    let lat: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            (
                format!("{} ms", r.preset),
                r.samples.iter().map(|s| (s.chunk as f64, s.ms)).collect(),
            )
        })
        .collect();
    loglog_chart(
        &out.join("attention_stream_latency.svg"),
        &format!("chunk latency on {}", meta.adapter),
        ("chunk", "ms"),
        &lat,
    )
}
