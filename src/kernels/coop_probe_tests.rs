//! Probes of each cooperative-matrix pattern the kernels use, one small shader each, with
//! exact expectations (small integers: every product and sum is exact in f16/f32). A
//! kernel test that fails on a new driver says *that* a kernel is wrong; these say *which*
//! operation the driver (or the WGSL → SPIR-V translation) handles differently: operand
//! layouts, strides, loading accumulators, accumulators declared inside loops, the trip
//! through a subgroup's scratch matrix. They run wherever a usable configuration exists
//! (`ci/coopmat.sh` on lavapipe's 8×8, and on GPUs through `bench/gpu/run.sh`'s tests).

use crate::gpu::Context;
use wgpu::util::DeviceExt;

/// Subgroups per workgroup in every probe (each owns its own A block and scratch).
const NSUB: u32 = 2;

/// One probe: a WGSL body that leaves the subgroup's result in `d: CC`, and the factor
/// and C term of its expectation `d = scale · A·B + (with_c ? C : 0)`.
struct Probe {
    name: &'static str,
    body: &'static str,
    scale: f32,
    with_c: bool,
}

const PROBES: &[Probe] = &[
    Probe {
        name: "A column-major, B row-major (the conv and QKᵀ loads)",
        body: "
    var d: CC;
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), d);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), d);",
        scale: 1.0,
        with_c: false,
    },
    Probe {
        name: "A row-major, B column-major (the PV loads)",
        body: "
    var d: CC;
    d = coopMultiplyAdd(coopLoadT<CA>(&a_rm[abase_rm], LD), coopLoad<CB>(&b_cm[0u], LD), d);
    d = coopMultiplyAdd(coopLoadT<CA>(&a_rm[abase_rm + S], LD), coopLoad<CB>(&b_cm[S], LD), d);",
        scale: 1.0,
        with_c: false,
    },
    Probe {
        name: "C loaded row-major (an accumulator read back)",
        body: "
    var d = coopLoadT<CC>(&c_rm[cbase], LD);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), d);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), d);",
        scale: 1.0,
        with_c: true,
    },
    Probe {
        name: "C loaded column-major",
        body: "
    var d = coopLoad<CC>(&c_cm[cbase], LD);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), d);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), d);",
        scale: 1.0,
        with_c: true,
    },
    Probe {
        name: "accumulator declared inside a loop (zeroed each iteration)",
        body: "
    var d: CC;
    for (var it = 0u; it < 3u; it += 1u) {
        var acc: CC;
        acc = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), acc);
        acc = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), acc);
        d = acc;
    }",
        scale: 1.0,
        with_c: false,
    },
    Probe {
        name: "accumulator through the subgroup's scratch (store, lanes scale rows, load back)",
        body: "
    var d: CC;
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), d);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), d);
    coopStoreT(d, &scr[sgid * SS], S);
    workgroupBarrier();
    for (var e = lane; e < SS; e += lanes) {
        scr[sgid * SS + e] *= 2.0;
    }
    workgroupBarrier();
    d = coopLoadT<CC>(&scr[sgid * SS], S);
    workgroupBarrier();",
        scale: 2.0,
        with_c: false,
    },
    Probe {
        name: "products of matrices held across a loop (P loaded once, used per chunk)",
        body: "
    let p0 = coopLoadT<CA>(&a_rm[abase_rm], LD);
    let p1 = coopLoadT<CA>(&a_rm[abase_rm + S], LD);
    var d: CC;
    for (var it = 0u; it < 2u; it += 1u) {
        d = coopMultiplyAdd(p0, coopLoad<CB>(&b_cm[0u], LD), d);
        d = coopMultiplyAdd(p1, coopLoad<CB>(&b_cm[S], LD), d);
    }",
        scale: 2.0,
        with_c: false,
    },
    Probe {
        name: "accumulator assigned in a workgroup-uniform branch",
        body: "
    var d: CC;
    if workgroupUniformLoad(&flag).x != 0u {
        d = coopLoadT<CC>(&c_rm[cbase], LD);
    }
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), d);
    d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), d);",
        scale: 1.0,
        with_c: true,
    },
    Probe {
        name: "scratch trip inside a uniform branch, in a loop (the attention's rescale)",
        body: "
    var d: CC;
    for (var it = 0u; it < 2u; it += 1u) {
        if workgroupUniformLoad(&flag).x != 0u {
            coopStoreT(d, &scr[sgid * SS], S);
            workgroupBarrier();
            for (var e = lane; e < SS; e += lanes) {
                scr[sgid * SS + e] *= 2.0;
            }
            workgroupBarrier();
            d = coopLoadT<CC>(&scr[sgid * SS], S);
            workgroupBarrier();
        }
        d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm], LD), coopLoadT<CB>(&b_rm[0u], LD), d);
        d = coopMultiplyAdd(coopLoad<CA>(&a_cm[abase_cm + S * LD], LD), coopLoadT<CB>(&b_rm[S * LD], LD), d);
    }",
        scale: 3.0,
        with_c: false,
    },
];

fn source(s: u32, lanes_max: u32, lanes_min: u32, body: &str) -> String {
    let mut src = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n");
    crate::kernels::coop::aliases(s, &mut src);
    let max_sub = NSUB * lanes_max / lanes_min.max(1);
    src.push_str(&format!(
        "
const S = {s}u;
const SS = S * S;
const LD = 4u * S;
const NSUB = {NSUB}u;
const MAXSUB = {max_sub}u;
const WG = NSUB * {lanes_max}u;
@group(0) @binding(0) var<storage, read> a: array<f32>;  // [sg][m][k], S x 2S each
@group(0) @binding(1) var<storage, read> b: array<f32>;  // [k][n], 2S x S
@group(0) @binding(2) var<storage, read> c: array<f32>;  // [sg][m][n]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [sg][m][n]
var<workgroup> a_cm: array<f16, NSUB * 2u * S * LD>;  // [sg][k][m]
var<workgroup> a_rm: array<f16, NSUB * S * LD>;       // [sg][m][k]
var<workgroup> b_rm: array<f16, 2u * S * LD>;         // [k][n]
var<workgroup> b_cm: array<f16, S * LD>;              // [n][k]
var<workgroup> c_rm: array<f32, NSUB * S * LD>;       // [sg][m][n]
var<workgroup> c_cm: array<f32, NSUB * S * LD>;       // [sg][n][m]
var<workgroup> scr: array<f32, MAXSUB * SS>;
var<workgroup> flag: vec4<u32>;  // 16 bytes: see shaders/attention.wgsl's `moved`

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sgid: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32) {{
    for (var e = li; e < NSUB * 2u * SS; e += WG) {{
        let g = e / (2u * SS);
        let m = (e % (2u * SS)) / (2u * S);
        let k = e % (2u * S);
        let v = f16(a[e]);
        a_cm[g * 2u * S * LD + k * LD + m] = v;
        a_rm[g * S * LD + m * LD + k] = v;
    }}
    for (var e = li; e < 2u * SS; e += WG) {{
        let k = e / S;
        let n = e % S;
        let v = f16(b[e]);
        b_rm[k * LD + n] = v;
        b_cm[n * LD + k] = v;
    }}
    for (var e = li; e < NSUB * SS; e += WG) {{
        let g = e / SS;
        let m = (e % SS) / S;
        let n = e % S;
        c_rm[g * S * LD + m * LD + n] = c[e];
        c_cm[g * S * LD + n * LD + m] = c[e];
    }}
    if li == 0u {{
        flag = vec4<u32>(1u);
    }}
    workgroupBarrier();
    let sg = sgid % NSUB;
    let abase_cm = sg * 2u * S * LD;
    let abase_rm = sg * S * LD;
    let cbase = sg * S * LD;
{body}
    coopStoreT(d, &scr[sgid * SS], S);
    workgroupBarrier();
    if sgid < NSUB {{
        for (var e = lane; e < SS; e += lanes) {{
            out[sgid * SS + e] = scr[sgid * SS + e];
        }}
    }}
}}
"
    ));
    src
}

/// Runs one probe; `Err` describes the first mismatches.
fn run_probe(ctx: &Context, probe: &Probe, a: &[f32], b: &[f32], c: &[f32]) -> Result<(), String> {
    let caps = ctx.caps();
    let s = caps.matrix().expect("matrix context").size;
    let (lanes_max, lanes_min) = (caps.subgroup_max_size, caps.subgroup_min_size);
    let device = ctx.device();
    let src = source(s, lanes_max, lanes_min, probe.body);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("coop probe"),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("coop probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(format!("does not compile: {e}"));
    }
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let init = |data: &[f32]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("coop probe"),
            contents: bytemuck::cast_slice(data),
            usage,
        })
    };
    let n = (NSUB * s * s) as usize;
    let bufs = [init(a), init(b), init(c), init(&vec![f32::NAN; n])];
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("coop probe"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[0, 1, 2, 3].map(|i| wgpu::BindGroupEntry {
            binding: i,
            resource: bufs[i as usize].as_entire_binding(),
        }),
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("coop probe readback"),
        size: (n * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    enc.copy_buffer_to_buffer(&bufs[3], 0, &staging, 0, (n * 4) as u64);
    ctx.queue().submit([enc.finish()]);
    let got: Vec<f32> = ctx
        .read_mapped(&staging, |bytes| bytemuck::cast_slice(bytes).to_vec())
        .map_err(|e| e.to_string())?;
    let (s, k) = (s as usize, 2 * s as usize);
    let mut bad = Vec::new();
    for g in 0..NSUB as usize {
        for m in 0..s {
            for j in 0..s {
                let mut want: f32 = (0..k)
                    .map(|kk| a[(g * s + m) * k + kk] * b[kk * s + j])
                    .sum();
                want *= probe.scale;
                if probe.with_c {
                    want += c[(g * s + m) * s + j];
                }
                let v = got[(g * s + m) * s + j];
                if v != want {
                    bad.push(format!("subgroup {g} [{m}][{j}]: {v} (want {want})"));
                }
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {n} wrong, e.g. {}",
            bad.len(),
            bad[..bad.len().min(6)].join("; ")
        ))
    }
}

#[test]
fn cooperative_matrix_probes_are_exact() {
    let Some(ctx) = crate::testing::matrix_test_context("cooperative_matrix_probes_are_exact")
    else {
        return;
    };
    let s = ctx.caps().matrix().unwrap().size as usize;
    // Small integers in [-2, 2]: exact in f16, every sum exact in f32.
    let ints = |n: usize, seed: u64| -> Vec<f32> {
        crate::testing::rand_vec(n, seed, 2.49)
            .into_iter()
            .map(|x| x.round().clamp(-2.0, 2.0))
            .collect()
    };
    let a = ints(NSUB as usize * s * 2 * s, 1);
    let b = ints(2 * s * s, 2);
    let c = ints(NSUB as usize * s * s, 3);
    let mut failed = Vec::new();
    for p in PROBES {
        match run_probe(&ctx, p, &a, &b, &c) {
            Ok(()) => eprintln!("probe ok: {}", p.name),
            Err(e) => {
                eprintln!("probe FAILED: {}: {e}", p.name);
                failed.push(p.name);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} ({}x{} matrices, subgroups of {}): {failed:?}",
        ctx.caps().adapter_name,
        s,
        s,
        ctx.caps().subgroup_max_size
    );
}
