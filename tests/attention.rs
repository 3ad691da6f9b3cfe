//! Multi-head flash attention, masks, KV caches and int8 K/V against naive
//! CPU references. Tolerance for f32 outputs: 1e-5 absolute + 1e-4 relative
//! (f64 reference); int8 outputs are compared with the CPU over the same
//! dequantised K/V (same tolerance) and with f32 (cosine similarity >= 0.999).

use std::sync::Arc;

use wgvae::attention::cpu::{cosine_similarity, cpu_attention, token_to_head_major};
use wgvae::attention::quant::{cpu_dequantize, cpu_quantize};
use wgvae::attention::{
    multi_head_attention, multi_head_attention_int8, AttentionOptions, ConcatKvCache,
    KvCacheConfig, KvDtype, Layout, Mask, QuantizedKv, RingKvCache,
};
use wgvae::gpu::{Capabilities, Context, Recorder};
use wgvae::memory::{Policy, TracingPool};
use wgvae::testing::{assert_close, max_abs_diff, rand_vec, test_context};
use wgvae::{DType, Error, LoadOptions, Tensor, Vae};

const ATOL: f32 = 1e-5;
const RTOL: f32 = 1e-4;

fn upload(ctx: &Context, shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::from_f32(ctx, shape, data, "test input").unwrap()
}

struct Case {
    batch: usize,
    heads: usize,
    n_q: usize,
    n_kv: usize,
    d: usize,
    mask: Mask,
    q_pos0: usize,
    layout: Layout,
}

fn run_case(ctx: &Context, c: &Case, seed: u64) {
    let (b, h, d) = (c.batch, c.heads, c.d);
    let qd = rand_vec(b * c.n_q * h * d, seed, 2.0);
    let kd = rand_vec(b * c.n_kv * h * d, seed + 1, 2.0);
    let vd = rand_vec(b * c.n_kv * h * d, seed + 2, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let want = cpu_attention(
        &qd, &kd, &vd, b, h, c.n_q, c.n_kv, d, scale, &c.mask, c.q_pos0,
    );
    let (q, k, v, out, want) = match c.layout {
        Layout::TokenMajor => (
            upload(ctx, &[b, c.n_q, h, d], &qd),
            upload(ctx, &[b, c.n_kv, h, d], &kd),
            upload(ctx, &[b, c.n_kv, h, d], &vd),
            Tensor::empty(ctx, &[b, c.n_q, h, d], DType::F32, "out").unwrap(),
            want,
        ),
        Layout::HeadMajor => (
            upload(
                ctx,
                &[b, h, c.n_q, d],
                &token_to_head_major(&qd, b, c.n_q, h, d),
            ),
            upload(
                ctx,
                &[b, h, c.n_kv, d],
                &token_to_head_major(&kd, b, c.n_kv, h, d),
            ),
            upload(
                ctx,
                &[b, h, c.n_kv, d],
                &token_to_head_major(&vd, b, c.n_kv, h, d),
            ),
            Tensor::empty(ctx, &[b, h, c.n_q, d], DType::F32, "out").unwrap(),
            token_to_head_major(&want, b, c.n_q, h, d),
        ),
    };
    let opts = AttentionOptions {
        layout: c.layout,
        mask: c.mask,
        scale: None,
        query_offset: c.q_pos0,
    };
    let mut rec = Recorder::new(ctx);
    multi_head_attention(&mut rec, &q, &k, &v, &out, &opts).unwrap();
    rec.submit().unwrap();
    let what = format!(
        "B{b} H{h} d{d} q{}@{} kv{} {:?} {:?}",
        c.n_q, c.q_pos0, c.n_kv, c.mask, c.layout
    );
    assert_close(&out.to_f32(ctx).unwrap(), &want, ATOL, RTOL, &what);
}

/// Every mask type (none, causal, sink + window, frame attention, global
/// frames, window + causal, chunked queries at an offset), odd token counts,
/// head dims 8 / 20 / 33 / 64 / 128 (every kernel configuration), both layouts.
#[test]
fn every_mask_matches_cpu() {
    let ctx = test_context();
    let tm = Layout::TokenMajor;
    let cases = [
        (1, 1, 1, 1, 8, Mask::NONE, 0, tm),
        (2, 3, 37, 37, 8, Mask::NONE, 0, tm),
        (2, 3, 37, 37, 20, Mask::causal(), 0, Layout::HeadMajor),
        (1, 2, 61, 61, 33, Mask::frame_window(5, 1, Some(2)), 0, tm),
        (
            1,
            2,
            61,
            61,
            64,
            Mask::frame_attention(6),
            0,
            Layout::HeadMajor,
        ),
        (2, 2, 45, 45, 8, Mask::frame_window(4, 2, None), 0, tm),
        (
            1,
            3,
            53,
            53,
            64,
            Mask::frame_window(7, 1, Some(3)).and_causal(),
            0,
            tm,
        ),
        (1, 2, 13, 45, 128, Mask::causal(), 32, tm),
        (
            2,
            2,
            15,
            59,
            20,
            Mask::frame_window(5, 2, Some(2)),
            44,
            Layout::HeadMajor,
        ),
        (1, 2, 7, 29, 128, Mask::NONE, 0, tm),
        (1, 1, 300, 300, 8, Mask::frame_window(16, 1, Some(4)), 0, tm),
        (1, 1, 41, 41, 8, Mask::frame_window(3, 20, Some(1)), 0, tm),
    ];
    for (i, &(batch, heads, n_q, n_kv, d, mask, q_pos0, layout)) in cases.iter().enumerate() {
        let c = Case {
            batch,
            heads,
            n_q,
            n_kv,
            d,
            mask,
            q_pos0,
            layout,
        };
        run_case(&ctx, &c, 10 * i as u64 + 1);
    }
}

/// Long key ranges: software rasterisers cap an invocation's loop
/// iterations (llvmpipe: 65535, then loops exit silently), so on CPU
/// adapters the kernel splits the keys over several dispatches that carry
/// the softmax state. f32 and int8, with and without masks, d = 128 and 512.
#[test]
fn long_key_ranges_match_cpu() {
    let ctx = test_context();
    let cases = [
        (2, 64, 3500, 128, Mask::NONE, 0),
        (2, 64, 3500, 128, Mask::causal(), 3436),
        (1, 64, 3500, 128, Mask::frame_window(100, 2, Some(8)), 3000),
        (
            1,
            200,
            1000,
            512,
            Mask::frame_window(50, 1, Some(12)).and_causal(),
            800,
        ),
    ];
    for (i, &(h, n_q, n_kv, d, mask, q_pos0)) in cases.iter().enumerate() {
        let seed = 900 + 10 * i as u64;
        let qd = rand_vec(n_q * h * d, seed, 2.0);
        let kd = rand_vec(n_kv * h * d, seed + 1, 2.0);
        let vd = rand_vec(n_kv * h * d, seed + 2, 1.0);
        let q = upload(&ctx, &[1, n_q, h, d], &qd);
        let k = upload(&ctx, &[1, n_kv, h, d], &kd);
        let v = upload(&ctx, &[1, n_kv, h, d], &vd);
        let out = Tensor::empty(&ctx, &[1, n_q, h, d], DType::F32, "out").unwrap();
        let out8 = Tensor::empty(&ctx, &[1, n_q, h, d], DType::F32, "out8").unwrap();
        let opts = AttentionOptions {
            mask,
            query_offset: q_pos0,
            ..Default::default()
        };
        let mut rec = Recorder::new(&ctx);
        multi_head_attention(&mut rec, &q, &k, &v, &out, &opts).unwrap();
        let dispatches = rec.labels().len();
        let k8 = QuantizedKv::quantize(&mut rec, &k, "k").unwrap();
        let v8 = QuantizedKv::quantize(&mut rec, &v, "v").unwrap();
        multi_head_attention_int8(&mut rec, &q, &k8, &v8, &out8, &opts).unwrap();
        rec.submit().unwrap();
        if ctx.caps().is_cpu() {
            assert!(
                dispatches > 1,
                "{n_kv} keys at d = {d} ran in one dispatch on a CPU adapter"
            );
        }
        let scale = 1.0 / (d as f32).sqrt();
        let what = format!("H{h} d{d} q{n_q}@{q_pos0} kv{n_kv} {mask:?} ({dispatches} dispatches)");
        let want = cpu_attention(&qd, &kd, &vd, 1, h, n_q, n_kv, d, scale, &mask, q_pos0);
        assert_close(&out.to_f32(&ctx).unwrap(), &want, ATOL, RTOL, &what);
        let (kq, vq) = (k8.to_f32(&ctx).unwrap(), v8.to_f32(&ctx).unwrap());
        let want8 = cpu_attention(&qd, &kq, &vq, 1, h, n_q, n_kv, d, scale, &mask, q_pos0);
        assert_close(
            &out8.to_f32(&ctx).unwrap(),
            &want8,
            ATOL,
            RTOL,
            &format!("int8 {what}"),
        );
    }
}

/// Tiles entirely outside every query block's window are skipped, not
/// masked: keys and values there are NaN, and NaN · 0 would poison the
/// output if a skipped tile were ever read.
#[test]
fn tiles_outside_the_window_are_never_read() {
    let ctx = test_context();
    let (h, d, tpf, frames) = (2, 16, 16, 12);
    let mask = Mask::frame_window(tpf, 1, Some(2));
    // Queries: the last two frames; they see frame 0 and frames 9..=11.
    let (n_kv, q_pos0) = (frames * tpf, 10 * tpf);
    let n_q = n_kv - q_pos0;
    let qd = rand_vec(n_q * h * d, 7, 2.0);
    let mut kd = rand_vec(n_kv * h * d, 8, 2.0);
    let mut vd = rand_vec(n_kv * h * d, 9, 1.0);
    let poisoned = tpf * h * d..9 * tpf * h * d; // frames 1..=8
    kd[poisoned.clone()].fill(f32::NAN);
    vd[poisoned].fill(f32::NAN);
    let scale = 1.0 / (d as f32).sqrt();
    let want = cpu_attention(&qd, &kd, &vd, 1, h, n_q, n_kv, d, scale, &mask, q_pos0);
    let q = upload(&ctx, &[1, n_q, h, d], &qd);
    let k = upload(&ctx, &[1, n_kv, h, d], &kd);
    let v = upload(&ctx, &[1, n_kv, h, d], &vd);
    let out = Tensor::empty(&ctx, &[1, n_q, h, d], DType::F32, "out").unwrap();
    let opts = AttentionOptions {
        mask,
        query_offset: q_pos0,
        ..Default::default()
    };
    let mut rec = Recorder::new(&ctx);
    multi_head_attention(&mut rec, &q, &k, &v, &out, &opts).unwrap();
    rec.submit().unwrap();
    let got = out.to_f32(&ctx).unwrap();
    assert!(got.iter().all(|x| x.is_finite()), "a skipped tile was read");
    assert_close(
        &got,
        &want,
        ATOL,
        RTOL,
        "windowed attention beside NaN frames",
    );
    // Causal: keys after the block's last query are never read either.
    let mut kd2 = rand_vec(40 * d, 3, 2.0);
    let mut vd2 = rand_vec(40 * d, 4, 1.0);
    kd2[32 * d..].fill(f32::NAN);
    vd2[32 * d..].fill(f32::NAN);
    let q2 = upload(&ctx, &[1, 16, 1, d], &rand_vec(16 * d, 5, 2.0));
    let out2 = Tensor::empty(&ctx, &[1, 16, 1, d], DType::F32, "out").unwrap();
    let (k2, v2) = (
        upload(&ctx, &[1, 40, 1, d], &kd2),
        upload(&ctx, &[1, 40, 1, d], &vd2),
    );
    let mut rec = Recorder::new(&ctx);
    let opts = AttentionOptions {
        mask: Mask::causal(),
        query_offset: 8,
        ..Default::default()
    };
    multi_head_attention(&mut rec, &q2, &k2, &v2, &out2, &opts).unwrap();
    rec.submit().unwrap();
    assert!(out2.to_f32(&ctx).unwrap().iter().all(|x| x.is_finite()));
}

/// The quantisation kernel agrees with the CPU (codes within one step where
/// rounding ties differ; scales to 1 ulp) and dequantises within half a step.
#[test]
fn quantize_matches_cpu() {
    let ctx = test_context();
    let (b, t, h, d) = (2, 19, 3, 36);
    let mut x = rand_vec(b * t * h * d, 21, 3.0);
    x[..d].fill(0.0); // an all-zero row: scale 0, codes 0
    let src = upload(&ctx, &[b, t, h, d], &x);
    let mut rec = Recorder::new(&ctx);
    let qkv = QuantizedKv::quantize(&mut rec, &src, "q").unwrap();
    rec.submit().unwrap();
    let (codes, scales) = qkv.read(&ctx).unwrap();
    let (want_codes, want_scales) = cpu_quantize(&x, d);
    assert_close(&scales, &want_scales, 0.0, 1e-6, "int8 scales");
    let worst = codes
        .iter()
        .zip(&want_codes)
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .unwrap();
    assert!(worst <= 1, "codes differ by {worst}");
    assert!(codes[..d].iter().all(|&c| c == 0) && scales[0] == 0.0);
    let deq = cpu_dequantize(&codes, &scales, d);
    for (row, (xs, ys)) in x.chunks(d).zip(deq.chunks(d)).enumerate() {
        let step = scales[row];
        for (a, b) in xs.iter().zip(ys) {
            assert!(
                (a - b).abs() <= 0.5 * step * 1.001 + 1e-7,
                "row {row}: {a} vs {b}"
            );
        }
    }
}

/// int8 K/V: exact against the CPU over the same dequantised values (the
/// kernel dequantises correctly, tile by tile), and close to f32 attention.
#[test]
fn int8_attention_matches_dequantised_cpu_and_f32() {
    let ctx = test_context();
    let (h, d) = (4, 128);
    for (n_q, n_kv, mask) in [
        (37, 150, Mask::NONE),
        (45, 45, Mask::frame_window(9, 1, Some(2))),
    ] {
        let qd = rand_vec(n_q * h * d, 31, 2.0);
        let kd = rand_vec(n_kv * h * d, 32, 2.0);
        let vd = rand_vec(n_kv * h * d, 33, 1.0);
        let scale = 1.0 / (d as f32).sqrt();
        let q = upload(&ctx, &[1, n_q, h, d], &qd);
        let k = upload(&ctx, &[1, n_kv, h, d], &kd);
        let v = upload(&ctx, &[1, n_kv, h, d], &vd);
        let out = Tensor::empty(&ctx, &[1, n_q, h, d], DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&ctx);
        let k8 = QuantizedKv::quantize(&mut rec, &k, "k").unwrap();
        let v8 = QuantizedKv::quantize(&mut rec, &v, "v").unwrap();
        multi_head_attention_int8(
            &mut rec,
            &q,
            &k8,
            &v8,
            &out,
            &AttentionOptions::masked(mask),
        )
        .unwrap();
        rec.submit().unwrap();
        let got = out.to_f32(&ctx).unwrap();
        let (kq, vq) = (k8.to_f32(&ctx).unwrap(), v8.to_f32(&ctx).unwrap());
        let same_inputs = cpu_attention(&qd, &kq, &vq, 1, h, n_q, n_kv, d, scale, &mask, 0);
        assert_close(
            &got,
            &same_inputs,
            ATOL,
            RTOL,
            "int8 kernel vs CPU on dequantised K/V",
        );
        let f32_ref = cpu_attention(&qd, &kd, &vd, 1, h, n_q, n_kv, d, scale, &mask, 0);
        let cos = cosine_similarity(&got, &f32_ref);
        let (err, _) = max_abs_diff(&got, &f32_ref);
        let peak = f32_ref.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        println!(
            "int8 vs f32 (H{h} d{d} q{n_q} kv{n_kv} {mask:?}): cosine {cos:.6}, max abs error {err:.3e} (max |out| {peak:.3})"
        );
        assert!(cos >= 0.999, "cosine similarity {cos} < 0.999");
    }
}

fn cache_config(dtype: KvDtype) -> KvCacheConfig {
    KvCacheConfig {
        batch: 2,
        heads: 2,
        head_dim: 8,
        tokens_per_frame: 3,
        sink_frames: 2,
        window_frames: 5,
        dtype,
    }
}

/// After many appends (2-frame chunks into 5 rotating slots, so runs wrap
/// around), the ring holds exactly the sinks and the last w frames, equal to
/// a freshly built window (f32: bit for bit; int8: the same codes and
/// scales as quantising the fresh window), and attention over the ring
/// equals attention over the fresh window.
#[test]
fn ring_cache_equals_a_freshly_built_window() {
    let ctx = test_context();
    for dtype in [KvDtype::F32, KvDtype::Int8] {
        let cfg = cache_config(dtype);
        let (b, h, d, tpf) = (cfg.batch, cfg.heads, cfg.head_dim, cfg.tokens_per_frame);
        let row = h * d;
        let mut ring = RingKvCache::new(&ctx, cfg).unwrap();
        // Stream history per batch element: frames × tpf × H × d.
        let mut hist_k: Vec<Vec<f32>> = vec![Vec::new(); b];
        let mut hist_v: Vec<Vec<f32>> = vec![Vec::new(); b];
        let chunk_frames = 2;
        let ct = chunk_frames * tpf;
        for step in 0..13 {
            let kd = rand_vec(b * ct * row, 100 + step, 2.0);
            let vd = rand_vec(b * ct * row, 200 + step, 1.0);
            for bi in 0..b {
                hist_k[bi].extend_from_slice(&kd[bi * ct * row..(bi + 1) * ct * row]);
                hist_v[bi].extend_from_slice(&vd[bi * ct * row..(bi + 1) * ct * row]);
            }
            let (k, v) = (
                upload(&ctx, &[b, ct, h, d], &kd),
                upload(&ctx, &[b, ct, h, d], &vd),
            );
            let mut rec = Recorder::new(&ctx);
            ring.append(&mut rec, &k, &v).unwrap();
            rec.submit().unwrap();
            let frames = ring.frames_appended();
            let sinks: Vec<usize> = (0..cfg.sink_frames.min(frames)).collect();
            let first_recent = frames.saturating_sub(cfg.window_frames).max(sinks.len());
            let want_frames: Vec<usize> = sinks.into_iter().chain(first_recent..frames).collect();
            let win = ring.read_window(&ctx).unwrap();
            assert_eq!(win.frames, want_frames, "{dtype:?} step {step}");
            // The fresh window, built from the history: [B, frames × tpf, H, d].
            let fresh = |hist: &[Vec<f32>]| -> Vec<f32> {
                let mut out = Vec::new();
                for hb in hist {
                    for &f in &want_frames {
                        out.extend_from_slice(&hb[f * tpf * row..(f + 1) * tpf * row]);
                    }
                }
                out
            };
            let (fk, fv) = (fresh(&hist_k), fresh(&hist_v));
            let wt = want_frames.len() * tpf;
            let (fk_t, fv_t) = (
                upload(&ctx, &[b, wt, h, d], &fk),
                upload(&ctx, &[b, wt, h, d], &fv),
            );
            let qd = rand_vec(b * ct * row, 300 + step, 2.0);
            let q = upload(&ctx, &[b, ct, h, d], &qd);
            let out_ring = Tensor::empty(&ctx, &[b, ct, h, d], DType::F32, "ring out").unwrap();
            let out_fresh = Tensor::empty(&ctx, &[b, ct, h, d], DType::F32, "fresh out").unwrap();
            let mut rec = Recorder::new(&ctx);
            ring.attend(&mut rec, &q, &out_ring, None).unwrap();
            let fresh_int8 = match dtype {
                KvDtype::F32 => {
                    multi_head_attention(
                        &mut rec,
                        &q,
                        &fk_t,
                        &fv_t,
                        &out_fresh,
                        &Default::default(),
                    )
                    .unwrap();
                    None
                }
                KvDtype::Int8 => {
                    let k8 = QuantizedKv::quantize(&mut rec, &fk_t, "fresh k").unwrap();
                    let v8 = QuantizedKv::quantize(&mut rec, &fv_t, "fresh v").unwrap();
                    multi_head_attention_int8(
                        &mut rec,
                        &q,
                        &k8,
                        &v8,
                        &out_fresh,
                        &Default::default(),
                    )
                    .unwrap();
                    Some((k8, v8))
                }
            };
            rec.submit().unwrap();
            match fresh_int8 {
                None => {
                    assert!(
                        win.k == fk && win.v == fv,
                        "f32 ring differs from the fresh window at step {step}"
                    );
                }
                Some((k8, v8)) => {
                    assert_eq!(
                        win.k_int8.as_ref().unwrap(),
                        &k8.read(&ctx).unwrap(),
                        "int8 K at step {step}"
                    );
                    assert_eq!(
                        win.v_int8.as_ref().unwrap(),
                        &v8.read(&ctx).unwrap(),
                        "int8 V at step {step}"
                    );
                }
            }
            assert_close(
                &out_ring.to_f32(&ctx).unwrap(),
                &out_fresh.to_f32(&ctx).unwrap(),
                ATOL,
                RTOL,
                &format!("{dtype:?} ring vs fresh attention at step {step}"),
            );
        }
    }
}

/// Streaming one frame at a time through a ring of s sinks + w frames is
/// exactly the one-shot frame-window mask (sinks [0, s), frames [f-w+1, f]).
#[test]
fn ring_streaming_equals_the_frame_window_mask() {
    let ctx = test_context();
    let (h, d, tpf, frames, s, w) = (2, 16, 5, 10, 1, 3);
    let cfg = KvCacheConfig {
        batch: 1,
        heads: h,
        head_dim: d,
        tokens_per_frame: tpf,
        sink_frames: s,
        window_frames: w,
        dtype: KvDtype::F32,
    };
    let n = frames * tpf;
    let row = h * d;
    let (qd, kd, vd) = (
        rand_vec(n * row, 41, 2.0),
        rand_vec(n * row, 42, 2.0),
        rand_vec(n * row, 43, 1.0),
    );
    let mut ring = RingKvCache::new(&ctx, cfg).unwrap();
    let mut streamed = Vec::new();
    for f in 0..frames {
        let part = |x: &[f32]| {
            upload(
                &ctx,
                &[1, tpf, h, d],
                &x[f * tpf * row..(f + 1) * tpf * row],
            )
        };
        let (q, k, v) = (part(&qd), part(&kd), part(&vd));
        let out = Tensor::empty(&ctx, &[1, tpf, h, d], DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&ctx);
        ring.append(&mut rec, &k, &v).unwrap();
        ring.attend(&mut rec, &q, &out, None).unwrap();
        rec.submit().unwrap();
        streamed.extend(out.to_f32(&ctx).unwrap());
    }
    let mask = Mask::frame_window(tpf, s, Some(w));
    let want = cpu_attention(
        &qd,
        &kd,
        &vd,
        1,
        h,
        n,
        n,
        d,
        1.0 / (d as f32).sqrt(),
        &mask,
        0,
    );
    assert_close(
        &streamed,
        &want,
        ATOL,
        RTOL,
        "ring stream vs frame-window mask",
    );
}

/// The ring allocates once: pool statistics after 10 and after 100 chunks
/// are identical. The concatenating cache grows with every chunk.
#[test]
fn ring_memory_is_constant_in_stream_length() {
    let base = test_context();
    for dtype in [KvDtype::F32, KvDtype::Int8] {
        let ctx = base.with_pool(Policy::Caching.new_pool());
        let cfg = KvCacheConfig {
            batch: 1,
            heads: 2,
            head_dim: 8,
            tokens_per_frame: 4,
            sink_frames: 3,
            window_frames: 9,
            dtype,
        };
        let ct = 3 * cfg.tokens_per_frame;
        let shape = [1, ct, cfg.heads, cfg.head_dim];
        let x = upload(&ctx, &shape, &rand_vec(ct * 16, 1, 1.0));
        let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
        let mut ring = RingKvCache::new(&ctx, cfg).unwrap();
        assert_eq!(ring.kv_bytes(), cfg.bytes());
        let mut after = Vec::new();
        for chunk in 1..=100 {
            let mut rec = Recorder::new(&ctx);
            ring.append(&mut rec, &x, &x).unwrap();
            ring.attend(&mut rec, &x, &out, None).unwrap();
            rec.submit().unwrap();
            if chunk == 10 || chunk == 100 {
                after.push(ctx.pool().stats());
            }
        }
        ctx.wait_idle().unwrap();
        assert_eq!(
            after[0], after[1],
            "{dtype:?}: pool statistics changed between chunk 10 and 100"
        );
    }
    let ctx = base.with_pool(Policy::Caching.new_pool());
    let cfg = cache_config(KvDtype::F32);
    let shape = [cfg.batch, cfg.tokens_per_frame, cfg.heads, cfg.head_dim];
    let x = upload(&ctx, &shape, &rand_vec(shape.iter().product(), 2, 1.0));
    let mut concat = ConcatKvCache::new(cfg).unwrap();
    let mut sizes = Vec::new();
    for _ in 0..20 {
        let mut rec = Recorder::new(&ctx);
        concat.append(&mut rec, &x, &x).unwrap();
        rec.submit().unwrap();
        sizes.push(concat.kv_bytes());
    }
    assert_eq!(
        sizes[19],
        20 * sizes[0],
        "the baseline cache grows linearly"
    );
}

/// int8 KV bytes (d = 128, one f32 scale per token-head) are (128 + 4) / 512
/// of f32: ≤ 0.3×.
#[test]
fn int8_cache_is_under_a_third_of_f32() {
    let mut cfg = KvCacheConfig {
        batch: 1,
        heads: 12,
        head_dim: 128,
        tokens_per_frame: 1560,
        sink_frames: 3,
        window_frames: 9,
        dtype: KvDtype::F32,
    };
    let f32_bytes = cfg.bytes();
    cfg.dtype = KvDtype::Int8;
    let ratio = cfg.bytes() as f64 / f32_bytes as f64;
    println!("int8 / f32 KV bytes at d = 128: {ratio:.4}");
    assert!(ratio <= 0.3, "{ratio}");
    let ctx = Context::null(Capabilities::reference_gpu(), Policy::Exact.new_pool());
    let ring = RingKvCache::new(&ctx, cfg).unwrap();
    assert_eq!(ring.kv_bytes(), cfg.bytes());
}

/// The VAE mid-block of a 4096² decode attends over 512² = 262 144 tokens
/// (d = 512). A dry-run trace of the SD1.5 decoder at that size (limits of an
/// unbounded device) records every allocation up to and through the
/// mid-block: the attention's buffers are q / k / v / out [1, 512, T], i.e.
/// O(T·d) = 512 MiB each, and nothing approaches the 262 144² × 4 B = 256 GiB
/// a score matrix would take. (The untiled decode itself stops later, in the
/// 4096² up-blocks, whose activations exceed u32 indexing: that size needs
/// tiling; the estimate at the mid-block is unaffected.)
#[test]
fn vae_4096_mid_block_attention_needs_no_n2_buffer() {
    let mut caps = Capabilities::reference_gpu();
    caps.max_storage_buffer_binding_size = 1 << 40;
    caps.max_buffer_size = 1 << 40;
    let tracer = Arc::new(TracingPool::new());
    let ctx = Context::null(caps, tracer.clone());
    let vae = Vae::load(&ctx, "preset:sd15", &LoadOptions::default()).unwrap();
    let z = wgvae::io::HostTensor::new(vec![1, 4, 512, 512], vec![0.0; 4 * 512 * 512]).unwrap();
    let mut rec = Recorder::new(&ctx);
    let decoded = wgvae::decode::record_decode(&mut rec, &vae, &z);
    let trace = tracer.trace();
    let tokens = 512u64 * 512;
    let at = trace
        .entries
        .iter()
        .position(|e| e.label == "attention out")
        .expect("the mid-block attention was recorded");
    // Allocations after the weights, through the mid-block's output projection.
    let first = trace
        .entries
        .iter()
        .position(|e| e.label == "latents")
        .unwrap();
    let through_mid = &trace.entries[first..=at + 1];
    let largest = through_mid.iter().map(|e| e.bytes).max().unwrap();
    println!(
        "4096² SD1.5 decode, dry-run trace through the mid-block: {} allocations, largest {} MiB (T·d·4 = {} MiB); an N² f32 score matrix would be {} GiB. Whole decode: {}",
        through_mid.len(),
        largest >> 20,
        (tokens * 512 * 4) >> 20,
        (tokens * tokens * 4) >> 30,
        match &decoded {
            Ok(_) => "recorded".to_string(),
            Err(e) => format!("stops later: {e}"),
        }
    );
    assert_eq!(trace.entries[at].bytes, tokens * 512 * 4);
    assert!(
        largest <= tokens * 512 * 4,
        "largest allocation {largest} B"
    );
    assert!(largest * 256 < tokens * tokens * 4);
}

/// The whole 4096² SD1.5 decode, planned as `auto` decides on a reference
/// GPU (dry run, tracing every allocation): it succeeds, and no allocation
/// of the whole decode comes near the 256 GiB a 262 144² f32 score matrix
/// would take (the largest is bounded by the device's binding limit).
#[test]
fn vae_4096_whole_decode_plans_without_an_n2_buffer() {
    let caps = Capabilities::reference_gpu();
    let tracer = Arc::new(TracingPool::new());
    let ctx = Context::null(caps.clone(), tracer.clone());
    let vae = Vae::load(&ctx, "preset:sd15", &LoadOptions::default()).unwrap();
    let z = wgvae::io::HostTensor::new(vec![1, 4, 512, 512], vec![0.0; 4 * 512 * 512]).unwrap();
    let opts = wgvae::decode::DecodeOptions {
        raw_latents: true,
        ..Default::default()
    };
    let decoded = wgvae::decode::decode(&ctx, &vae, &z, &opts).expect("4096² plans under auto");
    assert_eq!((decoded.width, decoded.height), (4096, 4096));
    let trace = tracer.trace();
    let tokens = 512u64 * 512;
    let largest = trace.entries.iter().map(|e| e.bytes).max().unwrap();
    println!(
        "4096² SD1.5 under auto ({} tiles, mid-block {}): {} allocations, largest {} MiB; a score matrix would be {} GiB",
        decoded.tiling.tiles,
        if decoded.tiling.mid_block_tiled { "tiled" } else { "whole" },
        trace.entries.len(),
        largest >> 20,
        (tokens * tokens * 4) >> 30
    );
    assert!(largest <= caps.max_storage_buffer_binding_size.max(tokens * 512 * 4));
    assert!(
        largest * 256 < tokens * tokens * 4,
        "largest allocation {largest} B"
    );
}

/// `wgvae bench attention …`: the stream `--json` keys the issue names, a
/// mid-block report whose rows hold what they say, and a tiny sweep.
#[test]
fn bench_attention_cli() {
    let run = |args: &[&str]| {
        let out =
            std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
                .args(args)
                .env(
                    "WGPU_BACKEND",
                    std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
                )
                .output()
                .expect("run wgvae");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stdout = run(&[
        "bench",
        "attention",
        "stream",
        "--preset",
        "int8-kv",
        "--chunks",
        "3",
        "--scale",
        "0.005",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    for key in [
        "preset",
        "chunks",
        "mean_ms",
        "p99_ms",
        "max_ms",
        "chunks_per_s",
        "peak_allocated_bytes",
        "kv_bytes",
        "int8_max_abs_error",
        "int8_cosine",
    ] {
        assert!(!v[key].is_null(), "stream --json lacks {key}: {v}");
    }
    assert_eq!(v["preset"], "int8-kv");
    assert!(v["int8_cosine"].as_f64().unwrap() >= 0.999, "{v}");

    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("attn-bench");
    let d = dir.to_str().unwrap();
    run(&[
        "bench",
        "attention",
        "midblock",
        "--tokens",
        "37,100",
        "--head-dim",
        "64",
        "--runs",
        "1",
        "--out",
        d,
    ]);
    let csv = std::fs::read_to_string(dir.join("attention_midblock.csv")).unwrap();
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    let col = |row: &Vec<&str>, name: &str| -> String {
        let i = header.iter().position(|h| *h == name).unwrap();
        row[i].trim_matches('"').to_string()
    };
    for (row, t) in rows.iter().zip([37u64, 100]) {
        assert_eq!(row.len(), header.len(), "{csv}");
        assert_eq!(col(row, "tokens"), t.to_string());
        assert_eq!(col(row, "status"), "ok");
        assert!(col(row, "gflops").parse::<f64>().unwrap() > 0.0);
        // q, k, v, out of [1, 64, T] f32, plus at most a 2·T scratch.
        let alloc: u64 = col(row, "peak_allocated_bytes").parse().unwrap();
        assert!(
            alloc >= 4 * t * 64 * 4 && alloc <= 4 * t * 64 * 4 + 8 * t + 4096,
            "{alloc}"
        );
        assert_eq!(col(row, "score_matrix_bytes"), (t * t * 4).to_string());
    }
    assert!(std::fs::read_to_string(dir.join("attention_midblock.md"))
        .unwrap()
        .contains("| 100 ("));

    run(&[
        "bench",
        "attention",
        "sweep",
        "--frames",
        "2,4",
        "--tokens-per-frame",
        "64",
        "--modes",
        "global,window-ring",
        "--budget",
        "5",
        "--runs",
        "1",
        "--reference",
        "/nonexistent.csv",
        "--out",
        d,
    ]);
    let sweep = std::fs::read_to_string(dir.join("attention_sweep.csv")).unwrap();
    let data = sweep.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(data, 1 + 4, "{sweep}");
}

#[test]
fn bad_inputs_are_errors() {
    let ctx = test_context();
    let q = Tensor::empty(&ctx, &[1, 5, 2, 8], DType::F32, "q").unwrap();
    let k = Tensor::empty(&ctx, &[1, 6, 3, 8], DType::F32, "k").unwrap();
    let out = Tensor::empty(&ctx, &[1, 5, 2, 8], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&ctx);
    let shape_err = |r: wgvae::Result<()>| matches!(r, Err(Error::Shape { .. }));
    assert!(shape_err(multi_head_attention(
        &mut rec,
        &q,
        &k,
        &k,
        &out,
        &Default::default()
    )));
    assert!(shape_err(multi_head_attention(
        &mut rec,
        &q,
        &q,
        &q,
        &q,
        &Default::default()
    )));
    let bad_window = AttentionOptions::masked(Mask::frame_window(4, 0, Some(0)));
    assert!(shape_err(multi_head_attention(
        &mut rec,
        &q,
        &q,
        &q,
        &out,
        &bad_window
    )));
    // Past the widest head (wider than 512 runs in output chunks).
    let d = wgvae::kernels::attention::MAX_HEAD_DIM + 1;
    let big = Tensor::empty(&ctx, &[1, 2, 1, d], DType::F32, "big").unwrap();
    let big_out = Tensor::empty(&ctx, &[1, 2, 1, d], DType::F32, "big").unwrap();
    assert!(matches!(
        multi_head_attention(&mut rec, &big, &big, &big, &big_out, &Default::default()),
        Err(Error::Unsupported(_))
    ));
    let mut cfg = cache_config(KvDtype::Int8);
    cfg.head_dim = 6;
    assert!(RingKvCache::new(&ctx, cfg).is_err());
    let cfg = cache_config(KvDtype::F32);
    let mut ring = RingKvCache::new(&ctx, cfg).unwrap();
    let too_long = Tensor::empty(&ctx, &[2, 6 * 3, 2, 8], DType::F32, "k").unwrap();
    assert!(shape_err(ring.append(&mut rec, &too_long, &too_long)));
    let ragged = Tensor::empty(&ctx, &[2, 4, 2, 8], DType::F32, "k").unwrap();
    assert!(shape_err(ring.append(&mut rec, &ragged, &ragged)));
    assert!(ConcatKvCache::new(cache_config(KvDtype::Int8)).is_err());
}
