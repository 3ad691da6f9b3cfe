//! Fuzz target: see `wgvae::fuzzing::wan_config`.
#![no_main]

#[global_allocator]
static ALLOC: wgvae::fuzzing::BoundedAlloc = wgvae::fuzzing::BoundedAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| wgvae::fuzzing::wan_config(data));
