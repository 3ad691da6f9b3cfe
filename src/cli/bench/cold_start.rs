//! `wgvae bench cold-start`: process start → first image in fresh child
//! processes, with empty and warm pipeline (and driver) caches.

use std::path::{Path, PathBuf};

use wgvae::tiling::Tiling;
use wgvae::{DecodeOptions, LoadOptions, Vae};

use super::load_average;
use crate::cli::context;
use crate::cli::report::bench as rb;

#[derive(clap::Args)]
pub(crate) struct ColdStartArgs {
    /// VAE: a diffusers folder, a .safetensors file or preset:NAME.
    #[arg(long)]
    vae: String,
    /// Square output size in pixels.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Storage dtype: f32, f16, bf16 or auto.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Steady-state decodes in the warm process (median reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Pipeline cache directory the children use (emptied first; default: a fresh
    /// directory under the system's temporary folder, removed afterwards).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The driver's own shader cache (Mesa's, in a fresh temporary directory) in the
    /// children: off (wgvae's pipeline cache alone), on, or both pairs.
    #[arg(long, default_value = "both", value_parser = ["off", "on", "both"])]
    driver_cache: String,
    /// Report folder (CSV, Markdown, SVG plots), created if missing.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

/// Bytes of the files under `dir`, recursively (0 when absent).
fn dir_bytes_deep(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes_deep(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Bytes of the files in `dir` (0 when absent).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A new directory under `parent` for the children's files: created exclusively under
/// a random name (a predictable one could be a planted link to follow), removed on drop.
fn scratch_in(parent: &Path) -> wgvae::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("wgvae-cold-start-")
        .tempdir_in(parent)
        .map_err(|source| wgvae::Error::Io {
            path: parent.to_path_buf(),
            source,
        })
}

impl ColdStartArgs {
    /// The report folder (`--out`).
    pub(crate) fn out(&self) -> &std::path::Path {
        &self.out
    }
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &ColdStartArgs) -> wgvae::Result<()> {
    use rb::ColdStartRow;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| wgvae::Error::Io { path, source }
    };
    if a.runs == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--runs 0: expected at least 1 timed run".into(),
        ));
    }
    let ctx = context(device_args)?;
    let load = LoadOptions {
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let vae = Vae::load_image_decoder(&ctx, &a.vae, &load)?;
    if a.size == 0 || !a.size.is_multiple_of(vae.upscale()) {
        return Err(wgvae::Error::InvalidInput(format!(
            "--size {}: expected a positive multiple of {}",
            a.size,
            vae.upscale()
        )));
    }
    let l = a.size / vae.upscale();
    let shape = [1, vae.latent_channels(), l, l];
    super::check_host_f32(
        "--size",
        "the random latents",
        shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)),
    )?;
    let n: usize = shape.iter().product();
    std::fs::create_dir_all(&a.out).map_err(io_err(&a.out))?;
    // Latents, images and caches of the children: scratch, not report files,
    // removed when `scratch_dir` drops (also on errors).
    let scratch_dir = scratch_in(&std::env::temp_dir())?;
    let scratch = scratch_dir.path();
    let latents = scratch.join("latents.npy");
    wgvae::io::write_npy(&latents, &shape, &wgvae::seeded::uniform(n, 7, 1.0))?;
    let cache = a
        .cache_dir
        .clone()
        .unwrap_or_else(|| scratch.join("pipeline_cache"));
    // Mesa's own on-disk shader cache (lavapipe, RADV, ANV), in a directory of ours.
    let driver_cache = scratch.join("driver_cache");
    std::fs::create_dir(&driver_cache).map_err(io_err(&driver_cache))?;
    let exe = std::env::current_exe().map_err(io_err(Path::new("wgvae")))?;
    let mut rows = Vec::new();
    // Each pair: an emptied pipeline cache, then the one the first process saved;
    // first with the driver's shader cache off (wgvae's cache alone), then on.
    let cases = [
        ("cold: empty pipeline cache; driver cache off", false),
        ("warm pipeline cache; driver cache off", false),
        ("cold: empty pipeline and driver caches", true),
        ("warm pipeline and driver caches", true),
    ];
    let wanted = |driver: bool| match a.driver_cache.as_str() {
        "off" => !driver,
        "on" => driver,
        _ => true,
    };
    for (i, (case, driver)) in cases.into_iter().enumerate() {
        if !wanted(driver) {
            continue;
        }
        if i % 2 == 0 {
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache).map_err(io_err(&cache))?;
        }
        eprintln!("{case}: a fresh `wgvae decode` process");
        let mut cmd = std::process::Command::new(&exe);
        if let Some(ad) = &device_args.adapter {
            cmd.args(["--adapter", ad]);
        }
        let matrices = format!("{:?}", device_args.cooperative_matrix).to_lowercase();
        cmd.args(["--cooperative-matrix", &matrices]);
        cmd.arg("decode")
            .arg(&latents)
            .args(["--vae", &a.vae, "--dtype", &a.dtype, "--raw-latents"])
            .args(["--tile", "off", "--json", "-o"])
            .arg(scratch.join("first.png"))
            .env("WGVAE_CACHE_DIR", &cache)
            .env_remove("WGVAE_PIPELINE_CACHE");
        if driver {
            cmd.env("MESA_SHADER_CACHE_DIR", &driver_cache)
                .env_remove("MESA_SHADER_CACHE_DISABLE");
        } else {
            cmd.env("MESA_SHADER_CACHE_DISABLE", "true");
        }
        let start = std::time::Instant::now();
        let out = cmd.output().map_err(io_err(&exe))?;
        let process_ms = start.elapsed().as_secs_f64() * 1e3;
        let (decode_ms, status) = if out.status.success() {
            let v: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            match v["decode_ms"].as_f64() {
                Some(ms) => (ms, "ok".to_string()),
                None => (f64::NAN, "no decode_ms in the child's output".into()),
            }
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            (f64::NAN, format!("child failed: {}", err.trim()))
        };
        rows.push(ColdStartRow {
            case: case.into(),
            process_ms,
            decode_ms,
            cache_bytes: dir_bytes(&cache),
            driver_cache_bytes: driver.then(|| dir_bytes_deep(&driver_cache)),
            status,
        });
    }
    eprintln!(
        "steady state: {} decodes in this process after one warm-up",
        a.runs
    );
    let z = wgvae::io::read_npy(&latents)?;
    let opts = DecodeOptions {
        raw_latents: true,
        tiling: Tiling::off(),
        ..Default::default()
    };
    let mut times = Vec::new();
    for i in 0..=a.runs.max(1) {
        let out = wgvae::decode(&ctx, &vae, &z, &opts)?;
        if i > 0 {
            times.push(out.decode_ms);
        }
    }
    times.sort_by(f64::total_cmp);
    rows.push(ColdStartRow {
        case: "steady state".into(),
        process_ms: f64::NAN,
        decode_ms: times[times.len() / 2],
        cache_bytes: dir_bytes(&cache),
        driver_cache_bytes: None,
        status: "ok".into(),
    });
    let settings = format!(
        "vae {}, {}², dtype {}, untiled, steady-state median of {} after 1 warm-up, pipeline cache dir {} (emptied before each cold run), driver cache: MESA_SHADER_CACHE_DISABLE=true or MESA_SHADER_CACHE_DIR={} (emptied first; other drivers keep their defaults){}",
        a.vae,
        a.size,
        a.dtype,
        a.runs.max(1),
        cache.display(),
        driver_cache.display(),
        load_average()
    );
    let meta = rb::Metadata::of(&ctx, settings);
    rb::write_cold_start_report(&rows, &meta, &a.out)?;
    drop(scratch_dir);
    for r in &rows {
        println!(
            "{}: process start → first image {:.0} ms, decode {:.0} ms, pipeline cache {} bytes, driver cache {} [{}]",
            r.case,
            r.process_ms,
            r.decode_ms,
            r.cache_bytes,
            r.driver_cache_bytes
                .map_or("off".into(), |b| format!("{b} bytes")),
            r.status
        );
    }
    println!("wrote {}/cold_start.csv, cold_start.md", a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::scratch_in;

    /// The scratch directory is new and private: the name the command used to
    /// take (`wgvae-cold-start-<pid>`), planted as a link to another directory,
    /// is neither followed nor reused, and nothing stays behind after the drop.
    #[cfg(unix)]
    #[test]
    fn scratch_is_created_fresh_and_removed() {
        let parent = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        let planted = parent
            .path()
            .join(format!("wgvae-cold-start-{}", std::process::id()));
        std::os::unix::fs::symlink(victim.path(), &planted).unwrap();
        let a = scratch_in(parent.path()).unwrap();
        let b = scratch_in(parent.path()).unwrap();
        for s in [&a, &b] {
            assert_ne!(s.path(), planted);
            assert_eq!(s.path().parent(), Some(parent.path()));
            assert!(s.path().symlink_metadata().unwrap().is_dir());
        }
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("latents.npy"), b"x").unwrap();
        drop((a, b));
        assert_eq!(std::fs::read_dir(victim.path()).unwrap().count(), 0);
        let left: Vec<_> = std::fs::read_dir(parent.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(left, [planted]);
    }
}
