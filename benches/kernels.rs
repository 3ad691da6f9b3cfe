//! Kernel benchmarks: `cargo bench --bench kernels`.
//!
//! conv2d at VAE decoder shapes, the tiled implicit-GEMM kernel and the naive
//! one-output-per-invocation kernel (for the ratio), and GroupNorm (32 groups) at the same
//! activation shapes. GPU time comes from timestamp queries
//! written (by empty compute passes) around a batch of dispatches in one encoder when the
//! device has `TIMESTAMP_QUERY`, else from wall time around submit + wait (which is printed).
//! conv2d throughput is GFLOP/s = 2 * MACs / time (criterion's "elem/s" with one element per
//! FLOP) plus GB/s of its compulsory traffic (input + weights + output read/written once);
//! GroupNorm is memory-bound and reports GB/s of the bytes it moves (criterion's "B/s").
//! Attention has its own suite: `cargo bench --bench attention`.
//!
//! Environment:
//! - `WGVAE_BENCH_CONV_SHAPES`: comma-separated `CINxHxW->COUT[/K]` (batch 1, K 3 by default), e.g.
//!   `512x64x64->512,512x64x64->256/1`. Default: the three 3x3 decoder shapes.
//! - `WGVAE_BENCH_NORM_SHAPES`: comma-separated `CxHxW` for GroupNorm (batch 1, 32 groups).
//!   Default: `512x64x64,256x128x128,128x256x256`. `0` skips GroupNorm.
//! - `WGVAE_BENCH_NAIVE`: `0` skips the naive kernel, `criterion` measures it like the tiled one;
//!   by default one dispatch is timed (it takes minutes on a CPU adapter).
//! - `WGVAE_BENCH_FUSED=1`: also time the decoder's fused form (GroupNorm-affine + SiLU
//!   prologue and an in-place residual add).
//! - `WGVAE_CONV_TILES=tm,tn,tw,tk,rm,rn[,direct 0|1]`: tiles of the tiled kernel (default: the engine's choice).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use wgvae::gpu::Recorder;
use wgvae::kernels::conv2d::{
    conv2d, conv2d_naive, macs, output_size, Conv2dCall, Conv2dOptions, Conv2dWeights, ConvTiles,
    Prologue, PytorchConv,
};
use wgvae::kernels::Activation;
use wgvae::testing::{rand_vec, test_context};
use wgvae::{Context, DType, Tensor};

/// Dispatches recorded between two timestamps (one encoder).
const BATCH: u64 = 4;

#[derive(Clone, Copy, Debug)]
struct Shape {
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    k: usize,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{0}x{0} [1,{1},{2},{3}]->{4}",
            self.k, self.cin, self.h, self.w, self.cout
        )
    }
}

fn parse_shape(s: &str) -> Option<Shape> {
    let (input, rest) = s.trim().split_once("->")?;
    let (cout, k) = match rest.split_once('/') {
        Some((c, k)) => (c.parse().ok()?, k.parse().ok()?),
        None => (rest.parse().ok()?, 3),
    };
    let dims: Vec<usize> = input
        .split('x')
        .map(|d| d.parse().ok())
        .collect::<Option<_>>()?;
    let [cin, h, w] = dims[..] else { return None };
    Some(Shape { cin, h, w, cout, k })
}

fn shapes() -> Vec<Shape> {
    if std::env::var_os("WGVAE_BENCH_SIZES").is_some() {
        println!(
            "note: WGVAE_BENCH_SIZES is ignored here; conv shapes are WGVAE_BENCH_CONV_SHAPES"
        );
    }
    let spec = std::env::var("WGVAE_BENCH_CONV_SHAPES")
        .unwrap_or_else(|_| "512x64x64->512,256x128x128->256,128x256x256->128".into());
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            parse_shape(s).unwrap_or_else(|| panic!("WGVAE_BENCH_CONV_SHAPES: cannot parse `{s}`"))
        })
        .collect()
}

/// GroupNorm activation shapes `[C, H, W]` (batch 1).
fn norm_shapes() -> Vec<[usize; 3]> {
    let spec = std::env::var("WGVAE_BENCH_NORM_SHAPES")
        .unwrap_or_else(|_| "512x64x64,256x128x128,128x256x256".into());
    if spec.trim() == "0" {
        return Vec::new();
    }
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let d: Vec<usize> = s.trim().split('x').filter_map(|d| d.parse().ok()).collect();
            match d[..] {
                [c, h, w] => [c, h, w],
                _ => panic!("WGVAE_BENCH_NORM_SHAPES: cannot parse `{s}` (CxHxW)"),
            }
        })
        .collect()
}

fn tiles_override() -> Option<ConvTiles> {
    let s = std::env::var("WGVAE_CONV_TILES")
        .ok()
        .filter(|s| !s.trim().is_empty())?;
    let v: Vec<u32> = s
        .split(',')
        .map(|x| x.trim().parse().expect("WGVAE_CONV_TILES: numbers"))
        .collect();
    let (&[tm, tn, tw, tk, rm, rn], direct) = (&v[..6.min(v.len())], v.get(6) == Some(&1)) else {
        panic!("WGVAE_CONV_TILES=tm,tn,tw,tk,rm,rn[,direct 0|1]")
    };
    Some(ConvTiles {
        tm,
        tn,
        tw,
        tk,
        rm,
        rn,
        direct,
        matrix: None,
    })
}

/// GPU timestamps around each batch of dispatches, or wall time.
enum Timer {
    Gpu {
        queries: wgpu::QuerySet,
        resolve: wgpu::Buffer,
        readback: wgpu::Buffer,
        period_ns: f64,
    },
    Wall,
}

impl Timer {
    fn new(ctx: &Context) -> Timer {
        if !ctx
            .device()
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Timer::Wall;
        }
        let d = ctx.device();
        Timer::Gpu {
            queries: d.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolve: d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench resolve"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench readback"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period_ns: ctx.queue().get_timestamp_period() as f64,
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Timer::Gpu { .. } => "GPU timestamp queries",
            Timer::Wall => "wall time around submit + wait (no TIMESTAMP_QUERY)",
        }
    }

    /// Time of `count` dispatches recorded by `record`, in batches of [`BATCH`].
    fn time(&self, ctx: &Context, count: u64, record: &dyn Fn(&mut Recorder)) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = count;
        while left > 0 {
            let n = left.min(BATCH);
            left -= n;
            total += match self {
                Timer::Wall => {
                    let start = Instant::now();
                    let mut rec = Recorder::new(ctx);
                    for _ in 0..n {
                        record(&mut rec);
                    }
                    rec.submit().expect("submit");
                    ctx.wait_idle().expect("wait");
                    start.elapsed()
                }
                Timer::Gpu {
                    queries,
                    resolve,
                    readback,
                    period_ns,
                } => {
                    let mut encoder = ctx.device().create_command_encoder(&Default::default());
                    // Empty passes whose ends write the timestamps: needs only TIMESTAMP_QUERY.
                    let stamp = |encoder: &mut wgpu::CommandEncoder, index: u32| {
                        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("bench timestamp"),
                            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                query_set: queries,
                                beginning_of_pass_write_index: None,
                                end_of_pass_write_index: Some(index),
                            }),
                        });
                    };
                    stamp(&mut encoder, 0);
                    {
                        let mut rec = Recorder::with_encoder(ctx, &mut encoder);
                        for _ in 0..n {
                            record(&mut rec);
                        }
                        rec.finish();
                    }
                    stamp(&mut encoder, 1);
                    encoder.resolve_query_set(queries, 0..2, resolve, 0);
                    encoder.copy_buffer_to_buffer(resolve, 0, readback, 0, 16);
                    ctx.queue().submit([encoder.finish()]);
                    readback
                        .slice(..)
                        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
                    ctx.wait_idle().expect("wait");
                    let ticks: Vec<u64> = {
                        let view = readback.slice(..).get_mapped_range().expect("mapped");
                        bytemuck::pod_collect_to_vec(&view)
                    };
                    readback.unmap();
                    let ns = ticks[1].saturating_sub(ticks[0]) as f64 * period_ns;
                    Duration::from_nanos(ns as u64)
                }
            };
        }
        total
    }
}

struct Problem {
    shape: Shape,
    opts: Conv2dOptions,
    input: Tensor,
    out: Tensor,
    weights: Conv2dWeights,
    /// GroupNorm-style scale/shift `[1, Cin, 2]` for the fused form.
    affine: Tensor,
    macs: u64,
    /// Compulsory traffic: input and weights read once, output written once.
    bytes: u64,
}

fn problem(ctx: &Context, shape: Shape) -> Problem {
    let Shape { cin, h, w, cout, k } = shape;
    let opts = Conv2dOptions::same(k as u32);
    let (ho, wo) = output_size(h, w, k, &opts);
    let input =
        Tensor::from_f32(ctx, &[1, cin, h, w], &rand_vec(cin * h * w, 1, 1.0), "x").unwrap();
    let out = Tensor::empty(ctx, &[1, cout, ho, wo], DType::F32, "out").unwrap();
    let wv = rand_vec(cout * cin * k * k, 2, 0.05);
    let bias = rand_vec(cout, 3, 0.1);
    let host = PytorchConv {
        weight: &wv,
        cout,
        cin,
        k,
        bias: Some(&bias),
    };
    let weights = Conv2dWeights::upload(ctx, &host, tiles_override(), DType::F32, "w").unwrap();
    let aff: Vec<f32> = (0..cin)
        .flat_map(|c| [1.0 + 0.01 * (c % 7) as f32, 0.1])
        .collect();
    let affine = Tensor::from_f32(ctx, &[1, cin, 2], &aff, "affine").unwrap();
    Problem {
        shape,
        opts,
        input,
        out,
        weights,
        affine,
        macs: macs(1, cin, cout, ho, wo, k),
        bytes: 4 * (cin * h * w + cout * cin * k * k + cout + cout * ho * wo) as u64,
    }
}

/// One measured kernel: seconds per dispatch (median and best) and CPU seconds per dispatch.
struct Measured {
    median: f64,
    best: f64,
    cpu: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// Times `record` through criterion (tiled kernel) or, when `quick`, over one dispatch
/// (the naive kernel, whose dispatches take many seconds at these shapes).
#[allow(clippy::too_many_arguments)]
fn measure(
    c: &mut Criterion,
    ctx: &Context,
    timer: &Timer,
    name: &str,
    label: &str,
    throughput: Throughput,
    quick: bool,
    record: &dyn Fn(&mut Recorder),
) -> Measured {
    // Compile the pipeline (Mesa keeps a disk cache: a second run compiles nothing) and
    // touch the buffers outside the measurement. Not for `quick`: the naive kernel compiles
    // in a fraction of a second and one of its dispatches takes minutes on a CPU adapter.
    if !quick {
        let start = Instant::now();
        timer.time(ctx, 1, record);
        let secs = start.elapsed().as_secs_f64();
        println!("{name} {label}: first dispatch (with pipeline creation) {secs:.2} s");
    }
    let per_dispatch = RefCell::new(Vec::<f64>::new());
    // Process CPU seconds per dispatch: on a CPU adapter shared with other work this says
    // what the kernel costs regardless of contention.
    let cpu_per_dispatch = RefCell::new(Vec::<f64>::new());
    let mut run = |iters: u64| {
        let cpu0 = process_cpu_seconds();
        let t = timer.time(ctx, iters, record);
        per_dispatch
            .borrow_mut()
            .push(t.as_secs_f64() / iters as f64);
        if let (Some(a), Some(b)) = (cpu0, process_cpu_seconds()) {
            cpu_per_dispatch.borrow_mut().push((b - a) / iters as f64);
        }
        t
    };
    if quick {
        run(1);
    } else {
        let mut group = c.benchmark_group(name);
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(1))
            .throughput(throughput);
        group.bench_function(label, |b| b.iter_custom(&mut run));
        group.finish();
    }
    let times = per_dispatch.into_inner();
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    Measured {
        median: median(times).unwrap_or(f64::NAN),
        best,
        cpu: median(cpu_per_dispatch.into_inner()).filter(|_| ctx.caps().is_cpu()),
    }
}

fn report(name: &str, p: &Problem, m: &Measured, timer: &Timer) -> f64 {
    let gflops = |s: f64| 2.0 * p.macs as f64 / s / 1e9;
    let cpu_note = m
        .cpu
        .map(|s| format!(", {:.2} GFLOP per CPU-second", gflops(s)))
        .unwrap_or_default();
    println!(
        "RESULT {name} {}: {:.2} GFLOP/s median ({:.2} best), {:.2} GB/s, {:.1} ms/dispatch{cpu_note} [{}]",
        p.shape,
        gflops(m.median),
        gflops(m.best),
        p.bytes as f64 / m.median / 1e9,
        m.median * 1e3,
        timer.describe()
    );
    gflops(m.median)
}

/// Records one benchmarked call.
type Record<'a> = dyn Fn(&mut Recorder) + 'a;

/// GroupNorm at `[1, C, H, W]`, 32 groups: the statistics pass alone (the decoder's
/// form: the next conv applies the affine) and statistics + SiLU apply. Returns GB/s
/// (median) of each.
fn bench_group_norm(
    c: &mut Criterion,
    ctx: &Context,
    timer: &Timer,
    [ch, h, w]: [usize; 3],
) -> (f64, f64) {
    use wgvae::kernels::group_norm::{
        group_norm, group_norm_stats, stats_scratch_len, GroupNormParams,
    };
    const GROUPS: usize = 32;
    let label = format!("[1,{ch},{h},{w}] g{GROUPS}");
    let numel = ch * h * w;
    let x = Tensor::from_f32(ctx, &[1, ch, h, w], &rand_vec(numel, 4, 1.0), "x").unwrap();
    let out = Tensor::empty(ctx, &[1, ch, h, w], DType::F32, "out").unwrap();
    let gamma = Tensor::from_f32(ctx, &[ch], &rand_vec(ch, 5, 1.0), "gamma").unwrap();
    let beta = Tensor::from_f32(ctx, &[ch], &rand_vec(ch, 6, 0.1), "beta").unwrap();
    let scratch_len = stats_scratch_len(1, ch, h, w, GROUPS);
    let scratch = Tensor::empty(ctx, &[scratch_len], DType::F32, "scratch").unwrap();
    let affine = Tensor::empty(ctx, &[1, ch, 2], DType::F32, "affine").unwrap();
    // Bytes each form must move: x read once (stats); x read twice and out written (full).
    let act_bytes = 4 * numel as u64;
    let forms: [(&str, u64, &Record); 2] = [
        ("group_norm_stats", act_bytes, &|rec: &mut Recorder| {
            group_norm_stats(
                rec,
                &x,
                &GroupNormParams::new(GROUPS, &gamma, &beta, 1e-6),
                &scratch,
                &affine,
            )
            .expect("group_norm_stats")
        }),
        ("group_norm_silu", 3 * act_bytes, &|rec: &mut Recorder| {
            group_norm(
                rec,
                &x,
                &GroupNormParams::new(GROUPS, &gamma, &beta, 1e-6),
                Activation::Silu,
                &scratch,
                &affine,
                &out,
            )
            .expect("group_norm")
        }),
    ];
    let mut gbs = [0.0; 2];
    for (i, (name, bytes, record)) in forms.into_iter().enumerate() {
        let m = measure(
            c,
            ctx,
            timer,
            name,
            &label,
            Throughput::Bytes(bytes),
            false,
            record,
        );
        gbs[i] = bytes as f64 / m.median / 1e9;
        let cpu_note = m
            .cpu
            .map(|s| format!(", {:.2} GB per CPU-second", bytes as f64 / s / 1e9))
            .unwrap_or_default();
        println!(
            "RESULT {name} {label}: {:.2} GB/s median ({:.2} best), {:.2} ms/call{cpu_note} [{}]",
            gbs[i],
            bytes as f64 / m.best / 1e9,
            m.median * 1e3,
            timer.describe()
        );
    }
    (gbs[0], gbs[1])
}

/// CPU time of this process's threads (Linux), for CPU adapters: the sum of
/// `/proc/self/task/*/schedstat` run times (nanosecond resolution).
fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        if let Ok(stat) = std::fs::read_to_string(path) {
            ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(ns as f64 * 1e-9)
}

fn main() {
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let ctx = test_context();
    let timer = Timer::new(&ctx);
    let caps = ctx.caps();
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {}; subgroups {}); timing: {}",
        caps.adapter_name,
        caps.backend,
        caps.device_type,
        caps.driver,
        caps.driver_info,
        caps.subgroup,
        timer.describe()
    );
    // `0`: skip the naive kernel; `criterion`: measure it like the tiled one; else one dispatch.
    let naive_mode = std::env::var("WGVAE_BENCH_NAIVE").unwrap_or_default();
    let mut summary = Vec::new();
    for shape in shapes() {
        let p = problem(&ctx, shape);
        println!("{}: tiles {:?}", p.shape, p.weights.tiles());
        let tiled = |rec: &mut Recorder| {
            conv2d(rec, &p.input, &p.weights, None, None, &p.out, &p.opts).expect("conv2d")
        };
        let label = p.shape.to_string();
        let flops = Throughput::Elements(2 * p.macs);
        let m = measure(
            &mut c,
            &ctx,
            &timer,
            "conv2d_tiled",
            &label,
            flops.clone(),
            false,
            &tiled,
        );
        let g_tiled = report("conv2d_tiled", &p, &m, &timer);
        if std::env::var("WGVAE_BENCH_FUSED").is_ok_and(|v| v == "1") {
            // out = conv(silu(x * scale + shift)) + bias + out, as in the decoder's ResNet blocks.
            let fused = |rec: &mut Recorder| {
                let pro = Prologue {
                    affine: &p.affine,
                    act: Activation::Silu,
                };
                conv2d(
                    rec,
                    &p.input,
                    &p.weights,
                    Some(pro),
                    Some(&p.out),
                    &p.out,
                    &p.opts,
                )
                .expect("conv2d")
            };
            let m = measure(
                &mut c,
                &ctx,
                &timer,
                "conv2d_tiled_fused",
                &label,
                flops.clone(),
                false,
                &fused,
            );
            report("conv2d_tiled_fused", &p, &m, &timer);
        }
        let mut g_naive = None;
        if naive_mode != "0" {
            let naive = |rec: &mut Recorder| {
                let call = Conv2dCall {
                    input: &p.input,
                    w: &p.weights,
                    prologue: None,
                    residual: None,
                    out: &p.out,
                    opts: &p.opts,
                };
                conv2d_naive(rec, &call).expect("naive")
            };
            let quick = naive_mode != "criterion";
            let m = measure(
                &mut c,
                &ctx,
                &timer,
                "conv2d_naive",
                &label,
                flops.clone(),
                quick,
                &naive,
            );
            g_naive = Some(report("conv2d_naive", &p, &m, &timer));
        }
        summary.push((p.shape, g_tiled, g_naive));
    }
    let mut norms = Vec::new();
    for shape in norm_shapes() {
        norms.push((shape, bench_group_norm(&mut c, &ctx, &timer, shape)));
    }
    println!("SUMMARY (GFLOP/s = 2 * MACs / time, {})", timer.describe());
    for (shape, t, n) in summary {
        match n {
            Some(n) => println!("  {shape}: tiled {t:.2}, naive {n:.2}, ratio {:.1}x", t / n),
            None => println!("  {shape}: tiled {t:.2}"),
        }
    }
    for ([ch, h, w], (stats, full)) in norms {
        println!("  group_norm [1,{ch},{h},{w}]: stats {stats:.2} GB/s, stats + SiLU apply {full:.2} GB/s");
    }
    c.final_summary();
}
