//! Issue #32 items 4 and 5: `wgvae memory` for videos (length, breakdown,
//! tiles, budget), readable output, and `bench` / `report` arguments
//! checked before any work.

use std::path::PathBuf;
use std::process::Command;

use wgvae::io::HostTensor;
use wgvae::testing::shared_dir;
use wgvae::{LoadOptions, VideoDecoder};

fn wgvae(args: &[&str]) -> (bool, String, String) {
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

/// `wgvae memory --json ARGS`, with the variable `env` set to 1 when given:
/// success, stdout and the error lines of stderr.
fn memory_json(args: &[&str], env: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")));
    cmd.args(["memory", "--json"]).args(args).env(
        "WGPU_BACKEND",
        std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
    );
    if let Some(var) = env {
        cmd.env(var, "1");
    }
    let out = cmd.output().expect("run wgvae");
    let err = String::from_utf8_lossy(&out.stderr);
    let err: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err.join("\n"),
    )
}

/// Paths in a fresh folder of one test's own, removed on drop (also on failure).
fn scratch() -> impl Fn(&str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap();
    move |name| dir.path().join(name)
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}

/// Wan 2.1 (tiny) streamed for real, one latent frame per chunk, untiled
/// and in exact tiles: the estimate of a video of T latent frames is the
/// measured peak of that video (Wan's first chunk skips its time convs, so
/// 1 frame peaks lower than 4), and its breakdown adds up to that peak.
#[test]
fn video_estimate_at_each_length_equals_the_measured_peak() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/wan21-tiny");
    let ctx = wgvae::testing::test_context();
    let load = LoadOptions::default();
    let (h, w) = (4, 6);
    let size = (8 * h, 8 * w);
    let tilings = [
        wgvae::tiling::Tiling::off(),
        wgvae::tiling::Tiling::exact().with_tile_size(16),
    ];
    for tiling in &tilings {
        let mut peaks = Vec::new();
        for frames in [1usize, 2, 4] {
            let ctx = ctx.with_pool(wgvae::memory::Policy::Exact.new_pool());
            let vae = wgvae::Vae::load(&ctx, dir.to_str().unwrap(), &load).unwrap();
            let mut stream = VideoDecoder::new(&ctx, &vae).unwrap();
            stream.set_tiling(tiling.clone()).unwrap();
            for t in 0..frames {
                let z = HostTensor::new(
                    vec![1, 16, h, w],
                    wgvae::testing::rand_vec(16 * h * w, t as u64, 1.0),
                )
                .unwrap();
                stream.decode(&z).unwrap();
            }
            let measured = ctx.pool().stats().allocated_bytes.peak;
            let e = wgvae::estimate::Estimate::new(
                ctx.caps(),
                wgvae::memory::Policy::Exact,
                dir.to_str().unwrap(),
                &load,
            )
            .video_tiled(size, frames, 1, tiling)
            .unwrap();
            println!(
                "wan21-tiny {size:?} {:?} tiles {:?}, {frames} latent frames: measured {measured} B, predicted {} B",
                tiling.mode, e.tile_size, e.peak_allocated_bytes
            );
            assert_eq!(e.peak_allocated_bytes, measured, "{frames} frames: {e:?}");
            let b = e.breakdown();
            assert_eq!(b.weights + b.caches + b.working, e.peak_allocated_bytes);
            assert_eq!(b.weights, e.weights_bytes);
            assert_eq!(e.independent_of_frames, frames >= 3);
            assert!(e.activation_bytes > 0, "{e:?}");
            peaks.push(measured);
        }
        // Shorter videos peak at most as high as longer ones.
        assert!(peaks[0] <= peaks[1] && peaks[1] <= peaks[2], "{peaks:?}");
        assert!(
            peaks[0] < peaks[2],
            "Wan's first chunk is lighter: {peaks:?}"
        );
    }
}

/// `wgvae memory` of a video: without --frames it estimates three chunks
/// (a bound on every length) and says so; the text is a table whose lines
/// add up to the peak; --tile exact is taken (as `decode` takes it), --tile
/// fast refused; a --max-memory it cannot keep is a non-zero exit.
#[test]
fn memory_of_a_video_states_its_length_and_adds_up() {
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("golden/wan21-tiny");
    let vae = vae.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["memory", "--vae", vae, "--size", "32x48"];
        args.extend(extra);
        wgvae(&args)
    };
    let (ok, out, err) = run(&["--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["frames"], 3, "default: three chunks of 1");
    assert_eq!(v["frames_defaulted"], true);
    assert_eq!(v["independent_of_frames"], true);
    let parts = ["weights_bytes", "cache_bytes", "working_bytes"]
        .map(|k| v["breakdown"][k].as_u64().unwrap());
    let peak = v["peak_allocated_bytes"].as_u64().unwrap();
    assert_eq!(parts.iter().sum::<u64>(), peak);
    let (ok, out1, err) = run(&["--frames", "1", "--json"]);
    assert!(ok, "{err}");
    let one = json(&out1);
    assert_eq!(one["independent_of_frames"], false);
    assert!(one["peak_allocated_bytes"].as_u64().unwrap() < peak);
    assert!(one["activation_bytes"].as_u64().unwrap() > 0);

    // The text: one number per line, the parts summing to the peak (to the
    // printed 0.1 MiB), no Rust debug text.
    let (ok, text, err) = run(&[]);
    assert!(ok, "{err}");
    assert!(!text.contains("Some(") && !text.contains("None"), "{text}");
    assert!(
        text.contains("3 latent frames") && text.contains("--frames not given"),
        "{text}"
    );
    let value = |label: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line: {text}"));
        line.split_whitespace().last().unwrap().parse().unwrap()
    };
    let sum = value("weights") + value("time caches") + value("chunk working memory");
    assert!((sum - value("= peak allocated")).abs() <= 0.15, "{text}");

    let (ok, out, err) = run(&[
        "--tile",
        "exact",
        "--tile-size",
        "16",
        "--frames",
        "2",
        "--json",
    ]);
    assert!(ok, "--tile exact: {err}");
    let tiled = json(&out);
    assert_eq!(tiled["tile_size"], 16);
    // The exact run's own report: its tiles, parking and staging (part of
    // `staging_bytes`: device memory outside the pool), and the caches the
    // pool holds (those parked on the host are not pool memory).
    let t = &tiled["tiling"];
    assert_eq!(t["mode"], "exact", "{tiled}");
    assert_eq!(t["tile_size"], 16);
    assert!(t["tiles"].as_u64().unwrap() >= 1 && t["steps"].as_u64().unwrap() > 0);
    let stage = t["staging_peak_bytes"].as_u64().unwrap();
    assert!(tiled["staging_bytes"].as_u64().unwrap() >= stage);
    assert!(
        tiled["cache_bytes"].as_u64().unwrap() <= t["device_parked_peak_bytes"].as_u64().unwrap(),
        "{tiled}"
    );
    assert!(v["tiling"].is_null(), "untiled: {v}");
    let (ok, text, err) = run(&["--tile", "exact", "--tile-size", "16", "--frames", "2"]);
    assert!(
        ok && text.contains("tiling: exact, 16-pixel tiles"),
        "{text}{err}"
    );
    assert!(!text.contains("Some(") && !text.contains("None"), "{text}");
    let (ok, _, err) = run(&["--chunk", "100000000"]);
    assert!(
        !ok && err.contains("--chunk 100000000") && err.contains("--frames"),
        "{err}"
    );
    let (ok, _, err) = run(&["--tile", "fast"]);
    assert!(!ok && err.contains("--tile exact"), "{err}");

    let (ok, out, err) = run(&["--max-memory", "1"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("--max-memory"), "{err}");
    // The budget covers the pool's peak and the read-back staging beside it.
    let device = peak + v["staging_bytes"].as_u64().unwrap();
    let budget = (device - 1).to_string();
    let (ok, _, err) = run(&["--tile", "off", "--max-memory", &budget]);
    assert!(
        !ok && err.contains("cannot be kept") && err.contains(&device.to_string()),
        "{err}"
    );
    let budget = device.to_string();
    let (ok, _, err) = run(&["--tile", "off", "--max-memory", &budget]);
    assert!(
        ok,
        "a budget of exactly the predicted device memory is kept: {err}"
    );
}

/// An image estimate in exact tiles prints its per-level tile sides as
/// words; an unmet --max-memory under --tile off is an error, not a
/// prediction with exit 0.
#[test]
fn memory_of_an_image_is_readable_and_keeps_its_budget() {
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("golden/aekl-tiny-sd");
    let vae = vae.to_str().unwrap();
    let (ok, out, err) = wgvae(&[
        "memory",
        "--vae",
        vae,
        "--size",
        "256x256",
        "--tile",
        "exact",
        "--tile-size",
        "64",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("tile side per level: latent"), "{out}");
    assert!(!out.contains("Some(") && !out.contains("None"), "{out}");
    let (ok, _, err) = wgvae(&[
        "memory",
        "--vae",
        vae,
        "--size",
        "256x256",
        "--tile",
        "off",
        "--max-memory",
        "1MiB",
    ]);
    assert!(
        !ok && err.contains("--max-memory") && err.contains("cannot be kept"),
        "{err}"
    );
}

/// `bench` and `report` refuse bad arguments before any work: no timed
/// runs, an --out that is a file, a chunk longer than the video, latents
/// larger than the host (exit 1 with a message, not an abort), a missing
/// --reference.
#[test]
fn bench_and_report_check_arguments_first() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let wan = shared.join("golden/wan21-tiny");
    let wan = wan.to_str().unwrap();
    let sd = shared.join("golden/aekl-tiny-sd");
    let sd = sd.to_str().unwrap();
    let file = tmp("a-file");
    std::fs::write(&file, b"x").unwrap();
    let file = file.to_str().unwrap();
    let out = tmp("never-written");
    let out = out.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["bench", "video", "--vae", wan, "--runs", "0", "--out", out],
            "--runs 0",
        ),
        (
            &["bench", "frames", "--vae", sd, "--runs", "0", "--out", out],
            "--runs 0",
        ),
        (
            &["bench", "decode", "--vae", sd, "--runs", "0", "--out", out],
            "--runs 0",
        ),
        (
            &[
                "bench",
                "cold-start",
                "--vae",
                sd,
                "--runs",
                "0",
                "--out",
                out,
            ],
            "--runs 0",
        ),
        (
            &[
                "bench",
                "cold-start",
                "--vae",
                sd,
                "--size",
                "1000000",
                "--out",
                out,
            ],
            "host memory",
        ),
        (
            &["bench", "cold-start", "--vae", sd, "--out", file],
            "--out",
        ),
        (&["bench", "video", "--vae", wan, "--out", file], "--out"),
        (&["bench", "frames", "--vae", sd, "--out", file], "--out"),
        (&["bench", "decode", "--vae", sd, "--out", file], "--out"),
        (
            &["report", "memory", "--sizes", "512", "--out", file],
            "--out",
        ),
        (
            &[
                "bench",
                "video",
                "--vae",
                wan,
                "--chunk",
                "5",
                "--latent-frames",
                "3",
                "--out",
                out,
            ],
            "--chunk 5",
        ),
        (
            &[
                "bench", "video", "--vae", wan, "--size", "1000000", "--out", out,
            ],
            "host memory",
        ),
        (
            &[
                "bench",
                "video",
                "--vae",
                wan,
                "--latent-frames",
                "1000000000",
                "--out",
                out,
            ],
            "--latent-frames",
        ),
        (
            &[
                "bench",
                "video",
                "--vae",
                wan,
                "--latent-frames",
                "16777217",
                "--out",
                out,
            ],
            "--latent-frames",
        ),
        (
            &[
                "bench", "frames", "--vae", sd, "--size", "1000000", "--out", out,
            ],
            "host memory",
        ),
        (
            &[
                "bench",
                "decode",
                "--vae",
                sd,
                "--sizes",
                "64,1000000",
                "--out",
                out,
            ],
            "host memory",
        ),
        (
            &[
                "report",
                "memory",
                "--reference",
                "/nonexistent.csv",
                "--out",
                out,
            ],
            "--reference",
        ),
    ];
    for (args, says) in cases {
        let started = std::time::Instant::now();
        let o = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(*args)
            .output()
            .expect("run wgvae");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
        println!(
            "{args:?}: {:.1} s: {}",
            started.elapsed().as_secs_f64(),
            err.trim()
        );
    }
    assert!(
        !std::path::Path::new(out).exists(),
        "nothing written to {out}"
    );
}

/// The planner's corner probe (`corner_over` in src/run/strategy.rs) skips
/// the dry runs of tile candidates whose top-left tiles already pass the
/// budget or a device limit: the plans, peaks and errors it gives are those
/// of full dry runs of every candidate (`WGVAE_NO_CROP_PROBE`), here on
/// images of many tiles (interior tiles, tiled mid-block, host parking),
/// under every policy, for this adapter's limits and the reference GPU's,
/// decodes and encodes.
#[test]
fn corner_probe_keeps_plans_peaks_and_errors() {
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("golden/aekl-tiny-sd");
    let vae = vae.to_str().unwrap();
    let run = |args: &[&str], probe: bool| {
        let args: Vec<&str> = ["--vae", vae].iter().chain(args).copied().collect();
        memory_json(&args, (!probe).then_some("WGVAE_NO_CROP_PROBE"))
    };
    let cases: &[&[&str]] = &[
        &["--size", "8192x8192"],
        &["--size", "8192x8192", "--policy", "caching"],
        &["--size", "6144x4096", "--policy", "exact"],
        &[
            "--size",
            "4096x4096",
            "--reference-gpu",
            "--max-memory",
            "256MiB",
        ],
        &[
            "--size",
            "4096x4096",
            "--reference-gpu",
            "--max-memory",
            "64MiB",
            "--policy",
            "caching",
        ],
        &["--size", "3072x2048", "--max-memory", "96MiB"],
        &["--size", "2048x2048", "--encode", "--max-memory", "64MiB"],
        &[
            "--size",
            "2048x2048",
            "--encode",
            "--reference-gpu",
            "--max-memory",
            "48MiB",
            "--policy",
            "exact",
        ],
        &["--size", "100000x100000"],
        &["--size", "40000x40000", "--reference-gpu"],
    ];
    let mut tiled = 0;
    for args in cases {
        let with = run(args, true);
        let without = run(args, false);
        assert_eq!(with, without, "{args:?}");
        if with.0 {
            let v = json(&with.1);
            tiled += (v["tiling"]["mode"] == "exact") as usize;
        }
        eprintln!(
            "{args:?}: {}",
            if with.0 {
                with.1.len().to_string() + " bytes of JSON"
            } else {
                with.2.clone()
            }
        );
    }
    assert!(tiled >= 4, "only {tiled} cases tiled");
}

/// The dry runs' shortcuts (peaks counted as the run goes instead of from
/// a kept trace, one attention call checked per query-tile shape, traces
/// too long to plan stopped at the limit) change no estimate: the JSON is
/// byte-identical to full dry runs (`WGVAE_FULL_DRY_RUNS`), for the
/// SD1.5 preset at 16384² in f16 (1,849 tiles, tiled mid-block, host
/// parking) and a few smaller cases under other policies.
#[test]
fn dry_run_shortcuts_keep_estimates() {
    let run = |args: &[&str], full: bool| memory_json(args, full.then_some("WGVAE_FULL_DRY_RUNS"));
    let cases: &[&[&str]] = &[
        &[
            "--vae",
            "preset:sd15",
            "--size",
            "16384x16384",
            "--dtype",
            "f16",
        ],
        &[
            "--vae",
            "preset:sd15",
            "--size",
            "4096x4096",
            "--tile",
            "exact",
        ],
        &[
            "--vae",
            "preset:sd15",
            "--size",
            "2048x1536",
            "--tile",
            "exact",
            "--policy",
            "caching",
        ],
    ];
    for args in cases {
        let fast = run(args, false);
        assert!(fast.0, "{args:?}: {}", fast.1);
        assert_eq!(fast, run(args, true), "{args:?}");
    }
}

/// The planner's replayed tile steps (dry runs that count only peaks skip
/// the allocations and recording of a step that repeats an earlier one,
/// e.g. attention K/V blocks of one shape and parking) change no plan and
/// no figure: the JSON is byte-identical to dry runs that run every step
/// (`WGVAE_FULL_PLAN`). Cases: edge tiles of odd sizes, tiled and whole mid
/// blocks, K/V parked on the device, on the host and both, f16 and f32,
/// SD- and FLUX-like models, decode and encode.
#[test]
fn replayed_tile_steps_keep_plans() {
    let Some(shared) = shared_dir() else { return };
    let golden = |name: &str| shared.join("golden").join(name);
    let (sd, flux) = (golden("aekl-tiny-sd"), golden("aekl-tiny-flux"));
    let (sd, flux) = (sd.to_str().unwrap(), flux.to_str().unwrap());
    // The model (sd, flux: the tiny goldens), then the other arguments.
    let cases = [
        "sd --size 2056x1544 --tile exact --max-memory 80MiB",
        "sd --size 3080x3080 --tile exact --max-memory 80MiB",
        "sd --size 3080x3080 --max-memory 128MiB --dtype f16",
        "sd --size 4104x2056 --max-memory 64MiB --dtype f32",
        "sd --size 2048x2048 --encode --max-memory 48MiB",
        "flux --size 2056x2056 --tile exact --max-memory 64MiB --dtype f16",
        "preset:sd15 --size 8200x4104 --dtype f16 --max-memory 1GiB",
        "preset:flux1 --size 4096x4096 --dtype f32 --max-memory 1GiB",
    ];
    let (mut mid, mut both) = (0, 0);
    for case in cases {
        let mut args = vec!["--vae"];
        args.extend(case.split(' ').map(|a| match a {
            "sd" => sd,
            "flux" => flux,
            a => a,
        }));
        let fast = memory_json(&args, None);
        assert!(fast.0, "{args:?}: {}", fast.2);
        assert_eq!(
            fast,
            memory_json(&args, Some("WGVAE_FULL_PLAN")),
            "{args:?}"
        );
        let t = &json(&fast.1)["tiling"];
        assert_eq!(t["mode"], "exact", "{args:?}");
        mid += (t["mid_block_tiled"] == true) as usize;
        let parked = |k: &str| t[k].as_u64().unwrap_or(0) > 0;
        both += (parked("device_parked_peak_bytes") && parked("host_parked_peak_bytes")) as usize;
    }
    assert!(
        mid >= 5 && both >= 3,
        "{mid} tiled mid blocks, {both} with mixed parking"
    );
}

/// `memory --size` counts output pixels at the model's own upscale: 16 for
/// Qwen-Image 2.1 (it once divided by 8 for every model and predicted a
/// decode twice as wide), and sides that are not multiples of it are refused.
#[test]
fn memory_sizes_follow_the_models_upscale() {
    let args = [
        "--vae",
        "preset:qwenimage21",
        "--size",
        "64x96",
        "--dtype",
        "f32",
    ];
    let (ok, out, err) = memory_json(&args, None);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["latents_shape"], serde_json::json!([1, 64, 4, 6]), "{v}");
    // RGBA: the output keeps its alpha channel.
    assert_eq!(v["image_shape"], serde_json::json!([1, 4, 64, 96]), "{v}");
    let args = [
        "--vae",
        "preset:qwenimage21",
        "--size",
        "72x72",
        "--dtype",
        "f32",
    ];
    let (ok, _, err) = memory_json(&args, None);
    assert!(
        !ok && err.contains("multiples of 16") && err.contains("80x80"),
        "{err}"
    );
}

/// Video estimates that would run minutes of dry runs are errors in
/// seconds that name the fix: rows of too many tiles (tiny tiles over huge
/// frames), and a model whose caches grow run chunk by chunk in thousands
/// of tiles; a device limit met in exact tiles does not advise exact tiles.
#[test]
fn video_estimates_out_of_reach_are_quick_errors() {
    let Some(shared) = shared_dir() else { return };
    let hunyuan = shared.join("golden/hunyuanvideo15-tiny");
    let hunyuan = hunyuan.to_str().unwrap();
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &[
                "--vae",
                "preset:wan21",
                "--size",
                "16384x16384",
                "--tile",
                "exact",
                "--tile-size",
                "16",
            ],
            &["1048576 tiles", "at most 256 tiles", "--tile-size"],
        ),
        (
            &[
                "--vae",
                hunyuan,
                "--size",
                "4096x4096",
                "--frames",
                "65",
                "--tile",
                "exact",
            ],
            &["caches grow", "65 chunks", "fewer latent frames"],
        ),
        (
            &[
                "--vae",
                hunyuan,
                "--size",
                "16384x16384",
                "--frames",
                "1",
                "--tile",
                "exact",
            ],
            &["in exact 256-pixel tiles", "smaller frames", "--tile-size"],
        ),
    ];
    for (args, want) in cases {
        let started = std::time::Instant::now();
        let (ok, _, err) = memory_json(args, None);
        assert!(!ok, "{args:?}: {err}");
        for w in want {
            assert!(err.contains(w), "{args:?}: `{w}` not in {err}");
        }
        assert!(!err.contains("--tile exact"), "{args:?}: {err}");
        assert!(
            started.elapsed().as_secs() < 10,
            "{args:?}: {:?}",
            started.elapsed()
        );
    }
}
