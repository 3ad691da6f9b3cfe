//! Criterion: whole decodes (TAEF2 and the SD1.5 / FLUX.1 presets) per size,
//! untiled and with exact tiles (half the image side: 4 tiles).
//!
//! Sizes come from `WGVAE_BENCH_DECODE_SIZES` (comma-separated output pixels,
//! default `128,256,512`; a GPU run can use `1024,2048`); cells the device
//! cannot run (e.g. an untiled activation above the binding limit) are skipped
//! with a message. `WGVAE_BENCH_DECODE_TILED=0` skips the tiled variants;
//! `WGVAE_BENCH_DECODE_MODELS=taef2,sd15,flux1` (default: all) picks models. Time
//! is the GPU time summed from timestamp queries when the adapter writes them
//! inside passes (for tiled decodes: summed over all tile steps), wall time
//! (submit to pixels on the host) otherwise; the choice is printed.
//! Throughput is in pixels; GFLOP/s = 2·MACs / median time is printed per cell.
//!
//! Group `frames`: `WGVAE_BENCH_FRAMES` (default 16) TAEF2 frames per size,
//! streamed by `wgvae::frames::decode_frames` (automatic chunk size, batched
//! forwards, double-buffered RGBA8 readback) against one `decode()` per
//! frame; wall time, throughput in frames. Needs `../shared` (TAEF2 weights).

use std::cell::RefCell;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgvae::frames::{decode_frames, FramesOptions};
use wgvae::io::HostTensor;
use wgvae::memory::Policy;
use wgvae::testing::{rand_vec, shared_dir, test_context};
use wgvae::tiling::Tiling;
use wgvae::{decode, DecodeOptions, LoadOptions, Vae};

fn sizes() -> Vec<usize> {
    if std::env::var_os("WGVAE_BENCH_SIZES").is_some() {
        println!("note: WGVAE_BENCH_SIZES is ignored; decode sizes are WGVAE_BENCH_DECODE_SIZES");
    }
    std::env::var("WGVAE_BENCH_DECODE_SIZES")
        .unwrap_or_else(|_| "128,256,512".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn models() -> Vec<(String, String)> {
    let mut m = vec![
        ("sd15".to_string(), "preset:sd15".to_string()),
        ("flux1".into(), "preset:flux1".into()),
    ];
    if let Some(s) = shared_dir() {
        m.insert(
            0,
            (
                "taef2".into(),
                s.join("weights/taef2/decoder.safetensors")
                    .display()
                    .to_string(),
            ),
        );
    }
    // Models named in WGVAE_BENCH_DECODE_MODELS, or all.
    if let Ok(wanted) = std::env::var("WGVAE_BENCH_DECODE_MODELS") {
        let wanted: Vec<&str> = wanted.split(',').map(str::trim).collect();
        m.retain(|(name, _)| wanted.contains(&name.as_str()));
    }
    m
}

fn bench_decode(c: &mut Criterion) {
    let ctx = test_context().with_pool(Policy::Planned.new_pool());
    let gpu_time = ctx.caps().timestamp_inside_passes;
    println!(
        "decode bench on {} ({:?}): {}",
        ctx.caps().adapter_name,
        ctx.caps().backend,
        if gpu_time {
            "GPU time from timestamp queries"
        } else {
            "wall time (no timestamps inside passes)"
        }
    );
    let mut group = c.benchmark_group("decode");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    let tiled_variants = std::env::var("WGVAE_BENCH_DECODE_TILED").map_or(true, |v| v != "0");
    for (name, spec) in models() {
        let vae = Vae::load(&ctx, &spec, &LoadOptions::default()).expect("load");
        for size in sizes() {
            let l = size / 8;
            let z = HostTensor::new(
                vec![1, vae.latent_channels(), l, l],
                rand_vec(vae.latent_channels() * l * l, 1, 1.0),
            )
            .unwrap();
            let mut variants = vec![("untiled", Tiling::off())];
            if tiled_variants {
                variants.push(("exact", Tiling::exact().with_tile_size(size / 2)));
            }
            for (variant, tiling) in variants {
                let id = format!("{name}/{variant}");
                let opts = DecodeOptions {
                    raw_latents: true,
                    profile: gpu_time,
                    tiling,
                    ..Default::default()
                };
                // Cells the device cannot decode are skipped, saying why.
                let first = match decode(&ctx, &vae, &z, &opts) {
                    Ok(o) => o,
                    Err(e) => {
                        println!("decode/{id}/{size}: skipped: {e}");
                        continue;
                    }
                };
                let secs = |o: &wgvae::Decoded| match &o.profile {
                    Some(p) => p.gpu_ms / 1e3,
                    None => o.decode_ms / 1e3,
                };
                let samples = RefCell::new(Vec::new());
                group.throughput(Throughput::Elements((size * size) as u64));
                group.bench_with_input(BenchmarkId::new(id.clone(), size), &z, |b, z| {
                    b.iter_custom(|iters| {
                        let t: f64 = (0..iters)
                            .map(|_| secs(&decode(&ctx, &vae, z, &opts).expect("decode")))
                            .sum();
                        samples.borrow_mut().push(t / iters as f64);
                        Duration::from_secs_f64(t)
                    })
                });
                let mut v = samples.into_inner();
                v.sort_by(f64::total_cmp);
                let median = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
                println!(
                    "decode/{id}/{size}: {:.2} GFLOP/s at the median {:.1} ms ({}, {} MACs)",
                    2.0 * first.macs as f64 / 1e9 / median,
                    median * 1e3,
                    describe_tiling(&first.tiling),
                    first.macs
                );
            }
        }
    }
    group.finish();
}

fn frame_count() -> usize {
    std::env::var("WGVAE_BENCH_FRAMES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16)
}

fn bench_frames(c: &mut Criterion) {
    let Some(shared) = shared_dir() else {
        println!("frames: skipped (TAEF2 weights live in ../shared)");
        return;
    };
    let ctx = test_context().with_pool(Policy::Planned.new_pool());
    let weights = shared.join("weights/taef2/decoder.safetensors");
    let vae = Vae::load(
        &ctx,
        &weights.display().to_string(),
        &LoadOptions::default(),
    )
    .expect("load TAEF2");
    let n = frame_count();
    let c_lat = vae.latent_channels();
    let mut group = c.benchmark_group("frames");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    for size in sizes() {
        let l = size / 8;
        let per = c_lat * l * l;
        let z = HostTensor::new(vec![n, c_lat, l, l], rand_vec(n * per, 2, 1.0)).unwrap();
        let singles: Vec<HostTensor> = (0..n)
            .map(|i| {
                HostTensor::new(
                    vec![1, c_lat, l, l],
                    z.data[i * per..(i + 1) * per].to_vec(),
                )
                .unwrap()
            })
            .collect();
        let opts = FramesOptions {
            raw_latents: true,
            ..Default::default()
        };
        let single = DecodeOptions {
            raw_latents: true,
            ..Default::default()
        };
        // Sizes the device cannot stream are skipped, saying why.
        match decode_frames(&ctx, &vae, &z, &opts, |_| Ok(())) {
            Ok(r) => println!(
                "frames/taef2/{size}: {n} frames in chunks of {}: {:.3} frames/s, latency mean {:.1} / P99 {:.1} / max {:.1} ms",
                r.chunk, r.frames_per_s, r.latency.mean_ms, r.latency.p99_ms, r.latency.max_ms
            ),
            Err(e) => {
                println!("frames/taef2/{size}: skipped: {e}");
                continue;
            }
        }
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("streamed", size), &z, |b, z| {
            b.iter(|| {
                decode_frames(&ctx, &vae, z, &opts, |f| {
                    std::hint::black_box(f.rgba);
                    Ok(())
                })
                .expect("stream frames")
            })
        });
        group.bench_with_input(BenchmarkId::new("loop", size), &singles, |b, s| {
            b.iter(|| {
                for z in s {
                    std::hint::black_box(decode(&ctx, &vae, z, &single).expect("decode"));
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_decode, bench_frames);
criterion_main!(benches);

/// A decode's tiling in a few words: `untiled`, `exact 128px ×4`, `fast 64px overlap 16 ×9`
/// (as the `tiling` column of `wgvae bench decode`).
fn describe_tiling(t: &wgvae::tiling::TilingReport) -> String {
    match t.mode.as_str() {
        "exact" => format!("exact {}px ×{}", t.tile_size.unwrap_or(0), t.tiles),
        "fast" => format!(
            "fast {}px overlap {} ×{}",
            t.tile_size.unwrap_or(0),
            t.overlap.unwrap_or(0),
            t.tiles
        ),
        m => m.to_string(),
    }
}
