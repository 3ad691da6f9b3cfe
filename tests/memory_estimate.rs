//! The estimator predicts exactly what a real decode measures, for every
//! policy; the planned policy reuses memory without changing a single output
//! value and keeps reserved within 2 % of allocated.

use wgvae::estimate::Estimate;
use wgvae::io::{read_npy, HostTensor};
use wgvae::memory::{PlannedPool, Policy};
use wgvae::models::Precision;
use wgvae::testing::{shared_dir, test_context};
use wgvae::{decode, DecodeOptions, LoadOptions, Vae};

struct Case {
    spec: String,
    latents: HostTensor,
    load: LoadOptions,
}

fn in_precision(c: &Case, precision: Precision) -> Case {
    Case {
        spec: c.spec.clone(),
        latents: c.latents.clone(),
        load: LoadOptions {
            precision,
            ..Default::default()
        },
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![Case {
        spec: "preset:sd15".into(),
        latents: HostTensor::new(
            vec![1, 4, 8, 6],
            wgvae::testing::rand_vec(4 * 8 * 6, 3, 1.0),
        )
        .unwrap(),
        load: LoadOptions::default(),
    }];
    v.push(in_precision(&v[0], Precision::F16));
    if let Some(s) = shared_dir() {
        let g = s.join("golden/aekl-tiny-sd");
        v.push(Case {
            spec: g.to_str().unwrap().into(),
            latents: read_npy(&g.join("latents.npy")).unwrap(),
            load: LoadOptions::default(),
        });
        v.push(in_precision(v.last().unwrap(), Precision::F16));
        let f = s.join("golden/aekl-tiny-flux");
        v.push(Case {
            spec: f.to_str().unwrap().into(),
            latents: read_npy(&f.join("latents.npy")).unwrap(),
            load: LoadOptions::default(),
        });
        v.push(in_precision(v.last().unwrap(), Precision::BF16));
        // FLUX.2's small decoder (decoder narrower than the encoder), from raw z.
        let f2 = s.join("golden/flux2-small-decoder-tiny");
        v.push(Case {
            spec: f2.to_str().unwrap().into(),
            latents: read_npy(&f2.join("z.npy")).unwrap(),
            load: LoadOptions::default(),
        });
        v.push(in_precision(v.last().unwrap(), Precision::F16));
        let t = s.join("golden/taef2/chelsea.latents.npy");
        let mut lat = read_npy(&t).unwrap();
        // A crop keeps the test fast: 1×32×12×10.
        let [_, c, h, w] = [lat.shape[0], lat.shape[1], lat.shape[2], lat.shape[3]];
        let mut crop = Vec::new();
        for ci in 0..c {
            for y in 0..12 {
                for x in 0..10 {
                    crop.push(lat.data[(ci * h + y) * w + x]);
                }
            }
        }
        lat = HostTensor::new(vec![1, c, 12, 10], crop).unwrap();
        v.push(Case {
            spec: s
                .join("weights/taef2/decoder.safetensors")
                .to_str()
                .unwrap()
                .into(),
            latents: lat,
            load: LoadOptions::default(),
        });
        v.push(in_precision(v.last().unwrap(), Precision::F16));
    }
    v
}

#[test]
fn estimate_equals_measured_for_every_policy() {
    let base = test_context();
    for case in cases() {
        let shape: [usize; 4] = case.latents.shape.clone().try_into().unwrap();
        let mut outputs = Vec::new();
        for policy in Policy::ALL {
            let ctx = base.with_pool(policy.new_pool());
            let vae = Vae::load(&ctx, &case.spec, &case.load).unwrap();
            let opts = DecodeOptions {
                raw_latents: true,
                keep_raw: true,
                ..Default::default()
            };
            let real = decode(&ctx, &vae, &case.latents, &opts).unwrap();
            let est = Estimate::new(ctx.caps(), policy, &case.spec, &case.load)
                .decode(shape)
                .unwrap();
            let (a, r) = (
                real.memory.allocated_bytes.peak,
                real.memory.reserved_bytes.peak,
            );
            println!(
                "{} {:?} {}: weights {} B, peak allocated {a} B (predicted {}), reserved {r} B (predicted {}), ratio {:.3}",
                case.spec,
                case.load.precision,
                policy.name(),
                vae.weights_bytes(),
                est.peak_allocated_bytes,
                est.peak_reserved_bytes,
                r as f64 / a as f64
            );
            assert_eq!(
                est.weights_bytes,
                vae.weights_bytes(),
                "{} {}: weights",
                case.spec,
                policy.name()
            );
            assert_eq!(
                est.peak_allocated_bytes,
                a,
                "{} {}: peak allocated",
                case.spec,
                policy.name()
            );
            assert_eq!(
                est.peak_reserved_bytes,
                r,
                "{} {}: peak reserved",
                case.spec,
                policy.name()
            );
            if let Some(p) = ctx.pool().as_any().downcast_ref::<PlannedPool>() {
                assert_eq!(
                    p.divergences(),
                    0,
                    "{}: replay left its trace: {:?}",
                    case.spec,
                    p.last_divergence()
                );
                assert!(
                    r as f64 <= 1.02 * a as f64,
                    "planned reserved/allocated {}",
                    r as f64 / a as f64
                );
            }
            outputs.push((policy, real.raw.unwrap().data, real.rgba));
        }
        // Memory reuse must not change a single value.
        for (p, raw, rgba) in &outputs[1..] {
            assert!(
                raw == &outputs[0].1,
                "{}: {} output differs from exact",
                case.spec,
                p.name()
            );
            assert!(
                rgba == &outputs[0].2,
                "{}: {} pixels differ from exact",
                case.spec,
                p.name()
            );
        }
    }
}

#[test]
fn planned_pool_reuses_its_plan_and_arenas() {
    let base = test_context();
    let ctx = base.with_pool(Policy::Planned.new_pool());
    let vae = Vae::load(&ctx, "preset:sd15", &LoadOptions::default()).unwrap();
    let z = HostTensor::new(vec![1, 4, 4, 4], vec![0.5; 64]).unwrap();
    let a = decode(&ctx, &vae, &z, &DecodeOptions::default()).unwrap();
    let b = decode(&ctx, &vae, &z, &DecodeOptions::default()).unwrap();
    assert_eq!(a.rgba, b.rgba);
    assert_eq!(a.memory.reserved_bytes.peak, b.memory.reserved_bytes.peak);
    // The second decode created no new device buffers beyond the first's.
    assert_eq!(a.memory.num_device_alloc, b.memory.num_device_alloc);
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>().unwrap();
    assert_eq!(planned.divergences(), 0, "{:?}", planned.last_divergence());
}

#[test]
fn dry_run_estimates_large_decodes_without_device_memory() {
    let ctx = test_context();
    // FLUX.1 at 2048² cannot even be bound on lavapipe; the estimate needs no device memory.
    let est = Estimate::new(
        ctx.caps(),
        Policy::Planned,
        "preset:flux1",
        &LoadOptions::default(),
    )
    .decode([1, 16, 256, 256]);
    match est {
        Ok(e) => panic!("lavapipe cannot bind a 2048² activation, yet the estimate passed: {e:?}"),
        Err(e) => assert!(
            e.to_string().contains("max_storage_buffer_binding_size"),
            "{e}"
        ),
    }
    let mut caps = ctx.caps().clone();
    caps.max_storage_buffer_binding_size = 4 << 30; // an RTX-class limit
    caps.max_buffer_size = 4 << 30;
    let est = Estimate::new(
        &caps,
        Policy::Planned,
        "preset:flux1",
        &LoadOptions::default(),
    )
    .decode([1, 16, 256, 256])
    .unwrap();
    println!("{est:?}");
    assert!(est.peak_allocated_bytes > est.weights_bytes);
    assert!(est.peak_reserved_bytes as f64 <= 1.02 * est.peak_allocated_bytes as f64);
}

#[test]
fn encode_estimate_equals_measured_for_every_policy() {
    let Some(shared) = shared_dir() else { return };
    let base = test_context();
    let dir = shared.join("golden/aekl-tiny-sd");
    let spec = dir.to_str().unwrap();
    let img = wgvae::encode::load_image(&dir.join("encode_input.png"), false).unwrap();
    let shape: [usize; 4] = img.shape.clone().try_into().unwrap();
    let mut outputs = Vec::new();
    for policy in Policy::ALL {
        let ctx = base.with_pool(policy.new_pool());
        let enc = wgvae::Vae::load_encoder(&ctx, spec, &LoadOptions::default()).unwrap();
        let real = wgvae::encode::encode(&ctx, &enc, &img, &Default::default()).unwrap();
        let est = Estimate::new(ctx.caps(), policy, spec, &LoadOptions::default())
            .encode(shape)
            .unwrap();
        assert_eq!(est.weights_bytes, enc.weights_bytes(), "{}", policy.name());
        assert_eq!(
            est.peak_allocated_bytes,
            real.memory.allocated_bytes.peak,
            "{}",
            policy.name()
        );
        assert_eq!(
            est.peak_reserved_bytes,
            real.memory.reserved_bytes.peak,
            "{}",
            policy.name()
        );
        outputs.push(real.latents.data);
    }
    assert!(
        outputs.iter().all(|o| o == &outputs[0]),
        "policies must not change the latents"
    );
}

/// Exact tiles with several interior tiles (a 6×6 grid of 48-px tiles at
/// 288², mid-block tiled too, so its attention streams 36 K/V blocks per
/// query group): the estimate equals the measured decode under every
/// policy — peaks and the whole tiling report — with the default budget
/// and with one tight enough to park tiles in host memory.
#[test]
fn estimate_equals_measured_with_interior_tiles() {
    let Some(shared) = shared_dir() else { return };
    let base = test_context();
    let dir = shared.join("golden/aekl-tiny-sd");
    let spec = dir.to_str().unwrap();
    let load = LoadOptions::default();
    let shape = [1usize, 4, 36, 36];
    let latents = HostTensor::new(
        shape.to_vec(),
        wgvae::testing::rand_vec(shape.iter().product(), 32, 1.0),
    )
    .unwrap();
    let untiled_peak = {
        let ctx = base.with_pool(Policy::Exact.new_pool());
        let vae = Vae::load(&ctx, spec, &load).unwrap();
        let opts = DecodeOptions {
            raw_latents: true,
            ..Default::default()
        };
        decode(&ctx, &vae, &latents, &opts)
            .unwrap()
            .memory
            .allocated_bytes
            .peak
    };
    let mut parked_on_host = false;
    for budget in [None, Some(untiled_peak / 2)] {
        let mut tiling = wgvae::tiling::Tiling::exact().with_tile_size(48);
        tiling.tile_mid_block = true;
        if let Some(b) = budget {
            tiling = tiling.with_max_memory(b);
        }
        for policy in Policy::ALL {
            let ctx = base.with_pool(policy.new_pool());
            let vae = Vae::load(&ctx, spec, &load).unwrap();
            let opts = DecodeOptions {
                raw_latents: true,
                tiling: tiling.clone(),
                ..Default::default()
            };
            let real = decode(&ctx, &vae, &latents, &opts).unwrap();
            let est = Estimate::new(ctx.caps(), policy, spec, &load)
                .tiled(&tiling)
                .decode(shape)
                .unwrap();
            println!(
                "288² in 48-px tiles, budget {budget:?}, {}: peak allocated {} B (predicted {}), reserved {} B (predicted {}), {} tiles, {} steps, host parking {} B",
                policy.name(),
                real.memory.allocated_bytes.peak,
                est.peak_allocated_bytes,
                real.memory.reserved_bytes.peak,
                est.peak_reserved_bytes,
                real.tiling.tiles,
                real.tiling.steps,
                real.tiling.host_parked_peak_bytes
            );
            assert_eq!(real.tiling.tiles, 36);
            assert!(real.tiling.mid_block_tiled);
            assert_eq!(est.tiling, real.tiling, "{}: tiling report", policy.name());
            assert_eq!(
                est.peak_allocated_bytes,
                real.memory.allocated_bytes.peak,
                "{} {budget:?}: peak allocated",
                policy.name()
            );
            assert_eq!(
                est.peak_reserved_bytes,
                real.memory.reserved_bytes.peak,
                "{} {budget:?}: peak reserved",
                policy.name()
            );
            parked_on_host |= real.tiling.host_parked_peak_bytes > 0;
        }
    }
    assert!(parked_on_host, "the tight budget parks tiles on the host");
}
