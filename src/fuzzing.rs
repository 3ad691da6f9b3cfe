//! Fuzz harnesses: one function per input loader, shared by the cargo-fuzz
//! targets (`fuzz/`) and the stable corpus replay (`tests/fuzz_corpus.rs`),
//! so CI exercises exactly what the fuzzer does. Each runs the loader on
//! untrusted bytes and asserts the contract: no panic, and every error names
//! the file it came from. No GPU is needed: only what runs before one.
#![doc(hidden)]

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;
use crate::io;
use crate::models::weights::{Layout, TaePart, WeightStore};
use crate::models::{resolve_config, AutoencoderKlConfig, LoadOptions};

/// The largest single allocation any loader may make on fuzz inputs: 1 GiB
/// (the `image` crate's own decoder cap is 512 MiB; the other loaders
/// allocate in proportion to the input, or at most 2^24 f32 zeros per
/// missing weight).
pub const ALLOC_LIMIT: usize = 1 << 30;

/// A global allocator that records the largest single allocation and aborts
/// above [`ALLOC_LIMIT`] (a crash the fuzzer saves), without a sanitizer.
pub struct BoundedAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The largest single allocation since the last [`reset_largest_alloc`].
pub fn largest_alloc() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// Starts a new [`largest_alloc`] measurement.
pub fn reset_largest_alloc() {
    LARGEST.store(0, Ordering::Relaxed);
}

fn note(size: usize) {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    if size > ALLOC_LIMIT {
        // No formatting here: it would allocate.
        let msg = b"wgvae fuzzing: an allocation above ALLOC_LIMIT (1 GiB)\n";
        let _ = std::io::Write::write_all(&mut std::io::stderr(), msg);
        std::process::abort();
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for BoundedAlloc {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

/// A harness: runs one loader on untrusted bytes.
pub type Harness = fn(&[u8]);

/// Every harness, by fuzz target name.
pub const TARGETS: &[(&str, Harness)] = &[
    ("fuzz_npy", npy),
    ("fuzz_safetensors", safetensors),
    ("fuzz_config", config),
    ("fuzz_layout", layout),
    ("fuzz_png", png),
    ("fuzz_wan_config", wan_config),
];

/// A loader's error must name the file (`origin`), whatever went wrong.
fn names_file<T>(r: crate::Result<T>, origin: &str) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains(origin), "error does not name {origin}: {m}");
            assert!(
                matches!(e, Error::BadFile { .. } | Error::InvalidInput(_)),
                "unexpected error kind: {e:?}"
            );
            None
        }
    }
}

/// `.npy` latents: parse, then the latent checks for 4 and 16 channels.
pub fn npy(data: &[u8]) {
    let path = Path::new("fuzz.npy");
    if let Some(t) = names_file(io::parse_npy(data, path), "fuzz.npy") {
        for channels in [4, 16] {
            let _ = io::validate_latents(&mut t.clone(), channels);
        }
    }
}

/// `.safetensors` latents (the only tensor, or key `latents`) and weights
/// (header and every tensor, both halves of a TAE file).
pub fn safetensors(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    let origin = "fuzz.safetensors";
    for key in [None, Some("latents")] {
        if let Some(mut t) = names_file(io::parse_safetensors_tensor(data, path, key), origin) {
            let _ = io::validate_latents(&mut t, 4);
        }
    }
    for part in [TaePart::Decoder, TaePart::Encoder] {
        if let Some(store) = names_file(
            WeightStore::from_safetensors_bytes(data, path, part),
            origin,
        ) {
            for key in store.keys() {
                let _ = store.shape_of(&key);
            }
        }
    }
}

/// A diffusers `config.json`: parse and validate (invalid UTF-8 is an I/O
/// error of `read_to_string` before parsing, so it is skipped here).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(c) = names_file(
        AutoencoderKlConfig::from_json(text, Path::new("fuzz/config.json")),
        "fuzz/config.json",
    ) {
        // Validated: these must not overflow.
        let _ = (c.upscale(), c.shift(), c.is_f16_safe());
    }
}

/// A Wan `config.json`: every error names the file; an accepted config is
/// one a decoder can be built from (stages and flags agree, widths bounded,
/// latent statistics one per channel or none).
pub fn wan_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = "fuzz/wan/config.json";
    match crate::models::WanConfig::from_json_noting(text, Path::new(origin)) {
        Ok((c, note)) => {
            let stages = c.dim_mult.len();
            assert!((1..=8).contains(&stages) && c.temperal_downsample.len() + 1 == stages);
            assert!((1..=1024).contains(&c.z_dim) && c.num_res_blocks >= 1);
            let widest = c.dim_mult.iter().max().copied().unwrap_or(0) * c.base_dim;
            assert!((1..=16384).contains(&widest), "{c:?}");
            for stats in [&c.latents_mean, &c.latents_std] {
                assert!(stats.is_empty() || stats.len() == c.z_dim, "{c:?}");
            }
            // Statistics not given are said so.
            assert_eq!(
                c.latents_mean.is_empty(),
                note.as_ref().is_some_and(|n| n.contains("only raw"))
            );
        }
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains(origin), "error does not name {origin}: {m}");
        }
    }
}

/// Layout detection and everything after a weight file is opened and before
/// a GPU is needed: the config inferred from shapes (AutoencoderKL) or the
/// TAE variant's checks, then the host side of a model load on a few keys
/// (`take` of the shapes the model would ask for, `finish`).
pub fn layout(data: &[u8]) {
    let path = Path::new("fuzz-layout.safetensors");
    let origin = "fuzz-layout.safetensors";
    for part in [TaePart::Decoder, TaePart::Encoder] {
        let Some(store) = names_file(
            WeightStore::from_safetensors_bytes(data, path, part),
            origin,
        ) else {
            continue;
        };
        if store.layout() == Layout::Tae {
            tae_host_load(&store, origin);
        } else {
            kl_host_load(&store, origin);
        }
    }
}

/// What `TaeDecoder::load` and `TaeEncoder::load` read before uploading.
fn tae_host_load(store: &WeightStore, origin: &str) {
    const W: usize = crate::models::tae::WIDTH;
    if let Some(shape) = names_file(store.conv_shape("1.weight", "no 1.weight"), origin) {
        if shape[0] == W {
            let c = shape[1];
            let _ = names_file(store.take("1.weight", &[W, c, 3, 3]), origin);
            let _ = names_file(store.take("1.bias", &[W]), origin);
            if store.contains("3.pool.0.weight") {
                let _ = names_file(store.take("3.pool.0.weight", &[4 * W, W, 1, 1]), origin);
            }
            let _ = names_file(store.take("3.conv.0.weight", &[W, W, 3, 3]), origin);
            let _ = names_file(store.take("19.weight", &[3, W, 3, 3]), origin);
            let _ = names_file(store.finish(&[]), origin);
        }
    }
    if let Some(shape) = names_file(store.conv_shape("14.weight", "no 14.weight"), origin) {
        let _ = names_file(store.take("14.weight", &[shape[0], W, 3, 3]), origin);
        let _ = names_file(store.take("0.weight", &[W, 3, 3, 3]), origin);
    }
}

/// What `Vae::load` and `AutoencoderKl::load` do before uploading: infer the
/// config, validate it, take the first and last convs and the quant convs.
fn kl_host_load(store: &WeightStore, origin: &str) {
    let Some(cfg) = names_file(resolve_config(store, None, &LoadOptions::default()), origin) else {
        return;
    };
    if cfg.validate().is_err() {
        return; // `AutoencoderKl::load` stops here with that message
    }
    let dec = cfg.decoder_channels();
    let (l, top) = (cfg.latent_channels, dec[dec.len() - 1]);
    let first = dec[0];
    let takes: [(&str, Vec<usize>); 5] = [
        ("post_quant_conv.weight", vec![l, l, 1, 1]),
        ("decoder.conv_in.weight", vec![top, l, 3, 3]),
        ("decoder.conv_in.bias", vec![top]),
        (
            "decoder.conv_out.weight",
            vec![cfg.out_channels, first, 3, 3],
        ),
        (
            "decoder.up_blocks.0.resnets.0.conv2.weight",
            vec![top, top, 3, 3],
        ),
    ];
    for (key, shape) in takes {
        let _ = names_file(store.take(key, &shape), origin);
    }
    let _ = (cfg.upscale(), store.finish(&["encoder.", "quant_conv."]));
}

/// A PNG for encoding, unpadded and padded to multiples of 8.
pub fn png(data: &[u8]) {
    for pad in [false, true] {
        if let Some(t) = names_file(io::parse_png(data, Path::new("fuzz.png"), pad), "fuzz.png") {
            assert_eq!(t.shape.len(), 4);
            assert!(t.shape[2] % 8 == 0 && t.shape[3] % 8 == 0, "{:?}", t.shape);
        }
    }
}
