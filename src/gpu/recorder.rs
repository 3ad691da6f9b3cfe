//! Recording kernels into one command encoder.
//!
//! A [`Recorder`] keeps one compute pass open across dispatches (wgpu inserts
//! the barriers), packs every dispatch's uniform parameters into shared
//! uniform buffers bound with dynamic offsets, and never submits on its own
//! unless it owns the encoder.

use bytemuck::Pod;

use crate::error::{Error, Result};
use crate::gpu::pipeline::{BindingKind, KernelSpec, PipelineKey};
use crate::gpu::tensor::Tensor;
use crate::gpu::Context;
use crate::memory::round_up;

const UNIFORM_CHUNK: u64 = 64 * 1024;

/// Most call signatures a dry-run recorder remembers ([`Recorder::repeat_dry`]).
const DRY_SIGNATURES: usize = 4096;

/// Dispatch labels of calls a dry run already checked, by signature
/// ([`Recorder::repeat_dry`]).
type DryMemo = std::collections::HashMap<Vec<u64>, Vec<DispatchLabel>>;

/// A call's signature for [`Recorder::repeat_dry`]: everything its checks
/// and dispatches depend on besides the device (on the stack: built for
/// every call of a dry run).
pub(crate) struct DrySignature {
    words: [u64; 96],
    len: usize,
}

impl DrySignature {
    /// An empty signature of calls of `kernel` (a word no other kernel uses).
    pub(crate) fn new(kernel: u64) -> Self {
        let mut s = DrySignature {
            words: [0; 96],
            len: 0,
        };
        s.push(kernel);
        s
    }
    /// Appends a word (callers stay within 96).
    pub(crate) fn push(&mut self, w: u64) {
        self.words[self.len] = w;
        self.len += 1;
    }
    /// Whether each pair of the present operands overlaps (checks refuse some).
    pub(crate) fn push_overlaps(&mut self, operands: &[Option<&Tensor>]) {
        for (i, a) in operands.iter().enumerate() {
            let Some(a) = a else { continue };
            for b in operands[i + 1..].iter().flatten() {
                self.push(a.overlaps(b) as u64);
            }
        }
    }
    pub(crate) fn as_slice(&self) -> &[u64] {
        &self.words[..self.len]
    }
}

/// What a dispatch was, for profiles and error messages.
#[derive(Clone, Debug)]
pub struct DispatchLabel {
    /// Kernel family.
    pub family: &'static str,
    /// Entry point.
    pub entry: &'static str,
    /// Multiply-accumulates done (for GFLOP/s), 0 when not meaningful.
    pub macs: u64,
}

/// One resource bound at binding 1, 2, … of a dispatch, matching the
/// kernel's [`BindingKind`]s: tensors for `Read`/`ReadWrite`, a texture view
/// for `WriteTexture`.
#[derive(Clone, Copy, Debug)]
pub enum Binding<'a> {
    /// A tensor's bytes as a storage buffer.
    Tensor(&'a Tensor),
    /// A single-mip 2-D view of a texture with `STORAGE_BINDING` usage, in
    /// the format the kernel's spec names.
    Texture(&'a wgpu::TextureView),
}

struct UniformChunk {
    buffer: wgpu::Buffer,
    data: Vec<u8>,
}

enum Encoder<'a> {
    Owned(wgpu::CommandEncoder),
    Borrowed(&'a mut wgpu::CommandEncoder),
}

impl Encoder<'_> {
    fn get(&mut self) -> &mut wgpu::CommandEncoder {
        match self {
            Encoder::Owned(e) => e,
            Encoder::Borrowed(e) => e,
        }
    }
}

/// Records kernels into a command encoder (its own or the host's).
pub struct Recorder<'a> {
    ctx: Context,
    encoder: Encoder<'a>,
    pass: Option<wgpu::ComputePass<'static>>,
    uniforms: Vec<UniformChunk>,
    labels: Vec<DispatchLabel>,
    profiler: Option<crate::gpu::Profiler>,
    /// Counter that f16 conv stores increment for values f16 cannot hold.
    range_flag: Option<Tensor>,
    /// The pipeline key last noted on a null device (dry runs of tiled
    /// attention dispatch the same kernel millions of times in a row).
    noted: Option<PipelineKey>,
    /// Null device: the dispatch labels of calls already checked, with
    /// their signatures ([`Recorder::repeat_dry`]).
    dry: DryMemo,
    /// A null device without [`super::full_plan`]: calls are memoised.
    memo: bool,
}

impl<'a> Recorder<'a> {
    /// A recorder with its own encoder; [`Recorder::submit`] submits it.
    pub fn new(ctx: &Context) -> Recorder<'static> {
        let encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgvae"),
            });
        Recorder::with(ctx, Encoder::Owned(encoder))
    }

    /// A recorder that records into the host's encoder; call [`Recorder::finish`]
    /// before the host submits it.
    pub fn with_encoder(ctx: &Context, encoder: &'a mut wgpu::CommandEncoder) -> Recorder<'a> {
        Recorder::with(ctx, Encoder::Borrowed(encoder))
    }

    fn with(ctx: &Context, encoder: Encoder<'a>) -> Recorder<'a> {
        Recorder {
            ctx: ctx.clone(),
            encoder,
            pass: None,
            uniforms: Vec::new(),
            labels: Vec::new(),
            profiler: None,
            range_flag: None,
            noted: None,
            dry: DryMemo::new(),
            memo: ctx.is_null() && !super::full_plan(),
        }
    }

    /// Dry runs: when a call with `signature` already passed its checks in
    /// this recorder, repeats its dispatch labels and returns true (a
    /// kernel's checks and dispatches depend only on what its signature
    /// holds, and a null device records nothing else). Always false on a
    /// real device and with [`super::full_plan`].
    pub(crate) fn repeat_dry(&mut self, signature: &[u64]) -> bool {
        if !self.memo {
            return false;
        }
        match self.dry.get(signature) {
            Some(labels) => {
                self.labels.extend(labels.iter().cloned());
                true
            }
            None => false,
        }
    }

    /// Records `call`, or on a dry run only repeats its labels when a call
    /// of the same signature (`None`: none to give) already passed its
    /// checks ([`Recorder::repeat_dry`]); a checked call is remembered.
    pub(crate) fn memoised(
        &mut self,
        signature: impl FnOnce() -> Option<DrySignature>,
        call: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let sig = if self.memo { signature() } else { None };
        if let Some(sig) = &sig {
            if self.repeat_dry(sig.as_slice()) {
                return Ok(());
            }
        }
        let mark = self.dry_mark();
        call(self)?;
        if let Some(sig) = sig {
            self.remember_dry(sig.as_slice(), mark);
        }
        Ok(())
    }

    /// The labels of the dispatches recorded since the last call (a null
    /// device's executor counts them instead of submitting).
    pub(crate) fn take_labels(&mut self) -> Vec<DispatchLabel> {
        std::mem::take(&mut self.labels)
    }

    /// Where the labels stand before a call ([`Recorder::remember_dry`]).
    pub(crate) fn dry_mark(&self) -> usize {
        self.labels.len()
    }

    /// Dry runs: pushes again the labels in `range` (a call repeated with
    /// the same signature, known identical to the caller). Nothing elsewhere.
    pub(crate) fn repeat_labels(&mut self, range: std::ops::Range<usize>) {
        if self.ctx.is_null() && range.end <= self.labels.len() {
            self.labels.extend_from_within(range);
        }
    }

    /// Dry runs: remembers the labels the call with `signature` pushed since `mark`.
    pub(crate) fn remember_dry(&mut self, signature: &[u64], mark: usize) {
        if self.memo && self.dry.len() < DRY_SIGNATURES {
            let labels = self.labels.get(mark..).unwrap_or_default().to_vec();
            self.dry.insert(signature.to_vec(), labels);
        }
    }

    /// Times every following dispatch with GPU timestamps, when the device
    /// can write them inside passes (returns whether profiling is on).
    pub fn enable_profiling(&mut self) -> bool {
        if self.profiler.is_none() {
            self.profiler = crate::gpu::Profiler::new(&self.ctx);
        }
        self.profiler.is_some()
    }

    /// The context this recorder allocates from and dispatches on.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// Dispatches recorded so far.
    pub fn labels(&self) -> &[DispatchLabel] {
        &self.labels
    }

    fn end_pass(&mut self) {
        self.pass = None;
    }

    /// The encoder, with the compute pass closed (for copies and host commands).
    pub fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.end_pass();
        self.encoder.get()
    }

    /// Writes an encoder timestamp (pass closed) when profiling copies is
    /// possible; returns whether it did.
    fn encoder_timestamp(&mut self) -> bool {
        self.end_pass();
        let Some(p) = self.profiler.as_mut().filter(|p| p.inside_encoders) else {
            return false;
        };
        let (set, i) = p.next_slot(&self.ctx);
        self.encoder.get().write_timestamp(set, i);
        true
    }

    /// Records `f` (copies or clears) between two encoder timestamps named `what`.
    /// Copies `dst.byte_size()` bytes of the host's `src` from `offset`
    /// into `dst` (nothing on a null device).
    pub(crate) fn copy_from_buffer(
        &mut self,
        src: &wgpu::Buffer,
        offset: u64,
        dst: &Tensor,
    ) -> Result<()> {
        if self.ctx.is_null() {
            return Ok(());
        }
        let (buffer, at, bytes) = (dst.buffer()?.clone(), dst.block().offset, dst.byte_size());
        self.timed_transfer("copy::latents", |e| {
            e.copy_buffer_to_buffer(src, offset, &buffer, at, bytes)
        });
        Ok(())
    }

    pub(crate) fn timed_transfer(&mut self, what: &str, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let timed = self.encoder_timestamp();
        f(self.encoder.get());
        if timed && self.encoder_timestamp() {
            if let Some(p) = self.profiler.as_mut() {
                p.span(what.to_string(), 0);
            }
        }
    }

    fn push_uniform(&mut self, bytes: &[u8]) -> Result<(usize, u32)> {
        let align = self.ctx.caps().min_uniform_buffer_offset_alignment as u64;
        let need = round_up(bytes.len() as u64, align);
        let fits = self
            .uniforms
            .last()
            .is_some_and(|c| round_up(c.data.len() as u64, align) + need <= UNIFORM_CHUNK);
        if !fits {
            let ctx = self.ctx.clone();
            let buffer = ctx.scoped("allocating a uniform buffer", || {
                Ok(ctx.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgvae uniforms"),
                    size: UNIFORM_CHUNK,
                    usage: wgpu::BufferUsages::UNIFORM,
                    mapped_at_creation: true,
                }))
            })?;
            self.uniforms.push(UniformChunk {
                buffer,
                data: Vec::new(),
            });
        }
        let i = self.uniforms.len() - 1;
        let chunk = &mut self.uniforms[i];
        let offset = round_up(chunk.data.len() as u64, align) as usize;
        chunk.data.resize(offset, 0);
        chunk.data.extend_from_slice(bytes);
        Ok((i, offset as u32))
    }

    /// Records one dispatch of `spec` specialised by `key`.
    ///
    /// `tensors` bind at 1, 2, … in the order of `spec.bindings`.
    pub fn dispatch<P: Pod>(
        &mut self,
        spec: &KernelSpec,
        key: &PipelineKey,
        params: &P,
        tensors: &[&Tensor],
        groups: [u32; 3],
        macs: u64,
    ) -> Result<()> {
        let bindings: Vec<Binding> = tensors.iter().map(|t| Binding::Tensor(t)).collect();
        self.dispatch_bindings(spec, key, params, &bindings, groups, macs)
    }

    /// [`Recorder::dispatch`] for kernels that also bind textures: `bindings`
    /// bind at 1, 2, … and must match `spec.bindings` kind by kind.
    pub fn dispatch_bindings<P: Pod>(
        &mut self,
        spec: &KernelSpec,
        key: &PipelineKey,
        params: &P,
        bindings: &[Binding],
        groups: [u32; 3],
        macs: u64,
    ) -> Result<()> {
        debug_assert_eq!(
            std::mem::size_of::<P>() as u64,
            spec.uniform_size,
            "{}: uniform struct size differs from its KernelSpec",
            spec.family
        );
        if bindings.len() != spec.bindings.len() {
            return Err(Error::Unsupported(format!(
                "{}::{} takes {} bindings, got {}",
                spec.family,
                spec.entry,
                spec.bindings.len(),
                bindings.len()
            )));
        }
        let caps = self.ctx.caps();
        for (i, (b, kind)) in bindings.iter().zip(spec.bindings).enumerate() {
            match (b, kind) {
                (Binding::Tensor(t), BindingKind::Read | BindingKind::ReadWrite) => {
                    if t.byte_size() > caps.max_storage_buffer_binding_size {
                        return Err(Error::BindingTooLarge {
                            what: format!("a {:?} tensor in {}", t.shape(), spec.family),
                            bytes: t.byte_size(),
                            limit: caps.max_storage_buffer_binding_size,
                        });
                    }
                }
                (Binding::Texture(_), BindingKind::WriteTexture(_)) => {}
                _ => {
                    return Err(Error::Unsupported(format!(
                        "{}::{}: binding {} is {kind:?}, got {b:?}",
                        spec.family,
                        spec.entry,
                        i + 1
                    )))
                }
            }
        }
        if let Some(&g) = groups
            .iter()
            .find(|&&g| g > caps.max_compute_workgroups_per_dimension)
        {
            return Err(Error::DispatchTooLarge {
                what: format!("{}::{}", spec.family, spec.entry),
                groups: g as u64,
                limit: caps.max_compute_workgroups_per_dimension,
            });
        }
        if groups.contains(&0) {
            return Ok(());
        }
        if self.ctx.is_null() {
            if self.noted.as_ref() != Some(key) {
                self.ctx.pipelines().note_requested(key);
                self.noted = Some(key.clone());
            }
            self.labels.push(DispatchLabel {
                family: spec.family,
                entry: spec.entry,
                macs,
            });
            return Ok(());
        }
        let pipeline = self.ctx.pipelines().get(self.ctx.device(), spec, key)?;
        let (chunk, offset) = self.push_uniform(bytemuck::bytes_of(params))?;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.uniforms[chunk].buffer,
                offset: 0,
                size: wgpu::BufferSize::new(spec.uniform_size),
            }),
        }];
        for (i, b) in bindings.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: match b {
                    Binding::Tensor(t) => wgpu::BindingResource::Buffer(t.binding()?),
                    Binding::Texture(view) => wgpu::BindingResource::TextureView(view),
                },
            });
        }
        // Bad bindings (offsets, sizes, usages) surface here as an Error.
        let during = format!("binding the operands of {}::{}", spec.family, spec.entry);
        let bind_group = self.ctx.scoped(&during, || {
            Ok(self
                .ctx
                .device()
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(spec.family),
                    layout: &pipeline.layout,
                    entries: &entries,
                }))
        })?;
        if self.pass.is_none() {
            let pass = self
                .encoder
                .get()
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("wgvae"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        #[allow(clippy::expect_used)] // opened just above when there was none
        let pass = self.pass.as_mut().expect("pass just opened");
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[offset]);
        if let Some(p) = self.profiler.as_mut() {
            let (set, i) = p.next_slot(&self.ctx);
            pass.write_timestamp(set, i);
        }
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if let Some(p) = self.profiler.as_mut() {
            let (set, i) = p.next_slot(&self.ctx);
            pass.write_timestamp(set, i);
            p.span(format!("{}::{}", spec.family, spec.entry), macs);
        }
        self.labels.push(DispatchLabel {
            family: spec.family,
            entry: spec.entry,
            macs,
        });
        Ok(())
    }

    /// Allocates a zeroed overflow counter: from now on, convolutions with f16
    /// outputs count the values they store outside f16's finite range (and
    /// NaNs) into it. Read it with [`read_range_flag`] after the submit.
    pub fn track_f16_range(&mut self) -> Result<Tensor> {
        let t = Tensor::empty(
            &self.ctx,
            &[1],
            crate::gpu::tensor::DType::F32,
            "f16 range counter",
        )?;
        self.zero(&t, "clear::f16_counter")?;
        self.range_flag = Some(t.clone());
        Ok(t)
    }

    /// Zeroes `t` inside the command stream (no host buffer or staging copy).
    pub(crate) fn zero(&mut self, t: &Tensor, label: &'static str) -> Result<()> {
        if self.ctx.is_null() {
            return Ok(());
        }
        let size = round_up(t.byte_size(), 4);
        if size > t.block().size {
            return Err(Error::shape("zero", format!("{size} bytes of {t:?}")));
        }
        let (buffer, offset) = (t.buffer()?.clone(), t.block().offset);
        self.timed_transfer(label, |e| e.clear_buffer(&buffer, offset, Some(size)));
        Ok(())
    }

    /// Counts into an existing counter (one per decode across several recorders).
    pub fn set_range_flag(&mut self, t: Tensor) {
        self.range_flag = Some(t);
    }

    /// The f16 overflow counter, when one is tracked (see [`Recorder::track_f16_range`]).
    pub fn range_flag(&self) -> Option<&Tensor> {
        self.range_flag.as_ref()
    }

    /// Uploads `bytes` into `t` inside the command stream (ordered with the
    /// recorded kernels, unlike `queue.write_buffer`, which lands before the
    /// whole submission — wrong for a block a pool reuses mid-forward).
    pub fn upload(&mut self, t: &Tensor, bytes: &[u8]) -> Result<()> {
        self.upload_at(t, 0, bytes)
    }

    /// [`Recorder::upload`] of `bytes` at byte `at` (a multiple of 4) of `t`:
    /// large uploads go in pieces, each with a staging buffer of its own.
    pub fn upload_at(&mut self, t: &Tensor, at: u64, bytes: &[u8]) -> Result<()> {
        if self.ctx.is_null() {
            return Ok(());
        }
        let len = round_up(bytes.len() as u64, 4);
        if !at.is_multiple_of(4) || at + len > t.block().size {
            return Err(Error::shape(
                "upload",
                format!("{} bytes into {t:?}", bytes.len()),
            ));
        }
        let ctx = self.ctx.clone();
        let staging = ctx.scoped("allocating an upload staging buffer", || {
            Ok(ctx.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgvae upload"),
                size: len.max(4),
                usage: wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            }))
        })?;
        // Straight into the mapped staging memory (no padded host copy first).
        {
            let mut view =
                staging
                    .slice(..)
                    .get_mapped_range_mut()
                    .map_err(|e| Error::Validation {
                        during: format!("mapping the upload staging buffer for {t:?}"),
                        message: e.to_string(),
                    })?;
            let pad = view.len() - bytes.len(); // 0..=4 bytes
            view.slice(..bytes.len()).copy_from_slice(bytes);
            view.slice(bytes.len()..).copy_from_slice(&[0u8; 4][..pad]);
        }
        staging.unmap();
        let (dst, off) = (t.buffer()?.clone(), t.block().offset + at);
        self.timed_transfer("copy::upload", |e| {
            e.copy_buffer_to_buffer(&staging, 0, &dst, off, len)
        });
        Ok(())
    }

    /// Copies `src` into `dst` (same byte size).
    pub fn copy(&mut self, src: &Tensor, dst: &Tensor) -> Result<()> {
        if src.byte_size() != dst.byte_size() {
            return Err(Error::shape(
                "copy",
                format!("{:?} into {:?}", src.shape(), dst.shape()),
            ));
        }
        if self.ctx.is_null() {
            return Ok(());
        }
        let n = src.byte_size();
        let (so, dof) = (src.block().offset, dst.block().offset);
        let (sb, db) = (src.buffer()?.clone(), dst.buffer()?.clone());
        self.timed_transfer("copy::buffer_to_buffer", |e| {
            e.copy_buffer_to_buffer(&sb, so, &db, dof, n)
        });
        Ok(())
    }

    /// Closes the pass and makes the uniform data visible. The encoder's
    /// commands are complete afterwards; the host may submit it.
    pub fn finish(mut self) -> Vec<DispatchLabel> {
        self.close();
        std::mem::take(&mut self.labels)
    }

    /// [`Recorder::finish`] that also records the resolve of the timestamps
    /// into the host's encoder; read the returned profiler
    /// ([`crate::gpu::Profiler::read`]) after that encoder's submission.
    pub fn finish_profiled(mut self) -> (Vec<DispatchLabel>, Option<crate::gpu::Profiler>) {
        let mut profiler = self.profiler.take();
        if let Some(p) = profiler.as_mut() {
            self.end_pass();
            let ctx = self.ctx.clone();
            p.resolve(&ctx, self.encoder.get());
        }
        (self.finish(), profiler)
    }

    fn close(&mut self) {
        self.end_pass();
        for c in self.uniforms.drain(..) {
            if !c.data.is_empty() {
                // Mapped at creation and never unmapped before: cannot fail.
                if let Ok(mut view) = c.buffer.slice(..c.data.len() as u64).get_mapped_range_mut() {
                    view.copy_from_slice(&c.data);
                }
            }
            c.buffer.unmap();
        }
    }

    /// Submits like [`Recorder::submit`], then waits and returns the
    /// per-kernel GPU times (`None` without timestamp support).
    pub fn submit_profiled(mut self) -> Result<(Vec<DispatchLabel>, Option<crate::gpu::Profile>)> {
        let profiler = self.profiler.take();
        let mut profiler = profiler;
        if let Some(p) = profiler.as_mut() {
            self.end_pass();
            let ctx = self.ctx.clone();
            p.resolve(&ctx, self.encoder.get());
        }
        let ctx = self.ctx.clone();
        let labels = self.submit()?;
        let profile = match profiler {
            Some(p) => Some(p.read(&ctx)?),
            None => None,
        };
        Ok((labels, profile))
    }

    /// Finishes and submits an owned encoder, reporting validation errors.
    pub fn submit(mut self) -> Result<Vec<DispatchLabel>> {
        self.close();
        let labels = std::mem::take(&mut self.labels);
        let Recorder { ctx, encoder, .. } = self;
        let Encoder::Owned(encoder) = encoder else {
            return Err(Error::Unsupported(
                "submit() on a recorder that borrows the host's encoder; call finish() and let the host submit".into(),
            ));
        };
        if ctx.is_null() {
            return Ok(labels);
        }
        ctx.scoped("submitting decode commands", || {
            ctx.queue().submit([encoder.finish()]);
            Ok(())
        })?;
        Ok(labels)
    }
}

/// Splits `total` workgroups over x and y so neither exceeds the device limit.
/// Shaders recover the linear index as `wg.x + wg.y * num_workgroups.x`.
pub fn linear_groups(ctx: &Context, total: u64) -> Result<[u32; 3]> {
    let max = ctx.caps().max_compute_workgroups_per_dimension as u64;
    if total <= max {
        return Ok([total as u32, 1, 1]);
    }
    let y = total.div_ceil(max);
    if y > max {
        return Err(Error::DispatchTooLarge {
            what: "a 1-D dispatch".into(),
            groups: total,
            limit: max as u32,
        });
    }
    Ok([total.div_ceil(y) as u32, y as u32, 1])
}

/// The value of an overflow counter from [`Recorder::track_f16_range`]
/// (blocking; 0 in dry runs).
pub fn read_range_flag(ctx: &Context, t: &Tensor) -> Result<u32> {
    if ctx.is_null() {
        return Ok(0);
    }
    let bytes = read_back(ctx, &[t])?.pop().unwrap_or_default();
    Ok(range_count(&bytes))
}

/// The count in an overflow counter's read-back bytes (to read it in the
/// same [`read_back`] as a decode's outputs).
pub fn range_count(bytes: &[u8]) -> u32 {
    bytes
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads tensors back to the host (one submit, one wait).
pub fn read_back(ctx: &Context, tensors: &[&Tensor]) -> Result<Vec<Vec<u8>>> {
    if ctx.is_null() {
        // Nothing ran: zeros of the right sizes (calloc'ed, so untouched
        // pages cost no host memory).
        return Ok(tensors
            .iter()
            .map(|t| vec![0; t.byte_size() as usize])
            .collect());
    }
    let sizes: Vec<u64> = tensors.iter().map(|t| t.byte_size()).collect();
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut total = 0u64;
    for s in &sizes {
        offsets.push(total);
        total += round_up(*s, 256);
    }
    let staging = ctx.scoped("allocating a readback buffer", || {
        Ok(ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgvae readback"),
            size: total.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    })?;
    let mut encoder = ctx
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("readback"),
        });
    for (t, off) in tensors.iter().zip(&offsets) {
        encoder.copy_buffer_to_buffer(t.buffer()?, t.block().offset, &staging, *off, t.byte_size());
    }
    ctx.scoped("reading back", || {
        ctx.queue().submit([encoder.finish()]);
        Ok(())
    })?;
    ctx.read_mapped(&staging, |data| {
        tensors
            .iter()
            .zip(&offsets)
            .map(|(t, off)| data[*off as usize..(*off + t.byte_size()) as usize].to_vec())
            .collect()
    })
}
