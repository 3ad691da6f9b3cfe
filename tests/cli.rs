//! The `wgvae` binary end to end: the README's main job, JSON output, the
//! memory estimator against a real decode, and errors with exit codes.

use std::path::PathBuf;
use std::process::Command;

use wgvae::testing::shared_dir;

fn wgvae(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wgvae"))
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

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wgvae-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
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
}

#[test]
fn decode_taef2_photo_to_png_with_json() {
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
    let raw = wgvae::io::read_npy(&raw).unwrap();
    assert_eq!(raw.shape, vec![1, 3, 288, 448]);
}

#[test]
fn pipeline_cache_is_persisted_on_vulkan() {
    let Some(shared) = shared_dir() else { return };
    let (_, info, _) = wgvae(&["info", "--json"]);
    if json(&info)["chosen"]["backend"] != "Vulkan" {
        println!("SKIPPED: the pipeline cache is persisted on Vulkan only");
        return;
    }
    let dir = tmp("pipeline-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let latents = tmp("cache.npy");
    wgvae::io::write_npy(&latents, &[1, 32, 2, 2], &[0.1; 128]).unwrap();
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_wgvae"))
        .args([
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            vae.to_str().unwrap(),
            "-o",
            tmp("cache.png").to_str().unwrap(),
        ])
        .env("WGVAE_CACHE_DIR", &dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1, "one cache file per adapter");
}

#[test]
fn memory_estimate_matches_a_real_decode() {
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

    let (ok, _, err) = wgvae(&[
        "decode",
        latents.to_str().unwrap(),
        "--vae",
        vae,
        "-o",
        png.to_str().unwrap(),
        "--tile",
        "exact",
        "--tile-overlap",
        "16",
    ]);
    assert!(
        !ok && err.contains("--tile-overlap applies to --tile fast only"),
        "{err}"
    );
    let mut args = vec!["decode", latents.to_str().unwrap(), "--vae", vae, "-o"];
    args.push(png.to_str().unwrap());
    args.extend(tile);
    args.extend(["--max-host-memory", "64KiB"]);
    let (ok, _, err) = wgvae(&args);
    assert!(!ok && err.contains("0.1 MiB are available"), "{err}");
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

#[test]
fn bad_inputs_fail_with_a_message_and_exit_code() {
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
}

#[test]
fn encode_then_decode_through_the_cli() {
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
