//! Device tensors: a shape, a dtype and a block from the context's pool.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::memory::{Block, MemoryPool};

/// Element type of a tensor's storage. Arithmetic is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half (native `f16` or packed pairs, by device).
    F16,
    /// bfloat16, packed in pairs.
    BF16,
    /// Four u8 packed in a u32: RGBA8 pixels, or an RGB8 byte stream (`kernels::image::to_rgb8`).
    Rgba8,
}

impl DType {
    /// Storage bytes per element (per pixel for `Rgba8`).
    pub fn size(self) -> u64 {
        match self {
            DType::F32 | DType::Rgba8 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
    /// Short name (`f32`, `f16`, `bf16`, `rgba8`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Rgba8 => "rgba8",
        }
    }
}

/// A block of pool memory; returned to the pool when the last tensor using it drops.
pub struct Storage {
    block: Block,
    pool: Arc<dyn MemoryPool>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.pool.release(&self.block);
    }
}

/// A tensor on the device. Cloning shares the storage.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Arc<Storage>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {})", self.shape, self.dtype.name())
    }
}

fn check_len(op: &str, shape: &[usize], data: &[f32]) -> Result<()> {
    if numel(shape) != data.len() {
        return Err(Error::shape(
            op,
            format!("{} values for shape {shape:?}", data.len()),
        ));
    }
    Ok(())
}

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Tensor {
    /// Allocates an uninitialised tensor from the context's pool.
    pub fn empty(ctx: &Context, shape: &[usize], dtype: DType, label: &str) -> Result<Tensor> {
        let bytes = Self::bytes_for(shape, dtype);
        let align = ctx.caps().min_storage_buffer_offset_alignment as u64;
        let pool = ctx.pool().clone();
        let block = pool.allocate(&ctx.backing(), bytes, align, label)?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Arc::new(Storage { block, pool }),
        })
    }

    /// Storage bytes of a shape in a dtype (f16/bf16 rounded up to whole u32 words).
    pub(crate) fn bytes_for(shape: &[usize], dtype: DType) -> u64 {
        let n = numel(shape) as u64 * dtype.size();
        n.div_ceil(4) * 4
    }

    /// Uploads f32 data as a new f32 tensor.
    pub fn from_f32(ctx: &Context, shape: &[usize], data: &[f32], label: &str) -> Result<Tensor> {
        Self::from_f32_as(ctx, shape, data, DType::F32, label)
    }

    /// Uploads f32 data as a new tensor of `dtype` (rounded to nearest even;
    /// f16 saturates at ±65504).
    pub(crate) fn from_f32_as(
        ctx: &Context,
        shape: &[usize],
        data: &[f32],
        dtype: DType,
        label: &str,
    ) -> Result<Tensor> {
        check_len("Tensor::from_f32", shape, data)?;
        let t = Tensor::empty(ctx, shape, dtype, label)?;
        if ctx.is_null() {
            return Ok(t); // nothing to write to, so nothing to convert
        }
        t.write_bytes(ctx, &crate::gpu::storage::encode_f32(data, dtype)?);
        Ok(t)
    }

    /// Allocates an f32 tensor and uploads `data` inside `rec`'s command
    /// stream (use this for tensors created during a forward pass).
    pub(crate) fn from_f32_in(
        rec: &mut crate::gpu::Recorder,
        shape: &[usize],
        data: &[f32],
        label: &str,
    ) -> Result<Tensor> {
        check_len("Tensor::from_f32_in", shape, data)?;
        let t = Tensor::empty(rec.ctx(), shape, DType::F32, label)?;
        rec.upload(&t, bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// Overwrites the tensor's bytes with a queue write (lands before the next submit).
    pub fn write_bytes(&self, ctx: &Context, bytes: &[u8]) {
        let b = &self.storage.block;
        let Some(buffer) = &b.buffer else { return }; // dry run
        let n = bytes.len() as u64;
        if n.is_multiple_of(4) {
            ctx.queue().write_buffer(buffer, b.offset, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(n.div_ceil(4) as usize * 4, 0);
            ctx.queue().write_buffer(buffer, b.offset, &padded);
        }
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// Bytes of the data (not of the pool block, which may be larger).
    pub fn byte_size(&self) -> u64 {
        Self::bytes_for(&self.shape, self.dtype)
    }
    /// The pool block holding the tensor.
    #[doc(hidden)]
    pub fn block(&self) -> &Block {
        &self.storage.block
    }

    /// The device buffer holding this tensor (an error in dry runs).
    pub fn buffer(&self) -> Result<&wgpu::Buffer> {
        self.storage.block.buffer.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "a dry-run tensor has no device buffer (memory estimation only)".into(),
            )
        })
    }

    /// The binding of this tensor's bytes.
    #[doc(hidden)]
    pub fn binding(&self) -> Result<wgpu::BufferBinding<'_>> {
        Ok(wgpu::BufferBinding {
            buffer: self.buffer()?,
            offset: self.storage.block.offset,
            size: wgpu::BufferSize::new(self.byte_size()),
        })
    }

    /// True when the two tensors' bytes overlap (same buffer, intersecting ranges).
    #[doc(hidden)]
    pub fn overlaps(&self, other: &Tensor) -> bool {
        let (a, b) = (self.block(), other.block());
        // Segment ids are unique per pool; tensors of two pools (several
        // engines or contexts on one device) share a buffer only if it is
        // the same wgpu buffer. Dry runs have no buffers: ids decide.
        let same = match (&a.buffer, &b.buffer) {
            (Some(x), Some(y)) => x == y,
            _ => a.segment == b.segment,
        };
        same && a.offset < b.offset + other.byte_size() && b.offset < a.offset + self.byte_size()
    }

    /// Same storage, another shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!("{:?} to {shape:?} changes the element count", self.shape),
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: self.dtype,
            storage: self.storage.clone(),
        })
    }

    /// Reads the tensor back as f32 (blocking). For tests, tools and final outputs.
    pub fn to_f32(&self, ctx: &Context) -> Result<Vec<f32>> {
        let bytes = crate::gpu::read_back(ctx, &[self])?
            .pop()
            .unwrap_or_default();
        self.f32_from_bytes(&bytes)
    }

    /// This tensor's values from its read-back bytes (see [`crate::gpu::read_back`]).
    pub(crate) fn f32_from_bytes(&self, bytes: &[u8]) -> Result<Vec<f32>> {
        let mut v = f32_from_bytes_of(self.dtype, bytes)?;
        v.truncate(self.numel());
        Ok(v)
    }

    /// Reads the tensor's raw bytes back (blocking).
    pub fn to_bytes(&self, ctx: &Context) -> Result<Vec<u8>> {
        Ok(crate::gpu::read_back(ctx, &[self])?
            .pop()
            .unwrap_or_default())
    }
}

/// Little-endian `T` elements in `bytes` (any alignment), widened to f32.
pub(crate) fn widen<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<f32>
where
    f32: From<T>,
{
    let values = bytemuck::pod_collect_to_vec::<u8, T>(bytes);
    values.into_iter().map(f32::from).collect()
}

/// Values of `dtype` elements in little-endian `bytes`, widened to f32.
pub(crate) fn f32_from_bytes_of(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        DType::F32 => widen::<f32>(bytes),
        DType::F16 => widen::<half::f16>(bytes),
        DType::BF16 => widen::<half::bf16>(bytes),
        DType::Rgba8 => {
            return Err(Error::Unsupported(
                "to_f32 on an rgba8 tensor; use to_bytes".into(),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Policy;
    use crate::testing::test_context;

    /// Two pools number their segments alike; only the same wgpu buffer overlaps.
    #[test]
    fn overlap_means_the_same_buffer_not_the_same_pool_id() {
        let ctx = test_context();
        let a = ctx.with_pool(Policy::Exact.new_pool());
        let b = ctx.with_pool(Policy::Exact.new_pool());
        let x = Tensor::empty(&a, &[4, 5], DType::F32, "x").unwrap();
        let y = Tensor::empty(&b, &[4, 5], DType::F32, "y").unwrap();
        assert_eq!(x.block().segment, y.block().segment);
        assert!(!x.overlaps(&y));
        assert!(x.overlaps(&x.reshape(&[20]).unwrap()));
    }
}
