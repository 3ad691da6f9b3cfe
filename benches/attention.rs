//! Criterion: flash attention at the VAE mid-block's shapes (one head of
//! d = 512 over T = h·w tokens, channel-major, as the decoder calls it).
//!
//! Token counts come from `WGVAE_ATTN_TOKENS` (comma-separated, default
//! `1024`; a GPU run can use `1024,4096,16384`, i.e. 256² / 512² / 1024²
//! decodes). Time is the GPU time of the dispatch from timestamp queries when
//! the adapter writes them inside passes, wall time (submit to done)
//! otherwise; the choice is printed. Throughput is in tokens; GFLOP/s
//! (4·T²·d / time) is printed per size.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgvae::gpu::Recorder;
use wgvae::kernels::attention::attention;
use wgvae::testing::{rand_vec, test_context};
use wgvae::{DType, Tensor};

const HEAD_DIM: usize = 512;

fn token_counts() -> Vec<usize> {
    std::env::var("WGVAE_ATTN_TOKENS")
        .unwrap_or_else(|_| "1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn bench_mid_block_attention(c: &mut Criterion) {
    let ctx = test_context();
    let gpu_time = ctx.caps().timestamp_inside_passes;
    println!(
        "attention bench on {} ({:?}): {}",
        ctx.caps().adapter_name,
        ctx.caps().backend,
        if gpu_time {
            "GPU time from timestamp queries"
        } else {
            "wall time (no timestamps inside passes)"
        }
    );
    let mut group = c.benchmark_group("vae_mid_block_attention");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    for t in token_counts() {
        let shape = [1, HEAD_DIM, t];
        let n = HEAD_DIM * t;
        let make = |seed, label| Tensor::from_f32(&ctx, &shape, &rand_vec(n, seed, 1.0), label);
        let (q, k, v) = match (make(1, "q"), make(2, "k"), make(3, "v")) {
            (Ok(q), Ok(k), Ok(v)) => (q, k, v),
            _ => {
                println!("attention/{t}: skipped: cannot allocate the inputs");
                continue;
            }
        };
        let out = Tensor::empty(&ctx, &shape, DType::F32, "out").expect("out");
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        // One run: seconds of GPU time (or wall time).
        let run = || -> wgvae::Result<f64> {
            let start = Instant::now();
            let mut rec = Recorder::new(&ctx);
            if gpu_time {
                rec.enable_profiling();
            }
            attention(&mut rec, &q, &k, &v, scale, &out)?;
            let (_, profile) = rec.submit_profiled()?;
            ctx.wait_idle()?;
            Ok(match profile {
                Some(p) if gpu_time => p.gpu_ms / 1e3,
                _ => start.elapsed().as_secs_f64(),
            })
        };
        let first = match run() {
            Ok(s) => s,
            Err(e) => {
                println!("attention/{t}: skipped: {e}");
                continue;
            }
        };
        let flop = 4.0 * (t as f64) * (t as f64) * HEAD_DIM as f64;
        println!(
            "attention/{t} (d = {HEAD_DIM}): {:.1} ms, {:.2} GFLOP/s",
            first * 1e3,
            flop / first / 1e9
        );
        group.throughput(Throughput::Elements(t as u64));
        group.bench_with_input(BenchmarkId::from_parameter(t), &t, |b, _| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| Duration::from_secs_f64(run().expect("attention")))
                    .sum()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_mid_block_attention);
criterion_main!(benches);
