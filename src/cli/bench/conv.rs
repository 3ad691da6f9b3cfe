//! `wgvae bench conv`: the convolution tile sets a device can run, timed with GPU timestamps
//! on the layer classes of the SD1.5-style decoder: per class and candidate the median ms and
//! TFLOP/s, the table's default beside the best (conv.csv, conv.md, conv.json).

use std::path::{Path, PathBuf};

use serde::Serialize;
use wgvae::kernels::conv2d::sweep::{sd15_decoder_classes, ClassInputs, LayerClass, Timing};
use wgvae::kernels::conv2d::ConvTiles;
use wgvae::DType;

use crate::cli::context;
use crate::cli::report::bench::Metadata;
use crate::cli::report::{create_dir, table, write};

#[derive(clap::Args)]
pub(crate) struct ConvBenchArgs {
    /// Decode sizes whose layer classes are timed (pixels per side, multiples of 8).
    #[arg(long, default_value = "1024", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Storage and operand type: f16 (the cooperative-matrix path where the adapter has
    /// one) or f32 (the scalar path).
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Classes timed with every candidate (the heaviest by MACs per decode); the others get
    /// the table's entries and the best 3 candidates of these.
    #[arg(long, default_value_t = 3)]
    heavy: usize,
    /// Every candidate on every class.
    #[arg(long)]
    full: bool,
    /// Untimed calls per candidate before the timed ones (the first compiles the pipeline).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed calls per candidate (the median is reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Report folder (conv.csv, conv.md, conv.json), created if missing.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
    /// Print the report's JSON on stdout instead of the text table.
    #[arg(long)]
    json: bool,
}

impl ConvBenchArgs {
    pub(crate) fn out(&self) -> &Path {
        &self.out
    }
}

/// One row: a candidate on a class.
#[derive(Clone, Debug, Serialize)]
struct Row {
    size: usize,
    class: String,
    calls: usize,
    gmacs: f64,
    #[serde(flatten)]
    timing: Timing,
    /// The tile set the engine picks for this layer today.
    default: bool,
    /// The fastest candidate of the class.
    best: bool,
}

/// Per class: the default's and the best's time, and what the best would save per decode.
#[derive(Clone, Debug, Serialize)]
struct Summary {
    size: usize,
    class: String,
    calls: usize,
    default_tiles: String,
    default_ms: f64,
    default_tflops: f64,
    best_tiles: String,
    best_ms: f64,
    best_tflops: f64,
}

pub(crate) fn run(adapter: &crate::cli::DeviceArgs, a: &ConvBenchArgs) -> wgvae::Result<()> {
    let dtype = match a.dtype.as_str() {
        "f16" => DType::F16,
        "f32" => DType::F32,
        other => {
            return Err(wgvae::Error::InvalidInput(format!(
                "--dtype {other}: expected f16 or f32"
            )))
        }
    };
    if a.runs == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--runs 0: expected at least 1 timed call".into(),
        ));
    }
    let mut classes = Vec::new();
    for &s in &a.sizes {
        classes.push((s, sd15_decoder_classes(s)?));
    }
    let ctx = context(adapter)?;
    if dtype == DType::F16 && !ctx.caps().shader_f16 {
        return Err(wgvae::Error::Unsupported(format!(
            "--dtype f16 on {}: the adapter has no shader-f16; use --dtype f32",
            crate::cli::device(&ctx)
        )));
    }
    let matrices = dtype == DType::F16 && ctx.caps().matrix().is_some();
    let mut rows: Vec<Row> = Vec::new();
    let mut summary = Vec::new();
    for (size, classes) in &classes {
        // Candidate names ranked by their total time over the heavy classes.
        let mut heavy_total: Vec<(String, f64)> = Vec::new();
        for (i, class) in classes.iter().enumerate() {
            let (all, table) = candidates(&ctx, class, matrices);
            let default = all[0];
            let chosen: Vec<ConvTiles> = if a.full || i < a.heavy {
                all
            } else {
                let mut ranked = heavy_total.clone();
                ranked.sort_by(|x, y| x.1.total_cmp(&y.1));
                let top: Vec<&String> = ranked.iter().take(3).map(|r| &r.0).collect();
                all.into_iter()
                    .enumerate()
                    .filter(|(j, t)| *j < table || top.contains(&&t.name()))
                    .map(|(_, t)| t)
                    .collect()
            };
            let inputs = ClassInputs::new(&ctx, class, dtype)?;
            let mut timed = Vec::new();
            for t in chosen {
                let timing = inputs.time(&ctx, t, a.warmup, a.runs)?;
                if !a.json {
                    eprintln!(
                        "{size}² {:<22} {:<34} {:>9.3} ms {:>9.3} TFLOP/s",
                        class.name, timing.tiles, timing.median_ms, timing.tflops
                    );
                }
                timed.push(timing);
            }
            if i < a.heavy {
                for t in &timed {
                    match heavy_total.iter_mut().find(|h| h.0 == t.tiles) {
                        Some(h) => h.1 += t.median_ms * class.calls as f64,
                        None if i == 0 => {
                            heavy_total.push((t.tiles.clone(), t.median_ms * class.calls as f64))
                        }
                        None => {}
                    }
                }
                // A candidate missing from a heavy class cannot rank.
                heavy_total.retain(|h| timed.iter().any(|t| t.tiles == h.0));
            }
            let best = timed
                .iter()
                .min_by(|x, y| x.median_ms.total_cmp(&y.median_ms))
                .cloned();
            let def = timed.iter().find(|t| t.set == default).cloned();
            if let (Some(b), Some(d)) = (&best, &def) {
                summary.push(Summary {
                    size: *size,
                    class: class.name.clone(),
                    calls: class.calls,
                    default_tiles: d.tiles.clone(),
                    default_ms: d.median_ms,
                    default_tflops: d.tflops,
                    best_tiles: b.tiles.clone(),
                    best_ms: b.median_ms,
                    best_tflops: b.tflops,
                });
            }
            for t in timed {
                rows.push(Row {
                    size: *size,
                    class: class.name.clone(),
                    calls: class.calls,
                    gmacs: class.macs() as f64 / 1e9,
                    best: best.as_ref().is_some_and(|b| b.tiles == t.tiles),
                    default: t.set == default,
                    timing: t,
                });
            }
        }
    }
    let settings = format!(
        "sizes {:?}, dtype {}, {}, heavy {}, full {}, warm-up {}, runs {}{}",
        a.sizes,
        a.dtype,
        if matrices {
            ctx.caps()
                .matrix()
                .map_or(String::new(), |m| format!("matrices {m}"))
        } else {
            "scalar".into()
        },
        a.heavy,
        a.full,
        a.warmup,
        a.runs,
        crate::cli::bench::load_average()
    );
    let meta = Metadata::of(&ctx, settings);
    write_report(&a.out, &meta, &rows, &summary)?;
    let json = serde_json::json!({ "meta": meta, "summary": summary, "rows": rows });
    if a.json {
        println!("{json}");
    } else {
        print!("{}", summary_table(&summary));
        println!("report: {}", a.out.display());
    }
    Ok(())
}

/// The candidates of a class ([`ConvTiles::candidates`]: the engine's table entries first, the
/// one it picks on this adapter leading) and how many of them are table entries. Without
/// matrices (or for f32), the scalar candidates: those of a view of the caps without matrices.
fn candidates(ctx: &wgvae::Context, class: &LayerClass, matrices: bool) -> (Vec<ConvTiles>, usize) {
    let mut caps = ctx.caps().clone();
    if !matrices {
        caps.cooperative_matrix = None;
        caps.matrix_configs.clear();
    }
    let table = ConvTiles::matrix_table(&caps, class.cout, class.k)
        .into_iter()
        .filter(|t| t.check(&caps).is_ok())
        .count()
        .max(1);
    (ConvTiles::candidates(&caps, class.cout, class.k), table)
}

fn summary_table(summary: &[Summary]) -> String {
    table(
        "\n| size | class | calls | default | ms | TFLOP/s | best | ms | TFLOP/s | best / default |\n|---|---|---|---|---|---|---|---|---|---|\n",
        summary,
        |s| {
            format!(
                "| {} | {} | {} | {} | {:.3} | {:.3} | {} | {:.3} | {:.3} | {:.2} |\n",
                s.size,
                s.class,
                s.calls,
                s.default_tiles,
                s.default_ms,
                s.default_tflops,
                s.best_tiles,
                s.best_ms,
                s.best_tflops,
                s.best_ms / s.default_ms
            )
        },
    )
}

fn write_report(out: &Path, meta: &Metadata, rows: &[Row], sums: &[Summary]) -> wgvae::Result<()> {
    create_dir(out)?;
    let csv = meta.csv(
        "size,class,calls,gmacs,tiles,median_ms,min_ms,tflops,gpu_time,default,best\n",
        rows,
        |r| {
            format!(
                "{},\"{}\",{},{:.3},\"{}\",{:.4},{:.4},{:.3},{},{},{}\n",
                r.size,
                r.class,
                r.calls,
                r.gmacs,
                r.timing.tiles,
                r.timing.median_ms,
                r.timing.min_ms,
                r.timing.tflops,
                r.timing.gpu_time,
                r.default,
                r.best
            )
        },
    );
    write(&out.join("conv.csv"), &csv)?;
    let md = meta.markdown("Convolution tile sets")
        + "\nPer class: the tile set the engine picks (default) beside the fastest candidate; \
           every timed candidate is in conv.csv. Times are GPU timestamps where the adapter \
           has them (the `gpu_time` column).\n"
        + &summary_table(sums);
    write(&out.join("conv.md"), &md)?;
    let json = serde_json::json!({ "meta": meta, "summary": sums, "rows": rows });
    write(&out.join("conv.json"), &format!("{json:#}\n"))?;
    Ok(())
}
