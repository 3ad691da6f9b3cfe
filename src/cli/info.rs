//! `wgvae info`: adapters, the chosen one, its features and limits.

use serde_json::json;
use wgvae::gpu::{Context, MatrixConfig};

use super::context;

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, as_json: bool) -> wgvae::Result<()> {
    let adapters: Vec<_> = Context::adapters(None)
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let info = a.get_info();
            json!({"index": i, "name": info.name, "backend": format!("{:?}", info.backend),
                   "type": format!("{:?}", info.device_type), "driver": info.driver,
                   "driver_info": info.driver_info,
                   "shader_f16": a.features().contains(wgpu::Features::SHADER_F16),
                   "cooperative_matrix": a.cooperative_matrix_properties().iter()
                       .map(|p| MatrixConfig::of(p).to_string()).collect::<Vec<_>>()})
        })
        .collect();
    let ctx = context(device_args)?;
    let c = ctx.caps();
    let chosen = json!({
        "name": c.adapter_name, "backend": format!("{:?}", c.backend), "type": format!("{:?}", c.device_type),
        "driver": c.driver, "driver_info": c.driver_info,
        "features": {"shader_f16": c.shader_f16, "timestamp_query": c.timestamp_query,
                     "timestamp_query_inside_passes": c.timestamp_inside_passes, "subgroup": c.subgroup,
                     "subgroup_min_size": c.subgroup_min_size, "subgroup_max_size": c.subgroup_max_size},
        "cooperative_matrix": {
            "configurations": c.matrix_configs.iter().map(|m| json!({
                "m": m.m, "n": m.n, "k": m.k, "ab": format!("{:?}", m.ab).to_lowercase(),
                "cr": format!("{:?}", m.cr).to_lowercase(), "name": m.to_string(),
                "usable": m.is_usable()})).collect::<Vec<_>>(),
            "used": c.cooperative_matrix.map(|m| m.to_string()),
        },
        "device_memory": c.device_memory,
        "default_max_memory": wgvae::tiling::default_max_memory(c),
        "limits": {"max_storage_buffer_binding_size": c.max_storage_buffer_binding_size,
                   "max_buffer_size": c.max_buffer_size,
                   "max_compute_workgroup_storage_size": c.max_compute_workgroup_storage_size,
                   "max_compute_invocations_per_workgroup": c.max_compute_invocations_per_workgroup,
                   "max_compute_workgroups_per_dimension": c.max_compute_workgroups_per_dimension,
                   "min_storage_buffer_offset_alignment": c.min_storage_buffer_offset_alignment},
    });
    if as_json {
        println!(
            "{}",
            json!({"wgvae": env!("CARGO_PKG_VERSION"), "adapters": adapters, "chosen": chosen,
                   "notice": ctx.notice()})
        );
        return Ok(());
    }
    println!("wgvae {}", env!("CARGO_PKG_VERSION"));
    println!("adapters:");
    for a in &adapters {
        println!(
            "  [{}] {} ({}, {}) driver {} {}{}",
            a["index"],
            a["name"].as_str().unwrap_or(""),
            a["backend"].as_str().unwrap_or(""),
            a["type"].as_str().unwrap_or(""),
            a["driver"].as_str().unwrap_or(""),
            a["driver_info"].as_str().unwrap_or(""),
            if a["shader_f16"] == true { ", f16" } else { "" }
        );
    }
    println!(
        "chosen: {} ({:?}, {:?})",
        c.adapter_name, c.backend, c.device_type
    );
    if let Some(n) = ctx.notice() {
        println!("notice: {n}");
    }
    println!(
        "features: shader_f16={} timestamp_query={} timestamp_inside_passes={} subgroup={}",
        c.shader_f16, c.timestamp_query, c.timestamp_inside_passes, c.subgroup
    );
    println!(
        "subgroups: {}..{} lanes",
        c.subgroup_min_size, c.subgroup_max_size
    );
    if c.matrix_configs.is_empty() {
        println!("cooperative matrices: none");
    } else {
        println!("cooperative matrices:");
        for m in &c.matrix_configs {
            println!(
                "  {m}{}{}",
                if m.is_usable() { " (usable)" } else { "" },
                if c.cooperative_matrix == Some(*m) {
                    " <- used for f16 models"
                } else {
                    ""
                }
            );
        }
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let budget = wgvae::tiling::default_max_memory(c);
    match c.device_memory {
        Some(m) => println!(
            "device memory: {:.2} GiB device-local heap{}; default --max-memory {:.2} GiB{}",
            gib(m.heap_bytes),
            m.budget_bytes
                .map(|b| format!(", {:.2} GiB available to this process", gib(b)))
                .unwrap_or_default(),
            gib(budget),
            if c.device_type == wgpu::DeviceType::DiscreteGpu {
                " (90 % of it)"
            } else {
                " (3/4 of max_buffer_size: not a discrete GPU)"
            }
        ),
        None => println!(
            "device memory: not reported; default --max-memory {:.2} GiB (3/4 of max_buffer_size)",
            gib(budget)
        ),
    }
    println!("limits:");
    for (k, v) in chosen["limits"].as_object().into_iter().flatten() {
        println!("  {k}: {v}");
    }
    Ok(())
}
