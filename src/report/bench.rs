//! `wgvae bench decode`: warm-up then timed decodes per size, with the
//! metadata published reports lacked (device, driver, versions, commit, date).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{line_chart, write, MIB};
use crate::decode::{decode, DecodeOptions};
use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::io::HostTensor;
use crate::memory::Policy;
use crate::models::{LoadOptions, Vae};

/// Where and how a report was made.
#[derive(Clone, Debug, Serialize)]
pub struct Metadata {
    /// Adapter name.
    pub adapter: String,
    /// Graphics API backend.
    pub backend: String,
    /// Device type.
    pub device_type: String,
    /// Driver name.
    pub driver: String,
    /// Driver version details.
    pub driver_info: String,
    /// wgpu version.
    pub wgpu_version: &'static str,
    /// wgvae version.
    pub wgvae_version: &'static str,
    /// Git commit wgvae was built from.
    pub git_commit: &'static str,
    /// Operating system.
    pub os: &'static str,
    /// Date and time of the run (UTC).
    pub date_utc: String,
    /// The benchmark's settings, as text.
    pub settings: String,
}

/// Today's date (UTC) as YYYY-MM-DD, without a date crate.
pub fn today_utc() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil-from-days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

impl Metadata {
    /// The header of a run on `ctx`'s adapter with `settings`.
    pub fn of(ctx: &Context, settings: String) -> Self {
        let c = ctx.caps();
        Metadata {
            adapter: c.adapter_name.clone(),
            backend: format!("{:?}", c.backend),
            device_type: format!("{:?}", c.device_type),
            driver: c.driver.clone(),
            driver_info: c.driver_info.clone(),
            wgpu_version: env!("WGVAE_WGPU_VERSION"),
            wgvae_version: env!("CARGO_PKG_VERSION"),
            git_commit: env!("WGVAE_GIT_COMMIT"),
            os: std::env::consts::OS,
            date_utc: today_utc(),
            settings,
        }
    }

    pub(crate) fn lines(&self, prefix: &str) -> String {
        let v = serde_json::to_value(self).unwrap_or_default();
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                format!(
                    "{prefix}{k}: {}\n",
                    v.as_str().map_or(v.to_string(), str::to_string)
                )
            })
            .collect()
    }
}

/// What to benchmark.
#[derive(Clone, Debug)]
pub struct DecodeBench {
    /// The VAE (path or preset).
    pub vae: String,
    /// Output sizes in pixels (square).
    pub sizes: Vec<usize>,
    /// Images per decode.
    pub batch: usize,
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed runs.
    pub runs: usize,
    /// Memory policy.
    pub policy: Policy,
    /// Storage precisions to measure (each a row per size).
    pub dtypes: Vec<crate::models::Precision>,
}

/// One measured cell.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// Image side in pixels.
    pub size: usize,
    /// Storage dtype.
    pub dtype: &'static str,
    /// Images per decode.
    pub batch: usize,
    /// Timed runs.
    pub runs: usize,
    /// The first decode of this size in the process (cold: pipelines compiled, plan traced).
    pub first_ms: f64,
    /// Median decode time in ms.
    pub median_ms: f64,
    /// Fastest decode in ms.
    pub min_ms: f64,
    /// Slowest decode in ms.
    pub max_ms: f64,
    /// Images per second (median).
    pub images_per_s: f64,
    /// Megapixels per second (median).
    pub megapixels_per_s: f64,
    /// Achieved GFLOP/s (2 · MACs / median time).
    pub gflops: f64,
    /// Peak allocated MiB.
    pub peak_allocated_mib: f64,
    /// Peak reserved MiB.
    pub peak_reserved_mib: f64,
    /// "ok" or why the cell did not run.
    pub status: String,
}

/// Runs the benchmark; cells the device cannot run are rows with a status.
pub fn run_decode_bench(
    ctx: &Context,
    b: &DecodeBench,
    mut progress: impl FnMut(&str),
) -> Result<Vec<BenchRow>> {
    let ctx = ctx.with_pool(b.policy.new_pool());
    let mut rows = Vec::new();
    for &precision in &b.dtypes {
        let load = LoadOptions {
            precision,
            ..Default::default()
        };
        let vae = Vae::load(&ctx, &b.vae, &load)?;
        for &size in &b.sizes {
            if size % vae.upscale() != 0 {
                return Err(Error::InvalidInput(format!(
                    "size {size} is not a multiple of {}",
                    vae.upscale()
                )));
            }
            let l = size / vae.upscale();
            let shape = vec![b.batch, vae.latent_channels(), l, l];
            let n: usize = shape.iter().product();
            let z = HostTensor::new(shape, crate::testing::rand_vec(n, size as u64, 1.0))?;
            let opts = DecodeOptions {
                raw_latents: true,
                ..Default::default()
            };
            let mut times = Vec::new();
            let mut first_ms = f64::NAN;
            let mut last = None;
            let mut status = "ok".to_string();
            for i in 0..b.warmup + b.runs {
                progress(&format!(
                    "{size}² {} run {}/{}",
                    vae.dtype.name(),
                    i + 1,
                    b.warmup + b.runs
                ));
                match decode(&ctx, &vae, &z, &opts) {
                    Ok(out) => {
                        if i == 0 {
                            first_ms = out.decode_ms;
                        }
                        if i >= b.warmup {
                            times.push(out.decode_ms);
                        }
                        last = Some(out);
                    }
                    Err(e) => {
                        status = e.to_string();
                        break;
                    }
                }
            }
            times.sort_by(f64::total_cmp);
            let (median, min, max) = match times.len() {
                0 => (f64::NAN, f64::NAN, f64::NAN),
                k => (times[k / 2], times[0], times[k - 1]),
            };
            let secs = median / 1e3;
            rows.push(BenchRow {
                size,
                dtype: vae.dtype.name(),
                batch: b.batch,
                runs: times.len(),
                first_ms,
                median_ms: median,
                min_ms: min,
                max_ms: max,
                images_per_s: b.batch as f64 / secs,
                megapixels_per_s: (b.batch * size * size) as f64 / 1e6 / secs,
                gflops: last
                    .as_ref()
                    .map_or(f64::NAN, |o| 2.0 * o.macs as f64 / 1e9 / secs),
                peak_allocated_mib: last
                    .as_ref()
                    .map_or(f64::NAN, |o| o.memory.allocated_bytes.peak as f64 / MIB),
                peak_reserved_mib: last
                    .as_ref()
                    .map_or(f64::NAN, |o| o.memory.reserved_bytes.peak as f64 / MIB),
                status,
            });
        }
    }
    Ok(rows)
}

/// Writes `decode.csv`, `decode.md`, `decode_time.svg`, `decode_memory.svg` into `out`.
pub fn write_decode_report(rows: &[BenchRow], meta: &Metadata, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|source| Error::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let mut csv = meta.lines("# ");
    csv += "size,dtype,batch,runs,first_ms,median_ms,min_ms,max_ms,images_per_s,megapixels_per_s,gflops,peak_allocated_mib,peak_reserved_mib,status\n";
    for r in rows {
        csv += &format!(
            "{},{},{},{},{:.2},{:.2},{:.2},{:.4},{:.4},{:.3},{:.2},{:.2},\"{}\"\n",
            r.size,
            r.dtype,
            r.batch,
            r.runs,
            r.median_ms,
            r.min_ms,
            r.max_ms,
            r.images_per_s,
            r.megapixels_per_s,
            r.gflops,
            r.peak_allocated_mib,
            r.peak_reserved_mib,
            r.status.replace('"', "'")
        );
    }
    write(&out.join("decode.csv"), &csv)?;
    let mut md = String::from("# Decode benchmark\n\n");
    md += &meta.lines("- ");
    md += "\n| size | dtype | batch | runs | first (cold) ms | median ms | min ms | max ms | images/s | MP/s | GFLOP/s | peak allocated MiB | peak reserved MiB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        md += &format!(
            "| {}² | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} | {} |\n",
            r.size, r.dtype, r.batch, r.runs, r.first_ms, r.median_ms, r.min_ms, r.max_ms, r.images_per_s,
            r.megapixels_per_s, r.gflops, r.peak_allocated_mib, r.peak_reserved_mib, r.status
        );
    }
    write(&out.join("decode.md"), &md)?;
    let mp = |r: &BenchRow| (r.size * r.size) as f64 / 1e6;
    let mut dtypes: Vec<&str> = rows.iter().map(|r| r.dtype).collect();
    dtypes.dedup();
    // One series per dtype.
    let series = |f: &dyn Fn(&BenchRow) -> f64, what: &str| -> Vec<(String, Vec<(f64, f64)>)> {
        dtypes
            .iter()
            .map(|d| {
                let pts = rows.iter().filter(|r| r.dtype == *d).map(|r| (mp(r), f(r)));
                (format!("{what} {d}"), pts.collect())
            })
            .collect()
    };
    line_chart(
        &out.join("decode_time.svg"),
        &format!("decode time on {}", meta.adapter),
        ("megapixels per image", "median ms"),
        &series(&|r| r.median_ms, "median ms"),
    )?;
    let mut memory = series(&|r| r.peak_allocated_mib, "peak allocated");
    memory.extend(series(&|r| r.peak_reserved_mib, "peak reserved"));
    line_chart(
        &out.join("decode_memory.svg"),
        &format!("decode memory ({})", meta.settings),
        ("megapixels per image", "MiB"),
        &memory,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn date_is_plausible() {
        let d = super::today_utc();
        assert_eq!(d.len(), 10);
        assert!(d.as_str() >= "2024-01-01", "{d}");
    }
}
