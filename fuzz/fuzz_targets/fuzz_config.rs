//! Fuzz target: see `wgvae::fuzzing::config`.
#![no_main]

#[global_allocator]
static ALLOC: wgvae::fuzzing::BoundedAlloc = wgvae::fuzzing::BoundedAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| wgvae::fuzzing::config(data));
