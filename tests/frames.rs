//! Streaming frame decoding (`wgvae::frames`): chunked, batched, double
//! buffered output against `decode()` of each frame alone, frame order,
//! automatic chunk size, errors, and the CLI's `--frames-out`.
//!
//! Equality is exact: every byte of every streamed frame equals the byte of
//! the single-frame decode (the kernels treat the batch dimension
//! independently, so batching changes no summation order).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use wgvae::frames::{choose_chunk, decode_frames, FramesOptions, FramesReport, LatencySummary};
use wgvae::gpu::Context;
use wgvae::io::HostTensor;
use wgvae::memory::Policy;
use wgvae::models::WeightStore;
use wgvae::testing::{rand_vec, shared_dir, test_context, tiny_kl_config};
use wgvae::{decode, DecodeOptions, Error, LoadOptions, Vae};

/// [`tiny_config`] with seeded random weights.
fn tiny_random_vae(ctx: &Context) -> Vae {
    let cfg = tiny_kl_config();
    Vae::from_kl_config(
        ctx,
        &cfg,
        &WeightStore::random(7),
        "tiny random AutoencoderKL",
    )
    .unwrap()
}

/// One frame `i` of `[N, C, h, w]` latents as a batch of one.
fn frame(z: &HostTensor, i: usize) -> HostTensor {
    let per: usize = z.shape[1..].iter().product();
    let mut shape = z.shape.clone();
    shape[0] = 1;
    HostTensor::new(shape, z.data[i * per..(i + 1) * per].to_vec()).unwrap()
}

/// Streams `z` and checks every frame against `want` (RGBA8 per frame),
/// byte for byte, and that frames arrive in order exactly once.
fn stream_and_compare(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    opts: &FramesOptions,
    want: &[Vec<u8>],
    what: &str,
) -> FramesReport {
    let mut seen = Vec::new();
    let mut latencies = Vec::new();
    let report = decode_frames(ctx, vae, z, opts, |f| {
        seen.push(f.index);
        latencies.push(f.latency_ms);
        let expected = &want[f.index];
        assert_eq!(
            f.rgba.len(),
            expected.len(),
            "{what}: frame {} size",
            f.index
        );
        let differ = f.rgba.iter().zip(expected).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "{what}: frame {}: {differ} bytes differ from decode() of the frame alone",
            f.index
        );
        Ok(())
    })
    .unwrap();
    let n = z.shape[0];
    assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{what}: order");
    assert_eq!(report.frames, n);
    // The report carries the latencies the callback saw, summarised from
    // them, each within the call's wall time; frames/s is N over that time.
    assert_eq!(report.latency_ms, latencies, "{what}: latencies");
    assert!(
        latencies.iter().all(|&l| l > 0.0 && l <= report.total_ms),
        "{what}: latencies {latencies:?} outside (0, {}]",
        report.total_ms
    );
    let summary = LatencySummary::of(&latencies);
    assert_eq!(
        (
            report.latency.mean_ms,
            report.latency.p99_ms,
            report.latency.max_ms
        ),
        (summary.mean_ms, summary.p99_ms, summary.max_ms),
        "{what}: latency summary"
    );
    let fps = n as f64 / (report.total_ms / 1e3);
    assert!(
        (report.frames_per_s - fps).abs() <= 1e-9 * fps,
        "{what}: {} frames/s, {n} frames in {} ms",
        report.frames_per_s,
        report.total_ms
    );
    assert!(report.dispatches > 0);
    assert_eq!(
        report.readback_bytes,
        (n * report.width * report.height * 4) as u64
    );
    println!(
        "{what}: {n} frames in chunks of {} ({} chunks): {:.2} frames/s, latency mean {:.1} / P99 {:.1} / max {:.1} ms, peak allocated {} B, reserved {} B",
        report.chunk,
        report.chunks,
        report.frames_per_s,
        report.latency.mean_ms,
        report.latency.p99_ms,
        report.latency.max_ms,
        report.peak_allocated_bytes,
        report.peak_reserved_bytes
    );
    report
}

fn single_frame_decodes(ctx: &Context, vae: &Vae, z: &HostTensor) -> Vec<Vec<u8>> {
    (0..z.shape[0])
        .map(|i| {
            let out = decode(ctx, vae, &frame(z, i), &DecodeOptions::default()).unwrap();
            out.rgba.into_iter().next().unwrap()
        })
        .collect()
}

#[test]
fn random_weights_stream_matches_single_frame_decodes_under_every_policy() {
    let base = test_context();
    for policy in Policy::ALL {
        let ctx = base.with_pool(policy.new_pool());
        let vae = tiny_random_vae(&ctx);
        // 7 pipeline latents frames, 6×5 → 12×10 pixels; chunks 3, 3, 1.
        let z = HostTensor::new(vec![7, 4, 6, 5], rand_vec(7 * 4 * 30, 11, 1.5)).unwrap();
        let want = single_frame_decodes(&ctx, &vae, &z);
        let opts = FramesOptions {
            chunk: Some(3),
            ..Default::default()
        };
        let what = format!("tiny random AutoencoderKL, {}", policy.name());
        let r = stream_and_compare(&ctx, &vae, &z, &opts, &want, &what);
        assert_eq!((r.chunk, r.chunks), (3, 3));
        assert_eq!((r.width, r.height), (10, 12));
        // Two alternating staging buffers of one chunk each (+ 4 bytes: the f16 overflow counter).
        assert_eq!(r.staging_bytes, 2 * (3 * 10 * 12 * 4 + 4));
        assert_eq!(r.f16_overflows, 0);
        // Chunk larger than N: one chunk, one staging buffer.
        let opts = FramesOptions {
            chunk: Some(100),
            ..Default::default()
        };
        let r = stream_and_compare(&ctx, &vae, &z, &opts, &want, &what);
        assert_eq!((r.chunk, r.chunks, r.staging_bytes), (7, 1, 7 * 480 + 4));
    }
}

#[test]
fn automatic_chunk_is_the_largest_that_fits() {
    let base = test_context().with_pool(Policy::Planned.new_pool());
    let vae = tiny_random_vae(&base);
    let z = HostTensor::new(vec![7, 4, 6, 5], rand_vec(7 * 120, 3, 1.0)).unwrap();
    // Everything fits the default budget: chunks of ceil(N / 4) frames, so
    // readback overlaps the next chunk's decode.
    assert_eq!(choose_chunk(&base, &vae, [7, 4, 6, 5], None).unwrap(), 2);
    assert_eq!(choose_chunk(&base, &vae, [16, 4, 6, 5], None).unwrap(), 4);
    assert_eq!(choose_chunk(&base, &vae, [1, 4, 6, 5], None).unwrap(), 1);
    // Emulate a device that binds at most 80000 bytes (the largest weight
    // is 73728 B): the 32-channel 12×10 activation (15360 B per frame)
    // limits the chunk.
    let mut caps = base.caps().clone();
    caps.max_storage_buffer_binding_size = 80_000;
    let small = base.with_caps(caps);
    // With 28 frames the cap is 7: the binding limit decides.
    let b = choose_chunk(&small, &vae, [28, 4, 6, 5], None).unwrap();
    assert!((1..7).contains(&b), "chunk {b}");
    let want = single_frame_decodes(&base, &vae, &z);
    let r = stream_and_compare(
        &small,
        &vae,
        &z,
        &FramesOptions {
            chunk: Some(b),
            ..Default::default()
        },
        &want,
        "binding-limited",
    );
    assert_eq!(r.chunk, b);
    let r = stream_and_compare(
        &small,
        &vae,
        &z,
        &FramesOptions::default(),
        &want,
        "automatic",
    );
    assert_eq!((r.chunk, r.chunks), (2.min(b), 7usize.div_ceil(2.min(b))));
    // One more frame per chunk exceeds the binding limit.
    let e = decode_frames(
        &small,
        &vae,
        &z,
        &FramesOptions {
            chunk: Some(b + 1),
            ..Default::default()
        },
        |_| Ok(()),
    )
    .unwrap_err();
    assert!(matches!(e, Error::BindingTooLarge { .. }), "{e}");
    // A memory budget below the weights: not even one frame fits, said so.
    let e = choose_chunk(&base, &vae, [7, 4, 6, 5], Some(1024)).unwrap_err();
    assert!(matches!(e, Error::OverBudget(_)), "{e}");
    assert!(e.to_string().contains("memory budget"), "{e}");
}

#[test]
fn bad_frame_inputs_are_errors() {
    let ctx = test_context();
    let vae = tiny_random_vae(&ctx);
    let run = |z: &HostTensor, chunk: Option<usize>| {
        decode_frames(
            &ctx,
            &vae,
            z,
            &FramesOptions {
                chunk,
                ..Default::default()
            },
            |_| Ok(()),
        )
        .expect_err("must fail")
        .to_string()
    };
    let empty = HostTensor::new(vec![0, 4, 6, 5], vec![]).unwrap();
    assert!(run(&empty, None).contains("no frames"));
    let wrong = HostTensor::new(vec![2, 3, 6, 5], vec![0.0; 180]).unwrap();
    assert!(run(&wrong, None).contains("expects 4"));
    let flat = HostTensor::new(vec![2, 120], vec![0.0; 240]).unwrap();
    assert!(run(&flat, None).contains("rank 2"));
    let mut nan = HostTensor::new(vec![2, 4, 6, 5], vec![0.0; 240]).unwrap();
    nan.data[200] = f32::NAN;
    assert!(run(&nan, None).contains("non-finite"));
    let ok = HostTensor::new(vec![5, 4, 6, 5], rand_vec(600, 1, 1.0)).unwrap();
    assert!(run(&ok, Some(0)).contains("chunk size 0"));

    // An error from the callback stops the stream and is returned.
    let mut seen = Vec::new();
    let e = decode_frames(
        &ctx,
        &vae,
        &ok,
        &FramesOptions {
            chunk: Some(2),
            ..Default::default()
        },
        |f| {
            seen.push(f.index);
            if f.index == 2 {
                return Err(Error::InvalidInput("disk full".into()));
            }
            Ok(())
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("disk full"), "{e}");
    assert_eq!(seen, vec![0, 1, 2]);

    // Dry runs predict memory; they have no frames to hand over.
    let dry = Context::null(
        ctx.caps().clone(),
        Arc::new(wgvae::memory::ExactPool::new()),
    );
    let dry_vae = tiny_random_vae(&dry);
    let e = decode_frames(&dry, &dry_vae, &ok, &FramesOptions::default(), |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("dry run"), "{e}");
}

/// Five TAEF2 frames: crops of the three golden photos' latents and two
/// perturbed copies, 6×7 latents (48×56 pixels) to keep lavapipe fast.
fn taef2_frames(shared: &std::path::Path) -> HostTensor {
    let (h, w) = (6, 7);
    let crop = |name: &str, y0: usize, x0: usize| -> Vec<f32> {
        let z =
            wgvae::io::read_npy(&shared.join(format!("golden/taef2/{name}.latents.npy"))).unwrap();
        assert_eq!(z.shape.len(), 4, "{name}: {:?}", z.shape);
        assert_eq!(z.shape[1], 32, "{name}: {:?}", z.shape);
        let (zh, zw) = (z.shape[2], z.shape[3]);
        assert!(y0 + h <= zh && x0 + w <= zw, "{name}: {:?}", z.shape);
        let mut out = Vec::with_capacity(32 * h * w);
        for c in 0..32 {
            for y in y0..y0 + h {
                let row = (c * zh + y) * zw;
                out.extend_from_slice(&z.data[row + x0..row + x0 + w]);
            }
        }
        out
    };
    let astronaut = crop("astronaut", 20, 24);
    let chelsea = crop("chelsea", 10, 30);
    let coffee = crop("coffee", 30, 40);
    let noisy: Vec<f32> = astronaut
        .iter()
        .zip(rand_vec(astronaut.len(), 9, 0.1))
        .map(|(a, r)| a + r)
        .collect();
    let dimmed: Vec<f32> = chelsea.iter().map(|v| v * 0.8).collect();
    let data = [astronaut, chelsea, coffee, noisy, dimmed].concat();
    HostTensor::new(vec![5, 32, h, w], data).unwrap()
}

fn taef2_path(shared: &std::path::Path) -> String {
    shared
        .join("weights/taef2/decoder.safetensors")
        .display()
        .to_string()
}

#[test]
fn taef2_chunks_of_two_match_single_frame_decodes() {
    let Some(shared) = shared_dir() else { return };
    let ctx = test_context().with_pool(Policy::Planned.new_pool());
    let vae = Vae::load(&ctx, &taef2_path(&shared), &LoadOptions::default()).unwrap();
    let z = taef2_frames(&shared);
    let want = single_frame_decodes(&ctx, &vae, &z);
    // N = 5, B = 2: chunks 2, 2, 1 (the last one of another shape).
    let opts = FramesOptions {
        chunk: Some(2),
        ..Default::default()
    };
    let r = stream_and_compare(&ctx, &vae, &z, &opts, &want, "taef2");
    assert_eq!((r.chunk, r.chunks, r.width, r.height), (2, 3, 56, 48));
}

/// Paths in a fresh folder of one test's own, removed on drop (also on failure).
fn scratch() -> impl Fn(&str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap();
    move |name| dir.path().join(name)
}

fn wgvae_cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .args(args)
        .env(
            "WGPU_BACKEND",
            std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
        )
        .output()
        .expect("run wgvae");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_frames_out_writes_numbered_pngs() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let z = taef2_frames(&shared);
    let latents = tmp("five.npy");
    wgvae::io::write_npy(&latents, &z.shape, &z.data).unwrap();
    let dir = tmp("five-frames");
    let _ = std::fs::remove_dir_all(&dir);
    let vae = taef2_path(&shared);
    let (ok, out, err) = wgvae_cli(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        &vae,
        "--frames-out",
        dir.to_str().unwrap(),
        "--chunk",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let f = &v["frames"];
    assert_eq!(f["frames"], 5);
    assert_eq!(f["chunk"], 2);
    // Latencies are ordered and within the wall time; frames/s is 5 over it.
    let total = f["total_ms"].as_f64().unwrap();
    let fps = f["frames_per_s"].as_f64().unwrap();
    assert!((fps - 5e3 / total).abs() <= 1e-9 * fps, "{v}");
    let lat = |k: &str| f["latency"][k].as_f64().unwrap();
    let (mean, p99, max) = (lat("mean_ms"), lat("p99_ms"), lat("max_ms"));
    assert!(0.0 < mean && mean <= max * (1.0 + 1e-12), "{v}");
    assert!(p99 == max && max <= total, "{v}");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want: Vec<String> = (0..5).map(|i| format!("frame_{i:05}.png")).collect();
    assert_eq!(names, want);
    for name in &names {
        let img = image::open(dir.join(name)).unwrap();
        assert_eq!((img.width(), img.height()), (56, 48), "{name}");
    }
    assert_eq!(v["outputs"].as_array().unwrap().len(), 5);

    // Text output names the rate and the latencies.
    let (ok, out, err) = wgvae_cli(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        &vae,
        "--frames-out",
        dir.to_str().unwrap(),
        "--overwrite",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("frames/s") && out.contains("P99"), "{out}");

    // The JSON names the storage dtype the frames were decoded in: the
    // default `auto` is f32 on a CPU adapter, f16 for a TAE on a GPU.
    let caps = wgvae::gpu::Context::new(&Default::default())
        .unwrap()
        .caps()
        .clone();
    let auto = wgvae::models::Precision::Auto.resolve(true, &caps).name();
    assert_eq!(v["dtype"], auto, "{v}");
    let (ok, out, err) = wgvae_cli(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        &vae,
        "--frames-out",
        dir.to_str().unwrap(),
        "--overwrite",
        "--dtype",
        "f16",
        "--json",
    ]);
    assert!(ok, "{err}");
    let half: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(half["dtype"], "f16", "{half}");

    // Errors: a zero chunk, and options the frame stream does not take.
    let (ok, _, err) = wgvae_cli(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        &vae,
        "--frames-out",
        dir.to_str().unwrap(),
        "--overwrite",
        "--chunk",
        "0",
    ]);
    assert!(!ok && err.contains("chunk"), "{err}");
    let (ok, _, err) = wgvae_cli(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        &vae,
        "--frames-out",
        dir.to_str().unwrap(),
        "--overwrite",
        "--tile",
        "exact",
    ]);
    assert!(!ok && err.contains("--frames-out"), "{err}");
}

/// f16 frames: streamed chunks equal single-frame f16 decodes byte for byte
/// under the planned pool (the chunk allocates like `decode()`, overflow
/// counter included, so both replay the same plans), with no overflow.
#[test]
fn half_precision_stream_matches_single_frame_decodes() {
    let ctx = test_context().with_pool(Policy::Planned.new_pool());
    let store = WeightStore::random(7);
    store.set_dtype(wgvae::DType::F16);
    let cfg = tiny_kl_config();
    let vae = Vae::from_kl_config(&ctx, &cfg, &store, "tiny random f16").unwrap();
    assert_eq!(vae.dtype(), wgvae::DType::F16);
    let z = HostTensor::new(vec![5, 4, 6, 5], rand_vec(5 * 4 * 30, 12, 1.5)).unwrap();
    let want = single_frame_decodes(&ctx, &vae, &z);
    let opts = FramesOptions {
        chunk: Some(2),
        ..Default::default()
    };
    let r = stream_and_compare(&ctx, &vae, &z, &opts, &want, "f16 planned");
    assert_eq!(r.f16_overflows, 0);
}

/// f16 overflow in a stream: with an AutoencoderKL whose `decoder.conv_in`
/// is scaled far beyond f16's range, every chunk overflows and is decoded
/// again in bf16 before its frames are handed over; the streamed frames
/// equal `decode()` of each frame alone (which redoes it in bf16 too).
#[test]
fn overflowing_f16_chunks_are_redone_in_bf16() {
    let Some(shared) = shared_dir() else { return };
    let golden = shared.join("golden/aekl-tiny-sd");
    let copy = tempfile::tempdir().unwrap();
    let dir = copy.path();
    wgvae::testing::scaled_weights_copy(&golden, "decoder.conv_in.", 3.0e5, dir);
    let ctx = test_context();
    let load = LoadOptions {
        precision: wgvae::models::Precision::F16,
        ..Default::default()
    };
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &load).unwrap();
    let one = wgvae::io::read_npy(&golden.join("latents.npy")).unwrap();
    let mut data = Vec::new();
    for k in [1.0f32, 0.5, -0.8] {
        data.extend(one.data.iter().map(|v| v * k));
    }
    let mut shape = one.shape.clone();
    shape[0] = 3;
    let z = HostTensor::new(shape, data).unwrap();
    let want = single_frame_decodes(&ctx, &vae, &z);
    let opts = FramesOptions {
        chunk: Some(2),
        ..Default::default()
    };
    let r = stream_and_compare(&ctx, &vae, &z, &opts, &want, "overflowing f16 model");
    println!(
        "overflowing f16 stream: {} values beyond f16, {} of 3 frames redone in bf16",
        r.f16_overflows, r.redone_frames
    );
    assert!(r.f16_overflows > 0);
    assert_eq!(r.redone_frames, 3);
}
