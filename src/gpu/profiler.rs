//! Per-dispatch GPU timing from timestamp queries written inside the compute
//! pass (needs `TIMESTAMP_QUERY_INSIDE_PASSES`), aggregated per kernel; copies
//! and clears recorded between passes are timed with encoder timestamps when
//! the device also has `TIMESTAMP_QUERY_INSIDE_ENCODERS`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::Result;
use crate::gpu::{Context, DispatchLabel};

/// Query slots per query set (wgpu's maximum).
const SET_SIZE: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// Timestamp query sets being filled by a recorder: two slots per timed
/// span (a dispatch, a copy or a clear), in the order of `spans`.
pub struct Profiler {
    sets: Vec<wgpu::QuerySet>,
    used: u32,
    resolve: Option<(wgpu::Buffer, wgpu::Buffer)>,
    /// What span i (slots 2i and 2i+1) timed: kernel name and MACs.
    spans: Vec<(String, u64)>,
    /// Copies and clears can be timed too (encoder timestamps).
    pub(crate) inside_encoders: bool,
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
    /// Multiply-accumulates of all calls (0 for copies and clears).
    pub macs: u64,
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

    /// A profile from per-kernel (calls, ms, MACs); percentages and GFLOP/s
    /// follow, most expensive first.
    fn from_totals(per: BTreeMap<String, (usize, f64, u64)>) -> Profile {
        let total: f64 = per.values().map(|v| v.1).sum();
        let mut kernels: Vec<KernelTime> = per
            .into_iter()
            .map(|(kernel, (calls, ms, macs))| KernelTime {
                kernel,
                calls,
                total_ms: ms,
                macs,
                percent: if total > 0.0 { 100.0 * ms / total } else { 0.0 },
                gflops: if ms > 0.0 && macs > 0 {
                    2.0 * macs as f64 / (ms * 1e6)
                } else {
                    0.0
                },
            })
            .collect();
        kernels.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        Profile {
            kernels,
            gpu_ms: total,
        }
    }

    /// Adds `other`'s kernels into this profile (several submissions of one
    /// decode, e.g. the steps of a tiled decode).
    pub fn merge(&mut self, other: &Profile) {
        let mut per: BTreeMap<String, (usize, f64, u64)> = BTreeMap::new();
        for k in self.kernels.iter().chain(&other.kernels) {
            let e = per.entry(k.kernel.clone()).or_default();
            e.0 += k.calls;
            e.1 += k.total_ms;
            e.2 += k.macs;
        }
        *self = Profile::from_totals(per);
    }
}

/// MACs and GPU times accumulated over the submissions of one decode.
#[derive(Clone, Debug, Default)]
pub(crate) struct SubmitStats {
    pub macs: u64,
    pub profile: Option<Profile>,
    /// Host time blocked on the device (waits, readbacks of parked tiles).
    pub wait_ms: f64,
}

impl SubmitStats {
    pub(crate) fn add(&mut self, labels: &[DispatchLabel], profile: Option<Profile>) {
        self.macs += labels.iter().map(|l| l.macs).sum::<u64>();
        if let Some(p) = profile {
            match self.profile.as_mut() {
                Some(acc) => acc.merge(&p),
                None => self.profile = Some(p),
            }
        }
    }
}

impl Profiler {
    /// `None` when the device cannot write timestamps inside passes.
    pub fn new(ctx: &Context) -> Option<Profiler> {
        (ctx.caps().timestamp_inside_passes && !ctx.is_null()).then(|| Profiler {
            sets: Vec::new(),
            used: 0,
            resolve: None,
            spans: Vec::new(),
            inside_encoders: ctx
                .device()
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS),
        })
    }

    /// Names the span whose two timestamps were just written.
    pub(crate) fn span(&mut self, kernel: String, macs: u64) {
        debug_assert_eq!(self.used as usize, 2 * (self.spans.len() + 1));
        self.spans.push((kernel, macs));
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

    /// After the submission completed: per-kernel (and per-copy) times.
    pub fn read(&self, ctx: &Context) -> Result<Profile> {
        let Some((_, read)) = &self.resolve else {
            return Ok(Profile::default());
        };
        let ticks: Vec<u64> = ctx.read_mapped(read, bytemuck::pod_collect_to_vec)?;
        let period_ns = ctx.queue().get_timestamp_period() as f64;
        let mut per: BTreeMap<String, (usize, f64, u64)> = BTreeMap::new();
        for (i, (kernel, macs)) in self.spans.iter().enumerate() {
            let (a, b) = (ticks.get(2 * i).copied(), ticks.get(2 * i + 1).copied());
            let (Some(a), Some(b)) = (a, b) else { break };
            let e = per.entry(kernel.clone()).or_default();
            e.0 += 1;
            e.1 += b.saturating_sub(a) as f64 * period_ns / 1e6;
            e.2 += macs;
        }
        Ok(Profile::from_totals(per))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(rows: &[(&str, usize, f64, u64)]) -> Profile {
        Profile::from_totals(
            rows.iter()
                .map(|&(k, calls, ms, macs)| (k.to_string(), (calls, ms, macs)))
                .collect(),
        )
    }

    #[test]
    fn merged_profiles_sum_calls_times_and_macs_per_kernel() {
        let mut a = profile(&[
            ("conv2d::conv2d", 2, 3.0, 3_000_000),
            ("copy::upload", 1, 1.0, 0),
        ]);
        let b = profile(&[
            ("conv2d::conv2d", 1, 2.0, 2_000_000),
            ("group_norm::partials", 4, 5.0, 0),
        ]);
        a.merge(&b);
        assert_eq!(a.gpu_ms, 11.0);
        let names: Vec<&str> = a.kernels.iter().map(|k| k.kernel.as_str()).collect();
        assert_eq!(
            names,
            ["conv2d::conv2d", "group_norm::partials", "copy::upload"]
        );
        let conv = &a.kernels[0];
        assert_eq!((conv.calls, conv.total_ms, conv.macs), (3, 5.0, 5_000_000));
        // 2 · 5e6 MACs in 5 ms = 2 GFLOP/s; shares of the merged total.
        assert!((conv.gflops - 2.0).abs() < 1e-9, "{}", conv.gflops);
        assert!((conv.percent - 100.0 * 5.0 / 11.0).abs() < 1e-9);
        assert_eq!(a.kernels[2].gflops, 0.0);
        assert!(a.table().contains("copy::upload"));
    }
}
