//! Per-dispatch GPU timing from timestamp queries written inside the compute
//! pass (needs `TIMESTAMP_QUERY_INSIDE_PASSES`), aggregated per kernel.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::{Context, DispatchLabel};

/// Query slots per query set (wgpu's maximum).
const SET_SIZE: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// Timestamp query sets being filled by a recorder: two slots per dispatch.
pub struct Profiler {
    sets: Vec<wgpu::QuerySet>,
    used: u32,
    resolve: Option<(wgpu::Buffer, wgpu::Buffer)>,
}

/// One kernel's share of a profiled forward.
#[derive(Clone, Debug, Serialize)]
pub struct KernelTime {
    /// Kernel family and entry point.
    pub kernel: String,
    /// Dispatches of this kernel.
    pub calls: usize,
    /// GPU time over all its dispatches, in ms.
    pub total_ms: f64,
    /// Share of the total GPU time, in percent.
    pub percent: f64,
    /// 2·MACs / time (0 where MACs are not counted).
    pub gflops: f64,
}

/// Per-kernel GPU times of a forward, most expensive first.
#[derive(Clone, Debug, Serialize, Default)]
pub struct Profile {
    /// Per-kernel times, slowest first.
    pub kernels: Vec<KernelTime>,
    /// Sum of the dispatches' GPU times.
    pub gpu_ms: f64,
}

impl Profile {
    /// A text table: name, calls, total ms, % of total, GFLOP/s.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:>6} {:>11} {:>7} {:>9}\n",
            "kernel", "calls", "total ms", "%", "GFLOP/s"
        );
        for k in &self.kernels {
            let g = if k.gflops > 0.0 {
                format!("{:.2}", k.gflops)
            } else {
                "-".into()
            };
            s += &format!(
                "{:<28} {:>6} {:>11.2} {:>6.1}% {:>9}\n",
                k.kernel, k.calls, k.total_ms, k.percent, g
            );
        }
        s += &format!("{:<28} {:>6} {:>11.2}\n", "total (GPU)", "", self.gpu_ms);
        s
    }
}

impl Profiler {
    /// `None` when the device cannot write timestamps inside passes.
    pub fn new(ctx: &Context) -> Option<Profiler> {
        (ctx.caps().timestamp_inside_passes && !ctx.is_dry_run()).then(|| Profiler {
            sets: Vec::new(),
            used: 0,
            resolve: None,
        })
    }

    /// The query set and index for the next timestamp.
    pub(crate) fn next_slot(&mut self, ctx: &Context) -> (&wgpu::QuerySet, u32) {
        if self.used as usize >= self.sets.len() * SET_SIZE as usize {
            self.sets
                .push(ctx.device().create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("wgvae profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: SET_SIZE,
                }));
        }
        let i = self.used;
        self.used += 1;
        (&self.sets[(i / SET_SIZE) as usize], i % SET_SIZE)
    }

    /// Records the resolve of every written timestamp into a readable buffer.
    pub(crate) fn resolve(&mut self, ctx: &Context, encoder: &mut wgpu::CommandEncoder) {
        let bytes = (self.used as u64 * 8).max(8);
        let gpu = ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgvae profile resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgvae profile readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for (k, set) in self.sets.iter().enumerate() {
            let first = k as u32 * SET_SIZE;
            let n = self.used.saturating_sub(first).min(SET_SIZE);
            if n > 0 {
                encoder.resolve_query_set(set, 0..n, &gpu, first as u64 * 8);
            }
        }
        encoder.copy_buffer_to_buffer(&gpu, 0, &read, 0, bytes);
        self.resolve = Some((gpu, read));
    }

    /// After the submission completed: per-kernel times for `labels`
    /// (dispatch i wrote slots 2i and 2i+1).
    pub fn read(&self, ctx: &Context, labels: &[DispatchLabel]) -> Result<Profile> {
        let Some((_, read)) = &self.resolve else {
            return Ok(Profile::default());
        };
        let (tx, rx) = std::sync::mpsc::channel();
        read.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        ctx.wait_idle()?;
        rx.recv()
            .map_err(|e| Error::Readback(e.to_string()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        let ticks: Vec<u64> = {
            let view = read
                .slice(..)
                .get_mapped_range()
                .map_err(|e| Error::Readback(e.to_string()))?;
            bytemuck::pod_collect_to_vec(&view)
        };
        read.unmap();
        let period_ns = ctx.queue().get_timestamp_period() as f64;
        let mut per: BTreeMap<String, (usize, f64, u64)> = BTreeMap::new();
        let mut total = 0.0;
        for (i, l) in labels.iter().enumerate() {
            let (a, b) = (ticks.get(2 * i).copied(), ticks.get(2 * i + 1).copied());
            let (Some(a), Some(b)) = (a, b) else { break };
            let ms = b.saturating_sub(a) as f64 * period_ns / 1e6;
            total += ms;
            let e = per.entry(format!("{}::{}", l.family, l.entry)).or_default();
            e.0 += 1;
            e.1 += ms;
            e.2 += l.macs;
        }
        let mut kernels: Vec<KernelTime> = per
            .into_iter()
            .map(|(kernel, (calls, ms, macs))| KernelTime {
                kernel,
                calls,
                total_ms: ms,
                percent: if total > 0.0 { 100.0 * ms / total } else { 0.0 },
                gflops: if ms > 0.0 && macs > 0 {
                    2.0 * macs as f64 / (ms * 1e6)
                } else {
                    0.0
                },
            })
            .collect();
        kernels.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        Ok(Profile {
            kernels,
            gpu_ms: total,
        })
    }
}
