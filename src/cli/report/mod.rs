//! Reports: CSV + Markdown + SVG files with the device and settings they
//! came from, the harnesses that measure them, and `wgvae report …`.

pub(crate) mod attention;
pub(crate) mod bench;
mod chart;
pub(crate) mod frames;
pub(crate) mod memory;
pub(crate) mod video;

use std::path::{Path, PathBuf};

use clap::Subcommand;

use wgvae::error::{Error, Result};

use crate::cli::context;
pub(crate) use chart::{line_chart, loglog_chart};

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a report file (CSV, Markdown, SVG, JSON) as every other output:
/// into a temporary file created exclusively beside it, renamed into place,
/// so a link planted at `path` is replaced, never written through.
pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    crate::cli::outputs::write_atomically(path, "--out", |out| {
        use std::io::Write;
        out.write_all(text.as_bytes()).map_err(io_err(path))
    })
}

/// Creates the report folder `out` (and its parents).
pub(crate) fn create_dir(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io_err(out))
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// A CSV or Markdown table: `head` (header lines), then each row's `line`.
/// A row marked "ok" must hold measured figures: NaN there is a bug, not a report.
/// `row` names the row in the error (`bench video: chunk 2 × 8 latent frames`).
pub(crate) fn check_measured(row: &str, runs: usize, figures: &[f64]) -> Result<()> {
    if runs == 0 || figures.iter().any(|f| !f.is_finite()) {
        return Err(Error::Internal(format!(
            "{row} ran {runs} timed runs and has non-finite figures; no report written"
        )));
    }
    Ok(())
}

pub(crate) fn table<R>(
    head: &str,
    rows: impl IntoIterator<Item = R>,
    line: impl FnMut(R) -> String,
) -> String {
    let mut s = head.to_string();
    s.extend(rows.into_iter().map(line));
    s
}

/// Where `report memory` looks for PyTorch's measurements unless told.
const DEFAULT_REFERENCE: &str = "../shared/reference/pytorch_vae_memory_rtx4090.csv";

#[derive(Subcommand)]
pub(crate) enum ReportKind {
    /// Decode memory of the FLUX.1 / SD1.5 / SDXL presets under every pool policy, beside PyTorch's.
    Memory {
        /// Report folder (CSV, Markdown, SVG plots), created if missing.
        #[arg(long, default_value = "report")]
        out: PathBuf,
        /// The published PyTorch measurements (read, never copied). Default:
        /// ../shared/reference/pytorch_vae_memory_rtx4090.csv, whose PyTorch columns stay
        /// empty when it is absent; a file named here must exist.
        #[arg(long)]
        reference: Option<PathBuf>,
        /// Predict for this machine's adapter instead of a 24 GB reference GPU.
        #[arg(long)]
        this_device: bool,
        /// Also decode the presets at 128² for real on this machine's adapter (f32, f16,
        /// each policy) and add those measured rows beside their predictions.
        #[arg(long)]
        measure: bool,
        /// Only these sizes (pixels per side, from the report's grid: 512,768,1024,1536,2048).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Only these models (FLUX, SD1.5, SDXL; any case).
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
    },
}

pub(crate) fn run(adapter: &crate::cli::DeviceArgs, which: &ReportKind) -> Result<()> {
    match which {
        ReportKind::Memory {
            out,
            reference,
            this_device,
            measure,
            sizes,
            models,
        } => {
            // Checked before any work: a typo should not cost the full report's minutes.
            let only = memory::Selection::new(sizes, models)?;
            crate::cli::bench::check_out_dir(out)?;
            let reference = match reference {
                Some(r) if !r.is_file() => {
                    return Err(Error::InvalidInput(format!(
                        "--reference {}: expected the PyTorch reference CSV, found {}; name an existing file or leave --reference out (the default {DEFAULT_REFERENCE} is optional)",
                        r.display(),
                        if r.exists() { "something that is not a file" } else { "no such file" }
                    )))
                }
                Some(r) => r.clone(),
                None => PathBuf::from(DEFAULT_REFERENCE),
            };
            report_memory(adapter, out, &reference, *this_device, *measure, &only)
        }
    }
}

fn report_memory(
    device_args: &crate::cli::DeviceArgs,
    out: &Path,
    reference: &Path,
    this_device: bool,
    measure: bool,
    only: &memory::Selection,
) -> wgvae::Result<()> {
    let device = if measure || this_device {
        Some(context(device_args)?)
    } else {
        None
    };
    let caps = match (&device, this_device) {
        (Some(d), true) => d.caps().clone(),
        _ => wgvae::gpu::Capabilities::reference_gpu(),
    };
    let reference = reference.exists().then_some(reference);
    let header = format!(
        "Predicted for: {} (max binding {} MiB, max buffer {} MiB). wgvae {} ({}), {}.",
        caps.adapter_name,
        caps.max_storage_buffer_binding_size >> 20,
        caps.max_buffer_size >> 20,
        env!("CARGO_PKG_VERSION"),
        env!("WGVAE_GIT_COMMIT"),
        std::env::consts::OS
    );
    let measure_on = device.as_ref().filter(|_| measure);
    let rows = memory::write_report(&caps, reference, &header, out, measure_on, only)?;
    println!(
        "wrote {} rows to {}/memory.csv, memory.md and memory_*.svg",
        rows.len(),
        out.display()
    );
    Ok(())
}
