//! `--video-out clip.mp4|.webm|.gif|.mkv|.mov`: frames piped, as they are
//! decoded, into an `ffmpeg` process (`--ffmpeg PATH`, else `WGVAE_FFMPEG`,
//! else `ffmpeg` on PATH) as raw RGB24 at the run's `--fps`. ffmpeg writes
//! the staged temporary file (`-y` on that name only), which is renamed into
//! place when ffmpeg exits successfully and removed otherwise (an error, a
//! signal). `.y4m` needs no ffmpeg (`wgvae::y4m`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;

use wgvae::kernels::image::{cpu_to_rgb8, ImageRange};
use wgvae::y4m::FrameRate;
use wgvae::Error;

/// A container ffmpeg writes, and how.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Container {
    /// The file extension (lower case, no dot).
    pub(crate) ext: &'static str,
    /// ffmpeg's muxer (`-f`): the temporary file has no extension to tell it.
    muxer: &'static str,
    /// The encoder the arguments use (checked in `ffmpeg -encoders`).
    pub(crate) encoder: &'static str,
    /// Output options.
    args: &'static [&'static str],
    /// [`YUV420`] follows `args`.
    yuv420: bool,
    /// What the stream holds, for the run's report.
    pub(crate) pixels: &'static str,
}

/// H.264 in yuv420p (what browsers and phones play), visually lossless;
/// odd sizes padded to even (4:2:0 needs them) with one black row/column.
const H264: &[&str] = &["-c:v", "libx264", "-preset", "medium", "-crf", "18"];

/// After H.264's and VP9's codec options: 4:2:0 BT.601 video, odd sides padded to even.
const YUV420: &[&str] = &[
    "-vf",
    "pad=ceil(iw/2)*2:ceil(ih/2)*2",
    "-pix_fmt",
    "yuv420p",
    "-colorspace",
    "smpte170m",
    "-color_range",
    "tv",
];

/// The containers `--video-out` writes through ffmpeg.
pub(crate) const CONTAINERS: &[Container] = &[
    Container {
        ext: "mp4",
        muxer: "mp4",
        encoder: "libx264",
        args: H264,
        yuv420: true,
        pixels: "H.264 yuv420p",
    },
    Container {
        ext: "mkv",
        muxer: "matroska",
        encoder: "libx264",
        args: H264,
        yuv420: true,
        pixels: "H.264 yuv420p",
    },
    Container {
        ext: "mov",
        muxer: "mov",
        encoder: "libx264",
        args: H264,
        yuv420: true,
        pixels: "H.264 yuv420p",
    },
    Container {
        ext: "webm",
        muxer: "webm",
        encoder: "libvpx-vp9",
        args: &[
            "-c:v",
            "libvpx-vp9",
            "-crf",
            "30",
            "-b:v",
            "0",
            "-row-mt",
            "1",
            "-deadline",
            "good",
            "-cpu-used",
            "4",
        ],
        yuv420: true,
        pixels: "VP9 yuv420p",
    },
    Container {
        ext: "gif",
        muxer: "gif",
        encoder: "gif",
        // One 256-colour palette for the clip, made from its own frames.
        args: &[
            "-vf",
            "split[a][b];[a]palettegen[p];[b][p]paletteuse",
            "-loop",
            "0",
        ],
        yuv420: false,
        pixels: "GIF palette",
    },
];

/// Every extension `--video-out` takes: `.y4m` (written here) and ffmpeg's.
pub(crate) const VIDEO_EXTS: &[&str] = &["mp4", "webm", "gif", "mkv", "mov", "y4m"];

/// The ffmpeg container for `path`'s extension (`None`: `.y4m` or unknown).
pub(crate) fn container_of(path: &Path) -> Option<&'static Container> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    CONTAINERS.iter().find(|c| c.ext == ext)
}

fn bad(path: &Path, message: String) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        message,
    }
}

/// The fix when no ffmpeg is found, or the one found does not run.
const INSTALL: &str = "install it (apt-get install ffmpeg, brew install ffmpeg, winget install ffmpeg; or `pip install imageio-ffmpeg` and pass --ffmpeg \"$(python -c 'import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())')\"), pass --ffmpeg PATH (or set WGVAE_FFMPEG), or write .y4m, which needs no ffmpeg";

/// The `ffmpeg` that writes `out`: `flag` (`--ffmpeg`), else the
/// `WGVAE_FFMPEG` environment variable, else `ffmpeg` on PATH.
pub(crate) fn find(flag: Option<&Path>, out: &Path) -> wgvae::Result<PathBuf> {
    let ext = out.extension().and_then(|e| e.to_str()).unwrap_or_default();
    let given = |exe: PathBuf, how: &str| {
        if exe.is_file() {
            Ok(exe)
        } else {
            Err(bad(
                out,
                format!(
                    "--video-out .{ext} is encoded by ffmpeg, and {how} names `{}`, which is not a file: give the path of an ffmpeg executable, or write .y4m, which needs no ffmpeg",
                    exe.display()
                ),
            ))
        }
    };
    if let Some(exe) = flag {
        return given(exe.to_path_buf(), "--ffmpeg");
    }
    if let Some(exe) = std::env::var_os("WGVAE_FFMPEG").filter(|v| !v.is_empty()) {
        return given(PathBuf::from(exe), "WGVAE_FFMPEG");
    }
    let names: &[&str] = if cfg!(windows) {
        &["ffmpeg.exe", "ffmpeg"]
    } else {
        &["ffmpeg"]
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| executable(p))
        .ok_or_else(|| {
            bad(
                out,
                format!(
                    "--video-out .{ext} needs ffmpeg to encode the frames, and none was found (no --ffmpeg, no WGVAE_FFMPEG, no `ffmpeg` on PATH): {INSTALL}"
                ),
            )
        })
}

#[cfg(unix)]
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn executable(p: &Path) -> bool {
    p.is_file()
}

/// The last lines of what ffmpeg printed (at most about 1500 characters).
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut kept = Vec::new();
    let mut size = 0;
    for l in lines.iter().rev().take(12) {
        size += l.len() + 3;
        if size > 1500 && !kept.is_empty() {
            break;
        }
        kept.push(*l);
    }
    kept.reverse();
    if kept.is_empty() {
        "(it printed nothing)".into()
    } else {
        kept.join(" | ")
    }
}

/// Runs `exe -encoders` before any work: ffmpeg starts, and it has the
/// encoder `container` needs.
pub(crate) fn check(exe: &Path, container: &Container, out: &Path) -> wgvae::Result<()> {
    let ran = Command::new(exe)
        .args(["-hide_banner", "-encoders"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            bad(
                out,
                format!(
                    "--video-out .{} needs ffmpeg, and `{}` does not start ({e}): {INSTALL}",
                    container.ext,
                    exe.display()
                ),
            )
        })?;
    if !ran.status.success() {
        return Err(bad(
            out,
            format!(
                "--video-out .{}: `{} -encoders` failed ({}): {}; is it ffmpeg? {INSTALL}",
                container.ext,
                exe.display(),
                ran.status,
                tail(&ran.stderr)
            ),
        ));
    }
    let listed = String::from_utf8_lossy(&ran.stdout);
    let has = listed
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(container.encoder));
    if !has {
        let others: Vec<String> = CONTAINERS
            .iter()
            .filter(|c| {
                c.encoder != container.encoder
                    && listed
                        .lines()
                        .any(|l| l.split_whitespace().nth(1) == Some(c.encoder))
            })
            .map(|c| format!(".{}", c.ext))
            .collect();
        return Err(bad(
            out,
            format!(
                "--video-out .{} is encoded with {}, and the ffmpeg at `{}` has no such encoder: use an ffmpeg built with it (distribution packages and the imageio-ffmpeg wheel's are), or write {}.y4m",
                container.ext,
                container.encoder,
                exe.display(),
                others
                    .iter()
                    .map(|e| format!("{e}, "))
                    .collect::<String>()
            ),
        ));
    }
    Ok(())
}

/// One video streamed into ffmpeg: [`FfmpegWriter::write_frame`] per frame,
/// then [`FfmpegWriter::finish`]; dropped unfinished, ffmpeg is killed.
pub(crate) struct FfmpegWriter {
    /// Shared with the signal thread, which kills it on a second signal;
    /// locked only for a poll, a kill or a reap, never while waiting.
    child: Arc<parking_lot::Mutex<Child>>,
    stdin: Option<std::io::BufWriter<ChildStdin>>,
    /// Reads ffmpeg's stderr (so it never blocks on a full pipe).
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
    width: usize,
    height: usize,
    range: ImageRange,
    /// The output as the user named it, for errors.
    path: PathBuf,
    exe: PathBuf,
    ext: &'static str,
}

impl FfmpegWriter {
    /// Starts `exe` writing `container` into `tmp` (the staged temporary
    /// file of `path`) from `width`×`height` frames at `rate` in `range`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        exe: &Path,
        container: &'static Container,
        tmp: &Path,
        path: &Path,
        width: usize,
        height: usize,
        rate: FrameRate,
        range: ImageRange,
    ) -> wgvae::Result<Self> {
        if width == 0 || height == 0 {
            return Err(bad(path, format!("a {width}×{height} video has no pixels")));
        }
        let mut cmd = Command::new(exe);
        cmd.args(["-hide_banner", "-nostats", "-loglevel", "error"])
            .args(["-f", "rawvideo", "-pix_fmt", "rgb24"])
            .arg("-video_size")
            .arg(format!("{width}x{height}"))
            .arg("-framerate")
            .arg(format!("{}/{}", rate.num, rate.den))
            .args(["-i", "pipe:0", "-an"])
            .args(container.args)
            .args(if container.yuv420 { YUV420 } else { &[] })
            .args(["-f", container.muxer, "-y"])
            // `file:`: a folder name with a colon is no protocol.
            .arg(format!("file:{}", tmp.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Its own process group: a terminal's Ctrl-C reaches wgvae alone,
        // which stops ffmpeg itself (killed on a second signal).
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|e| {
            bad(
                path,
                format!("cannot start ffmpeg `{}` ({e}): {INSTALL}", exe.display()),
            )
        })?;
        let stdin = child.stdin.take().map(std::io::BufWriter::new);
        let stderr = child.stderr.take().map(|mut s| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                buf
            })
        });
        Ok(FfmpegWriter {
            child: super::interrupt::child(child),
            stdin,
            stderr,
            width,
            height,
            range,
            path: path.to_path_buf(),
            exe: exe.to_path_buf(),
            ext: container.ext,
        })
    }

    /// Appends one frame of planar RGB `[3, H, W]` floats (the decoder's raw
    /// output, clamped to its range and rounded as the PNG frames are).
    pub(crate) fn write_frame(&mut self, rgb: &[f32]) -> wgvae::Result<()> {
        let (w, h) = (self.width, self.height);
        if rgb.len() != 3 * w * h {
            return Err(Error::Internal(format!(
                "a {w}×{h} video frame is {} values, got {}",
                3 * w * h,
                rgb.len()
            )));
        }
        let bytes = cpu_to_rgb8(rgb, 1, h, w, self.range);
        let sent = match &mut self.stdin {
            Some(s) => s.write_all(&bytes),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        match sent {
            Ok(()) => Ok(()),
            // ffmpeg stopped reading: its exit status and messages say why.
            Err(e) => Err(self.stop(Some(e))),
        }
    }

    /// Ends the stream and waits for ffmpeg: an error unless it exits 0.
    pub(crate) fn finish(mut self) -> wgvae::Result<()> {
        if let Some(mut s) = self.stdin.take() {
            let flushed = s.flush();
            // Closed: ffmpeg sees the end of the stream and finishes the file.
            drop(s);
            if let Err(e) = flushed {
                return Err(self.stop(Some(e)));
            }
        }
        match self.wait() {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(self.failed(&format!("ffmpeg exited with {status}"))),
            Err(e) => Err(self.failed(&format!("waiting for ffmpeg failed ({e})"))),
        }
    }

    /// Closes ffmpeg's input, waits for it, and says why writing stopped.
    fn stop(&mut self, cause: Option<std::io::Error>) -> Error {
        let status = self.wait();
        let cause = cause.map(|e| format!(" ({e})")).unwrap_or_default();
        match status {
            Ok(s) => self.failed(&format!(
                "ffmpeg stopped reading frames{cause} and exited with {s}"
            )),
            Err(e) => self.failed(&format!(
                "ffmpeg stopped reading frames{cause}; waiting for it failed ({e})"
            )),
        }
    }

    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        drop(self.stdin.take());
        // Polled, not `wait`ed under the lock: the signal thread may need it.
        loop {
            if let Some(status) = self.child.lock().try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn failed(&mut self, what: &str) -> Error {
        let stderr = self
            .stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        bad(
            &self.path,
            format!(
                "writing .{} through `{}` failed: {what}; ffmpeg said: {}",
                self.ext,
                self.exe.display(),
                tail(&stderr)
            ),
        )
    }
}

impl Drop for FfmpegWriter {
    fn drop(&mut self) {
        // Unfinished (an error, a signal): ffmpeg must not go on writing the
        // temporary file the staged output removes.
        let mut child = self.child.lock();
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
        }
        drop(self.stdin.take());
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_and_tails() {
        assert_eq!(container_of(Path::new("a/b.MP4")).unwrap().muxer, "mp4");
        assert_eq!(container_of(Path::new("x.mkv")).unwrap().muxer, "matroska");
        assert!(container_of(Path::new("x.y4m")).is_none());
        assert!(container_of(Path::new("x")).is_none());
        for c in CONTAINERS {
            assert!(VIDEO_EXTS.contains(&c.ext), "{}", c.ext);
        }
        let many: String = (0..40).map(|i| format!("line {i}\n")).collect();
        let t = tail(many.as_bytes());
        assert!(t.starts_with("line 28") && t.ends_with("line 39"), "{t}");
        assert_eq!(tail(b""), "(it printed nothing)");
    }

    #[test]
    fn a_missing_ffmpeg_is_named_with_the_fix() {
        let out = Path::new("clip.mp4");
        let e = find(Some(Path::new("/no/such/ffmpeg")), out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("clip.mp4") && e.contains("--ffmpeg") && e.contains(".y4m"),
            "{e}"
        );
    }
}
