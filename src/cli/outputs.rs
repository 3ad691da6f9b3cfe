//! Output paths, checked before any work and written atomically: a wrong
//! name costs no decode, no output can overwrite an input (links included),
//! and a failed run never leaves a half-written file where a good one was.

use std::path::{Path, PathBuf};

use wgvae::Error;

fn bad(path: &Path, message: String) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        message,
    }
}

/// The files a command reads: its outputs must be none of them.
#[derive(Default)]
pub(crate) struct Inputs(Vec<(PathBuf, (u64, u64))>);

impl Inputs {
    /// Adds `path` (a file, or the files a model folder's loader reads:
    /// configs and weights directly in it) if it exists. Other files in a
    /// `--vae` folder (an earlier run's `--save-raw`) are outputs like any.
    pub(crate) fn add(&mut self, path: &Path) {
        const READ: &[&str] = &["json", "safetensors", "bin", "ckpt", "pt", "pth"];
        let files = match std::fs::read_dir(path) {
            Ok(dir) => dir
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| READ.contains(&e.to_ascii_lowercase().as_str()))
                })
                .collect(),
            Err(_) => vec![path.to_path_buf()],
        };
        for f in files {
            if let Some(id) = file_id(&f) {
                self.0.push((f, id));
            }
        }
    }

    /// Adds the weight files and config behind a `--vae` value (nothing for
    /// a preset).
    pub(crate) fn add_vae(&mut self, spec: &str, config: Option<&Path>) {
        if spec.starts_with("preset:") {
            return;
        }
        let path = Path::new(spec);
        self.add(path);
        // A pipeline folder's `vae/`, a weight file's config.json beside it.
        self.add(&path.join("vae"));
        if path.is_file() {
            self.add(&path.with_file_name("config.json"));
        }
        if let Some(c) = config {
            self.add(c);
        }
    }

    /// The input `path` is, if it is one (same device and inode).
    fn same_as(&self, path: &Path) -> Option<&Path> {
        let id = file_id(path)?;
        self.0
            .iter()
            .find(|(_, i)| *i == id)
            .map(|(p, _)| p.as_path())
    }
}

#[cfg(unix)]
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(path: &Path) -> Option<(u64, u64)> {
    // Without inodes: the canonical path stands for the file.
    use std::hash::{Hash, Hasher};
    let c = std::fs::canonicalize(path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    c.hash(&mut h);
    Some((0, h.finish()))
}

/// Checks an output file `path` (`what` names the flag): its extension is
/// one of `exts`, it is not a folder, its folder exists and takes new files,
/// and it is none of `inputs`.
pub(crate) fn check_file(
    path: &Path,
    what: &str,
    exts: &[&str],
    inputs: &Inputs,
) -> wgvae::Result<()> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !ext.as_deref().is_some_and(|e| exts.contains(&e)) {
        let want: Vec<String> = exts.iter().map(|e| format!(".{e}")).collect();
        return Err(bad(
            path,
            format!(
                "{what} must be a {} file; choose a name ending in {}",
                want.join(" or "),
                want.first().map_or("", String::as_str)
            ),
        ));
    }
    if path.is_dir() {
        return Err(bad(
            path,
            format!("{what} is a folder; give a file name inside it"),
        ));
    }
    check_folder(path, what)?;
    if let Some(input) = inputs.same_as(path) {
        return Err(bad(
            path,
            format!(
                "{what} is the same file as the input `{}`: writing it would destroy the input; choose another path",
                input.display()
            ),
        ));
    }
    Ok(())
}

/// Checks an output folder `dir` (created if missing): not a file, its
/// parent exists, and it is no input. An existing folder must be empty, or
/// with `overwrite` its old frames are removed later ([`remove_old_frames`]):
/// a run never mixes its frames with another run's.
pub(crate) fn check_dir(
    dir: &Path,
    what: &str,
    inputs: &Inputs,
    overwrite: bool,
) -> wgvae::Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(bad(
            dir,
            format!("{what} exists and is not a folder; give a folder path"),
        ));
    }
    if !dir.exists() {
        return check_folder(dir, what);
    }
    if let Some(input) = inputs.same_as(dir) {
        return Err(bad(
            dir,
            format!("{what} is the input `{}`", input.display()),
        ));
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    if names.is_empty() || overwrite {
        return check_folder(&dir.join("frame_00000.png"), what);
    }
    names.sort();
    let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
    let more = match names.len() - shown.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Err(bad(
        dir,
        format!(
            "{what}: the folder already holds {} entries ({}{more}); this run's frames would be mixed with them (an earlier, longer run's last frames would stay). Choose a new or empty folder, or pass --overwrite to remove its old frame_*.png first",
            names.len(),
            shown.join(", ")
        ),
    ))
}

/// `frame_<digits>.png`, as the frame writers name them.
fn is_frame(name: &str) -> bool {
    name.strip_prefix("frame_")
        .and_then(|n| n.strip_suffix(".png"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `--overwrite`: removes the frames of an earlier run from `dir` (and from
/// its `video_<v>/` folders, a batch's) before new ones are written; other
/// files stay. Links are removed, never followed. Returns how many went.
pub(crate) fn remove_old_frames(dir: &Path) -> wgvae::Result<usize> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let mut removed = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let kind = e.file_type().map_err(io(&path))?;
        if is_frame(&name) && !kind.is_dir() {
            std::fs::remove_file(&path).map_err(io(&path))?;
            removed += 1;
        } else if kind.is_dir()
            && name
                .strip_prefix("video_")
                .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        {
            removed += remove_old_frames(&path)?;
        }
    }
    Ok(removed)
}

/// The folder `path` goes in (`.` for a bare name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The folder `path` goes in exists and takes new files: a temporary file
/// is created there (as the real write will) and removed.
fn check_folder(path: &Path, what: &str) -> wgvae::Result<()> {
    let parent = folder_of(path);
    if !parent.is_dir() {
        return Err(bad(
            path,
            format!(
                "{what}: the folder `{}` does not exist; create it first",
                parent.display()
            ),
        ));
    }
    Staged::new(path, what).map(drop)
}

/// An output written into a temporary file beside `path`, renamed into place
/// by [`Staged::commit`]; dropped uncommitted (an error, an interruption) it
/// removes the temporary file and leaves `path` as it was. The temporary file
/// has a random name and is created exclusively (`O_CREAT | O_EXCL`, which
/// follows no link), so nothing planted in the folder is written through; its
/// short name (`.wgvae-XXXXXXXXXX`) fits wherever `path`'s does.
pub(crate) struct Staged {
    path: PathBuf,
    tmp: Option<tempfile::NamedTempFile>,
}

impl Staged {
    /// Creates the temporary file for `path` (`what` names the flag in errors).
    pub(crate) fn new(path: &Path, what: &str) -> wgvae::Result<Staged> {
        let dir = folder_of(path);
        let mut builder = tempfile::Builder::new();
        builder.prefix(".wgvae-").rand_bytes(10);
        // The mode a plain create would give (0666 less the umask), not 0600.
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let mut live = super::interrupt::Live::lock();
        let tmp = builder.tempfile_in(dir).map_err(|source| {
            bad(
                path,
                format!(
                    "{what}: cannot write in the folder `{}`: {source}",
                    dir.display()
                ),
            )
        })?;
        live.add(tmp.path());
        Ok(Staged {
            path: path.to_path_buf(),
            tmp: Some(tmp),
        })
    }

    /// A buffered writer on the temporary file (its open handle: no path is
    /// looked up again).
    pub(crate) fn writer(&self) -> wgvae::Result<std::io::BufWriter<std::fs::File>> {
        let file = self
            .tmp
            .as_ref()
            .ok_or_else(|| Error::Internal("staged output already committed".into()))?
            .as_file()
            .try_clone()
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(std::io::BufWriter::new(file))
    }

    /// The temporary file's path (for a writer in another process, ffmpeg).
    pub(crate) fn temp_path(&self) -> wgvae::Result<&Path> {
        self.tmp
            .as_ref()
            .map(tempfile::NamedTempFile::path)
            .ok_or_else(|| Error::Internal("staged output already committed".into()))
    }

    /// Renames the written file into place (a link at `path` is replaced,
    /// not followed).
    pub(crate) fn commit(mut self) -> wgvae::Result<()> {
        let Some(tmp) = self.tmp.take() else {
            return Ok(());
        };
        let at = tmp.path().to_path_buf();
        let done = tmp.persist(&self.path);
        super::interrupt::forget(&at);
        // A failed persist hands the file back; dropping it removes it.
        done.map(drop).map_err(|e| Error::Io {
            path: self.path.clone(),
            source: e.error,
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let at = tmp.path().to_path_buf();
            drop(tmp);
            super::interrupt::forget(&at);
        }
    }
}

/// Writes `path` (`what`: its flag) through `write` into a temporary file
/// beside it, then renames it into place: readers never see a partial file,
/// and a failure leaves what was there before. `write` gets the file's
/// writer and must name `path` in its errors.
pub(crate) fn write_atomically(
    path: &Path,
    what: &str,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> wgvae::Result<()>,
) -> wgvae::Result<()> {
    let staged = Staged::new(path, what)?;
    let mut out = staged.writer()?;
    write(&mut out)?;
    use std::io::Write;
    out.flush().map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    drop(out);
    staged.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_checked_before_any_work() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path().to_path_buf();
        let input = d.join("latents.npy");
        std::fs::write(&input, b"x").unwrap();
        let mut inputs = Inputs::default();
        inputs.add(&input);
        let png = ["png"];
        assert!(check_file(&d.join("ok.png"), "-o", &png, &inputs).is_ok());
        let e =
            |p: &Path, exts: &[&str]| check_file(p, "-o", exts, &inputs).unwrap_err().to_string();
        assert!(e(&d.join("x.jpg"), &png).contains("must be a .png file"));
        assert!(e(&d.join("missing/x.png"), &png).contains("does not exist"));
        assert!(e(&d, &png).contains("must be a .png"));
        let sub = d.join("sub.png");
        std::fs::create_dir_all(&sub).unwrap();
        assert!(e(&sub, &png).contains("is a folder"));
        assert!(e(&input, &["npy"]).contains("same file as the input"));
        // The config.json beside a weight file is an input too.
        let weights = d.join("w.safetensors");
        std::fs::write(&weights, b"w").unwrap();
        std::fs::write(d.join("config.json"), b"{}").unwrap();
        let mut beside = Inputs::default();
        beside.add_vae(weights.to_str().unwrap(), None);
        let err = check_file(
            &d.join("config.json"),
            "--memory-snapshot",
            &["json"],
            &beside,
        );
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("same file as the input"));
        // A new (or earlier output) file in a --vae folder is no input; its weights are.
        let folder = d.join("vae_folder");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("diffusion_pytorch_model.safetensors"), b"w").unwrap();
        std::fs::write(folder.join("old_raw.npy"), b"r").unwrap();
        let mut vae = Inputs::default();
        vae.add_vae(folder.to_str().unwrap(), None);
        assert!(check_file(&folder.join("old_raw.npy"), "--save-raw", &["npy"], &vae).is_ok());
        assert!(check_file(&folder.join("new.npy"), "--save-raw", &["npy"], &vae).is_ok());
        let weights = folder.join("diffusion_pytorch_model.safetensors");
        let err = check_file(&weights, "-o", &["safetensors"], &vae);
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("same file as the input"));
        #[cfg(unix)]
        {
            let link = d.join("link.npy");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&input, &link).unwrap();
            assert!(e(&link, &["npy"]).contains("same file as the input"));
        }
        let file = d.join("frames");
        std::fs::write(&file, b"").unwrap();
        let err = check_dir(&file, "--frames-out", &inputs, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a folder"), "{err}");
        assert!(check_dir(&d.join("new_frames"), "--frames-out", &inputs, false).is_ok());
    }

    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path().to_path_buf();
        let out = d.join("keep.png");
        std::fs::write(&out, b"good").unwrap();
        let r = write_atomically(&out, "-o", |w| {
            std::io::Write::write_all(w, b"half").unwrap();
            Err(Error::InvalidInput("disk full".into()))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read(&out).unwrap(), b"good");
        write_atomically(&out, "-o", |w| {
            std::io::Write::write_all(w, b"new").map_err(|source| Error::Io {
                path: out.clone(),
                source,
            })
        })
        .unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        let leftovers = std::fs::read_dir(&d)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".wgvae-")
            })
            .count();
        assert_eq!(leftovers, 0);
    }

    /// A folder holding another run's frames is refused, naming them; with
    /// `--overwrite` its frames (and a batch's `video_N/` frames) go, other
    /// files stay.
    #[test]
    fn old_frames_are_refused_or_removed() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path().join("old_frames");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("video_1")).unwrap();
        for i in 0..20 {
            std::fs::write(d.join(format!("frame_{i:05}.png")), b"old").unwrap();
        }
        std::fs::write(d.join("video_1/frame_00003.png"), b"old").unwrap();
        std::fs::write(d.join("notes.txt"), b"keep").unwrap();
        let inputs = Inputs::default();
        let err = check_dir(&d, "--frames-out", &inputs, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("22 entries")
                && err.contains("frame_00000.png")
                && err.contains("--overwrite"),
            "{err}"
        );
        check_dir(&d, "--frames-out", &inputs, true).unwrap();
        assert_eq!(remove_old_frames(&d).unwrap(), 21);
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.txt", "video_1"]);
        assert!(is_frame("frame_00012.png") && !is_frame("frame_.png") && !is_frame("frame_1.jpg"));
    }

    /// A link planted at the output's name is replaced, not written through.
    #[cfg(unix)]
    #[test]
    fn a_link_at_the_output_is_replaced_not_followed() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path().to_path_buf();
        let victim = d.join("victim.txt");
        std::fs::write(&victim, b"victim").unwrap();
        let out = d.join("linked.png");
        let _ = std::fs::remove_file(&out);
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        write_atomically(&out, "-o", |w| {
            std::io::Write::write_all(w, b"new").map_err(|source| Error::Io {
                path: out.clone(),
                source,
            })
        })
        .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        assert!(!std::fs::symlink_metadata(&out).unwrap().is_symlink());
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
    }
}
