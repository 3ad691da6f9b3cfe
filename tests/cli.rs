//! The `wgvae` binary end to end: the README's main job, JSON output, the
//! memory estimator against a real decode, and errors with exit codes.

use std::path::PathBuf;
use std::process::Command;

use wgvae::testing::shared_dir;

fn wgvae(args: &[&str]) -> (bool, String, String) {
    wgvae_env(args, &[])
}

/// `wgvae(args)` with `env` set for the process (e.g. `TMPDIR`).
fn wgvae_env(args: &[&str], env: &[(&str, &std::path::Path)]) -> (bool, String, String) {
    let out = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .args(args)
        .env(
            "WGPU_BACKEND",
            std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
        )
        .envs(env.iter().copied())
        .output()
        .expect("run wgvae");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
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

#[test]
fn info_lists_the_adapter() {
    let (ok, out, err) = wgvae(&["info", "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert!(
        v["chosen"]["limits"]["max_storage_buffer_binding_size"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(!v["adapters"].as_array().unwrap().is_empty());
    // A CPU adapter chosen automatically is announced, in JSON and in text.
    let cpu = v["chosen"]["type"] == "Cpu";
    assert_eq!(v["notice"].is_string(), cpu, "{v}");
    let (ok, text, err) = wgvae(&["info"]);
    assert!(ok, "{err}");
    assert_eq!(text.contains("notice: no GPU adapter found"), cpu, "{text}");
}

/// `--cooperative-matrix`: `info --json` lists the adapter's configurations and the one used;
/// `on` is a clear error where none is usable (bookworm's lavapipe, GL) and otherwise names
/// it in `decode --json`; `off` always runs the scalar path; a bad value is refused.
#[test]
fn cooperative_matrix_flag() {
    let tmp = scratch();
    let (ok, out, err) = wgvae(&["info", "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    let m = &v["chosen"]["cooperative_matrix"];
    assert!(m["configurations"].is_array(), "{v}");
    let used = m["used"].as_str().map(str::to_string);
    // A usable configuration (on a CPU adapter, `auto` leaves it unused: it is emulated).
    let usable = m["configurations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["usable"] == true)
        .map(|c| c["name"].as_str().unwrap().to_string());
    assert!(used.is_none() || used == usable, "{m}");
    if v["chosen"]["type"] == "Cpu" {
        assert!(used.is_none(), "auto on a CPU adapter: {m}");
    }
    let (ok, out, err) = wgvae(&["--cooperative-matrix", "on", "info", "--json"]);
    match &usable {
        None => {
            assert!(
                !ok,
                "--cooperative-matrix on must fail without a configuration: {out}"
            );
            assert!(
                err.contains("cooperative matrices were asked for")
                    && err.contains("--cooperative-matrix"),
                "{err}"
            );
        }
        Some(u) => {
            assert!(ok, "{err}");
            assert_eq!(json(&out)["chosen"]["cooperative_matrix"]["used"], *u);
        }
    }
    let (ok, _, err) = wgvae(&["--cooperative-matrix", "sometimes", "info"]);
    assert!(!ok && err.contains("expected auto, on or off"), "{err}");
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let latents = dir.join("latents.npy");
    for (mode, want) in [
        ("auto", used.clone()),
        ("on", usable.clone()),
        ("off", None),
    ] {
        if mode == "on" && usable.is_none() {
            continue;
        }
        let png = tmp(&format!("coop-{mode}.png"));
        let (ok, out, err) = wgvae(&[
            "--cooperative-matrix",
            mode,
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            dir.to_str().unwrap(),
            "--dtype",
            "f16",
            "--json",
            "-o",
            png.to_str().unwrap(),
        ]);
        assert!(ok, "{mode}: {err}");
        assert_eq!(
            json(&out)["cooperative_matrix"]
                .as_str()
                .map(str::to_string),
            want,
            "{mode}"
        );
    }
}

/// A successful run on a machine without a display prints no "error" (the
/// driver's window-system probe is kept quiet).
#[test]
fn headless_success_prints_no_error() {
    let out = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .arg("info")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("DISPLAY")
        .env_remove("NODEVICE_SELECT")
        .output()
        .expect("run wgvae");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.to_lowercase().contains("error"), "{err}");
}

#[test]
fn decode_taef2_photo_to_png_with_json() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let png = tmp("chelsea.png");
    let raw = tmp("chelsea.npy");
    let latents = shared.join("golden/taef2/chelsea.latents.npy");
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let (ok, out, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        vae.to_str().unwrap(),
        "-o",
        png.to_str().unwrap(),
        "--save-raw",
        raw.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    for key in [
        "adapter",
        "backend",
        "model",
        "latents_shape",
        "image_shape",
        "dtype",
        "decode_ms",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
    ] {
        assert!(!v[key].is_null(), "--json lacks `{key}`: {v}");
    }
    assert_eq!(v["image_shape"], serde_json::json!([1, 3, 288, 448]));
    let ours = image::open(&png).unwrap().to_rgb8();
    let theirs = image::open(shared.join("golden/taef2/chelsea.decoded.png"))
        .unwrap()
        .to_rgb8();
    assert_eq!(ours.dimensions(), theirs.dimensions());
    let worst = ours
        .as_raw()
        .iter()
        .zip(theirs.as_raw())
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    assert!(worst <= 1, "PNG differs from PyTorch's by {worst}");
    // `--save-raw` holds the decoder's output: PyTorch's within README's
    // 4.8e-6 (×3), and the PNG is its bytes, round(clamp(x, 0, 1) · 255).
    let raw = wgvae::io::read_npy(&raw).unwrap();
    assert_eq!(raw.shape, vec![1, 3, 288, 448]);
    let want = wgvae::io::read_npy(&shared.join("golden/taef2/chelsea.decoded.npy")).unwrap();
    let (err, at) = wgvae::testing::max_abs_diff(&raw.data, &want.data);
    assert!(err <= 1.5e-5, "--save-raw vs PyTorch: {err} at {at}");
    let plane = 288 * 448;
    for (i, px) in ours.as_raw().chunks_exact(3).enumerate() {
        for (c, &byte) in px.iter().enumerate() {
            let x = raw.data[c * plane + i];
            let want = (x.clamp(0.0, 1.0) * 255.0).round_ties_even() as u8;
            assert_eq!(byte, want, "pixel {i} channel {c}: raw {x}");
        }
    }
}

#[test]
fn pipeline_cache_is_persisted_on_vulkan() {
    let Some(shared) = shared_dir() else { return };
    let (_, info, _) = wgvae(&["info", "--json"]);
    if json(&info)["chosen"]["backend"] != "Vulkan" {
        println!("SKIPPED: the pipeline cache is persisted on Vulkan only");
        return;
    }
    let files = taef2_decode_with_cache_dir(&shared, "pipeline-cache", &[]);
    assert_eq!(files, 1, "one cache file per adapter");
}

/// Decodes small latents with TAEF2 with `WGVAE_CACHE_DIR` at a fresh folder
/// `name` (plus `env`); returns how many files the folder then holds.
fn taef2_decode_with_cache_dir(
    shared: &std::path::Path,
    name: &str,
    env: &[(&str, &str)],
) -> usize {
    let tmp = scratch();
    let dir = tmp(name);
    let _ = std::fs::remove_dir_all(&dir);
    let latents = tmp(&format!("{name}.npy"));
    wgvae::io::write_npy(&latents, &[1, 32, 2, 2], &[0.1; 128]).unwrap();
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let out = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .args([
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            vae.to_str().unwrap(),
            "-o",
            tmp(&format!("{name}.png")).to_str().unwrap(),
        ])
        .env("WGVAE_CACHE_DIR", &dir)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn memory_estimate_matches_a_real_decode() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let latents = tmp("small.npy");
    wgvae::io::write_npy(
        &latents,
        &[1, 32, 6, 5],
        &wgvae::testing::rand_vec(32 * 30, 5, 1.0),
    )
    .unwrap();
    for policy in ["caching", "planned", "exact"] {
        let (ok, est, err) = wgvae(&[
            "memory",
            "--vae",
            vae.to_str().unwrap(),
            "--size",
            "48x40",
            "--policy",
            policy,
            "--json",
        ]);
        assert!(ok, "{err}");
        let png = tmp(&format!("small-{policy}.png"));
        let snapshot = tmp(&format!("snapshot-{policy}.json"));
        let (ok, dec, err) = wgvae(&[
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            vae.to_str().unwrap(),
            "-o",
            png.to_str().unwrap(),
            "--policy",
            policy,
            "--memory-snapshot",
            snapshot.to_str().unwrap(),
            "--json",
        ]);
        assert!(ok, "{err}");
        check_snapshot(policy, &std::fs::read_to_string(&snapshot).unwrap());
        let (e, d) = (json(&est), json(&dec));
        for key in [
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "weights_bytes",
        ] {
            assert_eq!(
                e[key], d[key],
                "{policy}: `{key}` predicted {} measured {}",
                e[key], d[key]
            );
        }
        assert_eq!(e["policy"], policy);
    }
}

/// Tiled decoding from the CLI: `decode --tile exact --tile-size --max-memory
/// --json` keeps the budget and reports the tiling; `memory` with the same
/// options predicts the same peak; `--tile-overlap` outside fast mode and a
/// too-small `--max-host-memory` are clear errors.
#[test]
fn tiled_decode_and_estimate_through_the_cli() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let latents = dir.join("latents.npy");
    let z = wgvae::io::read_npy(&latents).unwrap();
    let size = format!("{}x{}", z.shape[2] * 8, z.shape[3] * 8);
    let vae = dir.to_str().unwrap();
    let (ok, out, err) = wgvae(&["memory", "--vae", vae, "--size", &size, "--json"]);
    assert!(ok, "{err}");
    let weights = json(&out)["weights_bytes"].as_u64().unwrap();
    let budget = (weights + (3 << 19)).to_string();
    let tile = [
        "--tile",
        "exact",
        "--tile-size",
        "32",
        "--max-memory",
        &budget,
    ];
    let png = tmp("tiled.png");
    let mut args = vec!["decode", latents.to_str().unwrap(), "--vae", vae, "-o"];
    args.push(png.to_str().unwrap());
    args.extend(tile);
    args.push("--json");
    let (ok, dec, err) = wgvae(&args);
    assert!(ok, "{err}");
    let d = json(&dec);
    let t = &d["tiling"];
    assert_eq!(t["mode"], "exact");
    assert_eq!(t["tile_size"], 32);
    assert!(t["tiles"].as_u64().unwrap() > 1);
    let (peak, staging) = (
        d["peak_allocated_bytes"].as_u64().unwrap(),
        t["staging_peak_bytes"].as_u64().unwrap(),
    );
    assert!(peak + staging <= weights + (3 << 19), "{peak} + {staging}");
    let mut args = vec!["memory", "--vae", vae, "--size", &size];
    args.extend(tile);
    args.push("--json");
    let (ok, est, err) = wgvae(&args);
    assert!(ok, "{err}");
    let e = json(&est);
    assert_eq!(e["peak_allocated_bytes"].as_u64(), Some(peak));
    assert_eq!(e["tiling"]["tile_size"], 32);

    let decode_with = |extra: &[&str]| {
        let mut args = vec!["decode", latents.to_str().unwrap(), "--vae", vae, "-o"];
        args.push(png.to_str().unwrap());
        args.extend(extra);
        wgvae(&args)
    };
    let (ok, _, err) = decode_with(&["--tile", "exact", "--tile-overlap", "16"]);
    assert!(
        !ok && err.contains("--tile-overlap applies to --tile fast only"),
        "{err}"
    );
    // The library names its option (`Tiling::overlap`); the CLI shows the flag.
    let (ok, _, err) = decode_with(&[
        "--tile",
        "fast",
        "--tile-size",
        "64",
        "--tile-overlap",
        "64",
    ]);
    assert!(
        !ok && err.contains("--tile-overlap 64: must be a multiple of 8 below the tile size 64"),
        "{err}"
    );
    let mut args = vec!["decode", latents.to_str().unwrap(), "--vae", vae, "-o"];
    args.push(png.to_str().unwrap());
    args.extend(tile);
    args.extend(["--max-host-memory", "64KiB"]);
    let (ok, _, err) = wgvae(&args);
    assert!(
        !ok && err.contains("64.0 KiB are available (--max-host-memory)"),
        "{err}"
    );
}

/// A `--memory-snapshot` file: segments tile into blocks, add up to the
/// reserved bytes, allocated blocks to the allocated bytes; the planned pool
/// lists its arenas (cached after the decode, all free) beside the weights.
fn check_snapshot(policy: &str, text: &str) {
    let v = json(text);
    assert_eq!(v["policy"], policy);
    let segments = v["segments"].as_array().unwrap();
    assert!(!segments.is_empty(), "{policy}: no segments");
    let (mut reserved, mut allocated) = (0, 0);
    for seg in segments {
        let mut next = 0;
        for b in seg["blocks"].as_array().unwrap() {
            assert_eq!(b["offset"].as_u64().unwrap(), next, "{policy}: {seg}");
            next += b["size"].as_u64().unwrap();
            if b["allocated"].as_bool().unwrap() {
                allocated += b["size"].as_u64().unwrap();
            }
        }
        assert_eq!(next, seg["size"].as_u64().unwrap(), "{policy}: {seg}");
        reserved += next;
    }
    let stats = &v["stats"];
    assert_eq!(
        reserved,
        stats["reserved_bytes"]["current"].as_u64().unwrap()
    );
    assert_eq!(
        allocated,
        stats["allocated_bytes"]["current"].as_u64().unwrap()
    );
    let pools: Vec<&str> = segments
        .iter()
        .map(|s| s["pool"].as_str().unwrap())
        .collect();
    match policy {
        "planned" => assert!(
            pools.contains(&"arena") && pools.contains(&"dedicated"),
            "{pools:?}"
        ),
        "exact" => assert!(pools.iter().all(|p| *p == "dedicated"), "{pools:?}"),
        _ => assert!(
            pools.iter().all(|p| *p == "small" || *p == "large"),
            "{pools:?}"
        ),
    }
}

/// Output paths are checked before anything loads: a wrong extension, a
/// missing folder, a folder given as a file, a file given as a folder, and an
/// output that is an input (which would be destroyed) are errors, and the
/// inputs stay byte-identical.
#[test]
fn outputs_are_checked_first_and_never_overwrite_inputs() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let latents = tmp("keep.npy");
    wgvae::io::write_npy(&latents, &[1, 32, 2, 2], &[0.5; 128]).unwrap();
    let before = std::fs::read(&latents).unwrap();
    let decode = |extra: &[&str]| {
        let mut args = vec![
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            vae.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (ok, _, err) = wgvae(&args);
        assert!(!ok, "{extra:?} succeeded");
        err
    };
    let png = tmp("fine.png");
    let folder = std::env::temp_dir();
    let cases: [(Vec<&str>, &str); 5] = [
        (
            vec![
                "-o",
                png.to_str().unwrap(),
                "--save-raw",
                latents.to_str().unwrap(),
            ],
            "same file as the input",
        ),
        (vec!["-o", "/nonexistent-wgvae-dir/x.png"], "does not exist"),
        (vec!["-o", "x.jpg"], "must be a .png file"),
        (vec!["-o", folder.to_str().unwrap()], "is a folder"),
        (
            vec!["--frames-out", latents.to_str().unwrap()],
            "not a folder",
        ),
    ];
    for (extra, want) in cases {
        let err = decode(&extra);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    assert_eq!(
        std::fs::read(&latents).unwrap(),
        before,
        "the latents were touched"
    );
    // encode -o naming the weights it loads.
    let weights = tmp("encoder.safetensors");
    std::fs::copy(shared.join("weights/taef2/encoder.safetensors"), &weights).unwrap();
    let w_before = std::fs::read(&weights).unwrap();
    let image = shared.join("images/chelsea.png");
    let (ok, _, err) = wgvae(&[
        "encode",
        image.to_str().unwrap(),
        "--vae",
        weights.to_str().unwrap(),
        "-o",
        weights.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("same file as the input"), "{err}");
    assert_eq!(
        std::fs::read(&weights).unwrap(),
        w_before,
        "the weights were touched"
    );
}

/// Inputs that used to decode to an all-NaN image with exit 0: finite
/// latents that overflow when unscaled, an infinite shift factor, a scaling
/// factor so small the unscaled latents overflow.
#[test]
fn overflowing_unscaling_is_an_error_not_a_nan_image() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let good = dir.join("latents.npy");
    let z = wgvae::io::read_npy(&good).unwrap();
    let huge = tmp("huge.npy");
    wgvae::io::write_npy(&huge, &z.shape, &vec![3e38; z.data.len()]).unwrap();
    let out = tmp("nan.png");
    let run = |latents: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (ok, _, err) = wgvae(&args);
        assert!(!ok, "{extra:?} succeeded");
        err
    };
    let err = run(&huge, &[]);
    assert!(
        err.contains("overflow when unscaled") && err.contains("--scaling-factor"),
        "{err}"
    );
    let err = run(&good, &["--scaling-factor", "1e-45"]);
    assert!(err.contains("overflow when unscaled"), "{err}");
    let err = run(&good, &["--shift-factor", "inf"]);
    assert!(
        err.contains("shift_factor") && err.contains("must be finite"),
        "{err}"
    );
    // Finite raw latents the decoder overflows on: its output is counted on
    // the GPU (alpha 0) and refused, untiled, in exact tiles and in f16 (after
    // the bf16 re-decode).
    let extreme = tmp("extreme.npy");
    // ±3e38 by channel: conv_in overflows (spatial sign patterns can cancel).
    let plane = z.shape[2] * z.shape[3];
    let values: Vec<f32> = (0..z.data.len())
        .map(|i| {
            if (i / plane).is_multiple_of(2) {
                -3e38
            } else {
                3e38
            }
        })
        .collect();
    wgvae::io::write_npy(&extreme, &z.shape, &values).unwrap();
    let pixels = z.shape[2] * z.shape[3] * 64;
    for extra in [
        &["--raw-latents"][..],
        &["--raw-latents", "--tile", "exact", "--tile-size", "32"],
        &["--raw-latents", "--dtype", "f16"],
    ] {
        let err = run(&extreme, extra);
        assert!(
            err.contains(&format!("produced {pixels} non-finite pixels"))
                && err.contains("--raw-latents"),
            "{extra:?}: {err}"
        );
        if extra.contains(&"f16") {
            assert!(err.contains("even after re-decoding in bf16"), "{err}");
        }
    }
    assert!(!out.exists(), "no image is written");
}

/// Estimates of sizes no host could hold fail with a message instead of
/// aborting on an allocation (or overflowing the batch arithmetic).
#[test]
fn absurd_estimate_sizes_are_errors() {
    for args in [
        &[
            "memory",
            "--vae",
            "preset:sd15",
            "--size",
            "1024",
            "--batch",
            "18446744073709551615",
        ][..],
        &[
            "memory",
            "--vae",
            "preset:sd15",
            "--size",
            "100000x100000",
            "--batch",
            "100",
        ],
        &[
            "memory",
            "--vae",
            "preset:sd15",
            "--encode",
            "--size",
            "100000x100000",
            "--batch",
            "100",
        ],
        // A video chunk's decoded frames are held on the host (this dry
        // run walked for minutes, then aborted allocating them).
        &[
            "memory",
            "--vae",
            "preset:wan21",
            "--size",
            "100000x100000",
            "--frames",
            "5",
        ],
    ] {
        let (ok, _, err) = wgvae(args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.contains("fit this host's available memory"),
            "{args:?}: {err}"
        );
    }
    // One such image fits the host: more tiles than a plan walks, so it is
    // planned on a few rows of them (this planned for minutes, then was an
    // error past 4096 tiles); the counts are extrapolated to every row.
    let (ok, out, err) = wgvae(&[
        "memory",
        "--vae",
        "preset:sd15",
        "--size",
        "100000x100000",
        "--json",
    ]);
    assert!(ok, "100000²: {err}");
    let v = json(&out);
    let t = &v["tiling"];
    assert_eq!(t["mode"], "exact", "{v}");
    assert_eq!(t["extrapolated"], true, "{v}");
    assert_eq!(t["device_parking_cap"], 0, "{v}");
    let px = t["tile_size"].as_u64().unwrap();
    assert_eq!(t["tiles"], 100000u64.div_ceil(px).pow(2), "{v}");
    assert!(v["peak_allocated_bytes"].as_u64().unwrap() <= t["max_memory"].as_u64().unwrap());
}

#[test]
fn bad_inputs_fail_with_a_message_and_exit_code() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let nan = tmp("nan.npy");
    let mut v = vec![0.0f32; 32 * 4];
    v[7] = f32::NAN;
    wgvae::io::write_npy(&nan, &[1, 32, 2, 2], &v).unwrap();
    let (ok, _, err) = wgvae(&[
        "decode",
        nan.to_str().unwrap(),
        "--vae",
        vae.to_str().unwrap(),
        "-o",
        tmp("x.png").to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("non-finite"), "{err}");
    let wrong = tmp("wrong.npy");
    wgvae::io::write_npy(&wrong, &[1, 4, 2, 2], &[0.0; 16]).unwrap();
    let (ok, _, err) = wgvae(&[
        "decode",
        wrong.to_str().unwrap(),
        "--vae",
        vae.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("expects 32"), "{err}");
    let (ok, _, err) = wgvae(&["memory", "--vae", "preset:sd15", "--size", "100x100"]);
    assert!(!ok);
    assert!(err.contains("multiples of 8"), "{err}");
    let (ok, _, err) = wgvae(&[
        "decode",
        wrong.to_str().unwrap(),
        "--vae",
        "preset:sd15",
        "--policy",
        "lru",
    ]);
    assert!(!ok);
    assert!(err.contains("unknown memory policy"), "{err}");
    // Tile sizes are refused, not rounded, when they are not whole latent pixels.
    for (flag, px, fix) in [
        ("--tile-size", "3", "--tile-size 8"),
        ("--tile-size", "0", "--tile-size 8"),
        ("--tile-overlap", "12", "--tile-overlap 16"),
    ] {
        let mode = if flag == "--tile-overlap" {
            "fast"
        } else {
            "exact"
        };
        for cmd in [
            vec!["memory", "--vae", "preset:sd15", "--size", "512x512"],
            vec![
                "decode",
                wrong.to_str().unwrap(),
                "--vae",
                vae.to_str().unwrap(),
            ],
        ] {
            let mut args = cmd.clone();
            args.extend(["--tile", mode, flag, px]);
            let (ok, _, err) = wgvae(&args);
            assert!(!ok, "{args:?}");
            assert!(
                err.contains(&format!("{flag} {px}: expected a positive multiple of 8"))
                    && err.contains(fix),
                "{args:?}: {err}"
            );
        }
    }
}

#[test]
fn encode_then_decode_through_the_cli() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let img = tmp("small-photo.png");
    let photo = image::open(shared.join("images/chelsea.png"))
        .unwrap()
        .to_rgb8();
    image::imageops::crop_imm(&photo, 100, 60, 64, 48)
        .to_image()
        .save(&img)
        .unwrap();
    let lat = tmp("small-photo.safetensors");
    let enc = shared.join("weights/taef2/encoder.safetensors");
    let (ok, out, err) = wgvae(&[
        "encode",
        img.to_str().unwrap(),
        "--vae",
        enc.to_str().unwrap(),
        "-o",
        lat.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        json(&out)["latents_shape"],
        serde_json::json!([1, 32, 6, 8])
    );
    let dec = shared.join("weights/taef2/decoder.safetensors");
    let png = tmp("small-photo-back.png");
    let (ok, _, err) = wgvae(&[
        "decode",
        lat.to_str().unwrap(),
        "--vae",
        dec.to_str().unwrap(),
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(image::open(&png).unwrap().to_rgb8().dimensions(), (64, 48));
    let odd = tmp("odd.png");
    image::RgbImage::new(30, 20).save(&odd).unwrap();
    let (ok, _, err) = wgvae(&[
        "encode",
        odd.to_str().unwrap(),
        "--vae",
        enc.to_str().unwrap(),
        "-o",
        lat.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("multiple of 8"), "{err}");
}

/// A batch of two through the CLI: `-o NAME` without an extension writes
/// NAME_0.png and NAME_1.png, each within ±1 of the diffusers PNG.
#[test]
fn batch_decode_writes_numbered_pngs_matching_diffusers() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd-batch2");
    let out_dir = tmp("batch2");
    std::fs::create_dir_all(&out_dir).unwrap();
    let stem = out_dir.join("OUT");
    let (ok, out, err) = wgvae(&[
        "decode",
        dir.join("latents.safetensors").to_str().unwrap(),
        "--vae",
        dir.to_str().unwrap(),
        "-o",
        stem.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["image_shape"][0], 2, "{v}");
    let mut written: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, ["OUT_0.png", "OUT_1.png"]);
    for i in 0..2 {
        let got = image::open(out_dir.join(format!("OUT_{i}.png")))
            .unwrap()
            .to_rgb8();
        let want = image::open(dir.join(format!("decoded_{i}.png")))
            .unwrap()
            .to_rgb8();
        assert_eq!(got.dimensions(), want.dimensions(), "image {i}");
        let worst = got
            .as_raw()
            .iter()
            .zip(want.as_raw())
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert!(worst <= 1, "image {i} differs by {worst}");
    }
    // One image and no extension: NAME.png.
    let single = out_dir.join("single");
    let (ok, _, err) = wgvae(&[
        "decode",
        shared
            .join("golden/aekl-tiny-sd/latents.npy")
            .to_str()
            .unwrap(),
        "--vae",
        shared.join("golden/aekl-tiny-sd").to_str().unwrap(),
        "-o",
        single.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out_dir.join("single.png").exists());
}

/// Kernel rows of a `--profile` table: (name, calls, total ms).
fn profile_rows(stdout: &str) -> Vec<(String, usize, f64)> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("kernel "))
        .skip(1)
        .take_while(|l| !l.starts_with("total (GPU)"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.to_string(),
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn decode_profile_of_exact_tiles_has_kernel_rows() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let latents = tiny.join("latents.npy");
    let (ok, out, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        tiny.to_str().unwrap(),
        "--tile",
        "exact",
        "--tile-size",
        "64",
        "--profile",
        "-o",
        tmp("profile-tiled.png").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rows = profile_rows(&out);
    let conv = rows
        .iter()
        .find(|r| r.0 == "conv2d::conv2d")
        .unwrap_or_else(|| panic!("no conv2d row in\n{out}"));
    // Several tiles: more conv calls than the untiled decode's 31 layers.
    assert!(conv.1 > 31 && conv.2 > 0.0, "{out}");
    assert!(
        rows.iter().any(|r| r.0 == "tensor_ops::copy_window"),
        "{out}"
    );
    // Copies are timed too where the device has encoder timestamps (lavapipe does).
    assert!(rows.iter().any(|r| r.0 == "copy::upload"), "{out}");
    assert!(!out.contains("cannot write timestamps"), "{out}");
    assert!(out.contains("tiling: exact"), "{out}");
    let (ok, out, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        tiny.to_str().unwrap(),
        "--tile",
        "exact",
        "--tile-size",
        "64",
        "--json",
        "-o",
        tmp("profile-tiled.png").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let tiled = json(&out)["macs"].as_u64().unwrap();
    // Fast tiles: one recorder per tile, their profiles summed.
    let (ok, out, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        tiny.to_str().unwrap(),
        "--tile",
        "fast",
        "--tile-size",
        "64",
        "--profile",
        "-o",
        tmp("profile-fast.png").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rows = profile_rows(&out);
    let conv = rows.iter().find(|r| r.0 == "conv2d::conv2d");
    assert!(conv.is_some_and(|c| c.1 > 31 && c.2 > 0.0), "{out}");
    assert!(out.contains("tiling: fast"), "{out}");
    let (ok, out, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        tiny.to_str().unwrap(),
        "--tile",
        "off",
        "--json",
        "-o",
        tmp("profile-untiled.png").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let untiled = json(&out)["macs"].as_u64().unwrap();
    // Tiles recompute their halos: README's 1.857 GMAC against 1.828 untiled.
    let g = |m: u64| format!("{:.3}", m as f64 / 1e9);
    assert_eq!(
        [g(tiled), g(untiled)],
        ["1.857", "1.828"],
        "tiled {tiled} vs untiled {untiled} MACs"
    );
}

#[test]
fn profile_with_frames_out_times_kernels_and_copies() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let latents = tmp("frames-profile.npy");
    wgvae::io::write_npy(
        &latents,
        &[3, 4, 4, 4],
        &wgvae::testing::rand_vec(192, 3, 1.0),
    )
    .unwrap();
    let dir = tmp("frames-profile");
    let (ok, out, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        tiny.to_str().unwrap(),
        "--frames-out",
        dir.to_str().unwrap(),
        "--chunk",
        "2",
        "--profile",
    ]);
    assert!(ok, "{err}");
    let rows = profile_rows(&out);
    let conv = rows.iter().find(|r| r.0 == "conv2d::conv2d");
    // Two chunks of the same forward: the conv count is even and positive.
    assert!(
        conv.is_some_and(|c| c.1 > 0 && c.1 % 2 == 0 && c.2 > 0.0),
        "{out}"
    );
    let copy = rows.iter().find(|r| r.0 == "copy::frames_to_staging");
    assert!(copy.is_some_and(|c| c.1 == 2), "{out}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3);
}

#[test]
fn bench_decode_tiled_reports_tiling_and_gflops() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let dir = tmp("bench-tiled");
    let (ok, out, err) = wgvae(&[
        "bench",
        "decode",
        "--vae",
        tiny.to_str().unwrap(),
        "--sizes",
        "64",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--tile",
        "exact",
        "--tile-size",
        "32",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let csv = std::fs::read_to_string(dir.join("decode.csv")).unwrap();
    assert!(
        csv.contains("# settings: ") && csv.contains("tile exact, tile size 32"),
        "{csv}"
    );
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header.len(), row.len(), "{csv}");
    let col = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    assert_eq!(col("tiling"), "exact 32px ×4", "{csv}");
    assert!(col("gflops").parse::<f64>().unwrap() > 0.0, "{csv}");
    assert!(col("first_ms").parse::<f64>().unwrap() > 0.0, "{csv}");
    assert!(out.contains("GFLOP/s"), "{out}");
}

/// `wgvae bench cold-start --vae <tiny> --size 32 <extra>` with TMPDIR at a fresh
/// folder: (success, stdout, stderr, the entries the run left in that folder).
fn cold_start(tiny: &std::path::Path, extra: &[&str]) -> (bool, String, String, Vec<PathBuf>) {
    let tmpdir = tempfile::tempdir().unwrap();
    let mut args = vec!["bench", "cold-start", "--vae", tiny.to_str().unwrap()];
    args.extend_from_slice(&["--size", "32"]);
    args.extend_from_slice(extra);
    let (ok, out, err) = wgvae_env(&args, &[("TMPDIR", tmpdir.path())]);
    let left = std::fs::read_dir(tmpdir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    (ok, out, err, left)
}

#[test]
fn bench_cold_start_writes_both_numbers() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let dir = tmp("cold-start");
    let _ = std::fs::remove_dir_all(&dir);
    let (ok, out, err, left) = cold_start(
        &tiny,
        &[
            "--runs",
            "1",
            // One cold child is slow enough (pipeline compilation) for a test.
            "--driver-cache",
            "on",
            "--out",
            dir.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    // The children's scratch lived under TMPDIR and is gone.
    assert!(left.is_empty(), "{left:?}");
    let csv = std::fs::read_to_string(dir.join("cold_start.csv")).unwrap();
    assert!(
        csv.contains("# adapter: ") && csv.contains("# git_commit: "),
        "{csv}"
    );
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .filter(|l| !l.starts_with('#'))
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 3, "{csv}");
    let ms = |r: &[&str], i: usize| r[i].parse::<f64>().unwrap();
    let cases = [
        "cold: empty pipeline and driver caches",
        "warm pipeline and driver caches",
    ];
    for (row, case) in rows.iter().zip(cases) {
        assert_eq!(row[0], format!("\"{case}\""), "{csv}");
        // Process start → first image covers the decode inside it.
        assert!(ms(row, 1) > ms(row, 2) && ms(row, 2) > 0.0, "{csv}");
        assert_ne!(row[4], "off", "{csv}");
        assert_eq!(row[5], "\"ok\"", "{csv}");
    }
    assert_eq!(rows[2][0], "\"steady state\"", "{csv}");
    assert!(ms(&rows[2], 2) > 0.0, "{csv}");
    if csv.contains("# driver: llvmpipe") {
        // Mesa's shader cache holds lavapipe's compiled shaders: the second
        // process skips compilation (measured 28 s → 1.6 s for this model).
        assert!(ms(&rows[1], 1) < 0.5 * ms(&rows[0], 1), "{csv}");
    }
    assert!(dir.join("cold_start.md").exists());
    // Latents, images and caches of the children stay out of the report folder.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    assert!(out.contains("warm pipeline and driver caches"), "{out}");
}

/// `bench cold-start` failing after it wrote its scratch (a `--cache-dir` that
/// cannot be created) leaves nothing under TMPDIR either.
#[test]
fn bench_cold_start_error_leaves_no_scratch() {
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let tmp = scratch();
    let file = tmp("not-a-folder");
    std::fs::write(&file, b"").unwrap();
    let cache = file.join("cache");
    let out = tmp("out");
    let args = [
        "--cache-dir",
        cache.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let (ok, _, err, left) = cold_start(&tiny, &args);
    assert!(!ok && err.contains("not-a-folder"), "{err}");
    assert!(left.is_empty(), "{left:?}");
}

/// `--pad` through the CLI on a non-uniform 30×21 image: the latents equal
/// those of the same image padded to 32×24 by hand (right column and bottom
/// row replicated) and encoded without `--pad`.
#[test]
fn encode_pad_replicates_edges_through_the_cli() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let enc = shared.join("weights/taef2/encoder.safetensors");
    let (w, h) = (30u32, 21u32);
    let pixel = |x: u32, y: u32| image::Rgb([(x * 8) as u8, (y * 12) as u8, ((x * y) % 251) as u8]);
    let odd = tmp("gradient-30x21.png");
    image::RgbImage::from_fn(w, h, pixel).save(&odd).unwrap();
    let by_hand = tmp("gradient-32x24.png");
    image::RgbImage::from_fn(32, 24, |x, y| pixel(x.min(w - 1), y.min(h - 1)))
        .save(&by_hand)
        .unwrap();
    let run = |img: &PathBuf, out: &str, pad: bool| {
        let out = tmp(out);
        let mut args = vec![
            "encode",
            img.to_str().unwrap(),
            "--vae",
            enc.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--json",
        ];
        if pad {
            args.push("--pad");
        }
        let (ok, stdout, err) = wgvae(&args);
        assert!(ok, "{err}");
        assert_eq!(
            json(&stdout)["image_shape"],
            serde_json::json!([1, 3, 24, 32])
        );
        wgvae::io::read_npy(&out).unwrap()
    };
    let padded = run(&odd, "padded.npy", true);
    let manual = run(&by_hand, "manual.npy", false);
    assert_eq!(padded.shape, vec![1, 32, 3, 4]);
    assert_eq!(
        padded, manual,
        "--pad must replicate the right and bottom edges"
    );
}

/// `--sample` and `--raw-latents` through the CLI (AutoencoderKL): JSON
/// says so and the file equals the library's encode with the same options;
/// with a TAE encoder both are refused; a wrong output extension fails
/// before anything is loaded.
#[test]
fn encode_sample_and_raw_latents_through_the_cli() {
    let tmp = scratch();
    use wgvae::encode::{encode, load_image, EncodeOptions};
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let img = dir.join("encode_input.png");
    let out = tmp("sampled.npy");
    let (ok, stdout, err) = wgvae(&[
        "encode",
        img.to_str().unwrap(),
        "--vae",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--sample",
        "11",
        "--raw-latents",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&stdout);
    assert_eq!(
        (v["sampled"].as_bool(), v["raw_latents"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(v["f16_overflows"].as_u64(), Some(0));
    let got = wgvae::io::read_npy(&out).unwrap();
    let ctx = wgvae::testing::test_context();
    let enc = wgvae::Vae::load_encoder(&ctx, dir.to_str().unwrap(), &Default::default()).unwrap();
    let opts = EncodeOptions {
        sample: Some(11),
        raw_latents: true,
        ..Default::default()
    };
    let want = encode(&ctx, &enc, &load_image(&img, false).unwrap(), &opts).unwrap();
    let (err_max, _) = wgvae::testing::max_abs_diff(&got.data, &want.latents.data);
    assert!(err_max <= 1e-6, "CLI vs library sample: {err_max}");
    assert!(
        got.data != want.mean.unwrap().data,
        "a sample is not the mean"
    );

    let tae = shared.join("weights/taef2/encoder.safetensors");
    for flag in [&["--sample", "3"][..], &["--raw-latents"][..]] {
        let mut args = vec![
            "encode",
            img.to_str().unwrap(),
            "--vae",
            tae.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flag);
        let (ok, _, err) = wgvae(&args);
        assert!(
            !ok && err.contains(flag[0]) && err.contains("TAE"),
            "{flag:?}: {err}"
        );
    }
    let (ok, _, err) = wgvae(&[
        "encode",
        "/nonexistent.png",
        "--vae",
        "/nonexistent",
        "-o",
        tmp("latents.png").to_str().unwrap(),
    ]);
    assert!(!ok && err.contains(".npy or .safetensors"), "{err}");
}

/// `encode --dtype f16` with an encoder that overflows f16 (`encoder.conv_in`
/// scaled by 3·10⁵): the JSON reports the overflow, the bf16 re-encode and
/// the note; the written latents are the bf16 ones.
#[test]
fn encode_f16_overflow_is_reported_in_json() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let golden = shared.join("golden/aekl-tiny-sd");
    let dir = tmp("scaled");
    std::fs::create_dir(&dir).unwrap();
    wgvae::testing::scaled_weights_copy(&golden, "encoder.conv_in.", 3.0e5, &dir);
    let out = tmp("overflow.npy");
    let (ok, stdout, err) = wgvae(&[
        "encode",
        golden.join("encode_input.png").to_str().unwrap(),
        "--vae",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--dtype",
        "f16",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&stdout);
    assert!(v["f16_overflows"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["dtype"], "bf16");
    assert!(
        v["precision_note"]
            .as_str()
            .unwrap()
            .contains("re-encoded in bf16"),
        "{v}"
    );
    assert!(wgvae::io::read_npy(&out)
        .unwrap()
        .data
        .iter()
        .all(|x| x.is_finite()));
}

/// Runs `wgvae decode … --save-raw` and returns (success, raw output, stderr).
fn decode_raw(name: &str, args: &[&str]) -> (bool, Option<wgvae::io::HostTensor>, String) {
    let tmp = scratch();
    let raw = tmp(&format!("{name}.npy"));
    let png = tmp(&format!("{name}.png"));
    let _ = std::fs::remove_file(&raw);
    let mut all = vec!["decode"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "-o",
        png.to_str().unwrap(),
        "--save-raw",
        raw.to_str().unwrap(),
    ]);
    let (ok, _, err) = wgvae(&all);
    (ok, wgvae::io::read_npy(&raw).ok(), err)
}

/// `--key` picks the named tensor of a .safetensors file holding several; a
/// wrong key, or none, is an error naming the tensors there.
#[test]
fn key_picks_the_named_latent_tensor() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let z = wgvae::io::read_npy(&dir.join("latents.npy")).unwrap();
    let want = wgvae::io::read_npy(&dir.join("decoded.npy")).unwrap();
    let noise = wgvae::testing::rand_vec(z.data.len(), 9, 0.5);
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (zb, nb) = (bytes(&z.data), bytes(&noise));
    let view = |b| {
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, z.shape.clone(), b).unwrap()
    };
    let file = tmp("two-tensors.safetensors");
    safetensors::serialize_to_file(
        vec![("a_noise", view(&nb)), ("latents", view(&zb))],
        None,
        &file,
    )
    .unwrap();
    let (f, vae) = (file.to_str().unwrap(), dir.to_str().unwrap());
    let (ok, raw, err) = decode_raw("key-latents", &[f, "--vae", vae, "--key", "latents"]);
    assert!(ok, "{err}");
    let (e, at) = wgvae::testing::max_abs_diff(&raw.unwrap().data, &want.data);
    // (`a_noise` comes first in the file and by name: not picked by default.)
    assert!(e <= 1.5e-5, "--key latents vs diffusers: {e} at {at}");
    for (args, says) in [
        (vec!["--key", "nope"], "no tensor named `nope`"),
        (vec![], "2 tensors (a_noise, latents)"),
    ] {
        let mut all = vec![f, "--vae", vae];
        all.extend(args);
        let (ok, raw, err) = decode_raw("key-bad", &all);
        assert!(!ok && raw.is_none(), "{all:?} succeeded");
        assert!(err.contains(says), "{all:?}: {err}");
    }
}

/// `--scaling-factor S --shift-factor T` decode `z / S + T`: the same output
/// as those values decoded with `--raw-latents`, and not the config's;
/// `--raw-latents` on pipeline latents skips the unscaling.
#[test]
fn scaling_shift_and_raw_latents_flags_follow_the_formula() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let vae = dir.to_str().unwrap();
    let latents = dir.join("latents.npy");
    let z = wgvae::io::read_npy(&latents).unwrap();
    let unscaled: Vec<f32> = z.data.iter().map(|v| v / 0.5 + 0.25).collect();
    let unscaled_npy = tmp("unscaled-0.5-0.25.npy");
    wgvae::io::write_npy(&unscaled_npy, &z.shape, &unscaled).unwrap();
    let l = latents.to_str().unwrap();
    let flags = ["--scaling-factor", "0.5", "--shift-factor", "0.25"];
    let (ok, by_flags, err) = decode_raw("factors", &[&[l, "--vae", vae][..], &flags].concat());
    assert!(ok, "{err}");
    let by_flags = by_flags.unwrap();
    let u = unscaled_npy.to_str().unwrap();
    let (ok, by_hand, err) = decode_raw("factors-raw", &[u, "--vae", vae, "--raw-latents"]);
    assert!(ok, "{err}");
    let (e, at) = wgvae::testing::max_abs_diff(&by_flags.data, &by_hand.unwrap().data);
    assert!(
        e <= 1e-5,
        "flags vs z / 0.5 + 0.25 decoded raw: {e} at {at}"
    );
    // diffusers' output of the config's factors (0.18215, no shift).
    let want = wgvae::io::read_npy(&dir.join("decoded.npy")).unwrap();
    let (e, _) = wgvae::testing::max_abs_diff(&by_flags.data, &want.data);
    assert!(e > 1e-2, "the flags changed nothing ({e})");
    let (ok, skipped, err) = decode_raw("raw-latents", &[l, "--vae", vae, "--raw-latents"]);
    assert!(ok, "{err}");
    let skipped = skipped.unwrap();
    for (what, other) in [("diffusers'", &want.data), ("the flags'", &by_flags.data)] {
        let (e, _) = wgvae::testing::max_abs_diff(&skipped.data, other);
        assert!(e > 1e-2, "--raw-latents decoded like {what} output ({e})");
    }
}

/// `--seed` of preset random weights: the same seed decodes the same bytes,
/// another seed other ones.
#[test]
fn seed_makes_preset_weights_reproducible() {
    let tmp = scratch();
    let latents = tmp("seed.npy");
    wgvae::io::write_npy(&latents, &[1, 4, 1, 1], &[0.3, -0.2, 0.1, 0.5]).unwrap();
    let l = latents.to_str().unwrap();
    let run = |seed: &str| {
        let (ok, raw, err) = decode_raw(
            &format!("seed-{seed}"),
            &[l, "--vae", "preset:sd15", "--seed", seed],
        );
        assert!(ok, "{err}");
        raw.unwrap().data
    };
    let (a, again, b) = (run("1"), run("1"), run("2"));
    assert_eq!(a, again, "--seed 1 twice");
    let (e, _) = wgvae::testing::max_abs_diff(&a, &b);
    assert!(e > 1e-3, "--seed 1 and 2 decode alike ({e})");
}

/// `--dtype auto` (the default): f32 on a CPU adapter; on a GPU f16 for the SD
/// 1.x-like VAE (within 3× README's 3.8e-3 of diffusers), bf16 for the
/// 16-channel FLUX-like one. Leaving `--dtype` out is the same as `auto`.
#[test]
fn dtype_auto_picks_by_model_and_device() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let ctx = wgvae::gpu::Context::new(&Default::default()).unwrap();
    let cpu = ctx.caps().is_cpu();
    for (name, gpu_dtype, tol) in [
        ("aekl-tiny-sd", "f16", 1.2e-2),
        ("aekl-tiny-flux", "bf16", 1.3e-1),
    ] {
        let (dtype, tol) = if cpu { ("f32", 2e-4) } else { (gpu_dtype, tol) };
        for flag in [&["--dtype", "auto"][..], &[]] {
            let dir = shared.join("golden").join(name);
            let latents = dir.join("latents.npy");
            let raw = tmp(&format!("auto-{name}-{}.npy", flag.len()));
            let png = tmp(&format!("auto-{name}-{}.png", flag.len()));
            let mut args = vec![
                "decode",
                latents.to_str().unwrap(),
                "--vae",
                dir.to_str().unwrap(),
                "-o",
                png.to_str().unwrap(),
                "--save-raw",
                raw.to_str().unwrap(),
                "--json",
            ];
            args.extend_from_slice(flag);
            let (ok, out, err) = wgvae(&args);
            assert!(ok, "{err}");
            assert_eq!(json(&out)["dtype"], dtype, "{name} {flag:?}: {out}");
            let want = wgvae::io::read_npy(&dir.join("decoded.npy")).unwrap();
            let raw = wgvae::io::read_npy(&raw).unwrap();
            let (e, at) = wgvae::testing::max_abs_diff(&raw.data, &want.data);
            assert!(e <= tol, "{name} auto ({dtype}): {e} at {at}");
        }
    }
}

/// Rows of a report CSV (`# ` metadata lines skipped) as column → value maps.
fn csv_rows(path: &std::path::Path) -> Vec<std::collections::HashMap<String, String>> {
    let csv = std::fs::read_to_string(path).unwrap();
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(String::from))
                .collect()
        })
        .collect()
}

/// `memory --batch` predicts the batch (the library's estimate of that shape;
/// working memory grows with it) and `--reference-gpu` predicts for the
/// reference limits, not this adapter's.
#[test]
fn memory_batch_and_reference_gpu() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let vae = dir.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["memory", "--vae", vae, "--size", "96x128", "--json"];
        args.extend_from_slice(extra);
        let (ok, out, err) = wgvae(&args);
        assert!(ok, "{err}");
        json(&out)
    };
    let one = run(&[]);
    let two = run(&["--batch", "2"]);
    let reference = run(&["--batch", "2", "--reference-gpu"]);
    let caps = wgvae::gpu::Capabilities::reference_gpu();
    assert_eq!(reference["device"], caps.adapter_name.as_str());
    assert_ne!(one["device"], reference["device"]);
    // `--dtype` defaults to auto: 16-bit on the reference GPU (f16 for this SD-like VAE).
    assert_eq!(reference["dtype"], "f16", "{reference}");
    let load = wgvae::LoadOptions {
        precision: wgvae::models::Precision::Auto,
        ..Default::default()
    };
    let want = wgvae::estimate::Estimate::new(&caps, wgvae::memory::Policy::Planned, vae, &load)
        .tiled(&wgvae::Tiling::default())
        .decode([2, 4, 12, 16])
        .unwrap();
    assert_eq!(
        reference["latents_shape"],
        serde_json::json!([2, 4, 12, 16])
    );
    assert_eq!(reference["peak_allocated_bytes"], want.peak_allocated_bytes);
    assert_eq!(reference["weights_bytes"], want.weights_bytes);
    assert_eq!(
        reference["tiling"]["max_memory"], want.tiling.max_memory,
        "the reference GPU's default budget"
    );
    assert_eq!(two["latents_shape"], serde_json::json!([2, 4, 12, 16]));
    let working = |v: &serde_json::Value| {
        v["peak_allocated_bytes"].as_u64().unwrap() - v["weights_bytes"].as_u64().unwrap()
    };
    assert!(
        working(&two) as f64 >= 1.5 * working(&one) as f64,
        "batch 2 working {} vs batch 1 {}",
        working(&two),
        working(&one)
    );
}

/// `bench decode --dtypes f32,f16`: a row per dtype, the f16 one's peak
/// about half the f32 one's.
#[test]
fn bench_decode_dtypes_writes_a_row_per_dtype() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let dir = tmp("bench-dtypes");
    let (ok, _, err) = wgvae(&[
        "bench",
        "decode",
        "--vae",
        tiny.to_str().unwrap(),
        "--sizes",
        "32",
        "--dtypes",
        "f32,f16",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rows = csv_rows(&dir.join("decode.csv"));
    let dtypes: Vec<&str> = rows.iter().map(|r| r["dtype"].as_str()).collect();
    assert_eq!(dtypes, ["f32", "f16"], "{rows:?}");
    let peak = |i: usize| rows[i]["peak_allocated_mib"].parse::<f64>().unwrap();
    let ratio = peak(1) / peak(0);
    assert!(
        (0.45..=0.6).contains(&ratio),
        "f16 / f32 peak {ratio}: {rows:?}"
    );
}

/// `bench frames`: rows for the streamed decode and the one-frame loop with
/// the requested frames, size and chunk, consistent figures.
#[test]
fn bench_frames_writes_streamed_and_loop_rows() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let tiny = shared.join("golden/aekl-tiny-sd");
    let dir = tmp("bench-frames");
    let (ok, out, err) = wgvae(&[
        "bench",
        "frames",
        "--vae",
        tiny.to_str().unwrap(),
        "--frames",
        "3",
        "--size",
        "32",
        "--chunk",
        "2",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rows = csv_rows(&dir.join("frames.csv"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(
            (&*r["frames"], &*r["width"], &*r["height"], &*r["status"]),
            ("3", "32", "32", "\"ok\""),
            "{r:?}"
        );
        let f = |k: &str| r[k].parse::<f64>().unwrap();
        let fps = 3e3 / f("median_total_ms");
        assert!((f("frames_per_s") / fps - 1.0).abs() < 0.01, "{r:?}");
        assert!(f("latency_p99_ms") <= f("latency_max_ms"), "{r:?}");
    }
    assert!(rows.iter().any(|r| r["chunk"] == "2"), "{rows:?}");
    let latencies = std::fs::read_to_string(dir.join("frames_latency.csv")).unwrap();
    assert_eq!(
        latencies.lines().filter(|l| !l.starts_with('#')).count(),
        1 + 2 * 3
    );
    assert!(out.contains("frames/s"), "{out}");
}

/// `WGVAE_PIPELINE_CACHE=0` turns the pipeline cache folder off: nothing is
/// written where `WGVAE_CACHE_DIR` points.
#[test]
fn pipeline_cache_env_zero_writes_no_cache() {
    let Some(shared) = shared_dir() else { return };
    let files = taef2_decode_with_cache_dir(
        &shared,
        "pipeline-cache-off",
        &[("WGVAE_PIPELINE_CACHE", "0")],
    );
    assert_eq!(files, 0, "WGVAE_PIPELINE_CACHE=0 wrote a cache");
}

/// A FIFO named as latents, weights, a model folder's config.json or an
/// encode input is an error naming it, not a process blocked forever in
/// `open` (the run is killed after 60 s if it hangs).
#[test]
fn fifos_are_errors_not_hangs() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let d = tmp("fifos");
    let model = d.join("model");
    std::fs::create_dir_all(&model).unwrap();
    let fifo = |p: PathBuf| {
        let _ = std::fs::remove_file(&p);
        let ok = Command::new("mkfifo").arg(&p).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "mkfifo {p:?}: {ok:?}");
        p.to_str().unwrap().to_string()
    };
    // A model folder whose config.json is a FIFO.
    let kl = shared.join("golden/aekl-tiny-sd");
    let weights = model.join("diffusion_pytorch_model.safetensors");
    let _ = std::fs::remove_file(&weights);
    std::fs::copy(kl.join("diffusion_pytorch_model.safetensors"), &weights).unwrap();
    let s = |p: PathBuf| p.to_str().unwrap().to_string();
    let taef2 = shared.join("weights/taef2");
    let out = s(d.join("out.png"));
    let cases = [
        (
            "z.npy",
            vec![
                "decode".into(),
                fifo(d.join("z.npy")),
                "--vae".into(),
                s(taef2.join("decoder.safetensors")),
            ],
        ),
        (
            "w.safetensors",
            vec![
                "decode".into(),
                s(shared.join("golden/taef2/astronaut.latents.npy")),
                "--vae".into(),
                fifo(d.join("w.safetensors")),
            ],
        ),
        (
            "config.json",
            vec![
                "decode".into(),
                s(kl.join("latents.npy")),
                "--vae".into(),
                {
                    fifo(model.join("config.json"));
                    s(model.clone())
                },
            ],
        ),
        (
            "in.png",
            vec![
                "encode".into(),
                fifo(d.join("in.png")),
                "--vae".into(),
                s(taef2.join("encoder.safetensors")),
            ],
        ),
    ];
    for (name, mut args) in cases {
        let o = if args[0] == "encode" {
            s(d.join("z.safetensors"))
        } else {
            out.clone()
        };
        args.extend(["-o".to_string(), o]);
        let mut child = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run wgvae");
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed().as_secs() > 60 {
                child.kill().unwrap();
                panic!("{args:?} hangs");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let run = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(name) && err.contains("not a regular file"),
            "{args:?}: {err}"
        );
    }
    assert!(!d.join("out.png").exists());
}

/// `report memory` on a CI-sized selection: the files, README's FLUX.1 512²
/// figures (f32 caching 701.9 / 974 MiB, planned 701.0, weights 189.9 /
/// 189.0; f16 weights 98.1 / 94.6 and 47 % of PyTorch's working memory),
/// each row equal to the library's estimate, and a size off the grid
/// refused before any work.
#[test]
fn report_memory_partial_grid_matches_readme_and_estimates() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let reference = shared.join("reference/pytorch_vae_memory_rtx4090.csv");
    let out = tmp("report-memory");
    let (ok, stdout, err) = wgvae(&[
        "report",
        "memory",
        "--sizes",
        "512",
        "--models",
        "flux",
        "--reference",
        reference.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("wrote 18 rows"), "{stdout}");
    for f in ["memory.csv", "memory.md", "memory_flux.svg"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    assert!(
        !out.join("memory_sdxl.svg").exists(),
        "SDXL was not selected"
    );
    let rows = csv_rows(&out.join("memory.csv"));
    // decode and encode × 3 dtypes × 3 policies (PyTorch has no tiled 512² row to budget by).
    assert_eq!(rows.len(), 18, "{rows:?}");
    let row = |op: &str, dtype: &str, policy: &str| {
        rows.iter()
            .find(|r| r["op"] == op && r["dtype"] == dtype && r["policy"] == policy)
            .unwrap_or_else(|| panic!("no {op} {dtype} {policy} row"))
    };
    let f =
        |r: &std::collections::HashMap<String, String>, k: &str| -> f64 { r[k].parse().unwrap() };
    let c32 = row("decode", "float32", "caching");
    let p32 = row("decode", "float32", "planned");
    let p16 = row("decode", "float16", "planned");
    let c16 = row("decode", "float16", "caching");
    assert_eq!(
        [c32, p32].map(|r| format!(
            "{:.0} / {:.0}",
            f(r, "peak_allocated_mib"),
            f(r, "peak_reserved_mib")
        )),
        ["702 / 974", "701 / 701"]
    );
    assert_eq!(
        [c32, p32, c16, p16].map(|r| format!("{:.1}", f(r, "weights_mib"))),
        ["189.9", "189.0", "98.1", "94.6"]
    );
    assert_eq!(format!("{:.2}", f(p16, "working_vs_pytorch")), "0.47");
    assert_eq!(f(p16, "pytorch_allocated_mib"), 546.12, "the published row");
    // Every decode row is the library's estimate for the reference GPU.
    let caps = wgvae::gpu::Capabilities::reference_gpu();
    for (dtype, precision) in [
        ("float32", wgvae::models::Precision::F32),
        ("float16", wgvae::models::Precision::F16),
    ] {
        for policy in [
            wgvae::memory::Policy::Caching,
            wgvae::memory::Policy::Planned,
            wgvae::memory::Policy::Exact,
        ] {
            let load = wgvae::LoadOptions {
                precision,
                ..Default::default()
            };
            let e = wgvae::estimate::Estimate::new(&caps, policy, "preset:flux1", &load)
                .decode([1, 16, 64, 64])
                .unwrap();
            let r = row("decode", dtype, policy.name());
            let mib = |b: u64| format!("{:.2}", b as f64 / (1024.0 * 1024.0));
            assert_eq!(r["peak_allocated_mib"], mib(e.peak_allocated_bytes));
            assert_eq!(r["peak_reserved_mib"], mib(e.peak_reserved_bytes));
            assert_eq!(r["weights_mib"], mib(e.weights_bytes));
        }
    }
    let started = std::time::Instant::now();
    let (ok, _, err) = wgvae(&[
        "report",
        "memory",
        "--sizes",
        "640",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("--sizes 640") && err.contains("wgvae memory --size 640x640"),
        "{err}"
    );
    let (ok, _, err) = wgvae(&[
        "report",
        "memory",
        "--models",
        "sd2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("FLUX, SD1.5, SDXL"), "{err}");
    assert!(started.elapsed().as_secs() < 10, "refused before any work");
}

/// `decode --vae taew2_1.safetensors --frames-out DIR`: a TAEHV file takes the
/// video path, streams the latents in chunks and writes frame PNGs equal to
/// the golden's frames (±1 level); without --frames-out it says what to add.
#[test]
fn decode_taehv_video_writes_frames() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/taew2_1-rand");
    let vae = dir.join("taew2_1.safetensors");
    let latents = dir.join("latents.npy");
    let out = tmp("taehv_frames");
    let args = [
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        vae.to_str().unwrap(),
        "--frames-out",
        out.to_str().unwrap(),
        "--chunk",
        "2",
        "--json",
    ];
    let (ok, stdout, err) = wgvae(&args);
    assert!(ok, "{err}");
    let v = json(&stdout);
    assert_eq!(v["frames"], 9, "{v}");
    assert_eq!(v["frame_shape"], serde_json::json!([3, 64, 80]), "{v}");
    let want = wgvae::io::read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let range = wgvae::kernels::image::ImageRange::ZeroToOne;
    let want = wgvae::kernels::image::cpu_to_rgba8(&want.data, 9, 64, 80, range);
    for (i, frame) in want.chunks_exact(64 * 80 * 4).enumerate() {
        let png = image::open(out.join(format!("frame_{i:05}.png")))
            .unwrap()
            .to_rgb8()
            .into_raw();
        let worst = wgvae::testing::rgb_of(frame)
            .iter()
            .zip(&png)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert!(worst <= 1, "frame {i} differs by {worst}");
    }
    let (ok, _, err) = wgvae(&args[..4]);
    assert!(!ok && err.contains("--frames-out"), "{err}");
}

/// `decode --vae taew2_1 --video-out OUT.y4m --save-raw RAW.npy --json`:
/// the .y4m parses (frame count, size, rate, 4:2:0) with the BT.601
/// full-range luma of the golden's clamped frames, the raw .npy is the
/// golden's `decoded_raw.npy` (N×T'×3×H×W before the clamp) within
/// video_goldens' bound, and the JSON's timing and memory fields are sane.
#[test]
fn decode_taehv_video_out_and_raw() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/taew2_1-rand");
    let vae = dir.join("taew2_1.safetensors");
    let latents = dir.join("latents.npy");
    let y4m = tmp("taehv.y4m");
    let raw = tmp("taehv_raw.npy");
    let (ok, stdout, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        vae.to_str().unwrap(),
        "--video-out",
        y4m.to_str().unwrap(),
        "--save-raw",
        raw.to_str().unwrap(),
        "--fps",
        "24",
        "--chunk",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&stdout);
    assert_eq!(v["frames"], 9, "{v}");
    assert_eq!(v["layout"], "ntchw", "{v}");
    assert_eq!(v["video_chroma"], "420jpeg", "{v}");
    let fps = v["frames_per_s"].as_f64().unwrap();
    let ms = v["decode_ms"].as_f64().unwrap();
    assert!(fps > 0.0 && (fps * ms / 1e3 - 9.0).abs() < 1e-6, "{v}");
    let l = &v["latency"];
    let (mean, p99, max) = (
        l["mean_ms"].as_f64().unwrap(),
        l["p99_ms"].as_f64().unwrap(),
        l["max_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < mean && mean <= max && p99 <= max && max <= ms, "{v}");
    assert!(v["peak_allocated_bytes"].as_u64().unwrap() > 0, "{v}");

    let want = wgvae::io::read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let got = wgvae::io::read_npy(&raw).unwrap();
    assert_eq!(got.shape, vec![1, 9, 3, 64, 80]);
    let (e, at) = wgvae::testing::max_abs_diff(&got.data, &want.data);
    println!("--save-raw vs taehv.py: max abs {e:.3e} at {at}");
    assert!(e <= 8e-6, "--save-raw: {e} at {at}");

    let bytes = std::fs::read(&y4m).unwrap();
    let info = wgvae::y4m::parse_y4m(&bytes).unwrap();
    assert_eq!((info.width, info.height, info.frames), (80, 64, 9));
    assert_eq!(info.rate, wgvae::y4m::FrameRate { num: 24, den: 1 });
    assert_eq!(info.chroma, wgvae::y4m::Chroma::C420Jpeg);
    // Luma of every pixel of the last frame from the golden (±1 level).
    let header = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    let frame = 6 + 80 * 64 * 3 / 2;
    let luma = &bytes[header + 8 * frame + 6..][..80 * 64];
    let plane = 80 * 64;
    let last = &want.data[8 * 3 * plane..];
    let level = |x: f32| x.clamp(0.0, 1.0) * 255.0;
    for (i, y) in luma.iter().enumerate() {
        let [yy, _, _] = wgvae::y4m::rgb_to_ycbcr(
            level(last[i]),
            level(last[plane + i]),
            level(last[2 * plane + i]),
        );
        assert!((yy - *y as f32).abs() <= 1.0, "luma {i}: {y} vs {yy}");
    }
}

/// Video latents in the wrong layout, with the wrong channel count, T = 0,
/// 4-D (an image latent) for a video VAE, 5-D for an image VAE: errors that
/// name the file, what was expected and found, and the fix; `--layout
/// ncthw` then decodes the transposed latents like the golden.
#[test]
fn video_latent_shapes_are_clear_errors() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/taew2_1-rand");
    let vae = dir.join("taew2_1.safetensors");
    let golden = wgvae::io::read_npy(&dir.join("latents.npy")).unwrap();
    let [n, t, c, h, w] = golden.shape[..] else {
        panic!("not 5-D")
    };
    let save = |name: &str, shape: &[usize], data: &[f32]| {
        let p = tmp(name);
        wgvae::io::write_npy(&p, shape, data).unwrap();
        p
    };
    // N×C×T×h×w of the golden's N×T×C×h×w.
    let mut ncthw = vec![0.0; golden.data.len()];
    for f in 0..t {
        for ch in 0..c {
            let src = (f * c + ch) * h * w;
            let dst = (ch * t + f) * h * w;
            ncthw[dst..dst + h * w].copy_from_slice(&golden.data[src..src + h * w]);
        }
    }
    let transposed = save("ncthw.npy", &[n, c, t, h, w], &ncthw);
    let decode = |latents: &PathBuf, vae: &PathBuf, extra: &[&str]| {
        let raw = tmp("layout_raw.npy");
        let mut args = vec![
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            vae.to_str().unwrap(),
            "--save-raw",
            raw.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (ok, _, err) = wgvae(&args);
        (ok, err, raw)
    };
    let (ok, err, _) = decode(&transposed, &vae, &[]);
    assert!(
        !ok && err.contains("ncthw.npy")
            && err.contains("--layout ncthw")
            && err.contains("takes 16"),
        "{err}"
    );
    let one = |shape: &[usize]| vec![0.1; shape.iter().product()];
    let cases: [(&str, Vec<usize>, &[&str]); 4] = [
        (
            "c15.npy",
            vec![1, 2, 15, 2, 2],
            &["15 channels", "takes 16"],
        ),
        ("t0.npy", vec![1, 0, 16, 2, 2], &["T = 0"]),
        (
            "image.npy",
            vec![2, 16, 2, 2],
            &["4-D", "image latent", "1×T×C×h×w"],
        ),
        ("rank2.npy", vec![16, 4], &["rank 2", "5-D"]),
    ];
    for (name, shape, want) in cases {
        let p = save(name, &shape, &one(&shape));
        let (ok, err, _) = decode(&p, &vae, &[]);
        assert!(!ok && err.contains(name), "{name}: {err}");
        for w in want {
            assert!(err.contains(w), "{name}: `{w}` not in {err}");
        }
    }
    let (ok, err, _) = decode(&transposed, &vae, &["--layout", "nchw"]);
    assert!(
        !ok && err.contains("ntchw") && err.contains("ncthw"),
        "{err}"
    );
    // A video latent given to an image VAE (TAEF2).
    let taef2 = shared.join("weights/taef2/decoder.safetensors");
    let video = save("video5d.npy", &[1, 2, 32, 2, 2], &one(&[1, 2, 32, 2, 2]));
    let (ok, err, _) = decode(&video, &taef2, &[]);
    assert!(
        !ok && err.contains("video5d.npy") && err.contains("rank 5") && err.contains("video VAE"),
        "{err}"
    );
    let out = tmp("image.y4m");
    let (ok, err, _) = decode(&video, &taef2, &["--video-out", out.to_str().unwrap()]);
    assert!(!ok && err.contains("video decoders"), "{err}");
    // Image-only flags on a video decoder are refused, not ignored
    // (--max-memory and --max-host-memory apply: they budget exact video tiles).
    let (ok, err, _) = decode(
        &transposed,
        &vae,
        &[
            "--layout",
            "ncthw",
            "--tile",
            "exact",
            "--tile-size",
            "16",
            "--max-host-memory",
            "4KiB",
            "--max-memory",
            "40MiB",
        ],
    );
    assert!(
        !ok && err.contains("--max-host-memory") && err.contains("host memory"),
        "{err}"
    );
    for flag in [
        &["--scaling-factor", "0.5"][..],
        &["--shift-factor", "0.1"],
        &["--profile"],
    ] {
        let (ok, err, _) = decode(&transposed, &vae, flag);
        assert!(
            !ok && err.contains(flag[0]) && err.contains("image VAEs"),
            "{flag:?}: {err}"
        );
    }
    // The override decodes the transposed latents as the golden.
    let (ok, err, raw) = decode(&transposed, &vae, &["--layout", "ncthw"]);
    assert!(ok, "{err}");
    let want = wgvae::io::read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let got = wgvae::io::read_npy(&raw).unwrap();
    assert_eq!(got.shape, want.shape);
    let (e, at) = wgvae::testing::max_abs_diff(&got.data, &want.data);
    assert!(e <= 8e-6, "--layout ncthw: {e} at {at}");
}

/// `memory --vae taew2_1.safetensors --frames 81 --json`: a video decoder's
/// streaming estimate (was an error: "not images"), the same for any T; a
/// bad T or size is refused with a message.
#[test]
fn memory_of_a_video_decoder_streams() {
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let vae = vae.to_str().unwrap();
    let json = |frames: &str| {
        let (ok, out, err) = wgvae(&[
            "memory", "--vae", vae, "--size", "64x80", "--frames", frames, "--json",
        ]);
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let v = json("81");
    assert_eq!(v["op"], "decode_video");
    assert_eq!(v["frames"], 81);
    assert_eq!(v["output_frames"], 4 * 81 - 3);
    assert_eq!(v["chunk"], 1);
    assert_eq!(v["latent_frame"], serde_json::json!([16, 8, 10]));
    assert_eq!(v["independent_of_frames"], true);
    let peak = v["peak_allocated_bytes"].as_u64().unwrap();
    let parts =
        ["weights_bytes", "cache_bytes", "activation_bytes"].map(|k| v[k].as_u64().unwrap());
    assert_eq!(
        parts.iter().sum::<u64>(),
        v["chunk_peak_allocated_bytes"].as_u64().unwrap()
    );
    assert!(peak >= parts[0] + parts[1] && v["peak_reserved_bytes"].as_u64().unwrap() >= peak);
    assert_eq!(json("3")["peak_allocated_bytes"].as_u64().unwrap(), peak);
    for (args, says) in [
        (
            ["--size", "64x80", "--frames", "0"],
            "--frames must be at least 1",
        ),
        (["--size", "60x80", "--frames", "2"], "multiples of 8"),
    ] {
        let mut all = vec!["memory", "--vae", vae];
        all.extend(args);
        let (ok, _, err) = wgvae(&all);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
}

/// `bench video` on the tiny Wan VAE: a row per video length with the frame
/// counts, consistent figures, peak memory that does not grow with the
/// length, every chunk's latency, and both charts.
#[test]
fn bench_video_writes_a_row_per_length() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let wan = shared.join("golden/wan21-tiny");
    let dir = tmp("bench-video");
    let (ok, out, err) = wgvae(&[
        "bench",
        "video",
        "--vae",
        wan.to_str().unwrap(),
        "--size",
        "8",
        "--latent-frames",
        "2,3",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rows = csv_rows(&dir.join("video.csv"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (r, (t, frames)) in rows.iter().zip([("2", "5"), ("3", "9")]) {
        assert_eq!(
            (
                &*r["latent_frames"],
                &*r["frames"],
                &*r["width"],
                &*r["chunk"],
                &*r["status"]
            ),
            (t, frames, "8", "1", "\"ok\""),
            "{r:?}"
        );
        let f = |k: &str| r[k].parse::<f64>().unwrap();
        let fps = f("frames") * 1e3 / f("median_total_ms");
        assert!((f("frames_per_s") / fps - 1.0).abs() < 0.01, "{r:?}");
        assert!(
            f("chunk_latency_p50_ms") <= f("chunk_latency_p99_ms")
                && f("chunk_latency_p99_ms") <= f("chunk_latency_max_ms"),
            "{r:?}"
        );
        assert!(
            f("peak_allocated_mib") > 0.0 && f("cache_mib") > 0.0,
            "{r:?}"
        );
    }
    // Streaming: a longer video needs no more memory.
    let peak = |i: usize| rows[i]["peak_allocated_mib"].parse::<f64>().unwrap();
    assert!(peak(1) <= peak(0) * 1.01, "{rows:?}");
    let latencies = std::fs::read_to_string(dir.join("video_latency.csv")).unwrap();
    assert_eq!(
        latencies.lines().filter(|l| !l.starts_with('#')).count(),
        1 + 2 + 3
    );
    let md = std::fs::read_to_string(dir.join("video.md")).unwrap();
    assert!(
        md.contains("adapter: ") && md.contains("| P50 ms |"),
        "{md}"
    );
    for svg in ["video_memory.svg", "video_throughput.svg"] {
        assert!(dir.join(svg).exists(), "{svg}");
    }
    assert!(out.contains("frames/s"), "{out}");
}

/// `encode FRAMES.npy --vae taew2_1.safetensors -o LATENTS.npy`: a TAEHV
/// file takes the video path (5 frames pad to 8: 2 latent frames); flags of
/// the image encoders are refused by name.
#[test]
fn encode_taehv_video_frames() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let vae = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let frames = tmp("taehv_frames_in.npy");
    let values: Vec<f32> = (0..5 * 3 * 16 * 16).map(|i| (i % 7) as f32 / 7.0).collect();
    wgvae::io::write_npy(&frames, &[1, 5, 3, 16, 16], &values).unwrap();
    let out = tmp("taehv_latents.npy");
    let (f, v, o) = (
        frames.to_str().unwrap(),
        vae.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let (ok, stdout, err) = wgvae(&["encode", f, "--vae", v, "-o", o, "--json"]);
    assert!(ok, "{err}");
    assert_eq!(
        json(&stdout)["latents_shape"],
        serde_json::json!([1, 2, 16, 2, 2])
    );
    assert_eq!(
        wgvae::io::read_npy(&out).unwrap().shape,
        vec![1, 2, 16, 2, 2]
    );
    let o2 = tmp("taehv_latents2.npy");
    let (ok, _, err) = wgvae(&["encode", f, "--vae", v, "-o", o2.to_str().unwrap(), "--pad"]);
    assert!(
        !ok && err.contains("--pad") && err.contains("video VAE"),
        "{err}"
    );
}

/// `bench conv` refuses bad arguments before it opens a device or times anything: a dtype the
/// cooperative kernels do not take, a decode size that is no multiple of 8, no timed runs.
#[test]
fn bench_conv_bad_arguments_are_errors() {
    let tmp = scratch();
    let dir = tmp("conv");
    let out = dir.to_str().unwrap();
    for (args, want) in [
        (vec!["--dtype", "bf16"], "expected f16 or f32"),
        (vec!["--sizes", "100"], "multiple of 8"),
        (vec!["--runs", "0"], "at least 1 timed call"),
    ] {
        let mut all = vec!["bench", "conv", "--out", out];
        all.extend(args.iter().copied());
        let (ok, _, err) = wgvae(&all);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
        assert!(!dir.join("conv.csv").exists(), "{args:?} wrote a report");
    }
}

/// `bench gpu-model`: the paper GPU model's per-decode totals for every model ×
/// size × GPU × path, positive and ordered (perfect reuse ≤ roofline ≤ no
/// overlap; matrix units faster than none), with no GPU involved; `--json
/// --layers` gives the per-layer rows.
#[test]
fn bench_gpu_model_writes_positive_totals() {
    let tmp = scratch();
    let dir = tmp("gpu-model");
    let (ok, out, err) = wgvae(&["bench", "gpu-model", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("MODEL, not a measurement"), "{out}");
    let rows = csv_rows(&dir.join("gpu_model.csv"));
    assert_eq!(rows.len(), 7 * 2 * 2, "{rows:?}");
    let num = |r: &std::collections::HashMap<String, String>, c: &str| -> f64 {
        r[c].parse()
            .unwrap_or_else(|_| panic!("{c} of {r:?} is not a number"))
    };
    for (model, size) in [
        ("SD1.5", "512x512"),
        ("SD1.5", "1024x1024"),
        ("SDXL", "512x512"),
        ("SDXL", "1024x1024"),
        ("FLUX.1", "512x512"),
        ("FLUX.1", "1024x1024"),
        ("Wan 2.1", "480x832x81f"),
    ] {
        for gpu in ["H100 SXM", "RTX 4090"] {
            let row = |path: &str| {
                rows.iter()
                    .find(|r| {
                        r["model"] == model
                            && r["size"] == size
                            && r["gpu"] == gpu
                            && r["path"] == path
                    })
                    .unwrap_or_else(|| panic!("no {model} {size} {gpu} {path} row: {rows:?}"))
            };
            for path in ["matrix", "scalar"] {
                let r = row(path);
                for c in [
                    "ms",
                    "ms_perfect_reuse",
                    "ms_no_overlap",
                    "tflop",
                    "gb_moved",
                    "gb_unique",
                ] {
                    assert!(num(r, c) > 0.0, "{c}: {r:?}");
                }
                assert!(num(r, "ms_perfect_reuse") <= num(r, "ms"), "{r:?}");
                assert!(num(r, "ms") <= num(r, "ms_no_overlap"), "{r:?}");
                assert!((0.0..=100.0).contains(&num(r, "pct_time_bandwidth_bound")));
            }
            assert!(
                num(row("matrix"), "ms") < num(row("scalar"), "ms"),
                "{model} {size} {gpu}"
            );
        }
    }
    // The 1024² decodes do four times the work of the 512² ones (within the attention's growth).
    let tflop = |size: &str| {
        num(
            rows.iter()
                .find(|r| r["model"] == "SD1.5" && r["size"] == size)
                .unwrap(),
            "tflop",
        )
    };
    let ratio = tflop("1024x1024") / tflop("512x512");
    assert!((4.0..4.3).contains(&ratio), "{ratio}");
    let (ok, out, err) = wgvae(&[
        "bench",
        "gpu-model",
        "--json",
        "--layers",
        "--models",
        "sd1.5",
        "--gpus",
        "4090",
        "--out",
        tmp("gpu-model-json").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["totals"].as_array().unwrap().len(), 2 * 2);
    let layers = v["layers"].as_array().unwrap();
    assert!(layers.len() > 100, "{}", layers.len());
    assert!(layers
        .iter()
        .all(|l| l["prediction"]["time_s"].as_f64().unwrap() > 0.0));
}
