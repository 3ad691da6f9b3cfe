//! The memory report's CSV, Markdown tables, findings and charts.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Row, DTYPES, MODELS, OPS, SIZES};
use crate::cli::report::{line_chart, table};
use wgvae::error::Result;

pub(super) fn measured_markdown(rows: &[Row]) -> String {
    let measured: Vec<&Row> = rows
        .iter()
        .filter(|r| r.source.starts_with("measured"))
        .collect();
    let Some(first) = measured.first() else {
        return String::new();
    };
    let mut s = format!(
        "## Measured on this machine: {}\n\nReal decodes (preset weights, untiled) beside the estimator's prediction for the same device; every figure in bytes must agree.\n\n",
        first.source.trim_start_matches("measured on ")
    );
    s += "| model | size | dtype | policy | predicted alloc / reserved MiB | measured alloc / reserved MiB | |\n|---|---|---|---|---|---|---|\n";
    for m in measured {
        let Some(p) = rows.iter().find(|r| {
            r.source.starts_with("predicted (")
                && (&r.model, r.size, &r.dtype, &r.policy)
                    == (&m.model, m.size, &m.dtype, &m.policy)
        }) else {
            continue;
        };
        s += &format!(
            "| {} | {}² | {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {} |\n",
            m.model,
            m.size,
            m.dtype,
            m.policy,
            p.peak_allocated_mib,
            p.peak_reserved_mib,
            m.peak_allocated_mib,
            m.peak_reserved_mib,
            m.note
        );
    }
    s + "\n"
}

/// The CSV of `rows`; NaN figures are empty fields, `source` (a device
/// name may hold commas) and `note` are quoted.
pub(super) fn csv(rows: &[Row]) -> String {
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.2}"));
    let num = |x: f64, digits: usize| {
        if x.is_nan() {
            String::new()
        } else {
            format!("{x:.digits$}")
        }
    };
    table("model,op,size,dtype,policy,source,weights_mib,peak_allocated_mib,peak_reserved_mib,reserved_over_allocated,implied_constant,pytorch_allocated_mib,pytorch_reserved_mib,working_vs_pytorch,host_parked_mib,tile_px,note\n", rows, |r| {
        format!(
            "{},{},{},{},{},\"{}\",{},{},{},{},{},{},{},{},{},{},\"{}\"\n",
            r.model,
            r.op,
            r.size,
            r.dtype,
            r.policy,
            r.source,
            num(r.weights_mib, 2),
            num(r.peak_allocated_mib, 2),
            num(r.peak_reserved_mib, 2),
            num(r.reserved_over_allocated, 4),
            num(r.implied_constant, 0),
            opt(r.pytorch_allocated_mib),
            opt(r.pytorch_reserved_mib),
            r.working_vs_pytorch
                .map_or(String::new(), |x| format!("{x:.3}")),
            num(r.host_parked_mib, 2),
            r.tile_px.map_or(String::new(), |t| t.to_string()),
            r.note.replace('"', "\"\"")
        )
    })
}

pub(super) fn get<'a>(
    rows: &'a [Row],
    (op, model, dtype): (&str, &str, &str),
    size: usize,
    policy: &str,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.op == op && r.model == model && r.dtype == dtype && r.size == size && r.policy == policy
    })
}

pub(super) fn markdown(all_rows: &[Row], failed: &[String], header: &str) -> String {
    let predicted: Vec<Row> = all_rows
        .iter()
        .filter(|r| !r.peak_allocated_mib.is_nan() && r.source == "predicted")
        .cloned()
        .collect();
    let rows = &predicted[..];
    let mut s = format!(
        "# Decode and encode memory: wgvae pool policies vs PyTorch's caching allocator\n\n{header}\n\n"
    );
    s += "All wgvae figures are **predicted** by the estimator (a dry run of the real decode/encode code through the \
chosen pool; `wgvae memory` gives the same numbers, and CI checks that real decodes and encodes measure exactly what it predicts). \
PyTorch figures are the published RTX 4090 measurements (`torch.cuda.max_memory_allocated/reserved`), which \
exclude the weights; ours include them, and the working-memory column subtracts them (the planned row's own \
weights: the caching pool rounds the weight tensors into its segments, so its weights figure is larger, \
hence two weights figures). f16 and bf16 rows store \
weights and activations in 16 bits (arithmetic, GroupNorm statistics and softmax stay f32). `decode_tiled` \
rows: ours are exact tiled decodes (global GroupNorm statistics, output equal to the untiled decode) under \
`--max-memory` = PyTorch's tiled peak + our weights; PyTorch's are diffusers' blended 512-px tiles (with \
seams). Tiles waiting for statistics are parked on the device within the budget and in host memory beyond \
it (last column).\n\n";
    for (op, model, dtype) in OPS.into_iter().flat_map(|op| {
        MODELS
            .into_iter()
            .flat_map(move |(m, _)| DTYPES.map(|(d, _, _)| (op, m, d)))
    }) {
        let key = (op, model, dtype);
        if !rows
            .iter()
            .any(|r| r.op == op && r.model == model && r.dtype == dtype)
        {
            continue;
        }
        s += &format!("## {model} {op}, {dtype}\n\n");
        s += "| size | PyTorch alloc MiB | PyTorch reserved MiB | PyTorch res/alloc | wgvae weights MiB: caching / planned, exact | caching alloc / reserved MiB (ratio) | planned alloc / reserved MiB (ratio) | exact MiB | planned working vs PyTorch alloc | implied constant (planned) | tiles (planned): px, host-parked MiB |\n";
        s += "|---|---|---|---|---|---|---|---|---|---|---|\n";
        for size in SIZES {
            let (Some(c), Some(p), Some(e)) = (
                get(rows, key, size, "caching"),
                get(rows, key, size, "planned"),
                get(rows, key, size, "exact"),
            ) else {
                continue;
            };
            let py = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.1}"));
            let pyratio = match (c.pytorch_allocated_mib, c.pytorch_reserved_mib) {
                (Some(a), Some(r)) => format!("{:.2}", r / a),
                _ => "—".into(),
            };
            s += &format!(
                "| {size}² | {} | {} | {pyratio} | {:.1} / {:.1} | {:.1} / {:.1} ({:.3}) | {:.1} / {:.1} ({:.3}) | {:.1} | {} | {:.0} | {} |\n",
                py(c.pytorch_allocated_mib),
                py(c.pytorch_reserved_mib),
                c.weights_mib,
                p.weights_mib,
                c.peak_allocated_mib,
                c.peak_reserved_mib,
                c.reserved_over_allocated,
                p.peak_allocated_mib,
                p.peak_reserved_mib,
                p.reserved_over_allocated,
                e.peak_allocated_mib,
                p.working_vs_pytorch.map_or("—".into(), |x| format!("{:.0} %", x * 100.0)),
                p.implied_constant,
                match (p.tile_px, p.note.is_empty()) {
                    (None, _) => "untiled".to_string(),
                    (Some(t), true) => format!("{t}, {:.0}", p.host_parked_mib),
                    (Some(t), false) => format!("{t}, {:.0} (**tiled**: untiled exceeds the binding limit)", p.host_parked_mib),
                },
            );
        }
        s += "\n";
    }
    if !failed.is_empty() {
        s += "Not predictable untiled on this device (a single tensor exceeds a binding or buffer limit); these rows are predicted with `--tile auto` (exact tiles within the default budget) and marked **tiled** in the tables and in the CSV's `note` column:\n\n";
        for f in failed.iter().filter(|f| f.contains(" caching:")) {
            s += &format!("- {}\n", f.replace(" caching:", ":"));
        }
        s += "\n";
    }
    s += &findings(rows);
    s
}

fn findings(all: &[Row]) -> String {
    let enc: Vec<Row> = all.iter().filter(|r| r.op == "encode").cloned().collect();
    // Untiled decodes only: the tiled fallback rows would flatter the ranges.
    let rows: &[Row] = &all
        .iter()
        .filter(|r| r.op == "decode" && r.note.is_empty())
        .cloned()
        .collect::<Vec<_>>();
    let mut s = String::from("## Findings\n\n");
    // Resolution scaling: working memory per 2× pixels.
    for (model, _) in MODELS {
        let w = |size| {
            get(all, ("decode", model, "float32"), size, "planned")
                .filter(|r| r.note.is_empty())
                .map(|r| r.peak_allocated_mib - r.weights_mib)
        };
        if let (Some(a), Some(b)) = (w(1024), w(2048)) {
            s += &format!("- {model} decode: working memory grows {:.2}× from 1024² to 2048² (4× the pixels): it is linear in pixels, as PyTorch's is.\n", b / a);
        }
    }
    let ratios = |p: &str| -> (f64, f64) {
        let ratios = rows.iter().filter(|r| r.policy == p);
        span(ratios.map(|r| r.reserved_over_allocated)).unwrap_or((f64::MAX, 0.0))
    };
    let (clo, chi) = ratios("caching");
    let (plo, phi) = ratios("planned");
    let py = rows
        .iter()
        .filter(|r| r.policy == "planned")
        .filter_map(|r| Some(r.pytorch_reserved_mib? / r.pytorch_allocated_mib?));
    if let Some((lo, hi)) = span(py) {
        s += &format!(
            "- PyTorch's caching allocator reserves {lo:.2}–{hi:.2}× what it allocates on these decodes.\n"
        );
    }
    s += &format!(
        "- Our `caching` policy (the same CUDACachingAllocator rules, same decode) reserves {clo:.2}–{chi:.2}× allocated: the phenomenon reproduces. \
Why: every tensor over 10 MiB gets a segment of its own (rounded to 2 MiB) that stays cached after the tensor dies, and a cached \
segment can serve a later request only if it is at least as large. As the decoder widens the image block by block, each new, larger \
activation size needs fresh segments while the smaller cached ones sit idle; the large-pool split rule (remainders over 1 MiB) \
then fragments what is reused.\n"
    );
    s += &format!("- The `planned` policy reserves {plo:.3}–{phi:.3}× allocated: lifetimes are known before the decode runs, so reserved memory is the peak of live tensors.\n");
    for (dtype, _, _) in DTYPES {
        let vs = rows
            .iter()
            .filter(|r| r.policy == "planned" && r.dtype == dtype)
            .filter_map(|r| r.working_vs_pytorch);
        if let Some(p) = span(vs).map(percents) {
            s += &format!(
                "- Planned {dtype} decodes: working memory is {p} of PyTorch's allocated peak at the same dtype.\n"
            );
        }
    }
    if let Some(r) = get(all, ("decode", "FLUX", "float16"), 1024, "planned") {
        if let Some(py) = r.pytorch_allocated_mib {
            let working = r.peak_allocated_mib - r.weights_mib;
            s += &format!(
                "- Target: FLUX.1 decode 1024² float16, planned: working memory {working:.1} MiB = {:.1} % of PyTorch's {py:.1} MiB (goal ≤ 50 %), without tiling.\n",
                working / py * 100.0
            );
        }
    }
    for dtype in ["float16", "float32"] {
        let tiled = all
            .iter()
            .filter(|r| r.op == "decode_tiled" && r.policy == "planned" && r.dtype == dtype)
            .filter_map(|r| {
                Some((r.peak_allocated_mib - r.weights_mib) / r.pytorch_allocated_mib?)
            });
        if let Some(p) = span(tiled).map(percents) {
            s += &format!(
                "- Tiled {dtype} decodes: within a budget of PyTorch's tiled peak plus our weights, our exact tiles use {p} of the working memory of PyTorch's seamed tiles, with an output equal to the untiled decode (parked tiles in host memory: see the tables).\n"
            );
        }
    }
    let consts = rows
        .iter()
        .filter(|r| r.policy == "planned" && r.dtype == "float32")
        .map(|r| r.implied_constant);
    if let Some((lo, hi)) = span(consts) {
        s += &format!("- The implied working-memory constant `(peak − weights) / (H·W·4)` is {lo:.0}–{hi:.0} for planned decodes, against InvokeAI's rule of thumb of 2200 — a constant that our estimator makes unnecessary.\n");
    }
    let ev = enc
        .iter()
        .filter(|r| r.policy == "planned")
        .filter_map(|r| r.working_vs_pytorch);
    if let Some(p) = span(ev).map(percents) {
        s += &format!(
            "- Encode (planned): working memory is {p} of PyTorch's allocated peak (its SD1.5/SDXL encode rows at 1536² and 2048² are tiled by that pipeline, hence smaller).\n"
        );
    }
    s
}

pub(super) fn plot(rows: &[Row], model: &str, path: &Path) -> Result<()> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.model == model && r.op == "decode") {
        let mp = (r.size * r.size) as f64 / 1e6;
        if r.dtype == "float16" && r.policy == "planned" {
            series
                .entry("wgvae planned allocated, float16".into())
                .or_default()
                .push((mp, r.peak_allocated_mib));
        }
        if r.dtype != "float32" {
            continue;
        }
        series
            .entry(format!("wgvae {} allocated", r.policy))
            .or_default()
            .push((mp, r.peak_allocated_mib));
        if r.policy == "caching" {
            series
                .entry("wgvae caching reserved".into())
                .or_default()
                .push((mp, r.peak_reserved_mib));
            if let (Some(a), Some(res)) = (r.pytorch_allocated_mib, r.pytorch_reserved_mib) {
                series
                    .entry("PyTorch allocated (no weights)".into())
                    .or_default()
                    .push((mp, a));
                series
                    .entry("PyTorch reserved (no weights)".into())
                    .or_default()
                    .push((mp, res));
            }
        }
    }
    let series: Vec<(String, Vec<(f64, f64)>)> = series.into_iter().collect();
    line_chart(
        path,
        &format!("{model} decode: peak memory vs image size (float32 unless marked)"),
        ("megapixels", "MiB"),
        &series,
        &[],
    )
}

/// The smallest and the largest of `values` (the largest at least 0), or
/// `None` when there are none.
fn span(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let mut values = values.into_iter().peekable();
    values.peek()?;
    Some(values.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x))))
}

/// A span of ratios as percentages: `12–34 %`.
fn percents((lo, hi): (f64, f64)) -> String {
    format!("{:.0}–{:.0} %", lo * 100.0, hi * 100.0)
}
