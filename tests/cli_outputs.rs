//! What the `wgvae` binary writes, and where (issue #32): links planted at
//! every name it could use are never written through, an interrupted run
//! leaves no temporary file and exits 130 / 143, `--frames-out` never
//! mixes two runs' frames; and its messages blame the right thing.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wgvae::testing::shared_dir;

fn exe() -> PathBuf {
    wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae"))
}

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(exe());
    c.args(args).env(
        "WGPU_BACKEND",
        std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
    );
    c
}

fn wgvae(args: &[&str]) -> (Option<i32>, String, String) {
    let out = command(args).output().expect("run wgvae");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Names in `dir` starting with `.wgvae-` (temporary files).
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".wgvae-"))
        .collect()
}

/// Plants links to victim files at every name the old naming scheme could
/// give (`.wgvae-<pid>-<name>`, `.wgvae-write-check-<pid>`, for the pids
/// the next processes will likely get) and at the outputs themselves; runs
/// every output kind; checks that no victim changed.
#[test]
fn planted_links_are_never_written_through() {
    let Some(shared) = shared_dir() else { return };
    let sd = shared.join("golden/aekl-tiny-sd");
    let taehv = shared.join("golden/taew2_1-rand");
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let victims = root.path().join("victims");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&victims).unwrap();
    let names = [
        "img.png",
        "img_raw.npy",
        "v.y4m",
        "v_raw.npy",
        "lat.npy",
        "lat.safetensors",
        "frame_00000.png",
        "frame_00001.png",
    ];
    // Each victim holds its own name: a write through any link shows.
    let mut planted = Vec::new();
    let mut link = |at: PathBuf, tag: &str| {
        let victim = victims.join(tag);
        std::fs::write(&victim, tag.as_bytes()).unwrap();
        std::os::unix::fs::symlink(&victim, &at).unwrap();
        planted.push((victim, tag.to_string()));
    };
    // The pids the next few thousand processes get: they wrap at pid_max,
    // to 300 (the kernel's RESERVED_PIDS) and up.
    let me = std::process::id();
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(32768);
    let mut pids: Vec<u32> = (me.saturating_sub(50)..(me + 3000).min(pid_max)).collect();
    if me + 3000 > pid_max {
        pids.extend(300..300 + (me + 3000 - pid_max));
    }
    for &pid in &pids {
        link(
            out.join(format!(".wgvae-write-check-{pid}")),
            &format!("check-{pid}"),
        );
        for (i, n) in names.iter().enumerate() {
            link(out.join(format!(".wgvae-{pid}-{n}")), &format!("{pid}-{i}"));
        }
    }
    // The outputs themselves are links too: replaced, not followed.
    for n in [
        "img.png",
        "img_raw.npy",
        "v.y4m",
        "v_raw.npy",
        "lat.npy",
        "lat.safetensors",
    ] {
        link(out.join(n), &format!("output-{n}"));
    }
    let frames = out.join("frames");
    let vframes = out.join("vframes");
    let o = |n: &str| out.join(n);
    let runs: Vec<Vec<String>> = vec![
        vec![
            "decode".into(),
            s(&sd.join("latents.npy")).into(),
            "--vae".into(),
            s(&sd).into(),
            "-o".into(),
            s(&o("img.png")).into(),
            "--save-raw".into(),
            s(&o("img_raw.npy")).into(),
        ],
        vec![
            "decode".into(),
            s(&shared.join("golden/aekl-tiny-sd-batch2/latents.npy")).into(),
            "--vae".into(),
            s(&shared.join("golden/aekl-tiny-sd-batch2")).into(),
            "--frames-out".into(),
            s(&frames).into(),
        ],
        vec![
            "decode".into(),
            s(&taehv.join("latents.npy")).into(),
            "--vae".into(),
            s(&taehv.join("taew2_1.safetensors")).into(),
            "--video-out".into(),
            s(&o("v.y4m")).into(),
            "--save-raw".into(),
            s(&o("v_raw.npy")).into(),
            "--frames-out".into(),
            s(&vframes).into(),
            "--chunk".into(),
            "3".into(),
            "--fps".into(),
            "23.976".into(),
        ],
        vec![
            "encode".into(),
            s(&sd.join("encode_input.png")).into(),
            "--vae".into(),
            s(&sd).into(),
            "-o".into(),
            s(&o("lat.npy")).into(),
        ],
        vec![
            "encode".into(),
            s(&sd.join("encode_input.png")).into(),
            "--vae".into(),
            s(&sd).into(),
            "-o".into(),
            s(&o("lat.safetensors")).into(),
        ],
    ];
    for args in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Inside the planted range, or the old names would not be tested.
        let pid = child.id();
        assert!(pids.contains(&pid), "pid {pid} vs {me} (pid_max {pid_max})");
        let done = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&done.stderr);
        assert_eq!(done.status.code(), Some(0), "{args:?}: {err}");
    }
    for (victim, tag) in &planted {
        assert_eq!(
            std::fs::read(victim).unwrap(),
            tag.as_bytes(),
            "{} was written through a link",
            victim.display()
        );
    }
    // Each output is a new regular file that parses.
    for n in [
        "img.png",
        "img_raw.npy",
        "v.y4m",
        "v_raw.npy",
        "lat.npy",
        "lat.safetensors",
    ] {
        let m = std::fs::symlink_metadata(o(n)).unwrap();
        assert!(m.file_type().is_file() && m.len() > 0, "{n}: {m:?}");
    }
    let npy = wgvae::io::read_npy(&o("lat.npy")).unwrap();
    let st = wgvae::io::read_safetensors_tensor(&o("lat.safetensors"), Some("latents")).unwrap();
    assert_eq!((npy.shape.len(), &st.shape), (4, &npy.shape));
    let y4m = wgvae::y4m::parse_y4m(&std::fs::read(o("v.y4m")).unwrap()).unwrap();
    assert_eq!(
        y4m.rate,
        wgvae::y4m::FrameRate {
            num: 24000,
            den: 1001
        }
    );
    for d in [&frames, &vframes] {
        assert!(d.join("frame_00001.png").is_file(), "{}", d.display());
        assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
    }
    // Only the planted links start with `.wgvae-`: no temporary file is left.
    let left: Vec<String> = temporaries(&out)
        .into_iter()
        .filter(|n| !std::fs::symlink_metadata(out.join(n)).unwrap().is_symlink())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `bench … --out DIR` and `report … --out DIR` write their files (CSV,
/// Markdown, SVG) as every other output: a link planted at each file name
/// is replaced by a regular file, and the file it pointed to is untouched.
#[test]
fn bench_and_report_files_replace_planted_links() {
    let Some(shared) = shared_dir() else { return };
    let root = tempfile::tempdir().unwrap();
    let victims = root.path().join("victims");
    std::fs::create_dir_all(&victims).unwrap();
    let bench = root.path().join("bench");
    let report = root.path().join("report");
    let files: [(&Path, &[&str]); 2] = [
        (
            &bench,
            &["gpu_model.csv", "gpu_model.md", "gpu_model_layers.csv"],
        ),
        (&report, &["memory.csv", "memory.md", "memory_flux.svg"]),
    ];
    let mut planted = Vec::new();
    for (dir, names) in files {
        std::fs::create_dir_all(dir).unwrap();
        for n in names {
            let victim = victims.join(n);
            std::fs::write(&victim, n.as_bytes()).unwrap();
            std::os::unix::fs::symlink(&victim, dir.join(n)).unwrap();
            planted.push((victim, dir.join(n), n.to_string()));
        }
    }
    let reference = shared.join("reference/pytorch_vae_memory_rtx4090.csv");
    for args in [
        vec!["bench", "gpu-model", "--out", s(&bench)],
        vec![
            "report",
            "memory",
            "--sizes",
            "512",
            "--models",
            "flux",
            "--reference",
            s(&reference),
            "--out",
            s(&report),
        ],
    ] {
        let (code, _, err) = wgvae(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }
    for (victim, output, tag) in &planted {
        let kept = std::fs::read(victim).unwrap() == tag.as_bytes();
        assert!(kept, "{tag}: written through the planted link");
        let meta = std::fs::symlink_metadata(output).unwrap();
        assert!(meta.file_type().is_file(), "{tag} is not a regular file");
        assert!(meta.len() > 0, "{tag} is empty");
    }
    for dir in [&bench, &report] {
        assert!(temporaries(dir).is_empty(), "{:?}", temporaries(dir));
    }
}

/// A 252-byte output name (255 is the usual limit): the temporary file's
/// name must not be longer than the output's.
#[test]
fn a_long_output_name_is_written() {
    let Some(shared) = shared_dir() else { return };
    let sd = shared.join("golden/aekl-tiny-sd");
    let root = tempfile::tempdir().unwrap();
    let name = format!("{}.png", "n".repeat(248));
    assert_eq!(name.len(), 252);
    let out = root.path().join(&name);
    let (code, _, err) = wgvae(&[
        "decode",
        s(&sd.join("latents.npy")),
        "--vae",
        s(&sd),
        "-o",
        s(&out),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_file());
}

/// Video latents of `t` latent frames: the golden's first frame repeated.
fn long_video_latents(shared: &Path, at: &Path, t: usize) {
    let g = wgvae::io::read_npy(&shared.join("golden/taew2_1-rand/latents.npy")).unwrap();
    let [1, t0, c, h, w] = g.shape[..] else {
        panic!("golden latents {:?}", g.shape)
    };
    let per = c * h * w;
    let data: Vec<f32> = (0..t)
        .flat_map(|i| g.data[(i % t0) * per..][..per].to_vec())
        .collect();
    wgvae::io::write_npy(at, &[1, t, c, h, w], &data).unwrap();
}

/// Sends `signals` (by name, to `kill`) once the run has written part of
/// its raw output, then checks its exit code and that no temporary file and
/// no output is left. `None`: the run ended before it could be interrupted.
fn interrupt(signals: &[&str]) -> Option<i32> {
    let shared = shared_dir()?;
    let root = tempfile::tempdir().unwrap();
    let latents = root.path().join("long.npy");
    long_video_latents(&shared, &latents, 40);
    let out = root.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let vae = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let mut child = command(&[
        "decode",
        s(&latents),
        "--vae",
        s(&vae),
        "--video-out",
        s(&out.join("v.y4m")),
        "--save-raw",
        s(&out.join("raw.npy")),
        "--chunk",
        "1",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Mid-decode: a temporary file holds frames already.
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            eprintln!("the decode ended ({status}) before it could be interrupted");
            return None;
        }
        let started = temporaries(&out)
            .iter()
            .any(|n| std::fs::metadata(out.join(n)).is_ok_and(|m| m.len() > 100_000));
        if started {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no frame in 300 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for sig in signals {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(
        temporaries(&out).is_empty(),
        "{:?}; {err}",
        temporaries(&out)
    );
    assert!(
        !out.join("raw.npy").exists() && !out.join("v.y4m").exists(),
        "{err}"
    );
    done.status.code()
}

#[test]
fn sigint_mid_decode_exits_130_and_leaves_no_temporary_file() {
    if let Some(code) = interrupt(&["INT"]) {
        assert_eq!(code, 130);
    }
}

/// A second signal does not wait for the current chunk.
#[test]
fn a_second_sigterm_exits_143_at_once_and_leaves_no_temporary_file() {
    if let Some(code) = interrupt(&["TERM", "TERM"]) {
        assert_eq!(code, 143);
    }
}

/// `--frames-out` into a folder holding an earlier run's frames: an error
/// naming them (image and video decoders), or with `--overwrite` only this
/// run's frames are left.
#[test]
fn frames_out_into_an_earlier_runs_folder() {
    let Some(shared) = shared_dir() else { return };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("frames");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..20 {
        std::fs::write(dir.join(format!("frame_{i:05}.png")), b"old").unwrap();
    }
    let batch = shared.join("golden/aekl-tiny-sd-batch2");
    let (batch_latents, taehv_latents, taehv) = (
        batch.join("latents.npy"),
        shared.join("golden/taew2_1-rand/latents.npy"),
        shared.join("golden/taew2_1-rand/taew2_1.safetensors"),
    );
    let image = [
        "decode",
        s(&batch_latents),
        "--vae",
        s(&batch),
        "--frames-out",
        s(&dir),
    ];
    let video = [
        "decode",
        s(&taehv_latents),
        "--vae",
        s(&taehv),
        "--frames-out",
        s(&dir),
    ];
    for args in [&image[..], &video[..]] {
        let (code, _, err) = wgvae(args);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("20 entries")
                && err.contains("frame_00000.png")
                && err.contains("--overwrite"),
            "{err}"
        );
    }
    let (code, _, err) = wgvae(&[&image[..], &["--overwrite"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["frame_00000.png", "frame_00001.png"]);
    assert!(image::open(dir.join("frame_00001.png")).is_ok());
    let (code, _, err) = wgvae(&[&image[..4], &["--overwrite"]].concat());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--overwrite applies to --frames-out"), "{err}");
}

/// Damaged models with video-only flags, bad Wan configs, bad rates, and
/// inputs given to the wrong encoder: each error names the real problem.
#[test]
fn messages_blame_the_right_thing() {
    let Some(shared) = shared_dir() else { return };
    let root = tempfile::tempdir().unwrap();
    let taehv = shared.join("golden/taew2_1-rand");
    let latents = taehv.join("latents.npy");
    let y4m = root.path().join("v.y4m");
    let truncated = root.path().join("truncated.safetensors");
    let bytes = std::fs::read(taehv.join("taew2_1.safetensors")).unwrap();
    std::fs::write(&truncated, &bytes[..100]).unwrap();
    let huge = root.path().join("huge.safetensors");
    std::fs::write(&huge, [&(1u64 << 63).to_le_bytes()[..], b"{}"].concat()).unwrap();
    for (vae, want) in [
        (s(&truncated), "safetensors"),
        (s(&huge), "safetensors"),
        ("/dev/zero", "not a regular file"),
    ] {
        let (code, _, err) = wgvae(&["decode", s(&latents), "--vae", vae, "--video-out", s(&y4m)]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(want) && !err.contains("image VAE"),
            "{vae}: {err}"
        );
    }
    // A Wan folder whose config.json is wrong: named, field by field.
    let wan = root.path().join("wan");
    std::fs::create_dir_all(&wan).unwrap();
    let weights = "diffusion_pytorch_model.safetensors";
    std::os::unix::fs::symlink(
        shared.join("golden/wan21-tiny").join(weights),
        wan.join(weights),
    )
    .unwrap();
    let wan_latents = shared.join("golden/wan21-tiny/latents.npy");
    for (config, want) in [
        (
            r#"{"_class_name": "AutoencoderKLWan", "z_dim": -16}"#,
            "`z_dim` is -16",
        ),
        (
            r#"{"_class_name": "AutoencoderKLWan", "z_dim": 0}"#,
            "`z_dim` is 0",
        ),
        (
            r#"{"_class_name": "AutoencoderKLWan", "base_dim": 0}"#,
            "`base_dim` is 0",
        ),
        (
            r#"{"_class_name": "AutoencoderKLWan", "dim_mult": [1, 0, 4, 4]}"#,
            "`dim_mult[1]` is 0",
        ),
        (
            r#"{"z_dim": 16, "base_dim": 16, "num_res_blocks": 99}"#,
            "`num_res_blocks` is 99",
        ),
    ] {
        std::fs::write(wan.join("config.json"), config).unwrap();
        let (code, _, err) = wgvae(&[
            "decode",
            s(&wan_latents),
            "--vae",
            s(&wan),
            "--video-out",
            s(&y4m),
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(want) && err.contains("config.json"),
            "{config}: {err}"
        );
    }
    // A new --save-raw inside the --vae folder is an output, not an input:
    // written, then replaced by a second run.
    let config = std::fs::read(shared.join("golden/wan21-tiny/config.json")).unwrap();
    std::fs::write(wan.join("config.json"), config).unwrap();
    for run in 0..2 {
        let raw = wan.join("raw.npy");
        let (code, _, err) = wgvae(&[
            "decode",
            s(&wan_latents),
            "--vae",
            s(&wan),
            "--save-raw",
            s(&raw),
        ]);
        assert_eq!(code, Some(0), "run {run}: {err}");
        assert_eq!(wgvae::io::read_npy(&raw).unwrap().shape.len(), 5);
    }
    let vae = taehv.join("taew2_1.safetensors");
    for fps in ["1e30", "4294967296", "2.5e-10"] {
        let (code, _, err) = wgvae(&[
            "decode",
            s(&latents),
            "--vae",
            s(&vae),
            "--video-out",
            s(&y4m),
            "--fps",
            fps,
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("from 0.001 to 10000"), "{fps}: {err}");
    }
    // Inputs given to the wrong encoder.
    let out = root.path().join("lat.npy");
    let png = shared.join("golden/aekl-tiny-sd/encode_input.png");
    let (code, _, err) = wgvae(&["encode", s(&png), "--vae", s(&vae), "-o", s(&out)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("TAEHV video VAE") && err.contains(".npy"),
        "{err}"
    );
    let sd = shared.join("golden/aekl-tiny-sd");
    let (code, _, err) = wgvae(&["encode", s(&latents), "--vae", s(&sd), "-o", s(&out)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("image encoder") && err.contains("PNG"),
        "{err}"
    );
    // Video frames in 0–255: the range found and the fix.
    let frames = root.path().join("frames255.npy");
    let values: Vec<f32> = (0..4 * 3 * 16 * 16).map(|i| (i % 256) as f32).collect();
    wgvae::io::write_npy(&frames, &[1, 4, 3, 16, 16], &values).unwrap();
    let (code, _, err) = wgvae(&["encode", s(&frames), "--vae", s(&vae), "-o", s(&out)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("from 0 to 255") && err.contains("divide them by 255"),
        "{err}"
    );
}

/// `Context::with_cancel`: a set flag stops exact and fast tiled decodes at
/// their first tile, with an error; unset, the same context decodes.
#[test]
fn a_cancel_flag_stops_tiled_decodes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd-tiled");
    let flag = Arc::new(AtomicBool::new(false));
    let ctx = wgvae::testing::test_context().with_cancel(flag.clone());
    let vae = wgvae::Vae::load(&ctx, s(&dir), &wgvae::LoadOptions::default()).unwrap();
    let z = wgvae::io::read_npy(&dir.join("latents.npy")).unwrap();
    let decode = |tiling: wgvae::tiling::Tiling| {
        let opts = wgvae::DecodeOptions {
            tiling,
            ..Default::default()
        };
        wgvae::decode(&ctx, &vae, &z, &opts).map(|_| ())
    };
    let tilings = || {
        [
            wgvae::tiling::Tiling::exact().with_tile_size(128),
            wgvae::tiling::Tiling::fast().with_tile_size(128),
        ]
    };
    flag.store(true, Ordering::SeqCst);
    for t in tilings() {
        let e = decode(t.clone()).unwrap_err().to_string();
        assert!(e.contains("with_cancel"), "{t:?}: {e}");
    }
    flag.store(false, Ordering::SeqCst);
    decode(tilings()[0].clone()).unwrap();
}

/// SIGINT during an exact tiled image decode (no chunks: the library's
/// cancel flag, checked per tile step): exit 130, no output, no temporary file.
#[test]
fn sigint_mid_tiled_decode_exits_130() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd-tiled");
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("t.png");
    let mut child = command(&[
        "decode",
        s(&dir.join("latents.npy")),
        "--vae",
        s(&dir),
        "--tile",
        "exact",
        "--tile-size",
        "64",
        "-o",
        s(&out),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    if child.try_wait().unwrap().is_some() {
        eprintln!("the decode ended before it could be interrupted");
        return;
    }
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{err}");
    assert!(temporaries(root.path()).is_empty(), "{err}");
    // Signalled a third of the way into a lavapipe decode: nothing written.
    assert!(!out.exists(), "{err}");
}
