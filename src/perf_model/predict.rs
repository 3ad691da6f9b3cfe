//! The roofline prediction of one layer on one GPU and path ([`predict`]),
//! and the sums of a decode's layers ([`Totals`], [`predict_all`]).

use serde::Serialize;

use super::{
    ceil_div, occupancy, round_up, GpuSpec, InputReads, Layer, LayerKind, Occupancy, PathKind,
    Tile, Tiles, Work,
};

/// What bounds a layer's modelled time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// The FLOP term.
    Compute,
    /// The bytes term.
    Bandwidth,
    /// Too few workgroups: most slots of the quantised waves idle.
    Latency,
}

impl Bound {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Bandwidth => "bandwidth",
            Bound::Latency => "latency",
        }
    }
}

/// The model's prediction for one layer on one GPU and path.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    /// The tile (`None` for a pass).
    pub tile: Option<Tile>,
    /// Occupancy (`None` for a pass).
    pub occupancy: Option<Occupancy>,
    /// Useful FLOPs.
    pub flops: f64,
    /// FLOPs of whole tiles (what the time is charged).
    pub exec_flops: f64,
    /// Weight (A operand) bytes read.
    pub weight_bytes: f64,
    /// Input (B operand) bytes read.
    pub input_bytes: f64,
    /// Output bytes written.
    pub output_bytes: f64,
    /// Residual and prologue bytes read.
    pub extra_bytes: f64,
    /// All of the above.
    pub bytes: f64,
    /// Each tensor once (perfect cache reuse).
    pub unique_bytes: f64,
    /// Useful FLOPs per byte moved.
    pub intensity: f64,
    /// Workgroups dispatched.
    pub workgroups: u64,
    /// Waves of `SMs × wg_per_SM` workgroups.
    pub waves: u64,
    /// `workgroups / (waves · slots)`.
    pub wave_efficiency: f64,
    /// Executed FLOPs / peak, seconds.
    pub compute_s: f64,
    /// Bytes / bandwidth, seconds.
    pub memory_s: f64,
    /// The roofline time corrected for waves, seconds.
    pub time_s: f64,
    /// The same with [`Prediction::unique_bytes`], seconds.
    pub time_reuse_s: f64,
    /// `(compute + memory) · q`: no overlap, seconds.
    pub time_serial_s: f64,
    /// What bounds it.
    pub bound: Bound,
}

/// The model's prediction for `layer` on `gpu` with `path`'s `tiles`
/// (`None`: the tile does not fit the GPU's shared memory).
pub fn predict(layer: &Layer, gpu: &GpuSpec, tiles: &Tiles, path: PathKind) -> Option<Prediction> {
    let g = match &layer.work {
        Work::Pass(p) => {
            let bytes = p.elements as f64 * tiles.act_bytes as f64 * (p.reads + p.writes) as f64;
            let t = bytes / gpu.bandwidth;
            return Some(Prediction {
                tile: None,
                occupancy: None,
                flops: 0.0,
                exec_flops: 0.0,
                weight_bytes: 0.0,
                input_bytes: p.elements as f64 * tiles.act_bytes as f64 * p.reads as f64,
                output_bytes: p.elements as f64 * tiles.act_bytes as f64 * p.writes as f64,
                extra_bytes: 0.0,
                bytes,
                unique_bytes: bytes,
                intensity: 0.0,
                workgroups: 0,
                waves: 0,
                wave_efficiency: 1.0,
                compute_s: 0.0,
                memory_s: t,
                time_s: t,
                time_reuse_s: t,
                time_serial_s: t,
                bound: Bound::Bandwidth,
            });
        }
        Work::Gemm(g) => g,
    };
    let tile = tiles.pick(path, g.m());
    let occ = occupancy(gpu, &tile);
    if occ.wg_per_sm == 0 {
        return None;
    }
    let (m, n, kdim, frames) = (g.m(), g.n(), g.kdim(), g.frames);
    let m_tiles = ceil_div(m, tile.bm);
    let n_tiles = ceil_div(n, tile.bn);
    let columns = (n_tiles * frames) as f64;
    let workgroups = (m_tiles * n_tiles * frames) as u64;
    let ab = tiles.act_bytes as f64;
    let wb = tiles.weight_bytes as f64;
    let window = (g.cin * g.window(tile.bn, tiles.patch_cols)) as f64 * ab;
    let weight_bytes = columns * (m * kdim) as f64 * wb;
    let input_bytes = match g.input {
        InputReads::PerWorkgroup => workgroups as f64 * window,
        InputReads::PerColumn => columns * window,
        InputReads::None => 0.0,
    };
    let out_elems = (m * n * frames) as f64;
    let output_bytes = if g.writes_output { out_elems * ab } else { 0.0 };
    let residual_bytes = if g.residual { out_elems * ab } else { 0.0 };
    let prologue_bytes = if g.prologue {
        workgroups as f64 * (g.cin * 2 * 4) as f64
    } else {
        0.0
    };
    let extra_bytes = residual_bytes + prologue_bytes;
    let bytes = weight_bytes + input_bytes + output_bytes + extra_bytes;
    let a_copies = if g.a_per_frame { frames } else { 1 };
    let unique_bytes = (m * kdim * a_copies) as f64 * wb
        + if g.input == InputReads::None {
            0.0
        } else {
            (g.cin * g.hi * g.wi * frames) as f64 * ab
        }
        + output_bytes
        + residual_bytes;
    let flops = g.flops();
    let exec_flops = 2.0
        * (m_tiles * tile.bm) as f64
        * (n_tiles * tile.bn) as f64
        * round_up(kdim, tile.bk) as f64
        * frames as f64;
    let slots = gpu.sms as u64 * occ.wg_per_sm as u64;
    let waves = workgroups.div_ceil(slots);
    let wave_efficiency = workgroups as f64 / (waves * slots) as f64;
    let q = 1.0 / wave_efficiency;
    let compute_s = exec_flops / gpu.peak(path);
    let memory_s = bytes / gpu.bandwidth;
    let bound = if wave_efficiency < 0.5 {
        Bound::Latency
    } else if memory_s > compute_s {
        Bound::Bandwidth
    } else {
        Bound::Compute
    };
    Some(Prediction {
        tile: Some(tile),
        occupancy: Some(occ),
        flops,
        exec_flops,
        weight_bytes,
        input_bytes,
        output_bytes,
        extra_bytes,
        bytes,
        unique_bytes,
        intensity: flops / bytes,
        workgroups,
        waves,
        wave_efficiency,
        compute_s,
        memory_s,
        time_s: compute_s.max(memory_s) * q,
        time_reuse_s: compute_s.max(unique_bytes / gpu.bandwidth) * q,
        time_serial_s: (compute_s + memory_s) * q,
        bound,
    })
}

/// Sums of a decode's predictions.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    /// Rows summed.
    pub layers: usize,
    /// Useful FLOPs.
    pub flops: f64,
    /// Bytes moved (tile model).
    pub bytes: f64,
    /// Bytes with perfect reuse.
    pub unique_bytes: f64,
    /// Roofline time, seconds.
    pub time_s: f64,
    /// Roofline time with perfect reuse, seconds.
    pub time_reuse_s: f64,
    /// No-overlap time, seconds.
    pub time_serial_s: f64,
    /// Time of the bandwidth-bound rows (passes included), seconds.
    pub bandwidth_bound_s: f64,
    /// Time of the latency-bound rows, seconds.
    pub latency_bound_s: f64,
    /// Time of the passes (norms), seconds.
    pub pass_s: f64,
    /// Time of the attention matmuls (QKᵀ and PV), seconds.
    pub attention_s: f64,
}

impl Totals {
    /// Adds one row.
    pub fn add(&mut self, layer: &Layer, p: &Prediction) {
        self.layers += 1;
        self.flops += p.flops;
        self.bytes += p.bytes;
        self.unique_bytes += p.unique_bytes;
        self.time_s += p.time_s;
        self.time_reuse_s += p.time_reuse_s;
        self.time_serial_s += p.time_serial_s;
        match p.bound {
            Bound::Bandwidth => self.bandwidth_bound_s += p.time_s,
            Bound::Latency => self.latency_bound_s += p.time_s,
            Bound::Compute => {}
        }
        match layer.kind {
            LayerKind::Pass => self.pass_s += p.time_s,
            LayerKind::AttnQk | LayerKind::AttnPv => self.attention_s += p.time_s,
            _ => {}
        }
    }

    /// Share of the time in bandwidth-bound rows, percent.
    pub fn bandwidth_bound_pct(&self) -> f64 {
        100.0 * self.bandwidth_bound_s / self.time_s.max(f64::MIN_POSITIVE)
    }

    /// Share of the time in latency-bound rows, percent.
    pub fn latency_bound_pct(&self) -> f64 {
        100.0 * self.latency_bound_s / self.time_s.max(f64::MIN_POSITIVE)
    }
}

/// Predictions of every layer and their sums (`None`: a tile does not fit).
pub fn predict_all(
    layers: &[Layer],
    gpu: &GpuSpec,
    tiles: &Tiles,
    path: PathKind,
) -> Option<(Vec<Prediction>, Totals)> {
    let mut totals = Totals::default();
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        let p = predict(l, gpu, tiles, path)?;
        totals.add(l, &p);
        out.push(p);
    }
    Some((out, totals))
}
