//! Helpers shared by unit tests, integration tests and benches.
#![doc(hidden)]
// Test helpers: a helper that fails is a failed test, so they unwrap and panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use crate::gpu::{Context, ContextOptions};
use crate::io::HostTensor;

/// One device per test process (tests share it; pools can be swapped per test).
/// Panics with a clear message when no adapter exists: CI installs lavapipe.
pub fn test_context() -> Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| {
        // WGVAE_COOPERATIVE_MATRIX=on|off|auto (ci/coopmat.sh forces on).
        let cooperative_matrix = std::env::var("WGVAE_COOPERATIVE_MATRIX")
            .ok()
            .map(|v| {
                v.parse()
                    .expect("WGVAE_COOPERATIVE_MATRIX: auto, on or off")
            })
            .unwrap_or_default();
        let options = ContextOptions {
            cooperative_matrix,
            ..Default::default()
        };
        Context::new(&options).unwrap_or_else(|e| {
            panic!("GPU tests need an adapter (install mesa-vulkan-drivers for lavapipe): {e}")
        })
    })
    .clone()
}

/// The test context when its device has a usable cooperative-matrix configuration
/// (Mesa 26's lavapipe: 8×8×8 f16 → f32; `ci/coopmat.sh` runs the tests there), else
/// `None` after saying why on stderr, or a panic under `WGVAE_REQUIRE_COOP=1`.
pub fn matrix_test_context(test: &str) -> Option<Context> {
    let ctx = test_context();
    if ctx.caps().matrix().is_some() {
        return Some(ctx);
    }
    let why = format!(
        "{test}: `{}` has no usable cooperative-matrix configuration (its list: {:?}); ci/coopmat.sh runs this on Mesa 26's lavapipe",
        ctx.caps().adapter_name,
        ctx.caps()
            .matrix_configs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
    );
    if std::env::var("WGVAE_REQUIRE_COOP").is_ok_and(|v| v == "1") {
        panic!("{why} (WGVAE_REQUIRE_COOP=1)");
    }
    eprintln!("skipped: {why}");
    None
}

/// `ctx` on the scalar path: the same device and pipelines with its cooperative-matrix
/// configuration hidden, so models loaded on it lay their weights out for scalar tiles.
pub fn scalar_context(ctx: &Context) -> Context {
    let mut caps = ctx.caps().clone();
    caps.cooperative_matrix = None;
    ctx.with_caps(caps)
}

/// The test context once per storage path: (context, activation dtype) for
/// f32, native f16 (when the adapter has shader-f16), packed f16 (the same
/// device with shader-f16 hidden) and packed bf16.
pub fn dtype_contexts() -> Vec<(Context, crate::tensor::DType)> {
    use crate::tensor::DType;
    let ctx = test_context();
    let mut v = vec![(ctx.clone(), DType::F32)];
    if ctx.caps().shader_f16 {
        v.push((ctx.clone(), DType::F16));
    }
    let mut caps = ctx.caps().clone();
    caps.shader_f16 = false;
    v.push((ctx.with_caps(caps), DType::F16));
    v.push((ctx, DType::BF16));
    v
}

/// Deterministic pseudo-random values in [-scale, scale] (see [`crate::seeded::uniform`]).
pub fn rand_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    crate::seeded::uniform(n, seed, scale)
}

/// Largest |a - b| and the index where it occurs (the slices must be equally long).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    // Zipping alone would compare only the common prefix.
    assert_eq!(
        a.len(),
        b.len(),
        "max_abs_diff of slices of different lengths"
    );
    let mut worst = (0.0f32, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if d > worst.0 || d.is_nan() {
            worst = (if d.is_nan() { f32::INFINITY } else { d }, i);
        }
    }
    worst
}

/// Asserts `|got - want| <= atol + rtol * |want|` everywhere.
pub fn assert_close(got: &[f32], want: &[f32], atol: f32, rtol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = atol + rtol * w.abs();
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} (tolerance {tol}; max abs diff {:?})",
            max_abs_diff(got, want)
        );
    }
}

/// The project root: `$WGVAE_PROJECT_DIR`, else where the tests were
/// compiled. Prebuilt test executables run on another machine
/// (`bench/gpu/run.sh --bin`) set it to the copied project.
pub fn project_dir() -> std::path::PathBuf {
    match std::env::var_os("WGVAE_PROJECT_DIR") {
        Some(d) if !d.is_empty() => d.into(),
        _ => env!("CARGO_MANIFEST_DIR").into(),
    }
}

/// The shared test data: `$WGVAE_SHARED_DIR`, else `../shared` beside the
/// project root ([`project_dir`]), else `../shared` from the working
/// directory; `None` (tests then skip, saying so) without any — a panic
/// instead when `WGVAE_REQUIRE_SHARED=1` (CI), so no golden is skipped there.
pub fn shared_dir() -> Option<std::path::PathBuf> {
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("WGVAE_SHARED_DIR").filter(|d| !d.is_empty()) {
        candidates.push(std::path::PathBuf::from(d));
    }
    candidates.push(project_dir().join("../shared"));
    candidates.push("../shared".into());
    let found = candidates
        .into_iter()
        .find(|p| p.join("README.md").exists());
    if found.is_none() {
        let why = "../shared (golden data and weights) is not beside the project root (or set WGVAE_SHARED_DIR)";
        // CI sets WGVAE_REQUIRE_SHARED=1: there a skipped golden is a failure.
        if std::env::var_os("WGVAE_REQUIRE_SHARED").is_some_and(|v| v == "1") {
            panic!("WGVAE_REQUIRE_SHARED=1 but {why}");
        }
        eprintln!("SKIPPED: {why}");
    }
    found
}

/// The `wgvae` executable integration tests run: `$WGVAE_BIN`, else `built`
/// (pass `env!("CARGO_BIN_EXE_wgvae")`, the one cargo built beside the tests).
pub fn wgvae_exe(built: &str) -> std::path::PathBuf {
    match std::env::var_os("WGVAE_BIN") {
        Some(p) if !p.is_empty() => p.into(),
        _ => built.into(),
    }
}

/// PSNR in dB between two 8-bit images of equal size.
pub fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (255.0f64 * 255.0 / mse).log10()
}

/// RGB bytes of packed RGBA8 pixels.
pub fn rgb_of(rgba: &[u8]) -> Vec<u8> {
    rgba.chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect()
}

/// A copy of the diffusers folder `src` (config.json and
/// diffusion_pytorch_model.safetensors, f32 weights) in the existing folder
/// `dst` (the caller's, e.g. a `tempfile::TempDir`), with every tensor whose
/// name starts with `prefix` multiplied by `factor`: e.g. `decoder.conv_in.`
/// × 3e5 drives the activations far beyond f16's range (finite in bf16 and f32).
pub fn scaled_weights_copy(
    src: &std::path::Path,
    prefix: &str,
    factor: f32,
    dst: &std::path::Path,
) {
    use std::collections::HashMap;
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("diffusion_pytorch_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> = HashMap::new();
    let mut scaled = 0;
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        if name.starts_with(prefix) {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}: f32 weights");
            let vals: Vec<f32> = bytemuck::pod_collect_to_vec::<u8, f32>(&data)
                .into_iter()
                .map(|v| v * factor)
                .collect();
            data = bytemuck::cast_slice(&vals).to_vec();
            scaled += 1;
        }
        tensors.insert(name, (view.dtype(), view.shape().to_vec(), data));
    }
    assert!(scaled > 0, "no tensor starts with {prefix}");
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(k, (d, s, b))| {
            (
                k.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(dst.join("diffusion_pytorch_model.safetensors"), out).unwrap();
}

/// A tiny AutoencoderKL configuration for tests: two levels (2× upscale),
/// mid-block attention, scaling and shift (so unscaling is exercised).
pub fn tiny_kl_config() -> crate::models::AutoencoderKlConfig {
    crate::models::AutoencoderKlConfig {
        block_out_channels: vec![16, 32],
        layers_per_block: 1,
        norm_num_groups: 8,
        latent_channels: 4,
        out_channels: 3,
        scaling_factor: 0.5,
        shift_factor: Some(0.1),
        use_post_quant_conv: true,
        use_quant_conv: true,
        mid_block_add_attention: true,
        decoder_block_out_channels: None,
        flux2: None,
    }
}

/// Width of [`synthetic_tae_decoder`]'s blocks.
pub const TAE_WIDTH: usize = 64;
/// `nn.Sequential` indices of [`synthetic_tae_decoder`]'s residual blocks.
pub const TAE_BLOCKS: [usize; 10] = [3, 4, 5, 8, 9, 10, 13, 14, 15, 18];
/// `nn.Sequential` indices of its upsampling convs (no bias).
pub const TAE_UPS: [usize; 3] = [7, 12, 17];

/// A TAESD decoder's `nn.Sequential` weights for `c` latent channels, no
/// pool branch, seeded: PyTorch-like scales (1/sqrt(fan_in), biases 0.1).
pub fn synthetic_tae_decoder(
    c: usize,
    seed: u64,
) -> std::collections::BTreeMap<String, crate::models::weights::HostWeight> {
    const W: usize = TAE_WIDTH;
    let mut m = std::collections::BTreeMap::new();
    let mut seed = seed;
    let mut put = |key: String, shape: Vec<usize>, fan_in: usize| {
        seed += 1;
        let n = shape.iter().product();
        let scale = if key.ends_with("bias") {
            0.1
        } else {
            1.0 / (fan_in as f32).sqrt()
        };
        let data = rand_vec(n, seed, scale);
        m.insert(key, crate::models::weights::HostWeight { shape, data });
    };
    put("1.weight".into(), vec![W, c, 3, 3], c * 9);
    put("1.bias".into(), vec![W], 1);
    for i in TAE_BLOCKS {
        for j in [0, 2, 4] {
            put(format!("{i}.conv.{j}.weight"), vec![W, W, 3, 3], W * 9);
            put(format!("{i}.conv.{j}.bias"), vec![W], 1);
        }
    }
    for i in TAE_UPS {
        put(format!("{i}.weight"), vec![W, W, 3, 3], W * 9);
    }
    put("19.weight".into(), vec![3, W, 3, 3], W * 9);
    put("19.bias".into(), vec![3], 1);
    m
}

/// Latent frames `t0..t1` of video 0 of N×C×T×h×w latents as the
/// `[T, C, h, w]` chunk a [`crate::VideoDecoder`] takes.
pub fn ncthw_chunk(latents: &HostTensor, t0: usize, t1: usize) -> HostTensor {
    let [_, c, t, h, w] = latents.shape[..] else {
        panic!("latents {:?} are not 5-D", latents.shape)
    };
    let mut data = Vec::with_capacity((t1 - t0) * c * h * w);
    for f in t0..t1 {
        for ch in 0..c {
            let at = (ch * t + f) * h * w;
            data.extend_from_slice(&latents.data[at..at + h * w]);
        }
    }
    HostTensor::new(vec![t1 - t0, c, h, w], data).expect("a chunk of the latents")
}

/// A video decoder's frames `[T', C, H, W]` in diffusers' `[C, T', H, W]`
/// (`dims` = `[C, T', H, W]`).
pub fn channels_first(frames: &[f32], [c, t, h, w]: [usize; 4]) -> Vec<f32> {
    let plane = h * w;
    assert_eq!(frames.len(), c * t * plane, "frame values");
    let mut data = Vec::with_capacity(frames.len());
    for ch in 0..c {
        for f in 0..t {
            let at = (f * c + ch) * plane;
            data.extend_from_slice(&frames[at..at + plane]);
        }
    }
    data
}

/// The message of an error a test expects (panics when it succeeded).
pub fn error_message<T>(r: crate::Result<T>) -> String {
    match r {
        Ok(_) => panic!("accepted; an error was expected"),
        Err(e) => e.to_string(),
    }
}

/// `spec` loads as a video decoder ([`crate::Vae::load`] tells it by its
/// files), and decoding images with it is refused naming the video front
/// doors: the message, for further checks.
pub fn video_decoder_refuses_images(ctx: &Context, spec: &str) -> String {
    let vae = crate::Vae::load(ctx, spec, &Default::default()).expect("a video decoder");
    assert_eq!(vae.kind(), crate::ModelKind::VideoDecoder, "{spec}");
    let image = HostTensor::new(vec![1, 4, 2, 2], vec![0.0; 16]).expect("latents");
    let m = error_message(crate::decode(ctx, &vae, &image, &Default::default()));
    assert!(
        m.contains("is a video decoder") && m.contains("decode_video"),
        "{m}"
    );
    m
}

/// Decodes `latents` (N×C×T×h×w, video 0) through a [`crate::VideoDecoder`]
/// in chunks of `size` latent frames, `tiling` as given: the frames, and
/// the exact tile size the decode used (`None`: untiled).
pub fn stream_ncthw(
    ctx: &Context,
    model: &crate::Vae,
    latents: &HostTensor,
    size: usize,
    tiling: Option<crate::tiling::Tiling>,
) -> (Vec<f32>, Option<usize>) {
    let t = latents.shape[2];
    let mut s = crate::VideoDecoder::new(ctx, model).expect("a video decoder");
    if let Some(tiling) = tiling {
        s.set_tiling(tiling).expect("a tiling");
    }
    let mut frames = Vec::new();
    for t0 in (0..t).step_by(size) {
        let chunk = ncthw_chunk(latents, t0, (t0 + size).min(t));
        frames.extend(s.decode(&chunk).expect("a decoded chunk").data);
    }
    (frames, s.tile_size())
}

/// Checks exact tiles of `px` output pixels of a causal N×C×T×h×w video
/// decoder: the whole clip, and chunks of 1 latent frame within a tight
/// budget (tiles parked in host memory), each within `tiled` of the
/// untiled decode and `golden` of `want` (diffusers' N×3×T'×H×W). `ctx`
/// should have a pool of its own (tests run side by side).
pub fn check_exact_video_tiles(
    ctx: &Context,
    model: &crate::Vae,
    (z, want): (&HostTensor, &HostTensor),
    px: usize,
    (tiled, golden): (f32, f32),
    name: &str,
) {
    let t = z.shape[2];
    let [_, c, tt, h, w] = want.shape[..] else {
        panic!("{name}: the golden is not 5-D")
    };
    let (untiled, none) = stream_ncthw(ctx, model, z, t, None);
    assert!(none.is_none(), "{name}: the untiled decode ran in tiles");
    let tight = crate::tiling::Tiling::exact()
        .with_tile_size(px)
        .with_max_memory(ctx.pool().stats().allocated_bytes.current + (2 << 20));
    for (what, size, tiling) in [
        (
            "whole clip",
            t,
            crate::tiling::Tiling::exact().with_tile_size(px),
        ),
        ("chunks of 1, parked", 1, tight),
    ] {
        let (got, tile) = stream_ncthw(ctx, model, z, size, Some(tiling));
        assert!(tile.is_some(), "{name}: {what}: the decode ran untiled");
        let (e, at) = max_abs_diff(&got, &untiled);
        let (g, gat) = max_abs_diff(&channels_first(&got, [c, tt, h, w]), &want.data);
        println!("{name}: exact tiles, {what}: {e:.3e} from untiled (at {at}), {g:.3e} from the golden (at {gat})");
        assert!(e <= tiled, "{name}: {what}: {e} from untiled at {at}");
        assert!(g <= golden, "{name}: {what}: {g} from the golden at {gat}");
    }
}

/// Streams `frames` random latent frames `[1, C, h, w]` (the model's `C`)
/// one at a time through a fresh [`crate::VideoDecoder`] on `ctx` (whose
/// pool's peak is reset first): (output frames, peak allocated, cache bytes).
pub fn stream_random_frames(
    ctx: &Context,
    model: &crate::Vae,
    (h, w): (usize, usize),
    frames: usize,
) -> (usize, u64, u64) {
    let c = model.latent_channels();
    ctx.pool().reset_peak_stats();
    let mut s = crate::VideoDecoder::new(ctx, model).expect("a video decoder");
    let mut out = 0;
    for t in 0..frames {
        let z = HostTensor::new(vec![1, c, h, w], rand_vec(c * h * w, t as u64, 1.0))
            .expect("a latent frame");
        out += s.decode(&z).expect("a decoded frame").shape[0];
    }
    (
        out,
        ctx.pool().stats().allocated_bytes.peak,
        s.cache_bytes(),
    )
}
