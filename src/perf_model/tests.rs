use super::*;

fn gemm_layer(kind: LayerKind, g: Gemm) -> Layer {
    Layer {
        op: 0,
        section: String::new(),
        kind,
        work: Work::Gemm(g),
    }
}

/// The prediction of the conv `g` (a `LayerKind::Conv` layer).
fn conv_on(g: Gemm, gpu: &GpuSpec, t: &Tiles, path: PathKind) -> Prediction {
    predict(&gemm_layer(LayerKind::Conv, g), gpu, t, path).unwrap()
}

/// SD1.5's up-block 3×3 512→512 conv at 64×64 (512² output).
fn sd_conv() -> Gemm {
    Gemm::conv(512, 512, 3, (64, 64))
}

fn sd15_512() -> Workload {
    workload("SD1.5", DecoderKind::Image("sd15"), (512, 512), 1).unwrap()
}

fn gemms(w: &Workload) -> impl Iterator<Item = (&Layer, &Gemm)> {
    w.layers.iter().filter_map(|l| match &l.work {
        Work::Gemm(g) => Some((l, g)),
        Work::Pass(_) => None,
    })
}

#[test]
fn flops_of_known_layers() {
    assert_eq!(sd_conv().flops(), 2.0 * 512.0 * 512.0 * 9.0 * 4096.0);
    // The output conv 128→3 at 512².
    let out = Gemm::conv(128, 3, 3, (512, 512));
    assert_eq!(out.flops(), 2.0 * 3.0 * 128.0 * 9.0 * 512.0 * 512.0);
    // Frames multiply.
    let mut video = Gemm::conv(384, 384, 3, (60, 104));
    video.frames = 21;
    assert_eq!(video.flops(), 21.0 * 2.0 * 384.0 * 3456.0 * 6240.0);
}

/// The graph walk finds the SD1.5 decoder's layers with the right shapes.
#[test]
fn sd15_graph_layers() {
    let w = sd15_512();
    let n_512 = gemms(&w)
        .filter(|(l, g)| {
            l.kind == LayerKind::Conv
                && (g.cin, g.cout, g.k, g.ho, g.wo) == (512, 512, 3, 64, 64)
                && !g.upsample
        })
        .inspect(|(_, g)| assert_eq!(g.flops(), 2.0 * 512.0 * 512.0 * 9.0 * 4096.0))
        .count();
    // Mid-block: 2 resnets × 2 convs; up block 0: 3 resnets × 2 convs.
    assert_eq!(n_512, 10);
    // The up-sample convs: 64→128, 128→256, 256→512, fused.
    let ups: Vec<(usize, usize, usize)> = gemms(&w)
        .filter(|(_, g)| g.upsample)
        .map(|(_, g)| (g.cin, g.ho, g.hi))
        .collect();
    assert_eq!(ups, [(512, 128, 64), (512, 256, 128), (256, 512, 256)]);
    // Two shortcuts (512→256, 256→128), conv_out 128→3 at 512² with the GroupNorm prologue.
    let shortcuts: Vec<(usize, usize)> = gemms(&w)
        .filter(|(l, _)| l.kind == LayerKind::Shortcut)
        .map(|(_, g)| (g.cin, g.cout))
        .collect();
    assert_eq!(shortcuts, [(512, 256), (256, 128)]);
    let (last, out) = gemms(&w).last().unwrap();
    assert_eq!(last.kind, LayerKind::Conv);
    assert_eq!((out.cin, out.cout, out.ho, out.wo), (128, 3, 512, 512));
    assert!(out.prologue);
    // The attention: 4096 tokens of 512.
    let qk: Vec<&Gemm> = gemms(&w)
        .filter(|(l, _)| l.kind == LayerKind::AttnQk)
        .map(|(_, g)| g)
        .collect();
    assert_eq!(qk.len(), 1);
    assert_eq!(qk[0].flops(), 2.0 * 4096.0 * 4096.0 * 512.0);
    assert_eq!(w.layers[0].section, "post_quant_conv");
    // The whole decoder: 2.51 TFLOP at 512² (as measured against PyTorch's count).
    let total: f64 = gemms(&w).map(|(_, g)| g.flops()).sum();
    assert!((total / 2.51e12 - 1.0).abs() < 0.02, "{total:e}");
}

/// Wan 2.1 at 480×832, 21 latent frames: 81 output frames, causal taps per
/// frame, time up-sampling 21 → 41 → 81 frames.
#[test]
fn wan21_graph_layers() {
    let w = workload("Wan 2.1", DecoderKind::Wan21, (480, 832), 21).unwrap();
    assert_eq!(w.frames, 81);
    let conv_in: Vec<&Gemm> = gemms(&w)
        .filter(|(l, g)| l.kind == LayerKind::CausalTap && g.cin == 16)
        .map(|(_, g)| g)
        .collect();
    assert_eq!(conv_in.len(), 3, "three time taps");
    assert!(conv_in
        .iter()
        .all(|g| (g.cout, g.ho, g.wo, g.frames) == (384, 60, 104, 21)));
    assert_eq!(
        conv_in.iter().filter(|g| g.residual).count(),
        2,
        "the earlier taps accumulate"
    );
    let time: Vec<(usize, usize, usize)> = gemms(&w)
        .filter(|(l, _)| l.kind == LayerKind::TimeConv)
        .map(|(_, g)| (g.cout, g.ho, g.frames))
        .collect();
    assert_eq!(
        time,
        [(768, 60, 20); 3]
            .iter()
            .chain(&[(768, 120, 40); 3])
            .copied()
            .collect::<Vec<_>>()
    );
    let (_, out) = gemms(&w).last().unwrap();
    assert_eq!((out.cout, out.ho, out.wo, out.frames), (3, 480, 832, 81));
    let attn: Vec<&Gemm> = gemms(&w)
        .filter(|(l, _)| l.kind == LayerKind::AttnPv)
        .map(|(_, g)| g)
        .collect();
    assert_eq!(attn.len(), 1);
    assert_eq!((attn[0].cout, attn[0].n(), attn[0].frames), (384, 6240, 21));
}

#[test]
fn tiles_follow_the_output_channels() {
    let t = Tiles::default();
    let m = |c| t.pick(PathKind::Matrix, c);
    assert_eq!((m(512).bm, m(512).bn, m(512).invocations), (128, 128, 256));
    assert_eq!((m(64).bm, m(64).invocations), (64, 128));
    assert_eq!((m(3).bm, m(3).invocations), (16, 128));
    // A: 128×32 f16, B: 32×128 f16, 8 subgroups × 16×16 f32 scratch.
    assert_eq!(m(512).smem, 8192 + 8192 + 8 * 1024);
    let s = |c| t.pick(PathKind::Scalar, c);
    assert_eq!((s(512).bm, s(512).bk, s(512).invocations), (128, 8, 256));
    assert_eq!(s(512).smem, 8 * 256 * 4);
    assert_eq!(
        (s(3).bm, s(3).bn, s(3).bk, s(3).invocations),
        (4, 256, 16, 64)
    );
}

#[test]
fn bytes_of_the_tile_model() {
    let t = Tiles::default();
    let p = conv_on(sd_conv(), &GpuSpec::h100_sxm(), &t, PathKind::Matrix);
    // 32 pixel tiles (4×32 patches) × 4 channel tiles.
    assert_eq!(p.workgroups, 128);
    assert_eq!(p.weight_bytes, 32.0 * 512.0 * 4608.0 * 2.0);
    assert_eq!(p.input_bytes, 128.0 * 512.0 * 6.0 * 34.0 * 2.0);
    assert_eq!(p.output_bytes, 512.0 * 4096.0 * 2.0);
    assert_eq!(p.extra_bytes, 0.0);
    assert_eq!(
        p.unique_bytes,
        (512.0 * 4608.0 + 2.0 * 512.0 * 4096.0) * 2.0
    );
    assert!((p.intensity - p.flops / p.bytes).abs() < 1e-9);
    // A fused up-sample reads half the window (+1 halo row and column).
    let mut up = Gemm::conv(512, 512, 3, (64, 64));
    up.upsample = true;
    (up.ho, up.wo) = (128, 128);
    let pu = conv_on(up, &GpuSpec::h100_sxm(), &t, PathKind::Matrix);
    assert_eq!(
        pu.input_bytes,
        pu.workgroups as f64 * 512.0 * 4.0 * 18.0 * 2.0
    );
    // A residual reads one more output.
    let mut res = sd_conv();
    res.residual = true;
    let pr = conv_on(res, &GpuSpec::h100_sxm(), &t, PathKind::Matrix);
    assert_eq!(pr.bytes - p.bytes, p.output_bytes);
}

#[test]
fn executed_flops_pay_for_whole_tiles() {
    let t = Tiles::default();
    let out = Gemm::conv(128, 3, 3, (512, 512));
    let p = conv_on(out, &GpuSpec::rtx_4090(), &t, PathKind::Matrix);
    assert_eq!(p.exec_flops / p.flops, 16.0 / 3.0);
    let s = conv_on(out, &GpuSpec::rtx_4090(), &t, PathKind::Scalar);
    assert_eq!(s.exec_flops / s.flops, 4.0 / 3.0);
}

#[test]
fn occupancy_limits() {
    let h100 = GpuSpec::h100_sxm();
    let ada = GpuSpec::rtx_4090();
    let tile = |invocations, regs, smem| Tile {
        bm: 128,
        bn: 128,
        bk: 32,
        invocations,
        regs,
        smem,
    };
    // Threads: 1024 invocations, 1536 threads per SM on Ada.
    let o = occupancy(&ada, &tile(1024, 32, 0));
    assert_eq!((o.wg_per_sm, o.limiter), (1, Limiter::Threads));
    assert_eq!(occupancy(&h100, &tile(1024, 32, 0)).wg_per_sm, 2);
    // Blocks: one warp each, few registers.
    let o = occupancy(&h100, &tile(32, 16, 0));
    assert_eq!((o.wg_per_sm, o.limiter), (32, Limiter::Blocks));
    assert_eq!(occupancy(&ada, &tile(32, 16, 0)).wg_per_sm, 24);
    // Registers: 8 warps of 255 registers (8192 a warp): 2 warps per sub-partition.
    let o = occupancy(&h100, &tile(256, 255, 0));
    assert_eq!((o.wg_per_sm, o.limiter), (1, Limiter::Registers));
    // Shared memory: 100 KB + 1 KB reserved; over Ada's 99 KB per block.
    let o = occupancy(&h100, &tile(128, 32, 100 * 1024));
    assert_eq!((o.wg_per_sm, o.limiter), (2, Limiter::SharedMemory));
    assert_eq!(occupancy(&ada, &tile(128, 32, 100 * 1024)).wg_per_sm, 0);
    let mut big = Tiles::default();
    big.matrix.bk = 256; // A + B = 128 KB of f16
    let l = gemm_layer(LayerKind::Conv, sd_conv());
    assert!(predict(&l, &ada, &big, PathKind::Matrix).is_none());
    assert!(predict(&l, &h100, &big, PathKind::Matrix).is_some());
    // The engine's tiles fit both GPUs.
    for gpu in GpuSpec::all() {
        for path in PathKind::ALL {
            for m in [3, 16, 64, 128, 512] {
                let t = Tiles::default().pick(path, m);
                assert!(
                    occupancy(&gpu, &t).wg_per_sm >= 1,
                    "{} {path:?} {m}",
                    gpu.name
                );
            }
        }
    }
}

#[test]
fn wave_quantisation() {
    let gpu = GpuSpec::h100_sxm();
    let t = Tiles::default();
    let tile = t.pick(PathKind::Matrix, 128);
    let slots = (gpu.sms * occupancy(&gpu, &tile).wg_per_sm) as usize;
    // One 4×32 patch per frame: one workgroup per frame.
    let layer = |frames| {
        let mut g = Gemm::conv(512, 128, 3, (4, 32));
        g.frames = frames;
        gemm_layer(LayerKind::Conv, g)
    };
    let full = predict(&layer(slots), &gpu, &t, PathKind::Matrix).unwrap();
    let over = predict(&layer(slots + 1), &gpu, &t, PathKind::Matrix).unwrap();
    assert_eq!((full.waves, full.wave_efficiency), (1, 1.0));
    assert_eq!(over.waves, 2);
    assert!((over.time_s / full.time_s - 2.0).abs() < 1e-9);
    // Half a wave idle or more: latency-bound.
    let few = predict(&layer(slots / 4), &gpu, &t, PathKind::Matrix).unwrap();
    assert_eq!(few.bound, Bound::Latency);
    assert!((few.time_s - full.time_s).abs() < 1e-12 * full.time_s.max(1.0));
}

#[test]
fn roofline_is_monotonic() {
    let t = Tiles::default();
    for gpu in GpuSpec::all() {
        for path in PathKind::ALL {
            let time = |g: Gemm, gpu: &GpuSpec| conv_on(g, gpu, &t, path).time_s;
            let mut prev = 0.0;
            for side in [8, 16, 32, 64, 128, 256, 512] {
                let now = time(Gemm::conv(256, 256, 3, (side, side)), &gpu);
                assert!(now >= prev, "{} {path:?} {side}", gpu.name);
                prev = now;
            }
            let mut prev = 0.0;
            for cin in [4, 16, 64, 256, 1024] {
                let now = time(Gemm::conv(cin, 256, 3, (128, 128)), &gpu);
                assert!(now >= prev, "{} {path:?} cin {cin}", gpu.name);
                prev = now;
            }
            // A faster memory or more FLOP/s never slows a layer down.
            let g = Gemm::conv(512, 512, 3, (64, 64));
            let base = time(g, &gpu);
            let mut fast = gpu.clone();
            fast.bandwidth *= 2.0;
            assert!(time(g, &fast) <= base);
            fast.matrix_flops *= 2.0;
            fast.fp32_flops *= 2.0;
            assert!(time(g, &fast) <= time(g, &gpu));
        }
    }
}

#[test]
fn roofline_picks_the_larger_term() {
    let t = Tiles::default();
    let gpu = GpuSpec::rtx_4090();
    let l = gemm_layer(LayerKind::Conv, Gemm::conv(512, 512, 3, (256, 256)));
    let p = predict(&l, &gpu, &t, PathKind::Matrix).unwrap();
    assert!((p.compute_s - p.exec_flops / gpu.matrix_flops).abs() < 1e-15);
    assert!((p.memory_s - p.bytes / gpu.bandwidth).abs() < 1e-15);
    let q = 1.0 / p.wave_efficiency;
    assert!((p.time_s - p.compute_s.max(p.memory_s) * q).abs() < 1e-12);
    assert!(p.time_reuse_s <= p.time_s && p.time_s <= p.time_serial_s);
    // A 1×1 conv of few channels is bandwidth-bound; a wide 3×3 one is not.
    let thin = gemm_layer(LayerKind::Conv, Gemm::conv(16, 16, 1, (512, 512)));
    assert_eq!(
        predict(&thin, &gpu, &t, PathKind::Matrix).unwrap().bound,
        Bound::Bandwidth
    );
    let s = predict(&l, &gpu, &t, PathKind::Scalar).unwrap();
    assert_eq!(s.bound, Bound::Compute);
    assert!(s.time_s > p.time_s);
}

#[test]
fn totals_sum_the_rows() {
    let w = sd15_512();
    for gpu in GpuSpec::all() {
        let (m_preds, m) =
            predict_all(&w.layers, &gpu, &Tiles::default(), PathKind::Matrix).unwrap();
        let (_, s) = predict_all(&w.layers, &gpu, &Tiles::default(), PathKind::Scalar).unwrap();
        assert_eq!(m.layers, w.layers.len());
        let sum: f64 = m_preds.iter().map(|p| p.time_s).sum();
        assert!((m.time_s - sum).abs() < 1e-12);
        assert!(m.time_s > 0.0 && m.flops > 0.0 && m.bytes > m.unique_bytes);
        assert!(
            s.time_s > m.time_s,
            "{}: no matrix units is slower",
            gpu.name
        );
        assert!((0.0..=100.0).contains(&m.bandwidth_bound_pct()));
        assert!(m.pass_s > 0.0 && m.attention_s > 0.0);
    }
}

/// The kernel-level estimate against the one H100 measurement of the cooperative conv
/// (assets/reports/h100_2026-11-27, run4: 40 convs of the SD1.5 1024² f16 decode, 239.0 ms of
/// GPU time with the unpadded, one-stage kernel): within 1.5× of it. The other designs'
/// estimates are printed, not pinned (no measurement to hold them to), except that each
/// change of the rebuild is estimated to help.
#[test]
fn kernel_estimate_matches_the_h100_measurement() {
    use super::kernel::{conv_total, ConvDesign, SmRates};
    let w = workload("SD1.5", DecoderKind::Image("sd15"), (1024, 1024), 1).unwrap();
    let (gpu, rates, tiles) = (GpuSpec::h100_sxm(), SmRates::h100_sxm(), Tiles::default());
    let mut totals = Vec::new();
    for d in ConvDesign::all() {
        let (s, n) = conv_total(&w.layers, &gpu, &rates, &tiles, &d).unwrap();
        eprintln!(
            "SD1.5 1024² convs on H100, {}: {:.1} ms over {n} convs",
            d.name,
            s * 1e3
        );
        assert_eq!(
            n, 40,
            "the decode's convs (the profile's 40 conv2d_coop calls)"
        );
        totals.push(s * 1e3);
    }
    let measured = 239.0;
    let before = totals[0];
    assert!(
        before / measured < 1.5 && measured / before < 1.5,
        "model {before:.1} ms vs measured {measured} ms"
    );
    // Each change helps: padding, then pipelining with two stages.
    assert!(totals[1] < totals[0] && totals[2] < totals[1], "{totals:?}");
}
