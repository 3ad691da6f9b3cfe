//! The fuzz corpus on stable, for CI (the cargo-fuzz targets need nightly):
//! every file under `fuzz/corpus/<target>/` through the same harness as the
//! fuzzer (`wgvae::fuzzing`), then a deterministic mutation loop (byte
//! flips, inserts, deletions, truncations; fixed-seed xorshift) of
//! `WGVAE_FUZZ_ITERS` executions per target (default 10 000). Any panic names
//! the target and saves the input under `target/fuzz-failures/`; an
//! allocation above `wgvae::fuzzing::ALLOC_LIMIT` aborts the process
//! (`WGVAE_FUZZ_TRACE=1` prints each input's name before it runs).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use wgvae::fuzzing::{BoundedAlloc, TARGETS};

#[global_allocator]
static ALLOC: BoundedAlloc = BoundedAlloc;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
        .unwrap_or_else(|e| panic!("fuzz/corpus/{target}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four edits of the kinds that break parsers: bit flips, boundary
/// bytes, inserts, deletions, truncation, and a copied chunk.
fn mutate(rng: &mut XorShift, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = [0, 0xff, 0x7f, 0x80, b'9', b'-', b'"', b'['][rng.below(8)];
            }
            2 => v.insert(at, rng.next() as u8),
            3 if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            4 => v.truncate(at),
            5 if !v.is_empty() => {
                let from = rng.below(v.len());
                let end = (from + 1 + rng.below(32)).min(v.len());
                let chunk = v[from..end].to_vec();
                v.splice(at..at, chunk);
            }
            _ => {
                // A little-endian length field set to an extreme.
                let end = (at + 8).min(v.len());
                let big = [u64::MAX, 1 << 40, 1 << 31, 0][rng.below(4)].to_le_bytes();
                let n = end - at;
                v[at..end].copy_from_slice(&big[..n]);
            }
        }
    }
    v
}

/// Runs `f` on `data`; a panic saves the input and names it.
fn run(target: &str, f: fn(&[u8]), what: &str, data: &[u8]) -> Result<(), String> {
    // An allocation above the bound aborts: this names the input first.
    if std::env::var_os("WGVAE_FUZZ_TRACE").is_some() {
        eprintln!("{target} {what} ({} bytes)", data.len());
    }
    if catch_unwind(AssertUnwindSafe(|| f(data))).is_ok() {
        return Ok(());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{target}-{what}"));
    std::fs::write(&file, data).unwrap();
    Err(format!(
        "{target} panicked on {what} ({} bytes, saved to {})",
        data.len(),
        file.display()
    ))
}

#[test]
fn corpus_replays_and_mutations_do_not_panic() {
    let iters: usize = std::env::var("WGVAE_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let mut failures = Vec::new();
    for &(target, f) in TARGETS {
        let start = std::time::Instant::now();
        wgvae::fuzzing::reset_largest_alloc();
        let inputs = corpus(target);
        assert!(!inputs.is_empty(), "fuzz/corpus/{target} is empty");
        for (name, data) in &inputs {
            failures.extend(run(target, f, name, data).err());
        }
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
        for i in 0..iters {
            let base = &inputs[rng.below(inputs.len())].1;
            let data = mutate(&mut rng, base);
            failures.extend(run(target, f, &format!("mutation-{i}"), &data).err());
        }
        println!(
            "{target}: {} corpus files + {iters} mutations in {:.1} s, largest single allocation {} bytes",
            inputs.len(),
            start.elapsed().as_secs_f64(),
            wgvae::fuzzing::largest_alloc()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
