//! Real wgpu validation errors come back as `Error`s, never as panics.

use std::sync::Arc;

use wgvae::gpu::{Context, ContextOptions, Recorder};
use wgvae::kernels::elementwise::{unary, Unary};
use wgvae::memory::{Backing, Block, MemoryPool, MemoryStats};
use wgvae::{DType, Error, Tensor};

/// A broken pool policy: every block starts 4 bytes into its buffer, which no
/// device accepts as a storage-binding offset (wgpu requires a multiple of
/// `min_storage_buffer_offset_alignment`, at least 16 on lavapipe). Binding
/// such a tensor is a genuine wgpu validation error.
#[derive(Default)]
struct MisalignedPool {
    next_id: std::sync::atomic::AtomicU64,
}

impl MemoryPool for MisalignedPool {
    fn policy_name(&self) -> &'static str {
        "misaligned"
    }
    fn allocate(
        &self,
        backing: &Backing,
        bytes: u64,
        _align: u64,
        label: &str,
    ) -> wgvae::Result<Block> {
        let size = bytes.div_ceil(4) * 4 + 4;
        let buffer = backing.create_buffer(size, label)?;
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Block {
            buffer,
            offset: 4,
            size: size - 4,
            requested: bytes,
            id,
            segment: id,
        })
    }
    fn release(&self, _block: &Block) {}
    fn stats(&self) -> MemoryStats {
        MemoryStats::default()
    }
    fn reset_peak_stats(&self) {}
    fn empty_cache(&self) {}
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A device the test owns, wrapped like a host application would wrap its own.
fn host_context() -> Context {
    let adapter = Context::choose_adapter(&ContextOptions::default()).expect("an adapter");
    let (device, queue) =
        pollster::block_on(adapter.request_device(&Default::default())).expect("a device");
    Context::from_device(device, queue)
}

#[test]
fn misaligned_binding_is_a_validation_error_not_a_panic() {
    let ctx = host_context();
    assert!(ctx.caps().min_storage_buffer_offset_alignment > 4);
    let ctx = ctx.with_pool(Arc::new(MisalignedPool::default()));
    let x = Tensor::empty(&ctx, &[7, 5], DType::F32, "x").unwrap();
    let out = Tensor::empty(&ctx, &[7, 5], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&ctx);
    let err = unary(&mut rec, Unary::Silu, &x, &out).expect_err("a misaligned binding must fail");
    match &err {
        Error::Validation { during, message } => {
            assert!(during.contains("elementwise"), "{err}");
            assert!(!message.is_empty(), "{err}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    // The error was caught by the engine's scope, not left for the handler.
    assert!(ctx.take_uncaptured_errors().is_empty());
}

#[test]
fn from_device_records_uncaptured_errors_instead_of_panicking() {
    let ctx = host_context();
    // Host work outside any error scope: a buffer that is both MAP_READ and
    // MAP_WRITE is invalid. wgpu's default handler would panic here.
    let _bad = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("host's invalid buffer"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE,
        mapped_at_creation: false,
    });
    let errors = ctx.take_uncaptured_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(ctx.take_uncaptured_errors().is_empty(), "drained");
    // The device still works for the engine afterwards.
    let x = Tensor::from_f32(&ctx, &[3], &[1.0, -2.0, 0.5], "x").unwrap();
    let out = Tensor::empty(&ctx, &[3], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&ctx);
    unary(&mut rec, Unary::Relu, &x, &out).unwrap();
    rec.submit().unwrap();
    assert_eq!(out.to_f32(&ctx).unwrap(), vec![1.0, 0.0, 0.5]);
}

#[test]
fn a_buffer_beyond_max_buffer_size_is_named() {
    let ctx = wgvae::testing::test_context();
    let limit = ctx.caps().max_buffer_size;
    let elems = (limit / 4 + 1) as usize;
    let err = Tensor::empty(&ctx, &[elems], DType::F32, "huge").expect_err("over the limit");
    assert!(matches!(err, Error::BufferTooLarge { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("max_buffer_size") && msg.contains(&limit.to_string()),
        "{msg}"
    );
    assert!(msg.contains("tiling"), "{msg}");
}

/// A host's uncaptured-error handler survives `Context::from_host_device` (the path
/// `Engine` takes): the host's handler sees the error and wgvae records nothing.
#[test]
fn from_host_device_keeps_the_hosts_error_handler() {
    let adapter = Context::choose_adapter(&ContextOptions::default()).expect("an adapter");
    let (device, queue) =
        pollster::block_on(adapter.request_device(&Default::default())).expect("a device");
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = seen.clone();
    device.on_uncaptured_error(Arc::new(move |_| {
        s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    let ctx = Context::from_host_device(device, queue, Arc::new(wgvae::memory::ExactPool::new()));
    let _bad = ctx.device().create_buffer(&wgvae::wgpu::BufferDescriptor {
        label: Some("host's invalid buffer"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE,
        mapped_at_creation: false,
    });
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the host's handler ran"
    );
    assert!(ctx.take_uncaptured_errors().is_empty());
}
