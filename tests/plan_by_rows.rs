//! Exact tiled plans made on a few rows of tiles, as huge images get them
//! (more tiles than a plan walks one by one): the estimate equals the
//! measured run, peaks and counts, and the run still equals the untiled
//! decode (or encode). `WGVAE_MAX_PLAN_TILES` lowers the tile count that switches to
//! such plans (its own test binary: the variable is process-wide).

use wgvae::encode::{encode, EncodeOptions};
use wgvae::estimate::Estimate;
use wgvae::io::{read_npy, HostTensor};
use wgvae::memory::Policy;
use wgvae::testing::{max_abs_diff, shared_dir, test_context};
use wgvae::{decode, DecodeOptions, LoadOptions, Tiling, Vae};

/// The golden latents stacked `k` times along the height (a tall image of
/// many rows of tiles).
fn tall(z: &HostTensor, k: usize) -> HostTensor {
    let [n, c, h, w] = [z.shape[0], z.shape[1], z.shape[2], z.shape[3]];
    let mut data = Vec::with_capacity(z.data.len() * k);
    for plane in z.data.chunks(h * w) {
        for _ in 0..k {
            data.extend_from_slice(plane);
        }
    }
    HostTensor::new(vec![n, c, h * k, w], data).unwrap()
}

#[test]
fn a_plan_by_rows_predicts_the_run() {
    let Some(dir) = shared_dir().map(|s| s.join("golden/aekl-tiny-sd")) else {
        return;
    };
    std::env::set_var("WGVAE_MAX_PLAN_TILES", "16");
    let spec = dir.to_str().unwrap();
    let z = tall(&read_npy(&dir.join("latents.npy")).unwrap(), 6);
    let shape: [usize; 4] = z.shape.clone().try_into().unwrap();
    let ctx = test_context();
    let vae = Vae::load(&ctx, spec, &LoadOptions::default()).unwrap();
    let reference = decode(&ctx, &vae, &z, &DecodeOptions::default()).unwrap();
    for policy in [Policy::Exact, Policy::Planned] {
        let ctx = ctx.with_pool(policy.new_pool());
        let vae = Vae::load(&ctx, spec, &LoadOptions::default()).unwrap();
        // 16-px tiles (2 latent pixels): 36 rows of 8; a budget that
        // holds a few rows of attention queries per pass.
        let mut tiling = Tiling::exact()
            .with_tile_size(16)
            .with_max_memory(vae.weights_bytes() + (1 << 19));
        tiling.tile_mid_block = true;
        let est = Estimate::new(ctx.caps(), policy, spec, &LoadOptions::default())
            .tiled(&tiling)
            .decode(shape)
            .unwrap();
        // The estimate is of a decode without the raw output (as the CLI's).
        let out = decode(
            &ctx,
            &vae,
            &z,
            &DecodeOptions {
                tiling: tiling.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        let t = &out.tiling;
        println!(
            "{}: estimate {} B, measured {} B; {} tiles; estimate {:?}; run {t:?}",
            policy.name(),
            est.peak_allocated_bytes,
            out.memory.allocated_bytes.peak,
            t.tiles,
            est.tiling
        );
        assert!(est.tiling.extrapolated, "planned by rows: {:?}", est.tiling);
        assert_eq!(t.tiles, 36 * 8);
        assert_eq!(t.device_parked_peak_bytes, 0, "every tile on the host");
        assert_eq!(est.peak_allocated_bytes, out.memory.allocated_bytes.peak);
        assert_eq!(est.peak_reserved_bytes, out.memory.reserved_bytes.peak);
        // Counts extrapolated from three row counts are the run's; waits
        // for staging space (a floor of bytes over the limit) within 0.5%.
        let mut run = t.clone();
        run.extrapolated = true;
        run.syncs = est.tiling.syncs;
        assert_eq!(est.tiling, run);
        let off = est.tiling.syncs.abs_diff(t.syncs) as f64 / t.syncs as f64;
        assert!(off <= 0.005, "syncs {} vs {}", est.tiling.syncs, t.syncs);
        let raw = |tiling: Tiling| {
            let opts = DecodeOptions {
                tiling,
                keep_raw: true,
                ..Default::default()
            };
            decode(&ctx, &vae, &z, &opts).unwrap().raw.unwrap().data
        };
        let (err, at) = max_abs_diff(&raw(tiling.clone()), &raw(Tiling::off()));
        println!("{}: max abs vs untiled {err:.3e}", policy.name());
        assert!(err <= 1e-3, "{}: {err} at {at}", policy.name());
        let worst = out.rgba[0]
            .iter()
            .zip(&reference.rgba[0])
            .map(|(p, q)| p.abs_diff(*q))
            .max()
            .unwrap();
        assert!(worst <= 1, "pixels differ by {worst}");
    }
}

/// The same for an encode: a tall random image of 64 rows of 16-px tiles.
#[test]
fn an_encode_planned_by_rows_predicts_the_run() {
    let Some(dir) = shared_dir().map(|s| s.join("golden/aekl-tiny-sd")) else {
        return;
    };
    std::env::set_var("WGVAE_MAX_PLAN_TILES", "16");
    let spec = dir.to_str().unwrap();
    let (h, w) = (1024, 128);
    let pixels: Vec<f32> = wgvae::testing::rand_vec(3 * h * w, 5, 127.5)
        .into_iter()
        .map(|v| v + 127.5)
        .collect();
    let img = HostTensor::new(vec![1, 3, h, w], pixels).unwrap();
    // A pool of its own: the other test allocates in the shared context's.
    let ctx = test_context().with_pool(Policy::Exact.new_pool());
    let enc = wgvae::Vae::load_encoder(&ctx, spec, &LoadOptions::default()).unwrap();
    let mut tiling = Tiling::exact()
        .with_tile_size(16)
        .with_max_memory(enc.weights_bytes() + (1 << 20));
    tiling.tile_mid_block = true;
    let est = Estimate::new(ctx.caps(), Policy::Exact, spec, &LoadOptions::default())
        .tiled(&tiling)
        .encode([1, 3, h, w])
        .unwrap();
    let opts = |tiling: Tiling| EncodeOptions {
        raw_latents: true,
        tiling,
        ..Default::default()
    };
    let out = encode(&ctx, &enc, &img, &opts(tiling.clone())).unwrap();
    let t = &out.tiling;
    println!("encode: estimate {est:?}; run {t:?}");
    assert!(est.tiling.extrapolated, "planned by rows: {:?}", est.tiling);
    assert_eq!(t.tiles, 64 * 8);
    assert_eq!(est.latents_shape, out.latents.shape);
    assert_eq!(est.peak_allocated_bytes, out.memory.allocated_bytes.peak);
    let mut run = t.clone();
    run.extrapolated = true;
    run.syncs = est.tiling.syncs;
    assert_eq!(est.tiling, run);
    let off = est.tiling.syncs.abs_diff(t.syncs) as f64 / t.syncs.max(1) as f64;
    assert!(off <= 0.005, "syncs {} vs {}", est.tiling.syncs, t.syncs);
    let whole = encode(&ctx, &enc, &img, &opts(Tiling::off())).unwrap();
    let (err, at) = max_abs_diff(&out.latents.data, &whole.latents.data);
    println!("encode: max abs vs untiled {err:.3e}");
    assert!(err <= 7.5e-6, "{err} at {at}");
}

/// A video whose frames have more tiles than an estimate runs one by one:
/// Wan 2.1 (tiny) in 16-px tiles over tall frames (20 rows of 3 tiles),
/// three chunks of one latent frame streamed for real. The estimate, made
/// on a few rows of tiles, equals the measured peaks and counts, and the
/// frames equal the untiled decode.
#[test]
fn a_video_planned_by_rows_predicts_the_run() {
    let Some(dir) = shared_dir().map(|s| s.join("golden/wan21-tiny")) else {
        return;
    };
    std::env::set_var("WGVAE_MAX_PLAN_TILES", "16");
    let spec = dir.to_str().unwrap();
    let load = LoadOptions::default();
    let (h, w, frames) = (40, 6, 3);
    let ctx = test_context().with_pool(Policy::Exact.new_pool());
    let vae = wgvae::Vae::load(&ctx, spec, &load).unwrap();
    let weights = ctx.pool().stats().allocated_bytes.current;
    // A budget whose attention passes take parts of a row (q = 1 row).
    let tiling = Tiling::exact()
        .with_tile_size(16)
        .with_max_memory(weights + (16 << 10));
    let chunks: Vec<HostTensor> = (0..frames)
        .map(|t| {
            let z = wgvae::testing::rand_vec(16 * h * w, t as u64 + 7, 1.0);
            HostTensor::new(vec![1, 16, h, w], z).unwrap()
        })
        .collect();
    let decode = |tiling: Tiling| {
        let mut stream = wgvae::VideoDecoder::new(&ctx, &vae).unwrap();
        stream.set_tiling(tiling).unwrap();
        ctx.pool().reset_peak_stats();
        let out: Vec<f32> = chunks
            .iter()
            .flat_map(|z| stream.decode(z).unwrap().data)
            .collect();
        let stats = ctx.pool().stats();
        (out, stats, stream.tiling_report())
    };
    let (tiled, stats, report) = decode(tiling.clone());
    let t = report.expect("an exact tiled run reports its tiles");
    let est = Estimate::new(ctx.caps(), Policy::Exact, spec, &load)
        .video_tiled((8 * h, 8 * w), frames, 1, &tiling)
        .unwrap();
    let e = est.tiling.clone().expect("a tiled estimate");
    println!("video: estimate {est:?}; run {t:?}");
    assert!(e.extrapolated, "planned by rows: {e:?}");
    assert_eq!(e.tiles, 20 * 3);
    assert_eq!(t.device_parked_peak_bytes, 0, "every tile on the host");
    assert_eq!(est.peak_allocated_bytes, stats.allocated_bytes.peak);
    assert_eq!(est.peak_reserved_bytes, stats.reserved_bytes.peak);
    assert_eq!(est.cache_bytes, 0, "the caches parked on the host");
    let mut run = t.clone();
    run.extrapolated = true;
    run.syncs = e.syncs;
    run.tiles = e.tiles;
    run.max_memory = e.max_memory;
    assert_eq!(e, run);
    let off = e.syncs.abs_diff(t.syncs) as f64 / t.syncs.max(1) as f64;
    assert!(off <= 0.005, "syncs {} vs {}", e.syncs, t.syncs);
    let (untiled, _, _) = decode(Tiling::off());
    let (err, at) = max_abs_diff(&tiled, &untiled);
    println!("video: max abs vs untiled {err:.3e}");
    assert!(err <= 1e-5, "{err} at {at}");
}
