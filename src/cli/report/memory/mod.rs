//! `wgvae report memory`: our predicted decode memory under each pool policy
//! beside the published PyTorch measurements (RTX 4090, CUDA caching
//! allocator), read at run time from `../shared/reference/`.

mod tables;

use std::path::Path;

use serde::Serialize;

use super::{create_dir, io_err, write, MIB};
use tables::{csv, markdown, measured_markdown, plot};
use wgvae::error::{Error, Result};
use wgvae::estimate::Estimate;
use wgvae::gpu::Capabilities;
use wgvae::memory::Policy;
use wgvae::models::{LoadOptions, Precision};
use wgvae::tiling::Tiling;

/// Report sizes (output pixels per side) and models, as in the PyTorch report.
pub const SIZES: [usize; 5] = [512, 768, 1024, 1536, 2048];
/// The report's models: (label, preset).
pub const MODELS: [(&str, &str); 3] = [("FLUX", "flux1"), ("SD1.5", "sd15"), ("SDXL", "sdxl")];
/// Operations, named as in the PyTorch report: `decode_tiled` is ours exact
/// within PyTorch's tiled peak (plus weights), theirs blended 512-px tiles (with seams).
pub const OPS: [&str; 3] = ["decode", "decode_tiled", "encode"];
/// Storage dtypes, named as in the PyTorch report, with their precision and element bytes.
pub const DTYPES: [(&str, Precision, f64); 3] = [
    ("float32", Precision::F32, 4.0),
    ("float16", Precision::F16, 2.0),
    ("bfloat16", Precision::BF16, 2.0),
];

/// One PyTorch row of the reference CSV.
#[derive(Clone, Debug, Serialize)]
pub struct PytorchRow {
    /// Model label.
    pub model: String,
    /// `decode` or `encode`.
    pub op: String,
    /// Image side in pixels.
    pub size: usize,
    /// Storage dtype.
    pub dtype: String,
    /// Peak allocated MiB.
    pub allocated_mib: f64,
    /// Peak reserved MiB.
    pub reserved_mib: f64,
}

/// Reads `pytorch_vae_memory_rtx4090.csv`: square sizes only (this report's
/// grid; non-square rows are skipped on purpose). Some float32 rows appear
/// twice in the source with the same allocated and slightly different
/// reserved figures; all are returned in file order and the report uses the
/// **first** of each (model, op, size, dtype). A row with fewer than 7 fields
/// or a non-numeric figure is an error naming the line, not skipped.
pub fn read_pytorch(path: &Path) -> Result<Vec<PytorchRow>> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    parse_pytorch(path, &text)
}

fn parse_pytorch(path: &Path, text: &str) -> Result<Vec<PytorchRow>> {
    let mut rows = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |what: &str| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("line {}: {what} in `{line}`", n + 1),
        };
        if f.len() < 7 {
            return Err(bad(
                "fewer than 7 fields (model,op,height,width,dtype,allocated_mib,reserved_mib)",
            ));
        }
        let height: usize = f[2].parse().map_err(|_| bad("bad height"))?;
        let width: usize = f[3].parse().map_err(|_| bad("bad width"))?;
        if height != width {
            continue; // square sizes only in this report
        }
        rows.push(PytorchRow {
            model: f[0].to_string(),
            op: f[1].to_string(),
            size: height,
            dtype: f[4].to_string(),
            allocated_mib: f[5].parse().map_err(|_| bad("bad allocated_mib"))?,
            reserved_mib: f[6].parse().map_err(|_| bad("bad reserved_mib"))?,
        });
    }
    Ok(rows)
}

/// One of our rows.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Model label.
    pub model: String,
    /// `decode` or `encode`.
    pub op: String,
    /// Image side in pixels.
    pub size: usize,
    /// Storage dtype.
    pub dtype: String,
    /// Memory policy.
    pub policy: String,
    /// "predicted" (estimator) or "measured on `<device>`".
    pub source: String,
    /// Weights in MiB.
    pub weights_mib: f64,
    /// Peak allocated MiB (weights included).
    pub peak_allocated_mib: f64,
    /// Peak reserved MiB (weights included).
    pub peak_reserved_mib: f64,
    /// Reserved / allocated.
    pub reserved_over_allocated: f64,
    /// (peak allocated − weights) / (H·W·bytes per element): InvokeAI's constant.
    pub implied_constant: f64,
    /// PyTorch's allocated MiB (reference table), when listed.
    pub pytorch_allocated_mib: Option<f64>,
    /// PyTorch's reserved MiB (reference table), when listed.
    pub pytorch_reserved_mib: Option<f64>,
    /// Our working memory (peak − weights) over PyTorch's allocated (which excludes weights).
    pub working_vs_pytorch: Option<f64>,
    /// Host memory holding parked tiles at the peak (tiled rows).
    pub host_parked_mib: f64,
    /// Tile side of an exact tiled row.
    pub tile_px: Option<usize>,
    /// Empty for a plain row; otherwise why the row is tiled (an untiled
    /// decode exceeds a device limit) or why it has no figures (NaN).
    pub note: String,
}

impl Row {
    /// The row of a `size`² cell of `dtype` (`bytes` per element) with these
    /// MiB figures; no PyTorch figures, no parked tiles, no note.
    fn new(
        (model, op, size): (&str, &str, usize),
        (dtype, bytes): (&str, f64),
        policy: Policy,
        source: String,
        [weights, alloc, reserved]: [f64; 3],
    ) -> Row {
        Row {
            model: model.into(),
            op: op.into(),
            size,
            dtype: dtype.into(),
            policy: policy.name().into(),
            source,
            weights_mib: weights,
            peak_allocated_mib: alloc,
            peak_reserved_mib: reserved,
            reserved_over_allocated: reserved / alloc,
            implied_constant: (alloc - weights) * MIB / ((size * size) as f64 * bytes),
            pytorch_allocated_mib: None,
            pytorch_reserved_mib: None,
            working_vs_pytorch: None,
            host_parked_mib: 0.0,
            tile_px: None,
            note: String::new(),
        }
    }
}

/// The report's cells to compute: the whole grid, or the sizes and models
/// `--sizes` / `--models` name (a quick partial report).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    sizes: Vec<usize>,
    models: Vec<&'static str>,
}

impl Selection {
    /// Only `sizes` (from [`SIZES`]) and `models` (labels of [`MODELS`], any
    /// case); an empty list means all of them.
    pub fn new(sizes: &[usize], models: &[String]) -> Result<Selection> {
        for &s in sizes {
            if !SIZES.contains(&s) {
                return Err(Error::InvalidInput(format!(
                    "`--sizes {s}`: the memory report's grid has sizes {SIZES:?} (the PyTorch reference's); \
                     for other sizes use `wgvae memory --size {s}x{s}`"
                )));
            }
        }
        let labels: Vec<&str> = MODELS.iter().map(|(m, _)| *m).collect();
        let models = models
            .iter()
            .map(|m| {
                labels
                    .iter()
                    .find(|l| l.eq_ignore_ascii_case(m))
                    .copied()
                    .ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "`--models {m}`: the memory report's models are {}",
                            labels.join(", ")
                        ))
                    })
            })
            .collect::<Result<_>>()?;
        Ok(Selection {
            sizes: sizes.to_vec(),
            models,
        })
    }

    fn keeps(&self, model: &str, size: usize) -> bool {
        (self.sizes.is_empty() || self.sizes.contains(&size))
            && (self.models.is_empty() || self.models.contains(&model))
    }

    fn models(&self) -> Vec<(&'static str, &'static str)> {
        MODELS
            .into_iter()
            .filter(|(m, _)| self.models.is_empty() || self.models.contains(m))
            .collect()
    }
}

/// Predicts the rows of the cells (op, model, size, dtype) `keep` accepts for
/// a device with `caps`; cells the device cannot run untiled are also
/// returned as "model op size dtype policy: reason" lines. A
/// `decode_tiled` cell needs its model's `decode` cell at some size for the
/// weights of its budget. A decode that exceeds a device limit untiled is
/// predicted with `--tile auto` instead (its `note` says so); a cell that
/// cannot be predicted at all gets rows with NaN figures and the reason.
pub fn predict_cells(
    caps: &Capabilities,
    pytorch: &[PytorchRow],
    keep: impl Fn(&str, &str, usize, &str) -> bool,
) -> Result<(Vec<Row>, Vec<String>)> {
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for op in OPS {
        for (model, preset) in MODELS {
            for size in SIZES {
                for (dtype, precision, bytes) in DTYPES {
                    if !keep(op, model, size, dtype) {
                        continue;
                    }
                    let py = pytorch.iter().find(|r| {
                        r.model == model && r.op == op && r.size == size && r.dtype == dtype
                    });
                    // Tiled rows: ours exact within PyTorch's tiled peak plus our weights.
                    let tiled_budget = match (op, py) {
                        ("decode_tiled", None) => continue,
                        ("decode_tiled", Some(py)) => {
                            let Some(untiled) = rows.iter().find(|r: &&Row| {
                                r.op == "decode"
                                    && r.model == model
                                    && r.dtype == dtype
                                    && !r.weights_mib.is_nan()
                            }) else {
                                continue;
                            };
                            ((untiled.weights_mib + py.allocated_mib) * MIB) as u64
                        }
                        _ => 0,
                    };
                    for policy in [Policy::Caching, Policy::Planned, Policy::Exact] {
                        let (spec, load, latent) = preset_decode(preset, size, precision);
                        let estimate = match op {
                            "decode" => Estimate::new(caps, policy, &spec, &load).decode(latent),
                            "decode_tiled" => Estimate::new(caps, policy, &spec, &load)
                                .tiled(&Tiling::exact().with_max_memory(tiled_budget))
                                .decode(latent),
                            _ => {
                                Estimate::new(caps, policy, &spec, &load).encode([1, 3, size, size])
                            }
                        };
                        let too_large = |e: &Error| {
                            matches!(
                                e,
                                Error::BindingTooLarge { .. } | Error::BufferTooLarge { .. }
                            )
                        };
                        let mut note = String::new();
                        let estimate = match estimate {
                            Err(e) if op == "decode" && too_large(&e) => {
                                note = format!("tiled (--tile auto): untiled, {e}");
                                failed.push(format!(
                                    "{model} {op} {size}² {dtype} {}: {e}",
                                    policy.name()
                                ));
                                Estimate::new(caps, policy, &spec, &load)
                                    .tiled(&Tiling::default())
                                    .decode(latent)
                            }
                            other => other,
                        };
                        let e = match estimate {
                            Ok(e) => e,
                            Err(e) if too_large(&e) => {
                                rows.push(Row {
                                    pytorch_allocated_mib: py.map(|r| r.allocated_mib),
                                    pytorch_reserved_mib: py.map(|r| r.reserved_mib),
                                    host_parked_mib: f64::NAN,
                                    note: format!("{note} {e}").trim().to_string(),
                                    ..Row::new(
                                        (model, op, size),
                                        (dtype, bytes),
                                        policy,
                                        "not predicted".into(),
                                        [f64::NAN; 3],
                                    )
                                });
                                continue;
                            }
                            Err(e) => return Err(e),
                        };
                        let weights = e.weights_bytes as f64 / MIB;
                        let alloc = e.peak_allocated_bytes as f64 / MIB;
                        let reserved = e.peak_reserved_bytes as f64 / MIB;
                        rows.push(Row {
                            pytorch_allocated_mib: py.map(|r| r.allocated_mib),
                            pytorch_reserved_mib: py.map(|r| r.reserved_mib),
                            working_vs_pytorch: py.map(|r| (alloc - weights) / r.allocated_mib),
                            host_parked_mib: e.tiling.host_parked_peak_bytes as f64 / MIB,
                            tile_px: e.tiling.tile_size.filter(|_| e.tiling.mode == "exact"),
                            note,
                            ..Row::new(
                                (model, op, size),
                                (dtype, bytes),
                                policy,
                                "predicted".into(),
                                [weights, alloc, reserved],
                            )
                        });
                    }
                }
            }
        }
    }
    Ok((rows, failed))
}

/// The spec, load options and latent shape of a `size`² decode of `preset`.
fn preset_decode(
    preset: &str,
    size: usize,
    precision: Precision,
) -> (String, LoadOptions, [usize; 4]) {
    let channels = if preset == "flux1" { 16 } else { 4 };
    let load = LoadOptions {
        precision,
        ..Default::default()
    };
    (
        format!("preset:{preset}"),
        load,
        [1, channels, size / 8, size / 8],
    )
}

/// Sizes (pixels per side) of the rows measured on this machine's device.
pub const MEASURED_SIZES: [usize; 1] = [128];

/// Decodes each preset at `sizes` (f32 and f16, each policy) for real on
/// `ctx`'s device and returns, per cell, the estimator's row for that
/// device ("predicted (`<device>` limits)") and the measured one ("measured
/// on `<device>`"); the measured row's note says whether they agree.
pub fn measure(
    ctx: &wgvae::gpu::Context,
    models: &[(&str, &str)],
    sizes: &[usize],
) -> Result<Vec<Row>> {
    let device = ctx.caps().adapter_name.clone();
    let mut rows = Vec::new();
    for &(model, preset) in models {
        for &size in sizes {
            for (dtype, precision, bytes) in DTYPES.into_iter().take(2) {
                for policy in [Policy::Caching, Policy::Planned, Policy::Exact] {
                    let (spec, load, shape) = preset_decode(preset, size, precision);
                    let pctx = ctx.with_pool(policy.new_pool());
                    let vae = wgvae::models::Vae::load(&pctx, &spec, &load)?;
                    let z = wgvae::io::HostTensor::new(
                        shape.to_vec(),
                        wgvae::seeded::uniform(shape.iter().product(), 7, 0.5),
                    )?;
                    let opts = wgvae::DecodeOptions {
                        raw_latents: true,
                        tiling: Tiling::off(),
                        ..Default::default()
                    };
                    let real = wgvae::decode(&pctx, &vae, &z, &opts)?;
                    let est = Estimate::new(ctx.caps(), policy, &spec, &load).decode(shape)?;
                    let row =
                        |source: String, weights: u64, alloc: u64, reserved: u64, note: String| {
                            let mib = [weights, alloc, reserved].map(|b| b as f64 / MIB);
                            let cell = (model, "decode", size);
                            Row {
                                note,
                                ..Row::new(cell, (dtype, bytes), policy, source, mib)
                            }
                        };
                    let (ma, mr) = (
                        real.memory.allocated_bytes.peak,
                        real.memory.reserved_bytes.peak,
                    );
                    let agree = est.peak_allocated_bytes == ma
                        && est.peak_reserved_bytes == mr
                        && est.weights_bytes == vae.weights_bytes();
                    rows.push(row(
                        format!("predicted ({device} limits)"),
                        est.weights_bytes,
                        est.peak_allocated_bytes,
                        est.peak_reserved_bytes,
                        String::new(),
                    ));
                    rows.push(row(
                        format!("measured on {device}"),
                        vae.weights_bytes(),
                        ma,
                        mr,
                        if agree {
                            "estimate == measured (bytes)".into()
                        } else {
                            format!(
                                "ESTIMATE DIFFERS: predicted {} / {} B allocated / reserved",
                                est.peak_allocated_bytes, est.peak_reserved_bytes
                            )
                        },
                    ));
                }
            }
        }
    }
    Ok(rows)
}

/// Writes `memory.csv`, `memory.md` and `memory_<model>.svg` into `out`
/// for the cells `only` keeps; with `measure_on`, also rows measured on that context's device at
/// [`MEASURED_SIZES`] (see [`measure`]).
pub fn write_report(
    caps: &Capabilities,
    reference: Option<&Path>,
    header: &str,
    out: &Path,
    measure_on: Option<&wgvae::gpu::Context>,
    only: &Selection,
) -> Result<Vec<Row>> {
    create_dir(out)?;
    let pytorch = match reference {
        Some(p) => read_pytorch(p)?,
        None => Vec::new(),
    };
    let (mut rows, failed) =
        predict_cells(caps, &pytorch, |_, model, size, _| only.keeps(model, size))?;
    if let Some(ctx) = measure_on {
        rows.extend(measure(ctx, &only.models(), &MEASURED_SIZES)?);
    }
    write(&out.join("memory.csv"), &csv(&rows))?;
    let mut header = header.to_string();
    if reference.is_none() {
        header += "\n\nThe PyTorch reference CSV was not found: its columns are empty.";
    }
    let md = markdown(&rows, &failed, &header) + "\n" + &measured_markdown(&rows);
    write(&out.join("memory.md"), &md)?;
    for (model, _) in only.models() {
        plot(
            &rows,
            model,
            &out.join(format!("memory_{}.svg", model.to_lowercase())),
        )?;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::tables::get;
    use super::*;
    use wgvae::testing::shared_dir;

    fn pytorch() -> Option<Vec<PytorchRow>> {
        let path = shared_dir()?.join("reference/pytorch_vae_memory_rtx4090.csv");
        Some(read_pytorch(&path).expect("reference CSV parses"))
    }

    #[test]
    fn read_pytorch_errors_on_short_rows_and_keeps_duplicates_in_order() {
        let path = Path::new("test.csv");
        let head = "model,op,height,width,dtype,allocated_mib,reserved_mib,time_s\n";
        let text = format!(
            "{head}SD1.5,decode,512,512,float32,962.36,1532.00,0.06\n\
             SD1.5,decode,512,768,float32,1.0,2.0,0.1\n\
             SD1.5,decode,512,512,float32,962.36,1554.00,0.06\n"
        );
        let rows = parse_pytorch(path, &text).unwrap();
        assert_eq!(rows.len(), 2, "non-square skipped, duplicates kept");
        assert_eq!(
            rows[0].reserved_mib, 1532.0,
            "file order: the first is first"
        );
        let short = format!("{head}SD1.5,decode,512,512,float32,962.36\n");
        let err = parse_pytorch(path, &short).unwrap_err().to_string();
        assert!(
            err.contains("line 2") && err.contains("fewer than 7"),
            "{err}"
        );
        let bad = format!("{head}SD1.5,decode,512,512,float32,x,1.0\n");
        assert!(parse_pytorch(path, &bad).is_err());
    }

    /// The targets on the reference GPU (the limits the report uses):
    /// FLUX.1 f16 1024² planned working memory ≤ 50 % of PyTorch's, planned
    /// reserved/allocated ≤ 1.02 and caching > 1 on a sample of rows, and the
    /// f32 2048² decode (a 4 GiB tensor over the binding limit) predicted
    /// tiled, marked so, within the default budget.
    #[test]
    fn report_rows_meet_the_targets_on_reference_limits() {
        let Some(py) = pytorch() else { return };
        let caps = Capabilities::reference_gpu();
        let sample = [
            ("decode", "FLUX", 1024, "float16"),
            ("decode", "SD1.5", 512, "float32"),
            ("decode", "SD1.5", 2048, "float32"),
            ("encode", "SDXL", 768, "bfloat16"),
        ];
        let (rows, failed) = predict_cells(&caps, &py, |op, m, size, d| {
            sample.contains(&(op, m, size, d))
        })
        .unwrap();
        assert_eq!(rows.len(), 3 * sample.len(), "one row per policy and cell");
        let flux = get(&rows, ("decode", "FLUX", "float16"), 1024, "planned").unwrap();
        let working = flux.peak_allocated_mib - flux.weights_mib;
        assert_eq!(flux.pytorch_allocated_mib, Some(2178.5));
        assert!(
            working <= 0.5 * 2178.5,
            "FLUX f16 1024² working memory {working:.1} MiB > 50 % of PyTorch's 2178.5"
        );
        for r in &rows {
            assert!(!r.peak_allocated_mib.is_nan(), "{r:?}");
            // The tiled fallback's plan (greedy) leaves ~10 % slack
            // (9.80 GB arena for 8.86 GB live at SD1.5 f32 2048²): not held
            // to the 1.02 target, which is about untiled decodes.
            match r.policy.as_str() {
                "planned" if r.note.is_empty() => {
                    assert!(r.reserved_over_allocated <= 1.02, "{r:?}")
                }
                "exact" => assert!(r.reserved_over_allocated <= 1.0, "{r:?}"),
                "caching" => assert!(r.reserved_over_allocated > 1.0, "{r:?}"),
                _ => {}
            }
        }
        let tiled = get(&rows, ("decode", "SD1.5", "float32"), 2048, "planned").unwrap();
        assert!(
            tiled.tile_px.is_some() && tiled.note.starts_with("tiled"),
            "{tiled:?}"
        );
        assert!(
            tiled.peak_allocated_mib * MIB <= wgvae::tiling::default_max_memory(&caps) as f64,
            "{tiled:?}"
        );
        assert_eq!(failed.len(), 3, "{failed:?}");
        let text = csv(&rows);
        assert!(text.contains(",\"tiled (--tile auto): untiled, "));
        assert!(text.contains(",planned,\"predicted\","), "source quoted");
    }

    /// Rows measured on the test device agree with the estimator's to the
    /// byte (SD1.5 preset at 64², f32 and f16, every policy).
    #[test]
    fn measured_rows_equal_their_predictions() {
        let ctx = wgvae::testing::test_context();
        let rows = measure(&ctx, &[("SD1.5", "sd15")], &[64]).unwrap();
        let sd: Vec<&Row> = rows.iter().collect();
        assert_eq!(
            sd.len(),
            2 * 2 * 3,
            "predicted + measured, 2 dtypes, 3 policies"
        );
        for pair in sd.chunks(2) {
            let (p, m) = (pair[0], pair[1]);
            assert!(m.source.starts_with("measured on "), "{m:?}");
            assert_eq!(m.note, "estimate == measured (bytes)", "{m:?}");
            assert_eq!(p.peak_allocated_mib, m.peak_allocated_mib);
            assert_eq!(p.peak_reserved_mib, m.peak_reserved_mib);
        }
        assert!(measured_markdown(&rows).contains("estimate == measured"));
    }

    /// The committed report (assets/reports/memory/memory.csv) has a row per
    /// policy for every square (model, op, size, dtype) PyTorch measured,
    /// each with figures or a reason; planned rows keep reserved/allocated ≤ 1.02.
    #[test]
    fn committed_report_csv_covers_every_pytorch_row() {
        let Some(py) = pytorch() else { return };
        let path = wgvae::testing::project_dir().join("assets/reports/memory/memory.csv");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(header.last(), Some(&"note"), "regenerate the report");
        let ours: Vec<Vec<String>> = lines
            .map(|l| l.splitn(header.len(), ',').map(String::from).collect())
            .collect();
        for p in &py {
            for policy in ["caching", "planned", "exact"] {
                let row = ours.iter().find(|f| {
                    f[0] == p.model
                        && f[1] == p.op
                        && f[2] == p.size.to_string()
                        && f[3] == p.dtype
                        && f[4] == policy
                });
                let row = row.unwrap_or_else(|| {
                    panic!(
                        "no {policy} row for {} {} {} {}",
                        p.model, p.op, p.size, p.dtype
                    )
                });
                let has_figures = !row[7].is_empty();
                let note = &row[16];
                assert!(
                    has_figures || note.len() > 2,
                    "{row:?}: no figures, no reason"
                );
                if has_figures && policy == "planned" && note == "\"\"" {
                    let ratio: f64 = row[9].parse().unwrap();
                    assert!(ratio <= 1.02, "{row:?}");
                }
            }
        }
    }
}
