//! `decode --video-out clip.mp4|.webm|.gif` (issue #31): frames piped to
//! ffmpeg as they are decoded. Played back with the same ffmpeg, the files
//! hold the right number of frames, of the right size, at the right rate,
//! close to the run's PNG frames. A missing ffmpeg, an unknown extension and
//! an ffmpeg that fails are clear errors that leave no file behind.
//!
//! ffmpeg comes from WGVAE_FFMPEG or PATH (CI: the `imageio-ffmpeg` wheel's
//! static binary, `ci/test.sh python`); without one the playback tests skip
//! with a message, unless WGVAE_REQUIRE_FFMPEG=1, where they fail.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;

use wgvae::testing::shared_dir;

fn exe() -> PathBuf {
    wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs `wgvae args` with `env` set (`None`: removed): (success, stdout, stderr).
fn wgvae(args: &[&str], env: &[(&str, Option<&str>)]) -> (bool, String, String) {
    let mut c = Command::new(exe());
    c.args(args).env(
        "WGPU_BACKEND",
        std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
    );
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = c.output().expect("run wgvae");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The ffmpeg to test with: WGVAE_FFMPEG, else `ffmpeg` on PATH.
fn ffmpeg() -> Option<PathBuf> {
    let found = std::env::var_os("WGVAE_FFMPEG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|d| d.join("ffmpeg"))
                .find(|p| p.is_file())
        });
    if found.is_none() {
        let why = "no ffmpeg (set WGVAE_FFMPEG or put ffmpeg on PATH; `pip install imageio-ffmpeg` ships one)";
        if std::env::var("WGVAE_REQUIRE_FFMPEG").as_deref() == Ok("1") {
            panic!("WGVAE_REQUIRE_FFMPEG=1 but {why}");
        }
        eprintln!("SKIPPED: {why}");
    }
    found
}

/// Names in `dir` starting with `.wgvae-` (temporary files).
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".wgvae-"))
        .collect()
}

/// The golden's latents cropped to 2×3 latent pixels (16×24 frames: a fast
/// decode on lavapipe), written into `dir`.
fn small_latents(shared: &Path, dir: &Path) -> PathBuf {
    let golden =
        wgvae::io::read_npy(&shared.join("golden/taew2_1-rand/latents.npy")).expect("latents");
    let [n, t, c, h, w] = golden.shape[..] else {
        panic!("golden latents are not 5-D: {:?}", golden.shape)
    };
    let mut data = Vec::new();
    for plane in golden.data.chunks_exact(h * w).take(n * t * c) {
        for row in plane.chunks_exact(w).take(2) {
            data.extend_from_slice(&row[..3]);
        }
    }
    let p = dir.join("small.npy");
    wgvae::io::write_npy(&p, &[n, t, c, 2, 3], &data).unwrap();
    p
}

/// What ffmpeg reads back from `file`: its video stream line (size, rate)
/// and its frames as RGB24.
fn play(ffmpeg: &Path, file: &Path) -> (String, Vec<u8>) {
    let probe = Command::new(ffmpeg)
        .args(["-hide_banner", "-i", s(file)])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&probe.stderr);
    let stream = info
        .lines()
        .find(|l| l.contains("Video:"))
        .unwrap_or_else(|| panic!("{}: no video stream: {info}", file.display()))
        .to_string();
    let out = Command::new(ffmpeg)
        .args(["-v", "error", "-i", s(file), "-fps_mode", "passthrough"])
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (stream, out.stdout)
}

/// Decodes `latents` to `video` and `frames/`, plays `video` back and
/// compares: frame count, size, rate (`fps` as ffmpeg prints it), mean
/// absolute difference from the PNG frames within `bound`. Returns it.
fn check_video(
    ffmpeg: &Path,
    vae: &Path,
    latents: &Path,
    video: &Path,
    extra: &[&str],
    (frames, width, height, fps): (usize, usize, usize, &str),
    bound: f64,
) -> f64 {
    let dir = video.parent().unwrap();
    let pngs = dir.join(format!(
        "{}_frames",
        video.file_name().unwrap().to_string_lossy()
    ));
    let mut args = vec![
        "decode",
        s(latents),
        "--vae",
        s(vae),
        "--video-out",
        s(video),
        "--frames-out",
        s(&pngs),
        "--ffmpeg",
        s(ffmpeg),
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, err) = wgvae(&args, &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["video_out"][0], s(video), "{v}");
    assert!(temporaries(dir).is_empty(), "{:?}", temporaries(dir));
    let (stream, rgb) = play(ffmpeg, video);
    let size = format!(" {width}x{height}");
    assert!(
        stream.contains(&size) && stream.contains(&format!(" {fps} fps")),
        "{}: want{size} at {fps} fps: {stream}",
        video.display()
    );
    let frame = width * height * 3;
    assert_eq!(rgb.len(), frames * frame, "{}: {stream}", video.display());
    let mut sum = 0u64;
    for (i, got) in rgb.chunks_exact(frame).enumerate() {
        let png = image::open(pngs.join(format!("frame_{i:05}.png")))
            .unwrap()
            .to_rgb8();
        assert_eq!(
            (png.width() as usize, png.height() as usize),
            (width, height)
        );
        sum += got
            .iter()
            .zip(png.as_raw())
            .map(|(a, b)| u64::from(a.abs_diff(*b)))
            .sum::<u64>();
    }
    let mean = sum as f64 / rgb.len() as f64;
    println!(
        "{}: {frames} frames of {width}×{height}, {stream}; mean abs difference from the PNG frames {mean:.2} levels (bound {bound})",
        video.display()
    );
    assert!(mean <= bound, "{}: mean abs {mean}", video.display());
    mean
}

/// The taew2_1-rand golden as H.264 .mp4 (9 frames of 80×64 at 24 fps), and
/// its 16×24 crop as .gif (16 fps) and VP9 .webm (12.5 fps).
#[test]
fn mp4_gif_and_webm_play_back_as_decoded() {
    let Some(shared) = shared_dir() else { return };
    let Some(ffmpeg) = ffmpeg() else { return };
    let golden = shared.join("golden/taew2_1-rand");
    let vae = golden.join("taew2_1.safetensors");
    let root = tempfile::tempdir().unwrap();
    let d = root.path();
    let mp4 = d.join("clip.mp4");
    check_video(
        &ffmpeg,
        &vae,
        &golden.join("latents.npy"),
        &mp4,
        &["--fps", "24"],
        (9, 80, 64, "24"),
        // Measured 5.1 (libx264 of ffmpeg 9.0.2, imageio-ffmpeg) on noise-like random-weight frames.
        10.0,
    );
    let small = small_latents(&shared, d);
    check_video(
        &ffmpeg,
        &vae,
        &small,
        &d.join("clip.gif"),
        &[],
        // GIF stores delays in 1/100 s: 16 fps is 6 cs a frame.
        (9, 24, 16, "16.67"),
        12.0,
    );
    check_video(
        &ffmpeg,
        &vae,
        &small,
        &d.join("clip.webm"),
        &["--fps", "12.5", "--chunk", "3"],
        (9, 24, 16, "12.50"),
        12.0,
    );
}

/// No ffmpeg, an ffmpeg flag naming nothing, an unknown extension: errors
/// before any decode, naming the file and the fix; no file is left.
#[test]
fn missing_ffmpeg_and_unknown_extensions_are_clear_errors() {
    let Some(shared) = shared_dir() else { return };
    let golden = shared.join("golden/taew2_1-rand");
    let vae = golden.join("taew2_1.safetensors");
    let latents = golden.join("latents.npy");
    let root = tempfile::tempdir().unwrap();
    let empty = root.path().join("empty_bin");
    std::fs::create_dir_all(&empty).unwrap();
    let mp4 = root.path().join("clip.mp4");
    let args = [
        "decode",
        s(&latents),
        "--vae",
        s(&vae),
        "--video-out",
        s(&mp4),
    ];
    // Neither on PATH nor in WGVAE_FFMPEG.
    let (ok, _, err) = wgvae(&args, &[("PATH", Some(s(&empty))), ("WGVAE_FFMPEG", None)]);
    assert!(!ok);
    assert!(
        err.contains("clip.mp4")
            && err.contains("needs ffmpeg")
            && err.contains("--ffmpeg PATH")
            && err.contains(".y4m"),
        "{err}"
    );
    // --ffmpeg (and WGVAE_FFMPEG) naming no file.
    let mut with_flag = args.to_vec();
    with_flag.extend(["--ffmpeg", "/no/such/ffmpeg"]);
    let (ok, _, err) = wgvae(&with_flag, &[]);
    assert!(
        !ok && err.contains("/no/such/ffmpeg") && err.contains(".y4m"),
        "{err}"
    );
    let (ok, _, err) = wgvae(&args, &[("WGVAE_FFMPEG", Some("/no/such/ffmpeg"))]);
    assert!(!ok && err.contains("WGVAE_FFMPEG"), "{err}");
    // An extension nothing writes: the supported ones are listed.
    let avi = root.path().join("clip.avi");
    let (ok, _, err) = wgvae(
        &[
            "decode",
            s(&latents),
            "--vae",
            s(&vae),
            "--video-out",
            s(&avi),
        ],
        &[],
    );
    assert!(!ok);
    for ext in [".y4m", ".mp4", ".webm", ".gif", ".mkv", ".mov"] {
        assert!(err.contains(ext), "{ext}: {err}");
    }
    // --ffmpeg without an ffmpeg output.
    let y4m = root.path().join("clip.y4m");
    let (ok, _, err) = wgvae(
        &[
            "decode",
            s(&latents),
            "--vae",
            s(&vae),
            "--video-out",
            s(&y4m),
            "--ffmpeg",
            "/bin/true",
        ],
        &[],
    );
    assert!(!ok && err.contains("--ffmpeg"), "{err}");
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["empty_bin"], "no file left behind");
}

/// An ffmpeg that starts and lists the encoder but fails to encode: the
/// decode fails with its exit status and its last message, and leaves
/// neither the output nor a temporary file.
#[test]
fn a_failing_ffmpeg_is_reported_with_its_messages() {
    let Some(shared) = shared_dir() else { return };
    let root = tempfile::tempdir().unwrap();
    let d = root.path();
    let fake = d.join("fake-ffmpeg");
    std::fs::write(
        &fake,
        "#!/bin/sh\nif [ \"$2\" = -encoders ]; then echo ' V....D libx264   H.264'; exit 0; fi\necho 'Unknown encoder: pretend it broke' >&2\nexit 3\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let latents = small_latents(&shared, d);
    let vae = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let out = d.join("clip.mp4");
    let (ok, _, err) = wgvae(
        &[
            "decode",
            s(&latents),
            "--vae",
            s(&vae),
            "--video-out",
            s(&out),
            "--ffmpeg",
            s(&fake),
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("clip.mp4") && err.contains("pretend it broke") && err.contains("exit"),
        "{err}"
    );
    assert!(
        !out.exists() && temporaries(d).is_empty(),
        "{:?}",
        temporaries(d)
    );
}

/// SIGINT while ffmpeg encodes: the run exits 130, ffmpeg is stopped, and
/// neither the video nor a temporary file is left.
#[test]
fn sigint_stops_ffmpeg_and_leaves_no_file() {
    let Some(shared) = shared_dir() else { return };
    let Some(ffmpeg) = ffmpeg() else { return };
    let root = tempfile::tempdir().unwrap();
    let d = root.path();
    // 80 latent frames of the 2×3 crop: long enough to be interrupted.
    let small = wgvae::io::read_npy(&small_latents(&shared, d)).unwrap();
    let per = small.data.len() / small.shape[1];
    let t = 80;
    let data: Vec<f32> = (0..t)
        .flat_map(|i| small.data[(i % small.shape[1]) * per..][..per].to_vec())
        .collect();
    let latents = d.join("long.npy");
    let mut shape = small.shape.clone();
    shape[1] = t;
    wgvae::io::write_npy(&latents, &shape, &data).unwrap();
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let vae = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let mut child = Command::new(exe())
        .args([
            "decode",
            s(&latents),
            "--vae",
            s(&vae),
            "--video-out",
            s(&out.join("v.mp4")),
            "--save-raw",
            s(&out.join("raw.npy")),
            "--ffmpeg",
            s(&ffmpeg),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-decode: the raw output's temporary file holds frames already.
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            eprintln!("the decode ended ({status}) before it could be interrupted");
            return;
        }
        let started = temporaries(&out)
            .iter()
            .any(|n| std::fs::metadata(out.join(n)).is_ok_and(|m| m.len() > 100_000));
        if started {
            break;
        }
        assert!(start.elapsed().as_secs() < 300, "no frame in 300 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT");
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{err}");
    assert!(
        temporaries(&out).is_empty(),
        "{:?}; {err}",
        temporaries(&out)
    );
    assert!(!out.join("v.mp4").exists(), "{err}");
    // No ffmpeg still writing into the folder.
    let mine = s(&out).to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&mine))
        .collect();
    assert!(left.is_empty(), "still running: {left:?}");
}

/// A second signal exits at once and kills ffmpeg with it. The stand-in
/// ffmpeg ignores SIGINT/SIGTERM and never exits, so once the frames are in
/// its pipe the run waits for it and the first SIGTERM cannot stop it (a
/// stop between frames would kill ffmpeg on the way out: the test checks
/// that this is not what happened); the second one must.
#[test]
fn a_second_signal_kills_ffmpeg() {
    let Some(shared) = shared_dir() else { return };
    let root = tempfile::tempdir().unwrap();
    let d = root.path();
    let pid_file = d.join("ffmpeg.pid");
    let fake = d.join("stuck-ffmpeg");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nif [ \"$2\" = -encoders ]; then echo ' V....D libx264   H.264'; exit 0; fi\ntrap '' INT TERM\necho $$ > {}\nexec sleep 600\n",
            pid_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A few small frames: they all fit in the pipe, so the decode finishes.
    let latents = small_latents(&shared, d);
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let vae = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let mut child = Command::new(exe())
        .args([
            "decode",
            s(&latents),
            "--vae",
            s(&vae),
            "--video-out",
            s(&out.join("v.mp4")),
            "--ffmpeg",
            s(&fake),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let pid = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the decode ended ({status}) before ffmpeg started");
        }
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            break pid;
        }
        assert!(
            start.elapsed().as_secs() < 300,
            "ffmpeg not started in 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stat = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let alive = |pid: u32| stat(pid).is_some_and(|s| !s.contains(") Z "));
    // CPU ticks (user + system) of the run: flat once it only waits for ffmpeg.
    let ticks = |pid: u32| {
        stat(pid).map_or(0, |s| {
            let f: Vec<&str> = s.rsplit(") ").next().unwrap_or("").split(' ').collect();
            f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0)
        })
    };
    let wgvae_pid = child.id();
    let mut last = ticks(wgvae_pid);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(700));
        let now = ticks(wgvae_pid);
        if now == last {
            break;
        }
        last = now;
        assert!(
            start.elapsed().as_secs() < 300,
            "the decode is still busy after 300 s"
        );
    }
    let term = || {
        let ok = Command::new("kill")
            .args(["-TERM", &wgvae_pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM");
    };
    term();
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(
        child.try_wait().unwrap().is_none() && alive(pid),
        "the first signal stopped the run: the case under test did not arise"
    );
    term();
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(143), "{err}");
    let gone = std::time::Instant::now();
    while alive(pid) && gone.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !alive(pid),
        "ffmpeg (pid {pid}) still runs after the second signal"
    );
    assert!(
        temporaries(&out).is_empty(),
        "{:?}; {err}",
        temporaries(&out)
    );
    assert!(!out.join("v.mp4").exists(), "{err}");
}
