//! `wgvae bench gpu-model`: the paper GPU model ([`wgvae::perf_model`]) of
//! every conv layer of the SD1.5, SDXL, FLUX.1 and Wan 2.1 decoders on an
//! H100 SXM and an RTX 4090, with and without matrix units — predicted, not
//! measured (no GPU needed: the decoders load on the null device) — beside
//! PyTorch's published decode times.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::json;
use wgvae::perf_model::{self, GpuSpec, Layer, PathKind, Prediction, Tiles, Totals, Workload};

use crate::cli::report::bench::{self as rb, Metadata};
use crate::cli::report::{create_dir, table, write};

#[derive(clap::Args)]
pub(crate) struct GpuModelArgs {
    /// Also print the per-layer table (always written to gpu_model_layers.csv).
    #[arg(long)]
    layers: bool,
    /// Print JSON (totals; with --layers, the rows too) instead of text.
    #[arg(long)]
    json: bool,
    /// Only these models (sd1.5, sdxl, flux.1, wan; any case, comma-separated).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Only these GPUs (h100, 4090; comma-separated).
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<String>,
    /// The matrix path's large tile, BMxBNxBK (default 128x128x32; the
    /// 64- and 16-row tiles for narrow layers stay).
    #[arg(long)]
    matrix_tile: Option<String>,
    /// Rows x columns of C one subgroup owns on the matrix path (default 64x32).
    #[arg(long)]
    matrix_subgroup: Option<String>,
    /// Report folder (gpu_model.csv, gpu_model.md, gpu_model_layers.csv).
    #[arg(long, default_value = "bench")]
    out: PathBuf,
    /// PyTorch's published RTX 4090 decode times (read, never copied; the
    /// column stays empty when the file is absent).
    #[arg(
        long,
        default_value = "../shared/reference/pytorch_vae_memory_rtx4090.csv"
    )]
    reference: PathBuf,
}

/// Published PyTorch decode times not in the reference CSV: (model, size,
/// device and setup, seconds). The brief's figures, kept as cited.
const PUBLISHED: [(&str, &str, &str, f64); 4] = [
    ("SD1.5", "512x512", "RTX 4090, diffusers eager (f16)", 0.031),
    (
        "SD1.5",
        "1024x1024",
        "RTX 4090, diffusers eager (f16)",
        0.148,
    ),
    ("FLUX.1", "1024x1024", "B200, torch.compile", 0.027),
    (
        "Wan 2.1",
        "720x1280x81f (5 s 720p; 2.3× this row's pixels)",
        "A800, bf16",
        9.26,
    ),
];

/// One line of the totals table.
#[derive(Clone, Debug, Serialize)]
struct TotalRow {
    model: &'static str,
    size: String,
    gpu: &'static str,
    path: &'static str,
    #[serde(flatten)]
    totals: Totals,
    /// PyTorch on an RTX 4090, f16 (reference CSV), seconds.
    pytorch_4090_f16_s: Option<f64>,
}

/// One line of the per-layer table.
#[derive(Clone, Debug, Serialize)]
struct LayerRow<'a> {
    model: &'static str,
    size: String,
    gpu: &'static str,
    path: &'static str,
    layer: &'a Layer,
    label: String,
    prediction: Prediction,
}

fn wanted(filter: &[String], names: &[&str]) -> bool {
    filter.is_empty()
        || filter.iter().any(|f| {
            let f = f.to_lowercase();
            names.iter().any(|n| n.to_lowercase().contains(&f))
        })
}

/// PyTorch's f16 decode seconds per (model, size) from the reference CSV
/// (`model,op,height,width,dtype,allocated_mib,reserved_mib,time_s`).
fn read_reference(path: &Path) -> Vec<(String, usize, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() < 8 || f[1] != "decode" || f[4] != "float16" || f[2] != f[3] {
                return None;
            }
            Some((f[0].to_string(), f[2].parse().ok()?, f[7].parse().ok()?))
        })
        .collect()
}

/// The reference CSV's label of a workload's model.
fn reference_label(model: &str) -> &str {
    match model {
        "FLUX.1" => "FLUX",
        m => m,
    }
}

/// `AxB` or `AxBxC` as numbers (`what` names the flag in errors).
fn dims<const N: usize>(what: &str, s: &str) -> wgvae::Result<[usize; N]> {
    let v: Vec<usize> = s
        .split(['x', 'X'])
        .map(|p| p.trim().parse().unwrap_or(0))
        .collect();
    v.try_into()
        .ok()
        .filter(|d: &[usize; N]| d.iter().all(|&x| x > 0 && x % 16 == 0))
        .ok_or_else(|| {
            wgvae::Error::InvalidInput(format!(
                "{what} `{s}`: expected {N} positive multiples of 16 separated by `x`"
            ))
        })
}

/// The engine's tiles with the flags' overrides.
fn tiles_of(a: &GpuModelArgs) -> wgvae::Result<Tiles> {
    let mut tiles = Tiles::default();
    if let Some(t) = &a.matrix_tile {
        let [bm, bn, bk] = dims("--matrix-tile", t)?;
        (tiles.matrix.bm_default, tiles.matrix.bn, tiles.matrix.bk) = (bm, bn, bk);
    }
    if let Some(t) = &a.matrix_subgroup {
        let [m, n] = dims("--matrix-subgroup", t)?;
        (tiles.matrix.sub_m, tiles.matrix.sub_n) = (m, n);
    }
    Ok(tiles)
}

pub(crate) fn run(a: &GpuModelArgs) -> wgvae::Result<()> {
    let tiles = tiles_of(a)?;
    let gpus: Vec<GpuSpec> = GpuSpec::all()
        .into_iter()
        .filter(|g| wanted(&a.gpus, &[g.name]))
        .collect();
    let workloads: Vec<Workload> = perf_model::workloads()?
        .into_iter()
        .filter(|w| wanted(&a.models, &[w.model]))
        .collect();
    if gpus.is_empty() || workloads.is_empty() {
        return Err(wgvae::Error::InvalidInput(format!(
            "--models {:?} / --gpus {:?} select nothing (models: SD1.5, SDXL, FLUX.1, Wan 2.1; GPUs: H100, 4090)",
            a.models, a.gpus
        )));
    }
    let reference = read_reference(&a.reference);
    let mut totals = Vec::new();
    let mut layer_rows = Vec::new();
    for w in &workloads {
        let torch = reference
            .iter()
            .find(|(m, s, _)| m == reference_label(w.model) && *s == w.height && w.frames == 1)
            .map(|r| r.2);
        for gpu in &gpus {
            for path in PathKind::ALL {
                let (preds, t) =
                    perf_model::predict_all(&w.layers, gpu, &tiles, path).ok_or_else(|| {
                        wgvae::Error::InvalidInput(format!(
                            "a {} tile does not fit one {} SM (registers or shared memory): {:?}",
                            path.name(),
                            gpu.name,
                            tiles.matrix
                        ))
                    })?;
                totals.push(TotalRow {
                    model: w.model,
                    size: w.size(),
                    gpu: gpu.name,
                    path: path.name(),
                    totals: t,
                    pytorch_4090_f16_s: torch,
                });
                for (layer, prediction) in w.layers.iter().zip(preds) {
                    layer_rows.push(LayerRow {
                        model: w.model,
                        size: w.size(),
                        gpu: gpu.name,
                        path: path.name(),
                        layer,
                        label: layer.label(),
                        prediction,
                    });
                }
            }
        }
    }
    let mut models: Vec<String> = workloads
        .iter()
        .map(|w| format!("{} {}", w.model, w.size()))
        .collect();
    models.dedup();
    let settings = format!(
        "paper GPU model (no device), decodes {models:?}, GPUs {:?}, tiles {}",
        gpus.iter().map(|g| g.name).collect::<Vec<_>>(),
        serde_json::to_string(&tiles).unwrap_or_default()
    );
    let meta = Metadata {
        adapter: "none: a model of H100 SXM / RTX 4090, not a measurement".into(),
        backend: "-".into(),
        device_type: "-".into(),
        driver: "-".into(),
        driver_info: "-".into(),
        wgpu_version: env!("WGVAE_WGPU_VERSION"),
        wgvae_version: env!("CARGO_PKG_VERSION"),
        git_commit: env!("WGVAE_GIT_COMMIT"),
        os: std::env::consts::OS,
        date_utc: rb::today_utc(),
        settings,
    };
    write_report(&a.out, &meta, &totals, &layer_rows, &gpus)?;
    let kernel = kernel_rows(&workloads, &tiles)?;
    write(
        &a.out.join("gpu_model_kernel.csv"),
        &meta.csv("model,size,design,conv_ms,convs\n", &kernel, |r| {
            format!(
                "{},{},\"{}\",{:.2},{}\n",
                r.model, r.size, r.design, r.conv_ms, r.convs
            )
        }),
    )?;
    if a.json {
        let mut v = json!({
            "model": "paper GPU model, not a measurement",
            "totals": totals,
            "kernel_estimate_h100": kernel,
        });
        if a.layers {
            v["layers"] = json!(layer_rows);
        }
        println!("{v}");
        return Ok(());
    }
    if a.layers {
        print!("{}", layers_markdown(&layer_rows));
        println!();
    }
    print!("{}", totals_markdown(&totals));
    println!();
    print!("{}", kernel_markdown(&kernel));
    println!(
        "MODEL, not a measurement. Wrote {0}/gpu_model.csv, {0}/gpu_model.md, {0}/gpu_model_layers.csv, {0}/gpu_model_kernel.csv",
        a.out.display()
    );
    Ok(())
}

/// One line of the kernel-estimate table: a decode's matrix-path convs on an H100 with one
/// kernel design.
#[derive(Clone, Debug, Serialize)]
struct KernelRow {
    model: &'static str,
    size: String,
    design: &'static str,
    conv_ms: f64,
    convs: usize,
}

/// The kernel-level estimate ([`perf_model::kernel`]) of every workload's convs on an H100
/// SXM, per kernel design.
fn kernel_rows(workloads: &[Workload], tiles: &Tiles) -> wgvae::Result<Vec<KernelRow>> {
    use perf_model::kernel::{conv_total, ConvDesign, SmRates};
    let (gpu, rates) = (GpuSpec::all().remove(0), SmRates::h100_sxm());
    let mut rows = Vec::new();
    for w in workloads {
        for d in ConvDesign::all() {
            let (s, convs) = conv_total(&w.layers, &gpu, &rates, tiles, &d).ok_or_else(|| {
                wgvae::Error::InvalidInput(format!(
                    "a matrix tile of {} does not fit one {} SM: {:?}",
                    d.name, gpu.name, tiles.matrix
                ))
            })?;
            rows.push(KernelRow {
                model: w.model,
                size: w.size(),
                design: d.name,
                conv_ms: ms(s),
                convs,
            });
        }
    }
    Ok(rows)
}

fn kernel_markdown(rows: &[KernelRow]) -> String {
    table(
        "Kernel-level estimate of the matrix-path convs on an H100 SXM (MODEL: matrix cycles, shared-memory wavefronts, issue slots and load latency per K step; docs/gpu-model.md)\n\n| model | size | kernel design | convs ms | convs |\n|---|---|---|---|---|\n",
        rows,
        |r| format!("| {} | {} | {} | {:.1} | {} |\n", r.model, r.size, r.design, r.conv_ms, r.convs),
    )
}

fn ms(s: f64) -> f64 {
    s * 1e3
}

fn totals_markdown(rows: &[TotalRow]) -> String {
    table(
        "| model | size | GPU | path | ms (roofline) | ms (perfect reuse) | ms (no overlap) | TFLOP | GB moved | GB unique | % time bandwidth-bound | % time latency-bound | attention QKᵀ+PV ms | norm passes ms | PyTorch RTX 4090 f16 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        rows,
        |r| {
            let t = &r.totals;
            format!(
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} | {:.2} | {} |\n",
                r.model,
                r.size,
                r.gpu,
                r.path,
                ms(t.time_s),
                ms(t.time_reuse_s),
                ms(t.time_serial_s),
                t.flops / 1e12,
                t.bytes / 1e9,
                t.unique_bytes / 1e9,
                t.bandwidth_bound_pct(),
                t.latency_bound_pct(),
                ms(t.attention_s),
                ms(t.pass_s),
                r.pytorch_4090_f16_s.map_or("—".into(), |s| format!("{:.0}", ms(s)))
            )
        },
    )
}

fn layers_markdown(rows: &[LayerRow]) -> String {
    table(
        "| model | size | GPU | path | section | op | layer | tile BM×BN×BK | wg/SM (limit) | warps/SM | workgroups | waves | wave eff. | GFLOP | MB moved | FLOP/B | compute µs | memory µs | time µs | bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        rows,
        |r| {
            let p = &r.prediction;
            let tile = p
                .tile
                .map_or("—".into(), |t| format!("{}×{}×{}", t.bm, t.bn, t.bk));
            let occ = p.occupancy.map_or("—".into(), |o| {
                format!("{} ({})", o.wg_per_sm, o.limiter.name())
            });
            let warps = p.occupancy.map_or("—".into(), |o| o.warps_per_sm.to_string());
            format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {} |\n",
                r.model,
                r.size,
                r.gpu,
                r.path,
                r.layer.section,
                r.layer.op,
                r.label,
                tile,
                occ,
                warps,
                p.workgroups,
                p.waves,
                p.wave_efficiency,
                p.flops / 1e9,
                p.bytes / 1e6,
                p.intensity,
                p.compute_s * 1e6,
                p.memory_s * 1e6,
                p.time_s * 1e6,
                p.bound.name()
            )
        },
    )
}

fn write_report(
    out: &Path,
    meta: &Metadata,
    totals: &[TotalRow],
    layers: &[LayerRow],
    gpus: &[GpuSpec],
) -> wgvae::Result<()> {
    create_dir(out)?;
    let csv = meta.csv(
        "model,size,gpu,path,ms,ms_perfect_reuse,ms_no_overlap,tflop,gb_moved,gb_unique,pct_time_bandwidth_bound,pct_time_latency_bound,attention_ms,norm_passes_ms,layers,pytorch_rtx4090_f16_ms\n",
        totals,
        |r| {
            let t = &r.totals;
            format!(
                "{},{},{},{},{:.4},{:.4},{:.4},{:.5},{:.4},{:.4},{:.1},{:.1},{:.4},{:.4},{},{}\n",
                r.model,
                r.size,
                r.gpu,
                r.path,
                ms(t.time_s),
                ms(t.time_reuse_s),
                ms(t.time_serial_s),
                t.flops / 1e12,
                t.bytes / 1e9,
                t.unique_bytes / 1e9,
                t.bandwidth_bound_pct(),
                t.latency_bound_pct(),
                ms(t.attention_s),
                ms(t.pass_s),
                t.layers,
                r.pytorch_4090_f16_s.map_or(String::new(), |s| format!("{:.1}", ms(s)))
            )
        },
    );
    write(&out.join("gpu_model.csv"), &csv)?;
    let layers_csv = meta.csv(
        "model,size,gpu,path,section,op,kind,label,bm,bn,bk,invocations,regs,smem_bytes,wg_per_sm,limiter,warps_per_sm,workgroups,waves,wave_efficiency,gflop,exec_gflop,mb_weights,mb_input,mb_output,mb_extra,mb_moved,mb_unique,flop_per_byte,compute_us,memory_us,time_us,time_perfect_reuse_us,time_no_overlap_us,bound\n",
        layers,
        |r| {
            let p = &r.prediction;
            let t = p.tile;
            let o = p.occupancy;
            let opt = |v: Option<usize>| v.map_or(String::new(), |v| v.to_string());
            format!(
                "{},{},{},{},{},{},{},\"{}\",{},{},{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.2},{:.3},{:.3},{:.3},{:.3},{:.3},{}\n",
                r.model,
                r.size,
                r.gpu,
                r.path,
                r.layer.section,
                r.layer.op,
                r.layer.kind.name(),
                r.label,
                opt(t.map(|t| t.bm)),
                opt(t.map(|t| t.bn)),
                opt(t.map(|t| t.bk)),
                opt(t.map(|t| t.invocations)),
                opt(t.map(|t| t.regs)),
                opt(t.map(|t| t.smem)),
                opt(o.map(|o| o.wg_per_sm as usize)),
                o.map_or("", |o| o.limiter.name()),
                opt(o.map(|o| o.warps_per_sm as usize)),
                p.workgroups,
                p.waves,
                p.wave_efficiency,
                p.flops / 1e9,
                p.exec_flops / 1e9,
                p.weight_bytes / 1e6,
                p.input_bytes / 1e6,
                p.output_bytes / 1e6,
                p.extra_bytes / 1e6,
                p.bytes / 1e6,
                p.unique_bytes / 1e6,
                p.intensity,
                p.compute_s * 1e6,
                p.memory_s * 1e6,
                p.time_s * 1e6,
                p.time_reuse_s * 1e6,
                p.time_serial_s * 1e6,
                p.bound.name()
            )
        },
    );
    write(&out.join("gpu_model_layers.csv"), &layers_csv)?;
    let mut md = meta.markdown("Paper GPU model of the decoders (a MODEL, not a measurement)");
    md += "\nPredicted by `wgvae bench gpu-model` from published peaks and the engine's tiles \
           (assumptions: the `wgvae::perf_model` docs and docs/gpu-model.md). \
           ms (roofline): max(FLOPs/peak, bytes/bandwidth) per layer with the tile traffic, \
           corrected for wave quantisation; perfect reuse: each tensor read once; no overlap: \
           compute + memory. matrix = f16 tensor cores with f32 accumulate, scalar = FP32 CUDA cores.\n\n";
    md += "| GPU | SMs | matrix TFLOP/s | FP32 TFLOP/s | GB/s | shared/SM KB | L2 MB |\n|---|---|---|---|---|---|---|\n";
    for g in gpus {
        md += &format!(
            "| {} | {} | {:.1} | {:.1} | {:.0} | {} | {} |\n",
            g.name,
            g.sms,
            g.matrix_flops / 1e12,
            g.fp32_flops / 1e12,
            g.bandwidth / 1e9,
            g.smem_per_sm / 1024,
            g.l2_bytes >> 20
        );
    }
    md += "\n## Totals per decode\n\n";
    md += &totals_markdown(totals);
    md += "\n## Published PyTorch decode times (measured elsewhere)\n\n| model | size | device, setup | ms |\n|---|---|---|---|\n";
    for (model, size, setup, s) in PUBLISHED {
        md += &format!("| {model} | {size} | {setup} | {:.0} |\n", ms(s));
    }
    md += "\nThe RTX 4090 f16 column of the totals comes from `pytorch_vae_memory_rtx4090.csv` (read at run time).\n";
    md += "\n## Per layer\n\nSee `gpu_model_layers.csv` (every row, every GPU and path).\n";
    write(&out.join("gpu_model.md"), &md)
}
