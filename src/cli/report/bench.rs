//! `wgvae bench decode`: warm-up then timed decodes per size, with the
//! metadata published reports lacked (device, driver, versions, commit, date).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{create_dir, line_chart, table, write, MIB};
use wgvae::decode::{decode, DecodeOptions};
use wgvae::error::{Error, Result};
use wgvae::gpu::Context;
use wgvae::io::HostTensor;
use wgvae::memory::Policy;
use wgvae::models::{LoadOptions, Vae};

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

#[cfg(test)]
impl Metadata {
    /// A fixed header for the reports' tests.
    pub(crate) fn for_test(settings: &str) -> Metadata {
        Metadata {
            adapter: "test adapter".into(),
            backend: "Vulkan".into(),
            device_type: "Cpu".into(),
            driver: "d".into(),
            driver_info: "i".into(),
            wgpu_version: "30",
            wgvae_version: "0.1.0",
            git_commit: "abc",
            os: "linux",
            date_utc: today_utc(),
            settings: settings.into(),
        }
    }
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

    /// A CSV file: the metadata as `# ` lines, then [`table`]`(head, rows, line)`.
    pub(crate) fn csv<R>(
        &self,
        head: &str,
        rows: impl IntoIterator<Item = R>,
        line: impl FnMut(R) -> String,
    ) -> String {
        self.lines("# ") + &table(head, rows, line)
    }

    /// A Markdown report's start: `# title`, then the metadata as a list.
    pub(crate) fn markdown(&self, title: &str) -> String {
        format!("# {title}\n\n{}", self.lines("- "))
    }
}

/// Warm-up runs, timed runs and memory policy of a benchmark.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed runs.
    pub runs: usize,
    /// Memory policy.
    pub policy: Policy,
}

impl Timing {
    /// Warm-up and timed runs.
    pub fn total(&self) -> usize {
        self.warmup + self.runs
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
    /// Runs and memory policy.
    pub timing: Timing,
    /// Storage precisions to measure (each a row per size).
    pub dtypes: Vec<wgvae::models::Precision>,
    /// Tiling of every decode.
    pub tiling: wgvae::tiling::Tiling,
}

/// One measured cell.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// Image side in pixels.
    pub size: usize,
    /// Storage dtype.
    pub dtype: &'static str,
    /// The convolutions' cooperative-matrix configuration (`8x8x8 f16->f32`), or `scalar`.
    pub matrix: String,
    /// How the decodes were tiled: `untiled`, `exact 128px ×4 tiles`, … (from the decode itself).
    pub tiling: String,
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
    let ctx = ctx.with_pool(b.timing.policy.new_pool());
    let mut rows = Vec::new();
    for &precision in &b.dtypes {
        let load = LoadOptions {
            precision,
            ..Default::default()
        };
        let vae = Vae::load_image_decoder(&ctx, &b.vae, &load)?;
        // Every size before any decode: random latents of each fit the host.
        for &size in &b.sizes {
            let l = size / vae.upscale();
            crate::cli::bench::check_host_f32(
                "--sizes/--batch",
                "the random latents",
                [b.batch, vae.latent_channels(), l, l]
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d)),
            )?;
        }
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
            let z = HostTensor::new(shape, wgvae::seeded::uniform(n, size as u64, 1.0))?;
            let opts = DecodeOptions {
                raw_latents: true,
                tiling: b.tiling.clone(),
                ..Default::default()
            };
            let mut tiling = format!("{} (not run)", b.tiling.mode.name());
            let mut times = Vec::new();
            let mut first_ms = f64::NAN;
            let mut last = None;
            let mut status = "ok".to_string();
            for i in 0..b.timing.total() {
                progress(&format!(
                    "{size}² {} run {}/{}",
                    vae.dtype().name(),
                    i + 1,
                    b.timing.total()
                ));
                match decode(&ctx, &vae, &z, &opts) {
                    Ok(out) => {
                        tiling = describe_tiling(&out.tiling);
                        if i == 0 {
                            first_ms = out.decode_ms;
                        }
                        if i >= b.timing.warmup {
                            times.push(out.decode_ms);
                        }
                        last = Some(out);
                    }
                    Err(e) => {
                        // A cell the device cannot run (a binding or buffer
                        // limit) is a row with a reason; the sweep goes on.
                        status = format!("skipped: {e}");
                        progress(&format!("{size}² {}: {status}", vae.dtype().name()));
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
            // A decode redone in bf16 after an f16 overflow ran the scalar twin.
            let redone = last.as_ref().is_some_and(|o| o.dtype != vae.dtype());
            let matrix = match vae.cooperative_matrix() {
                Some(m) if !redone => m,
                _ => "scalar".to_string(),
            };
            rows.push(BenchRow {
                size,
                dtype: vae.dtype().name(),
                matrix,
                tiling,
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

/// A decode's tiling in a few words: `untiled`, `exact 128px ×4`, `fast 64px overlap 16 ×9`.
pub fn describe_tiling(t: &wgvae::tiling::TilingReport) -> String {
    match t.mode.as_str() {
        "exact" => format!("exact {}px ×{}", t.tile_size.unwrap_or(0), t.tiles),
        "fast" => format!(
            "fast {}px overlap {} ×{}",
            t.tile_size.unwrap_or(0),
            t.overlap.unwrap_or(0),
            t.tiles
        ),
        m => m.to_string(),
    }
}

/// The CSV columns of a [`BenchRow`]: one table, so the header and the
/// values cannot drift apart.
const CSV_COLUMNS: &[Column<BenchRow>] = &[
    ("size", |r| r.size.to_string()),
    ("dtype", |r| r.dtype.to_string()),
    ("matrix", |r| r.matrix.clone()),
    ("tiling", |r| r.tiling.clone()),
    ("batch", |r| r.batch.to_string()),
    ("runs", |r| r.runs.to_string()),
    ("first_ms", |r| format!("{:.2}", r.first_ms)),
    ("median_ms", |r| format!("{:.2}", r.median_ms)),
    ("min_ms", |r| format!("{:.2}", r.min_ms)),
    ("max_ms", |r| format!("{:.2}", r.max_ms)),
    ("images_per_s", |r| format!("{:.4}", r.images_per_s)),
    ("megapixels_per_s", |r| format!("{:.4}", r.megapixels_per_s)),
    ("gflops", |r| format!("{:.3}", r.gflops)),
    ("peak_allocated_mib", |r| {
        format!("{:.2}", r.peak_allocated_mib)
    }),
    ("peak_reserved_mib", |r| {
        format!("{:.2}", r.peak_reserved_mib)
    }),
    ("status", |r| format!("\"{}\"", r.status.replace('"', "'"))),
];

/// A CSV column: its header name and how a row's value is written.
pub(crate) type Column<R> = (&'static str, fn(&R) -> String);

/// A CSV file of `rows` under `columns` (each a header name and its value),
/// the metadata first as `# ` lines: one table, so header and values agree.
pub(crate) fn columns_csv<R>(meta: &Metadata, columns: &[Column<R>], rows: &[R]) -> String {
    let header: Vec<&str> = columns.iter().map(|c| c.0).collect();
    meta.csv(&(header.join(",") + "\n"), rows, |r| {
        let values: Vec<String> = columns.iter().map(|c| (c.1)(r)).collect();
        values.join(",") + "\n"
    })
}

/// `decode.csv`: the metadata as `# ` lines, a header, one line per row.
pub fn decode_csv(rows: &[BenchRow], meta: &Metadata) -> String {
    columns_csv(meta, CSV_COLUMNS, rows)
}

/// Writes `decode.csv`, `decode.md`, `decode_time.svg`, `decode_memory.svg` into `out`.
pub fn write_decode_report(rows: &[BenchRow], meta: &Metadata, out: &Path) -> Result<()> {
    create_dir(out)?;
    write(&out.join("decode.csv"), &decode_csv(rows, meta))?;
    let md = meta.markdown("Decode benchmark") + &table(
        "\n| size | dtype | matrix | tiling | batch | runs | first (cold) ms | median ms | min ms | max ms | images/s | MP/s | GFLOP/s | peak allocated MiB | peak reserved MiB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        rows,
        |r| format!(
            "| {}² | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} | {} |\n",
            r.size, r.dtype, r.matrix, r.tiling, r.batch, r.runs, r.first_ms, r.median_ms, r.min_ms, r.max_ms, r.images_per_s,
            r.megapixels_per_s, r.gflops, r.peak_allocated_mib, r.peak_reserved_mib, r.status
        ),
    );
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
        &[],
    )?;
    let mut memory = series(&|r| r.peak_allocated_mib, "peak allocated");
    let allocated = memory.len();
    memory.extend(series(&|r| r.peak_reserved_mib, "peak reserved"));
    // Reserved often equals allocated (planned pool): dashed, so both show.
    let dashed: Vec<bool> = (0..memory.len()).map(|i| i >= allocated).collect();
    line_chart(
        &out.join("decode_memory.svg"),
        &format!("peak decode memory on {}", meta.adapter),
        ("megapixels per image", "MiB"),
        &memory,
        &dashed,
    )
}

/// One line of the cold-start report.
#[derive(Clone, Debug, Serialize)]
pub struct ColdStartRow {
    /// `cold (empty cache)`, `warm cache` or `steady state`.
    pub case: String,
    /// Child process spawn → exit after writing the first image (NaN for the steady state).
    pub process_ms: f64,
    /// The decode itself as the process timed it (pipelines compiled or loaded
    /// on first use inside it; median of the runs for the steady state).
    pub decode_ms: f64,
    /// Bytes in the pipeline cache directory afterwards.
    pub cache_bytes: u64,
    /// Bytes in the driver's shader cache directory afterwards (`None`: off).
    pub driver_cache_bytes: Option<u64>,
    /// `ok`, or why the run failed.
    pub status: String,
}

/// Writes `cold_start.csv` and `cold_start.md` into `out`.
pub fn write_cold_start_report(rows: &[ColdStartRow], meta: &Metadata, out: &Path) -> Result<()> {
    create_dir(out)?;
    let mut csv = meta.lines("# ");
    csv += "case,process_ms,decode_ms,cache_bytes,driver_cache_bytes,status\n";
    let mut md = meta.markdown("Cold start");
    md += "\n| case | process start → first image ms | decode ms | pipeline cache bytes | driver cache bytes | status |\n|---|---|---|---|---|---|\n";
    for r in rows {
        let driver = r.driver_cache_bytes.map_or("off".into(), |b| b.to_string());
        csv += &format!(
            "\"{}\",{:.1},{:.1},{},{driver},\"{}\"\n",
            r.case,
            r.process_ms,
            r.decode_ms,
            r.cache_bytes,
            r.status.replace('"', "'")
        );
        let process = if r.process_ms.is_finite() {
            format!("{:.0}", r.process_ms)
        } else {
            "—".into()
        };
        md += &format!(
            "| {} | {process} | {:.0} | {} | {driver} | {} |\n",
            r.case, r.decode_ms, r.cache_bytes, r.status
        );
    }
    write(&out.join("cold_start.csv"), &csv)?;
    write(&out.join("cold_start.md"), &md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: usize, first_ms: f64, median_ms: f64, status: &str) -> BenchRow {
        BenchRow {
            size,
            dtype: "f16",
            matrix: "scalar".into(),
            tiling: "exact 128px ×4".into(),
            batch: 2,
            runs: 3,
            first_ms,
            median_ms,
            min_ms: median_ms - 1.0,
            max_ms: median_ms + 1.0,
            images_per_s: 0.5,
            megapixels_per_s: 0.25,
            gflops: 12.5,
            peak_allocated_mib: 26.5,
            peak_reserved_mib: 27.5,
            status: status.into(),
        }
    }

    fn meta() -> Metadata {
        Metadata::for_test("s, with a comma")
    }

    /// Splits one CSV line on commas outside double quotes.
    fn fields(line: &str) -> Vec<String> {
        let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
        for c in line.chars() {
            match c {
                '"' => quoted = !quoted,
                ',' if !quoted => out.push(std::mem::take(&mut cur)),
                _ => cur.push(c),
            }
        }
        out.push(cur);
        out
    }

    #[test]
    fn decode_report_plots_have_whole_titles_and_both_memory_series() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("bench-report");
        let rows = [
            row(256, 3412.8, 2908.8, "ok"),
            row(512, 11635.7, 11476.9, "ok"),
        ];
        write_decode_report(&rows, &meta(), &dir).unwrap();
        let svg = std::fs::read_to_string(dir.join("decode_memory.svg")).unwrap();
        assert!(svg.contains("peak decode memory on test adapter"), "{svg}");
        assert!(svg.contains("peak allocated f16") && svg.contains("peak reserved f16"));
        // Reserved points are hollow rings over the filled allocated ones.
        assert!(svg.matches("<circle").count() >= 4, "{svg}");
        assert!(svg.contains("fill=\"none\""), "{svg}");
        let md = std::fs::read_to_string(dir.join("decode.md")).unwrap();
        assert!(
            md.contains("| 256² | f16 | scalar | exact 128px ×4 | 2 | 3 | 3412.8 | 2908.8 |"),
            "{md}"
        );
    }

    #[test]
    fn git_commit_is_a_hash_with_an_optional_dirty_marker() {
        let c = env!("WGVAE_GIT_COMMIT");
        let hash = c.strip_suffix("-dirty").unwrap_or(c);
        assert!(
            c == "unknown" || (hash.len() == 12 && hash.chars().all(|ch| ch.is_ascii_hexdigit())),
            "{c}"
        );
    }

    #[test]
    fn decode_csv_rows_match_the_header() {
        let rows = [
            row(256, 3412.8, 2908.8, "ok"),
            row(512, 11635.7, 11476.9, "binding too large, \"x\""),
        ];
        let csv = decode_csv(&rows, &meta());
        let lines: Vec<&str> = csv.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines.len(), 1 + rows.len(), "{csv}");
        let header = fields(lines[0]);
        for line in &lines[1..] {
            assert_eq!(fields(line).len(), header.len(), "{line}\nvs {:?}", header);
        }
        // Values land under their own names.
        let at = |line: usize, name: &str| {
            let i = header.iter().position(|h| h == name).unwrap();
            fields(lines[line])[i].clone()
        };
        assert_eq!(at(1, "size"), "256");
        assert_eq!(at(1, "dtype"), "f16");
        assert_eq!(at(1, "tiling"), "exact 128px ×4");
        assert_eq!(at(1, "batch"), "2");
        assert_eq!(at(1, "runs"), "3");
        assert_eq!(at(1, "first_ms"), "3412.80");
        assert_eq!(at(1, "median_ms"), "2908.80");
        assert_eq!(at(1, "min_ms"), "2907.80");
        assert_eq!(at(1, "max_ms"), "2909.80");
        assert_eq!(at(1, "gflops"), "12.500");
        assert_eq!(at(1, "peak_allocated_mib"), "26.50");
        assert_eq!(at(1, "peak_reserved_mib"), "27.50");
        assert_eq!(at(2, "first_ms"), "11635.70");
        assert_eq!(at(2, "status"), "binding too large, 'x'");
    }

    #[test]
    fn date_is_plausible() {
        let d = super::today_utc();
        assert_eq!(d.len(), 10);
        assert!(d.as_str() >= "2024-01-01", "{d}");
    }
}
