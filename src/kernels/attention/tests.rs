use super::*;
use crate::gpu::Context;
use crate::testing::{assert_close, rand_vec, test_context};

#[test]
fn configs_fit_webgpu_default_limits() {
    for c in CONFIGS.iter().chain(&CPU_CONFIGS) {
        assert!(
            c.workgroup_bytes() <= 16384 * 2,
            "{c:?}: {} bytes",
            c.workgroup_bytes()
        );
        assert!(c.invocations() <= 256, "{c:?}");
    }
    assert_eq!(config_for(512).map(|c| c.max_d()), Some(512));
    // Wider heads: the widest configuration, in output chunks.
    assert_eq!(config_for(513), Some(CONFIGS[5]));
    assert_eq!(config_for(1152).map(|c| c.chunks(1152)), Some(3));
    assert_eq!(config_for(512).map(|c| c.chunks(512)), Some(1));
    assert_eq!(config_for(MAX_HEAD_DIM + 1), None);
    let cpu = test_context().caps().clone();
    if cpu.is_cpu() {
        let big = config_for_device(128, 4680, &cpu).unwrap();
        let small = config_for_device(128, 93, &cpu).unwrap();
        assert_eq!((big.ds, big.qg, small.qg), (2, 64, CPU_SMALL_QG));
    }
    let gpu = Capabilities::reference_gpu();
    assert_eq!(config_for_device(512, 4096, &gpu), config_for(512));
}

/// [`attention`] and [`cpu_attention`] of random `[n, d, t]` q, k (in
/// ±`qk`) and v (in ±1) from seeds `seed ..= seed + 2`.
fn gpu_and_cpu(
    ctx: &Context,
    shape: [usize; 3],
    seed: u64,
    qk: f32,
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let [n, d, t] = shape;
    let len = n * d * t;
    let qd = rand_vec(len, seed, qk);
    let kd = rand_vec(len, seed + 1, qk);
    let vd = rand_vec(len, seed + 2, 1.0);
    let q = Tensor::from_f32(ctx, &shape, &qd, "q").unwrap();
    let k = Tensor::from_f32(ctx, &shape, &kd, "k").unwrap();
    let v = Tensor::from_f32(ctx, &shape, &vd, "v").unwrap();
    let out = Tensor::empty(ctx, &shape, DType::F32, "out").unwrap();
    let mut rec = Recorder::new(ctx);
    attention(&mut rec, &q, &k, &v, scale, &out).unwrap();
    rec.submit().unwrap();
    let want = cpu_attention(&qd, &kd, &vd, n, d, t, scale);
    (out.to_f32(ctx).unwrap(), want)
}

/// Wide heads (d > 512: output chunks over workgroups, see the shader's
/// "Wide heads") on the engine's own configuration: odd d, d just past a
/// chunk, Qwen-Image 2.1's 1152, and 2048; odd T (300 keys are split over
/// several dispatches on CPU adapters). Batch 2, f64 reference, 1e-5 abs +
/// 1e-4 rel.
#[test]
fn wide_heads_match_cpu() {
    let ctx = test_context();
    for (i, (d, t)) in [
        (513usize, 37usize),
        (1152, 300),
        (1155, 37),
        (2048, 37),
        (2048, 300),
    ]
    .into_iter()
    .enumerate()
    {
        let scale = 1.0 / (d as f32).sqrt();
        let (got, want) = gpu_and_cpu(&ctx, [2, d, t], 900 + 3 * i as u64, 2.0, scale);
        assert_close(
            &got,
            &want,
            1e-5,
            1e-4,
            &format!("wide attention d={d} T={t}"),
        );
    }
}

/// d in {8, 33, 64, 512} x T in {1, 7, 37, 300}, batch 2, against an f64
/// reference. Tolerance: 1e-4 relative + 1e-5 absolute. Inputs in
/// [-2, 2] with scale 1/sqrt(d) give peaked as well as flat softmaxes.
#[test]
fn attention_matches_cpu() {
    let ctx = test_context();
    let n = 2;
    let mut seed = 0;
    for d in [8usize, 33, 64, 512] {
        for t in [1usize, 7, 37, 300] {
            seed += 3;
            let scale = 1.0 / (d as f32).sqrt();
            let (got, want) = gpu_and_cpu(&ctx, [n, d, t], seed, 2.0, scale);
            assert_close(&got, &want, 1e-5, 1e-4, &format!("attention d={d} T={t}"));
        }
    }
}

/// Every configuration (GPU table, CPU table, short-block CPU variants),
/// forced, at its largest head dimension, one odd one below, and (wide, in
/// output chunks) one odd one above and one of 2.25 chunks, with a
/// sink + window + causal mask and odd token counts, against the CPU.
/// (On this CPU adapter the engine itself would pick only the CPU table.)
#[test]
fn every_configuration_matches_cpu() {
    use crate::attention::cpu::cpu_attention as cpu_mha;
    let ctx = test_context();
    let small = CPU_CONFIGS.map(|c| cfg(c.ds, CPU_SMALL_QG, c.dpt));
    let mask = Mask::frame_window(7, 1, Some(2)).and_causal();
    let mut seed = 500;
    for c in CONFIGS.iter().chain(&CPU_CONFIGS).chain(&small).copied() {
        if check_device(&Recorder::new(&ctx), &c, c.max_d()).is_err() {
            println!("{c:?}: does not fit this device, skipped");
            continue;
        }
        let wide = 2 * c.max_d() + c.max_d() / 4;
        for d in [c.max_d(), c.max_d() - 3, c.max_d() + 1, wide] {
            seed += 3;
            let (h, t) = (2, 37);
            let qd = rand_vec(t * h * d, seed, 2.0);
            let kd = rand_vec(t * h * d, seed + 1, 2.0);
            let vd = rand_vec(t * h * d, seed + 2, 1.0);
            let shape = [1, t, h, d];
            let q = Tensor::from_f32(&ctx, &shape, &qd, "q").unwrap();
            let k = Tensor::from_f32(&ctx, &shape, &kd, "k").unwrap();
            let v = Tensor::from_f32(&ctx, &shape, &vd, "v").unwrap();
            let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
            let scale = 1.0 / (d as f32).sqrt();
            let strides = Strides::token_major(t, h, d);
            let prob = AttentionProblem {
                mask,
                config: Some(c),
                f16_operands: false,
                ..AttentionProblem::self_attention(1, h, t, d, strides, scale)
            };
            let mut rec = Recorder::new(&ctx);
            flash_attention(&mut rec, &prob, &q, KvInput::F32 { k: &k, v: &v }, &out).unwrap();
            rec.submit().unwrap();
            // `out` against the CPU over keys `k` and values `v`.
            let check = |k: &[f32], v: &[f32], what: &str| {
                let want = cpu_mha(&qd, k, v, 1, h, t, t, d, scale, &mask, 0);
                let what = format!("{what}{c:?} d={d}");
                assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-5, 1e-4, &what);
            };
            check(&kd, &vd, "");
            if d % 4 == 0 {
                // int8 K/V through the same configuration, against the
                // CPU over the dequantised values.
                let mut rec = Recorder::new(&ctx);
                let k8 = crate::attention::QuantizedKv::quantize(&mut rec, &k, "k").unwrap();
                let v8 = crate::attention::QuantizedKv::quantize(&mut rec, &v, "v").unwrap();
                let kv = KvInput::Int8 {
                    k_codes: &k8.codes,
                    k_scales: &k8.scales,
                    v_codes: &v8.codes,
                    v_scales: &v8.scales,
                };
                flash_attention(&mut rec, &prob, &q, kv, &out).unwrap();
                rec.submit().unwrap();
                let (kq, vq) = (k8.to_f32(&ctx).unwrap(), v8.to_f32(&ctx).unwrap());
                check(&kq, &vq, "int8 ");
            }
        }
    }
}

/// Large logits (scale 1): the online softmax must not overflow.
#[test]
fn attention_is_stable_with_large_scores() {
    let ctx = test_context();
    let (got, want) = gpu_and_cpu(&ctx, [1, 64, 45], 91, 4.0, 1.0);
    // Logits reach ~±200: exp's relative error grows with |x| (Vulkan: 3 + 2|x| ulp).
    assert_close(&got, &want, 1e-4, 1e-3, "large-score attention");
}

#[test]
fn bad_shapes_are_errors() {
    let ctx = test_context();
    let q = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "q").unwrap();
    let k = Tensor::empty(&ctx, &[1, 8, 6], DType::F32, "k").unwrap();
    let mut rec = Recorder::new(&ctx);
    assert!(matches!(
        attention(&mut rec, &q, &k, &q, 1.0, &q),
        Err(Error::Shape { .. })
    ));
    let q4 = Tensor::empty(&ctx, &[1, 8, 5, 1], DType::F32, "q4").unwrap();
    assert!(matches!(
        attention(&mut rec, &q4, &q4, &q4, 1.0, &q4),
        Err(Error::Shape { .. })
    ));
    let big = Tensor::empty(&ctx, &[1, MAX_HEAD_DIM + 1, 2], DType::F32, "big").unwrap();
    assert!(matches!(
        attention(&mut rec, &big, &big, &big, 1.0, &big),
        Err(Error::Unsupported(_))
    ));
}

/// Columns `[t0, t1)` of `[n, d, t]` data.
fn columns(x: &[f32], n: usize, d: usize, t: usize, t0: usize, t1: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * d * (t1 - t0));
    for row in 0..n * d {
        out.extend_from_slice(&x[row * t + t0..row * t + t1]);
    }
    out
}

/// Keys split over separate tensors (uneven blocks, blocks shorter than
/// a key tile, one block longer than a CPU adapter runs in one dispatch)
/// combine through `flash_attention_block` to attention over all keys;
/// d in {33, 64, 512, 1152 (wide: a state per output chunk)}, batch 2, odd
/// query counts. Tolerance 1e-5 abs + 1e-4 rel vs an f64 reference.
#[test]
fn key_blocks_combine_to_full_attention() {
    let ctx = test_context();
    let caps = ctx.caps().clone();
    let n = 2;
    let cpu_share = |d: usize, tq: usize| {
        config_for_device(d, tq, &caps)
            .and_then(|c| keys_per_dispatch(&c, d, false, &caps))
            .unwrap_or(40)
    };
    let long = cpu_share(512, 9) + 13;
    for (d, tq, k_splits) in [
        (33usize, 37usize, vec![0, 5, 20, 37]),
        (64, 13, vec![0, 1, 9, 30, 45]),
        (512, 29, vec![0, 29]),
        (512, 9, vec![0, 7, 7 + long, 7 + long + 3]),
        (1152, 11, vec![0, 3, 3 + long, 3 + long + 9]),
    ] {
        let tk = *k_splits.last().unwrap();
        let qd = rand_vec(n * d * tq, d as u64, 2.0);
        let kd = rand_vec(n * d * tk, d as u64 + 1, 2.0);
        let vd = rand_vec(n * d * tk, d as u64 + 2, 1.0);
        let scale = 1.0 / (d as f32).sqrt();
        let want = super::cpu::cpu_cross_attention(&qd, &kd, &vd, n, d, tq, tk, scale);
        let q = Tensor::from_f32(&ctx, &[n, d, tq], &qd, "q").unwrap();
        let out = Tensor::empty(&ctx, &[n, d, tq], DType::F32, "out").unwrap();
        let problem = |len: usize| AttentionProblem {
            batch: n,
            heads: 1,
            q_len: tq,
            kv_len: len,
            head_dim: d,
            q_strides: Strides::channel_major(d, tq),
            kv_strides: Strides::channel_major(d, len),
            scale,
            mask: Mask::NONE,
            q_pos0: 0,
            config: None,
            f16_operands: false,
        };
        let state = state_len(&problem(1), false, &caps);
        assert_eq!(state, n * tq * 2 * d.div_ceil(512), "d={d}");
        let stats = Tensor::empty(&ctx, &[state], DType::F32, "stats").unwrap();
        let mut rec = Recorder::new(&ctx);
        let blocks = k_splits.len() - 1;
        for (b, ks) in k_splits.windows(2).enumerate() {
            let len = ks[1] - ks[0];
            let [k, v] = [(&kd, "k"), (&vd, "v")].map(|(data, name)| {
                let block = columns(data, n, d, tk, ks[0], ks[1]);
                Tensor::from_f32_in(&mut rec, &[n, d, len], &block, name).unwrap()
            });
            let prob = problem(len);
            let role = BlockRole {
                first: b == 0,
                last: b + 1 == blocks,
            };
            flash_attention_block(
                &mut rec,
                &prob,
                &q,
                KvInput::F32 { k: &k, v: &v },
                &out,
                Some(&stats),
                role,
            )
            .unwrap();
        }
        rec.submit().unwrap();
        assert_close(
            &out.to_f32(&ctx).unwrap(),
            &want,
            1e-5,
            1e-4,
            &format!("d={d} queries {tq} key blocks {k_splits:?}"),
        );
    }
    // A block of a longer sequence without a stats scratch is an error.
    let q = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "q").unwrap();
    let o = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "o").unwrap();
    let prob = AttentionProblem {
        batch: 1,
        heads: 1,
        q_len: 5,
        kv_len: 5,
        head_dim: 8,
        q_strides: Strides::channel_major(8, 5),
        kv_strides: Strides::channel_major(8, 5),
        scale: 1.0,
        mask: Mask::NONE,
        q_pos0: 0,
        config: None,
        f16_operands: false,
    };
    let role = BlockRole {
        first: true,
        last: false,
    };
    let mut rec = Recorder::new(&ctx);
    assert!(matches!(
        flash_attention_block(
            &mut rec,
            &prob,
            &q,
            KvInput::F32 { k: &q, v: &q },
            &o,
            None,
            role
        ),
        Err(Error::Shape { .. })
    ));
}

/// Rough throughput: `cargo test --lib attention_throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn attention_throughput() {
    let ctx = test_context();
    let t: usize = std::env::var("ATT_T")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096);
    let d: usize = std::env::var("ATT_D")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let n = 1;
    let shape = [n, d, t];
    let data = rand_vec(n * d * t, 5, 1.0);
    let q = Tensor::from_f32(&ctx, &shape, &data, "q").unwrap();
    let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
    // Warm up (pipeline compile) on a small problem.
    let small = Tensor::from_f32(&ctx, &[1, d, 16], &data[..d * 16], "s").unwrap();
    let small_out = Tensor::empty(&ctx, &[1, d, 16], DType::F32, "so").unwrap();
    let mut rec = Recorder::new(&ctx);
    attention(&mut rec, &small, &small, &small, 0.044, &small_out).unwrap();
    rec.submit().unwrap();
    ctx.wait_idle().unwrap();
    let start = std::time::Instant::now();
    let mut rec = Recorder::new(&ctx);
    attention(&mut rec, &q, &q, &q, 1.0 / (d as f32).sqrt(), &out).unwrap();
    rec.submit().unwrap();
    ctx.wait_idle().unwrap();
    let secs = start.elapsed().as_secs_f64();
    let flops = 4.0 * (t * t * d) as f64;
    println!(
        "attention d={d} T={t}: {:.3} s, {:.2} GFLOP/s",
        secs,
        flops / secs / 1e9
    );
}

/// Multi-head throughput, GPU time from timestamps:
/// `ATT_T=4096 ATT_H=16 ATT_D=8 ATT_WINDOW=64,1,8 ATT_INT8=1 cargo test --lib multihead_throughput -- --ignored --nocapture`
/// (ATT_WINDOW = tokens per frame, sinks, window frames).
#[test]
#[ignore]
fn multihead_throughput() {
    use crate::attention::{
        multi_head_attention, multi_head_attention_int8, AttentionOptions, QuantizedKv,
    };
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (t, h, d) = (env("ATT_T", 2048), env("ATT_H", 16), env("ATT_D", 8));
    let mask = match std::env::var("ATT_WINDOW") {
        Ok(w) => {
            let v: Vec<usize> = w.split(',').filter_map(|x| x.parse().ok()).collect();
            Mask::frame_window(v[0], v[1], Some(v[2]))
        }
        Err(_) => Mask::NONE,
    };
    let int8 = std::env::var("ATT_INT8").is_ok();
    // ATT_CFG=ds,qg,dpt forces a configuration.
    let forced = std::env::var("ATT_CFG").ok().map(|v| {
        let v: Vec<u32> = v.split(',').filter_map(|x| x.parse().ok()).collect();
        cfg(v[0], v[1], v[2])
    });
    let ctx = test_context();
    let shape = [1, t, h, d];
    let x = Tensor::from_f32(&ctx, &shape, &rand_vec(t * h * d, 1, 1.0), "x").unwrap();
    let y = Tensor::from_f32(&ctx, &shape, &rand_vec(t * h * d, 2, 1.0), "y").unwrap();
    let nq = env("ATT_Q", t);
    let qx = Tensor::from_f32(&ctx, &[1, nq, h, d], &rand_vec(nq * h * d, 3, 1.0), "q").unwrap();
    let out = Tensor::empty(&ctx, &[1, nq, h, d], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&ctx);
    let k8 = QuantizedKv::quantize(&mut rec, &x, "k").unwrap();
    let v8 = QuantizedKv::quantize(&mut rec, &y, "v").unwrap();
    rec.submit().unwrap();
    let opts = AttentionOptions::masked(mask);
    // Process CPU seconds (utime + stime): on a software rasteriser this
    // measures the work even when other processes share the cores.
    let cpu_s = || -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let rest = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<f64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
    };
    for run in 0..3 {
        let c0 = cpu_s();
        let mut rec = Recorder::new(&ctx);
        rec.enable_profiling();
        if let Some(config) = forced {
            let prob = AttentionProblem {
                batch: 1,
                heads: h,
                q_len: nq,
                kv_len: t,
                head_dim: d,
                q_strides: Strides::token_major(nq, h, d),
                kv_strides: Strides::token_major(t, h, d),
                scale: 1.0 / (d as f32).sqrt(),
                mask,
                q_pos0: 0,
                config: Some(config),
                f16_operands: false,
            };
            let kv = if int8 {
                KvInput::Int8 {
                    k_codes: &k8.codes,
                    k_scales: &k8.scales,
                    v_codes: &v8.codes,
                    v_scales: &v8.scales,
                }
            } else {
                KvInput::F32 { k: &x, v: &y }
            };
            flash_attention(&mut rec, &prob, &qx, kv, &out).unwrap();
        } else if int8 {
            multi_head_attention_int8(&mut rec, &qx, &k8, &v8, &out, &opts).unwrap();
        } else {
            multi_head_attention(&mut rec, &qx, &x, &y, &out, &opts).unwrap();
        }
        let rec_macs: u64 = rec.labels().iter().map(|l| l.macs).sum();
        let (_, prof) = rec.submit_profiled().unwrap();
        let p = prof.unwrap();
        let cpu = cpu_s() - c0;
        let macs: u64 = rec_macs;
        let flop = 2.0 * macs as f64 / 1e9;
        println!(
            "run {run}: Q={nq} T={t} H={h} d={d} int8={int8} {mask:?}: {:.1} ms, {:.2} GFLOP/s; {cpu:.2} CPU s, {:.2} GFLOP per CPU s",
            p.gpu_ms, flop / (p.gpu_ms / 1e3), flop / cpu
        );
    }
}

/// Dry runs: a call whose signature already passed its checks repeats its
/// dispatch labels without redoing them; a call of the same shapes that
/// aliases its output, or a too-short operand, is still refused.
#[test]
fn dry_runs_repeat_checked_calls_and_still_refuse_bad_ones() {
    let ctx = Context::null(
        Capabilities::reference_gpu(),
        crate::memory::Policy::Exact.new_pool(),
    );
    let (n, c, t) = (1, 8, 16);
    let f32s = |shape: &[usize]| Tensor::empty(&ctx, shape, DType::F32, "dry").unwrap();
    let (q, k, v, acc) = (
        f32s(&[n, c, t]),
        f32s(&[n, c, t]),
        f32s(&[n, c, t]),
        f32s(&[n, c, t]),
    );
    let ml = f32s(&[n, t, 2]);
    let prob = AttentionProblem {
        batch: n,
        heads: 1,
        q_len: t,
        kv_len: t,
        head_dim: c,
        q_strides: Strides::channel_major(c, t),
        kv_strides: Strides::channel_major(c, t),
        scale: 0.5,
        mask: Mask::NONE,
        q_pos0: 0,
        config: None,
        f16_operands: false,
    };
    let role = BlockRole {
        first: true,
        last: false,
    };
    let mut rec = Recorder::new(&ctx);
    let kv = || KvInput::F32 { k: &k, v: &v };
    flash_attention_block(&mut rec, &prob, &q, kv(), &acc, Some(&ml), role).unwrap();
    let once = rec.dry_mark();
    assert!(once > 0);
    for _ in 0..3 {
        flash_attention_block(&mut rec, &prob, &q, kv(), &acc, Some(&ml), role).unwrap();
    }
    assert_eq!(
        rec.dry_mark(),
        4 * once,
        "each repeat records the same labels"
    );
    let e = flash_attention_block(&mut rec, &prob, &q, kv(), &q, Some(&ml), role).unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    let short = f32s(&[n, c, t - 1]);
    let kv_short = KvInput::F32 { k: &short, v: &v };
    let e =
        flash_attention_block(&mut rec, &prob, &q, kv_short, &acc, Some(&ml), role).unwrap_err();
    assert!(e.to_string().contains("k must be"), "{e}");
    assert_eq!(rec.dry_mark(), 4 * once, "refused calls record nothing");
    let labels = rec.submit().unwrap();
    assert_eq!(labels.len(), 4 * once);
}
