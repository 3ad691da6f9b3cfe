//! Property tests over random tiny models (beyond the memory pools'
//! `tests/memory_pools.rs`): random AutoencoderKL configs (1–3 blocks of
//! 4–32 channels, 1–2 layers per block, GroupNorm groups dividing every
//! block, 4 or 16 latent channels, with or without mid-block attention and
//! post-quant conv) and random TAE decoders (4 or 16 latent channels), with
//! seeded random weights and random latent shapes (odd sizes included).
//!
//! - `exact_tiles_equal_untiled`: an `exact` tiled decode at a random tile
//!   size (mid-block tiled or not) equals the untiled decode within
//!   [`EXACT_BOUND`] (f32).
//! - `estimate_equals_measured`: under every memory policy, untiled and
//!   exact-tiled (some under a `max_memory` that forces parking), in f32,
//!   f16 and bf16, [`Estimate`] (a dry run on a null device) of the model
//!   written to files (a diffusers folder, a TAE weight file) predicts the
//!   weights, peak allocated, peak reserved and the tiling report of the real
//!   decode exactly, or fails with the same error (README: "CI checks that
//!   real decodes measure exactly the predicted peaks under every policy").
//!
//! Cases: `WGVAE_PROP_CASES` (default [`EXACT_CASES`] and
//! [`ESTIMATE_CASES`], sized for CI on lavapipe), a fixed seed
//! (`WGVAE_PROP_SEED` to vary it); proptest prints the (shrunk) failing case.

use std::path::PathBuf;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed, TestCaseError};
use wgvae::estimate::Estimate;
use wgvae::io::HostTensor;
use wgvae::memory::{PlannedPool, Policy};
use wgvae::models::weights::HostWeight;
use wgvae::models::{AutoencoderKlConfig, Precision, WeightStore};
use wgvae::testing::{max_abs_diff, rand_vec, synthetic_tae_decoder, test_context};
use wgvae::{decode, Context, DType, DecodeOptions, Decoded, LoadOptions, Tiling, Vae};

/// Cases of `exact_tiles_equal_untiled` unless `WGVAE_PROP_CASES` says
/// otherwise (CI on lavapipe, a loaded 2-core machine: 0.5–12 s a case).
const EXACT_CASES: u32 = 8;
/// Cases of `estimate_equals_measured` (6 real decodes and 6 dry runs a
/// case: 1–30 s).
const ESTIMATE_CASES: u32 = 4;

/// Largest |exact tiled − untiled| allowed in f32: about 3× the worst of
/// 100 cases measured on lavapipe (3.2e-6 AutoencoderKL, TAE bit-identical;
/// README, tiled decoding). Convs sum in the same order tiled or not; the
/// rounding comes from GroupNorm statistics merged per tile and attention
/// streamed over key blocks.
const EXACT_BOUND: f32 = 1e-5;

fn config(default_cases: u32) -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: env("WGVAE_PROP_CASES").map_or(default_cases, |n| n as u32),
        rng_seed: RngSeed::Fixed(env("WGVAE_PROP_SEED").unwrap_or(15)),
        // Each shrink step is a few GPU decodes.
        max_shrink_iters: 24,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/properties.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// A random tiny decoder.
#[derive(Clone, Debug)]
enum Model {
    /// AutoencoderKL with seeded random weights ([`WeightStore::random`]).
    Kl(AutoencoderKlConfig, u64),
    /// TAESD-layout decoder with `c` latent channels, random weights (seed).
    Tae(usize, u64),
}

fn kl_config() -> impl Strategy<Value = AutoencoderKlConfig> {
    let channels =
        prop::collection::vec(prop::sample::select(vec![4usize, 8, 12, 16, 24, 32]), 1..=3);
    (
        channels,
        any::<prop::sample::Index>(),
        1usize..=2,
        prop::sample::select(vec![4usize, 16]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(block_out_channels, groups, layers_per_block, latent_channels, attn, pq)| {
                // Groups must divide every block's channels.
                let divisors: Vec<usize> = [1, 2, 4, 8]
                    .into_iter()
                    .filter(|g| block_out_channels.iter().all(|c| c % g == 0))
                    .collect();
                AutoencoderKlConfig {
                    block_out_channels,
                    layers_per_block,
                    norm_num_groups: *groups.get(&divisors),
                    latent_channels,
                    out_channels: 3,
                    scaling_factor: 0.5,
                    shift_factor: Some(0.1),
                    use_post_quant_conv: pq,
                    use_quant_conv: pq,
                    mid_block_add_attention: attn,
                    decoder_block_out_channels: None,
                    flux2: None,
                }
            },
        )
}

fn model() -> impl Strategy<Value = Model> {
    prop_oneof![
        5 => (kl_config(), 0u64..1000).prop_map(|(c, s)| Model::Kl(c, s)),
        1 => (prop::sample::select(vec![4usize, 16]), 0u64..1000).prop_map(|(c, s)| Model::Tae(c, s)),
    ]
}

/// A model, latents `[n, C, h, w]` (seed) and an exact tile size.
#[derive(Clone, Debug)]
struct Case {
    model: Model,
    n: usize,
    h: usize,
    w: usize,
    latent_seed: u64,
    /// Tile side in latent pixels (times the upscale in image pixels).
    tile: usize,
    tile_mid_block: bool,
}

impl Case {
    fn upscale(&self) -> usize {
        match &self.model {
            Model::Kl(c, _) => 1 << (c.block_out_channels.len() - 1),
            Model::Tae(..) => 8,
        }
    }
    fn latent_channels(&self) -> usize {
        match &self.model {
            Model::Kl(c, _) => c.latent_channels,
            Model::Tae(c, _) => *c,
        }
    }
    fn latents(&self) -> HostTensor {
        let shape = vec![self.n, self.latent_channels(), self.h, self.w];
        let data = rand_vec(shape.iter().product(), self.latent_seed, 2.0);
        HostTensor::new(shape, data).unwrap()
    }
    fn exact(&self) -> Tiling {
        let mut t = Tiling::exact().with_tile_size(self.tile * self.upscale());
        t.tile_mid_block = self.tile_mid_block;
        t
    }
}

/// Latent sides from 5 to `kl_side` for AutoencoderKL, from 3 to
/// `tae_side` for TAE (8× with 64 channels throughout: the costly one).
fn case(kl_side: usize, tae_side: usize) -> impl Strategy<Value = Case> {
    (model(), 1usize..=8, any::<u64>(), any::<bool>(), 0u8..8).prop_flat_map(
        move |(model, tile_hint, latent_seed, mid, batch)| {
            let side = match model {
                Model::Kl(..) => 5usize..=kl_side,
                Model::Tae(..) => 3usize..=tae_side,
            };
            (Just(model), side.clone(), side).prop_map(move |(model, h, w)| {
                // At most ~6 tiles per side (tile steps cost a submit each).
                let longest = h.max(w);
                let tile = tile_hint.max(longest.div_ceil(6)).min(longest - 1);
                Case {
                    model,
                    n: if batch == 0 { 2 } else { 1 },
                    h,
                    w,
                    latent_seed,
                    tile,
                    tile_mid_block: mid,
                }
            })
        },
    )
}

/// The (key, shape) of every AutoencoderKL decoder weight of `cfg`, as the
/// loader asks for them (diffusers names; the loader rejects any other set).
fn kl_keys(cfg: &AutoencoderKlConfig) -> Vec<(String, Vec<usize>)> {
    let mut v = Vec::new();
    let mut conv = |p: &str, cout: usize, cin: usize, k: usize| {
        v.push((format!("{p}.weight"), vec![cout, cin, k, k]));
        v.push((format!("{p}.bias"), vec![cout]));
    };
    let lc = cfg.latent_channels;
    let rev: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
    let top = rev[0];
    if cfg.use_post_quant_conv {
        conv("post_quant_conv", lc, lc, 1);
    }
    conv("decoder.conv_in", top, lc, 3);
    let mut norms = Vec::new();
    let mut resnet =
        |conv: &mut dyn FnMut(&str, usize, usize, usize), p: String, cin: usize, cout: usize| {
            norms.push((format!("{p}.norm1"), cin));
            conv(&format!("{p}.conv1"), cout, cin, 3);
            norms.push((format!("{p}.norm2"), cout));
            conv(&format!("{p}.conv2"), cout, cout, 3);
            if cin != cout {
                conv(&format!("{p}.conv_shortcut"), cout, cin, 1);
            }
        };
    for i in 0..2 {
        resnet(
            &mut conv,
            format!("decoder.mid_block.resnets.{i}"),
            top,
            top,
        );
    }
    let mut prev = top;
    for (i, &cout) in rev.iter().enumerate() {
        for j in 0..=cfg.layers_per_block {
            let cin = if j == 0 { prev } else { cout };
            resnet(
                &mut conv,
                format!("decoder.up_blocks.{i}.resnets.{j}"),
                cin,
                cout,
            );
        }
        if i + 1 < rev.len() {
            conv(
                &format!("decoder.up_blocks.{i}.upsamplers.0.conv"),
                cout,
                cout,
                3,
            );
        }
        prev = cout;
    }
    if cfg.mid_block_add_attention {
        let p = "decoder.mid_block.attentions.0";
        norms.push((format!("{p}.group_norm"), top));
        for q in ["to_q", "to_k", "to_v", "to_out.0"] {
            conv(&format!("{p}.{q}"), top, top, 1);
        }
    }
    norms.push(("decoder.conv_norm_out".into(), prev));
    conv("decoder.conv_out", cfg.out_channels, prev, 3);
    for (p, c) in norms {
        v.push((format!("{p}.weight"), vec![c]));
        v.push((format!("{p}.bias"), vec![c]));
    }
    v
}

/// A case's model as files, for the public loader and [`Estimate`] (which
/// take a path): a diffusers folder (config.json, the same seeded weights
/// [`WeightStore::random`] gives) or a TAE weight file; unique to the case,
/// removed with it. `None`: an AutoencoderKL built in memory.
struct ModelFile(Option<(tempfile::TempDir, PathBuf)>);

impl ModelFile {
    fn new(model: &Model, kl_files: bool) -> Self {
        let weights: Vec<(String, HostWeight)> = match model {
            Model::Kl(..) if !kl_files => return ModelFile(None),
            Model::Kl(cfg, seed) => {
                let store = WeightStore::random(*seed);
                kl_keys(cfg)
                    .into_iter()
                    .map(|(k, shape)| {
                        let data = store.take(&k, &shape).unwrap();
                        (k, HostWeight { shape, data })
                    })
                    .collect()
            }
            Model::Tae(c, seed) => synthetic_tae_decoder(*c, *seed * 1000)
                .into_iter()
                .collect(),
        };
        // A folder per case: nothing but the model is beside the file.
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let file = match model {
            Model::Kl(cfg, _) => {
                let json = serde_json::to_string(cfg).unwrap();
                std::fs::write(dir.join("config.json"), json).unwrap();
                dir.join("diffusion_pytorch_model.safetensors")
            }
            Model::Tae(c, _) => dir.join(format!("tae{c}_decoder.safetensors")),
        };
        let views: Vec<(String, safetensors::tensor::TensorView)> = weights
            .iter()
            .map(|(k, w)| {
                let bytes: &[u8] = bytemuck::cast_slice(&w.data);
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    w.shape.clone(),
                    bytes,
                )
                .unwrap();
                (k.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &file).unwrap();
        ModelFile(Some((scratch, file)))
    }

    fn spec(&self) -> &str {
        self.0.as_ref().and_then(|(_, p)| p.to_str()).unwrap()
    }
}

fn precision_dtype(p: Precision) -> DType {
    match p {
        Precision::F16 => DType::F16,
        Precision::BF16 => DType::BF16,
        _ => DType::F32,
    }
}

/// The case's model on `ctx` (a real or a null device).
fn load(
    ctx: &Context,
    model: &Model,
    file: &ModelFile,
    precision: Precision,
) -> wgvae::Result<Vae> {
    match (model, &file.0) {
        (Model::Kl(cfg, seed), None) => {
            let store = WeightStore::random(*seed);
            store.set_dtype(precision_dtype(precision));
            Vae::from_kl_config(ctx, cfg, &store, "random tiny AutoencoderKL")
        }
        _ => {
            let load = LoadOptions {
                precision,
                ..Default::default()
            };
            Vae::load(ctx, file.spec(), &load)
        }
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

fn ok<T>(r: wgvae::Result<T>, what: &str) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

fn decode_with(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    tiling: Tiling,
    keep_raw: bool,
) -> wgvae::Result<Decoded> {
    let opts = DecodeOptions {
        keep_raw,
        tiling,
        ..Default::default()
    };
    decode(ctx, vae, z, &opts)
}

fn check_exact_tiles(case: &Case) -> Result<(), TestCaseError> {
    let ctx = test_context();
    let vae = ok(
        load(
            &ctx,
            &case.model,
            &ModelFile::new(&case.model, false),
            Precision::F32,
        ),
        "load",
    )?;
    let z = case.latents();
    let whole = ok(decode_with(&ctx, &vae, &z, Tiling::off(), true), "untiled")?;
    let tiled = ok(decode_with(&ctx, &vae, &z, case.exact(), true), "exact")?;
    let t = &tiled.tiling;
    ensure(t.mode == "exact" && t.tiles > 1, || {
        format!("not tiled: {t:?}")
    })?;
    let (a, b) = (whole.raw.unwrap(), tiled.raw.unwrap());
    ensure(a.shape == b.shape, || {
        format!("shapes {:?} vs {:?}", a.shape, b.shape)
    })?;
    let (err, at) = max_abs_diff(&b.data, &a.data);
    let spread = a.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    println!(
        "{:?} [{}, {}, {}, {}]: {} tiles of {} px (mid-block tiled: {}): max abs {err:.2e} (output max |x| {spread:.2e})",
        case.model,
        case.n,
        case.latent_channels(),
        case.h,
        case.w,
        t.tiles,
        t.tile_size.unwrap_or(0),
        t.mid_block_tiled
    );
    ensure(spread > 1e-3, || {
        format!("degenerate output (max |x| {spread})")
    })?;
    ensure(err <= EXACT_BOUND, || {
        format!("exact tiles differ from untiled by {err} at {at} (bound {EXACT_BOUND})")
    })
}

/// One decode measured on the device and predicted by a dry run.
fn check_estimate(
    case: &Case,
    file: &ModelFile,
    policy: Policy,
    precision: Precision,
    tiling: &Tiling,
) -> Result<(u64, Option<Decoded>), TestCaseError> {
    let base = test_context();
    let z = case.latents();
    let shape: [usize; 4] = z.shape.clone().try_into().unwrap();
    let what = format!("{} {precision:?} {:?}", policy.name(), tiling.mode);
    // The public estimator: the same load and decode on a null device.
    let load_opts = LoadOptions {
        precision,
        ..Default::default()
    };
    let est = Estimate::new(base.caps(), policy, file.spec(), &load_opts)
        .tiled(tiling)
        .decode(shape)
        .map(|e| {
            (
                e.weights_bytes,
                e.peak_allocated_bytes,
                e.peak_reserved_bytes,
                e.tiling,
            )
        });
    let ctx = base.with_pool(policy.new_pool());
    let vae = ok(load(&ctx, &case.model, file, precision), &what)?;
    let real = decode_with(&ctx, &vae, &z, tiling.clone(), false);
    let (est, real) = match (est, real) {
        (Ok(e), Ok(r)) => (e, r),
        // A budget too small fails in both, before decoding.
        (Err(e), Err(r)) => {
            println!("{what}: both fail: {r}");
            ensure(e.to_string() == r.to_string(), || {
                format!("{what}: predicted error `{e}`, real error `{r}`")
            })?;
            return Ok((vae.weights_bytes(), None));
        }
        (e, r) => {
            return Err(TestCaseError::fail(format!(
                "{what}: predicted {:?}, real {:?}",
                e.map(|e| e.1),
                r.map(|r| r.memory.allocated_bytes.peak)
            )))
        }
    };
    let (weights, alloc, reserved, est_tiling) = est;
    let (a, r) = (
        real.memory.allocated_bytes.peak,
        real.memory.reserved_bytes.peak,
    );
    println!(
        "{what}: peak allocated {a} B (predicted {alloc}), reserved {r} B (predicted {reserved}), {} tiles, {} B host-parked",
        real.tiling.tiles, real.tiling.host_parked_peak_bytes
    );
    ensure(weights == vae.weights_bytes(), || {
        format!(
            "{what}: weights {} B, predicted {weights} B",
            vae.weights_bytes()
        )
    })?;
    ensure(alloc == a, || {
        format!("{what}: peak allocated {a} B, predicted {alloc} B")
    })?;
    ensure(reserved == r, || {
        format!("{what}: peak reserved {r} B, predicted {reserved} B")
    })?;
    ensure(est_tiling == real.tiling, || {
        format!("{what}: tiling {:?}, predicted {est_tiling:?}", real.tiling)
    })?;
    if let Some(p) = ctx.pool().as_any().downcast_ref::<PlannedPool>() {
        ensure(p.divergences() == 0, || {
            format!(
                "{what}: planned replay left its trace: {:?}",
                p.last_divergence()
            )
        })?;
    }
    Ok((vae.weights_bytes(), Some(real)))
}

/// Every policy, untiled and in exact tiles; with `budget_frac`, the tiled
/// decode gets that fraction of the untiled working memory (weights on top):
/// tiles are parked (on the host once the device part runs out), or the plan
/// fails, in both runs alike.
fn check_estimates(
    case: &Case,
    precision: Precision,
    budget_frac: Option<f64>,
) -> Result<(), TestCaseError> {
    println!("{case:?} {precision:?} budget {budget_frac:?}");
    let file = ModelFile::new(&case.model, true);
    for policy in Policy::ALL {
        let (weights, whole) = check_estimate(case, &file, policy, precision, &Tiling::off())?;
        let whole = whole.ok_or_else(|| TestCaseError::fail("the untiled decode failed"))?;
        let mut tiling = case.exact();
        if let Some(f) = budget_frac {
            let peak = whole.memory.allocated_bytes.peak;
            tiling.max_memory = Some(weights + ((peak - weights) as f64 * f) as u64);
        }
        check_estimate(case, &file, policy, precision, &tiling)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(EXACT_CASES))]

    #[test]
    fn exact_tiles_equal_untiled(case in case(24, 6)) {
        let t = std::time::Instant::now();
        check_exact_tiles(&case)?;
        println!("case took {:.1} s", t.elapsed().as_secs_f64());
    }
}

proptest! {
    #![proptest_config(config(ESTIMATE_CASES))]

    #[test]
    fn estimate_equals_measured(
        case in case(12, 4),
        precision in prop::sample::select(vec![Precision::F32, Precision::F16, Precision::BF16]),
        budget_frac in prop::option::of(0.3f64..0.9),
    ) {
        let t = std::time::Instant::now();
        check_estimates(&case, precision, budget_frac)?;
        println!("case took {:.1} s", t.elapsed().as_secs_f64());
    }
}
