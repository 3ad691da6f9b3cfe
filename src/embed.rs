//! Embedding wgvae in a wgpu application: decode on the host's own device,
//! into the host's own texture, with no round trip through the CPU.
//!
//! # Setting up the device
//!
//! wgvae needs no wgpu feature ([`required_features`] is empty) and modest
//! limits ([`required_limits`]); merge them into the descriptor you create
//! your device with, e.g.
//! `my_limits.or_better_values_from(&wgvae::required_limits())`. Request the
//! adapter's [`optional_features`] when you can: the engine consults the
//! device's features and simply does without those it lacks (see
//! [`Engine`]'s "Features" section). [`recommended_limits`] raises the
//! size-related limits to what the adapter allows, which large images need.
//!
//! # Decoding
//!
//! An [`Engine`] takes the device and queue (by value: `wgpu::Device` and
//! `wgpu::Queue` are cheap reference-counted handles in wgpu 30, so pass
//! `device.clone()`), loads one VAE, and then
//! - [`Engine::decode_to_image`] returns an [`image::RgbaImage`] (the simple
//!   path: one submit, one read back), or
//! - [`Engine::record_decode_to_texture`] records the whole decode into *your*
//!   `wgpu::CommandEncoder`, writing *your* `wgpu::Texture`. Nothing is
//!   submitted and nothing is read back: you submit when you want, and keep
//!   the returned [`PendingDecode`] until you have.
//!
//! Latents come from host memory ([`HostTensor`]) or from one of your
//! buffers ([`DeviceLatents`], e.g. written by your own diffusion model).
//!
//! Streamed video decodes record into your encoder too:
//! [`crate::VideoDecoder::record_chunk_to_textures`] writes each frame of a
//! chunk into one of your textures (same formats and values as here) and
//! returns a [`crate::PendingFrames`] to keep until you submit.
//!
//! # Thread safety
//!
//! [`Engine`] and [`PendingDecode`] are `Send + Sync` (checked at compile
//! time). An engine serialises its own decodes (one lock around recording);
//! separate engines are independent: each has its own pipeline cache, memory
//! pool and memory plans, so several engines may share one device, each with
//! its own VAE. No device state is global. Process-wide are only (a) id
//! counters (models, pools) and (b) an interned cache of generated WGSL
//! sources for the tiled convolution: text, a pure function of (tile shape,
//! kernel size, stride), written once per distinct key and never freed — a
//! few KiB per key. Decoders use a handful of keys (the tile shapes they
//! pick × 1×1/3×3 × stride 1/2); only callers of the kernel API with custom
//! `ConvTiles` add more. It holds no device objects and cannot make one
//! engine's results depend on another's.

use parking_lot::Mutex;

use crate::decode::{decode_replay, device_decode_replay, DecodeOptions};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context, CooperativeMatrix, Recorder};
use crate::io::HostTensor;
use crate::kernels::image::{
    storage_texture, to_rgba8, to_texture, ImageRange, STORAGE_TEXTURE_FORMATS,
};
use crate::memory::Policy;
use crate::models::{layers::dims4, ImageDecoder, LoadOptions, Vae};
use crate::run::input::{record_decoder, record_decoder_from_buffer};
use crate::run::{precision, run_untiled, Replay};
use crate::tensor::{DType, Tensor};

pub use crate::decode::DeviceLatents;
pub use crate::gpu::requirements::{
    check_device, cooperative_matrix_features, optional_features, recommended_limits,
    required_features, required_limits,
};

/// Options of an [`Engine`].
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// Memory policy of the engine's pool (default: `Planned`, lowest peak).
    pub policy: Policy,
    /// Latents passed to the engine are decoder input already: skip the
    /// pipeline unscaling `latents / scaling_factor + shift_factor`.
    pub raw_latents: bool,
    /// Cooperative matrices (tensor cores) with [`Engine::with_adapter`]: automatic, on
    /// (an error where unusable) or off. Engines made without the adapter take the scalar
    /// path.
    pub cooperative_matrix: CooperativeMatrix,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            policy: Policy::Planned,
            raw_latents: false,
            cooperative_matrix: CooperativeMatrix::Auto,
        }
    }
}

/// Latents for a decode: in host memory or in a host buffer on the device.
#[derive(Clone, Copy, Debug)]
pub enum Latents<'a> {
    /// Pipeline latents `[N, C, h, w]` (or `[C, h, w]`), f32, in host memory.
    /// Checked for shape and finite values before anything is recorded.
    Host(&'a HostTensor),
    /// f32 latents in a host buffer with `COPY_SRC` usage. Copied inside the
    /// command stream, so they only have to be written by work submitted (or
    /// recorded into the same encoder) before the decode. Not checked for
    /// finite values (that would need a read back).
    Device(DeviceLatents<'a>),
}

impl<'a> From<&'a HostTensor> for Latents<'a> {
    fn from(t: &'a HostTensor) -> Self {
        Latents::Host(t)
    }
}

impl<'a> From<DeviceLatents<'a>> for Latents<'a> {
    fn from(d: DeviceLatents<'a>) -> Self {
        Latents::Device(d)
    }
}

/// Latents checked and (for host latents) unscaled, ready to record.
enum Prepared<'a> {
    Host(HostTensor),
    /// Device latents and the decoder's input shape.
    Device(&'a DeviceLatents<'a>, [usize; 4]),
}

impl Prepared<'_> {
    /// The memory plan of an untiled decode of these latents with `vae`.
    fn replay<'c>(
        &self,
        ctx: &'c Context,
        vae: &ImageDecoder,
        raw_latents: bool,
    ) -> Result<Replay<'c>> {
        match self {
            Prepared::Host(z) => decode_replay(ctx, vae, &z.shape),
            Prepared::Device(d, _) => device_decode_replay(ctx, vae, d.shape, raw_latents),
        }
    }

    /// The decoder's input shape.
    fn shape(&self) -> [usize; 4] {
        match self {
            Prepared::Host(z) => [z.shape[0], z.shape[1], z.shape[2], z.shape[3]],
            Prepared::Device(_, z) => *z,
        }
    }
}

/// A decode recorded into the host's encoder by
/// [`Engine::record_decode_to_texture`].
///
/// **Keep it until you have submitted that encoder, then drop it.** It owns
/// the decode's output memory (from the engine's pool) and, for formats
/// written through an intermediate, that intermediate texture: while it
/// lives the engine's pool counts them as in use and does not hand them out
/// again. (wgpu itself keeps every resource an unsubmitted encoder uses alive,
/// so dropping it early is memory-safe; it only stops the accounting.)
///
/// With the default planned memory policy, a decode of a *different* latent
/// shape cannot be recorded while a `PendingDecode` is alive (its memory
/// plan would overlap the live one): that call returns
/// [`Error::Unsupported`]. Decodes of the same shape can be recorded back to
/// back, even into one encoder: they run in queue order.
#[must_use = "keep the PendingDecode until the encoder is submitted"]
#[derive(Debug)]
pub struct PendingDecode {
    _output: Tensor,
    _intermediates: Vec<wgpu::Texture>,
    width: u32,
    height: u32,
    dispatches: usize,
    /// f16 models: a 4-byte `MAP_READ` copy of the decode's overflow
    /// counter, written at the end of the recorded commands.
    overflows: Option<wgpu::Buffer>,
    ctx: Context,
}

impl PendingDecode {
    /// Width of the decoded image in pixels (texels written: `0..width`).
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height of the decoded image in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Compute dispatches recorded.
    pub fn dispatches(&self) -> usize {
        self.dispatches
    }

    /// How many values the decode's f16 convolutions stored beyond ±65504
    /// (or as NaN): then the texture holds a saturated, wrong image. Always
    /// 0 for f32 and bf16 models (nothing is tracked).
    ///
    /// **Call it only after submitting the encoder** the decode was recorded
    /// into: it maps a 4-byte buffer and blocks until the device is idle
    /// (`device.poll`). To read it without blocking, map
    /// [`PendingDecode::f16_overflow_buffer`] yourself.
    ///
    /// On a non-zero count, call [`Engine::fall_back_to_bf16`] and record the
    /// decode again ([`Engine::decode_to_images`] does this by itself).
    pub fn read_f16_overflows(&self) -> Result<u64> {
        let Some(buffer) = &self.overflows else {
            return Ok(0);
        };
        let count = self.ctx.read_mapped(buffer, crate::gpu::range_count)?;
        Ok(count as u64)
    }

    /// The 4-byte `MAP_READ` buffer the f16 overflow counter (a little-endian
    /// `u32`) is copied into at the end of the recorded decode, for hosts that
    /// map it asynchronously; `None` when the model is not f16 (then nothing
    /// can overflow). Unmap it before calling [`PendingDecode::read_f16_overflows`].
    pub fn f16_overflow_buffer(&self) -> Option<&wgpu::Buffer> {
        self.overflows.as_ref()
    }
}

/// A VAE decoder on a host application's device.
///
/// Created from the host's `wgpu::Device` and `wgpu::Queue` (taken by value:
/// both are reference-counted handles, pass clones). The engine checks the
/// device against [`required_features`] / [`required_limits`], loads one VAE
/// and keeps its weights, a pipeline cache and a memory pool of its own. It
/// never installs an error handler on, polls, or otherwise reconfigures the
/// device, except that [`Engine::decode_to_image`] submits to the queue and
/// waits for the device, and [`PendingDecode::read_f16_overflows`] waits
/// for it.
///
/// # f16 overflow
///
/// f16 models count the values their convolutions cannot hold (beyond
/// ±65504). [`Engine::decode_to_images`] reads the count with the pixels
/// and decodes again in bf16 when it is not zero; a decode recorded into
/// your encoder carries it in its [`PendingDecode`]
/// ([`PendingDecode::read_f16_overflows`]), and
/// [`Engine::fall_back_to_bf16`] switches the engine to bf16.
///
/// # Features
///
/// The engine uses what the device was created with: without `SHADER_F16`
/// it never compiles a kernel using WGSL's `f16` type, and an f16 model
/// (`LoadOptions::precision`) stores its f16 weights and activations as
/// packed pairs in `u32` words instead (`unpack2x16float` / `pack2x16float`:
/// the same values and memory, some conversion cost); without timestamp
/// queries it does not profile. A device created with
/// `wgpu::Features::empty()` and [`required_limits`] decodes correctly.
///
/// # Threads
///
/// `Send + Sync`. Calls on one engine are serialised by an internal lock
/// (the memory pool replays one plan at a time); use one engine per thread
/// for parallel recording.
pub struct Engine {
    ctx: Context,
    vae: Vae,
    options: EngineOptions,
    /// Set by [`Engine::fall_back_to_bf16`]: decode with the bf16 twin.
    bf16: std::sync::atomic::AtomicBool,
    /// Held while recording: the pool's planned replay is per pool.
    recording: Mutex<()>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("ctx", &self.ctx)
            .field("vae", &self.vae.name())
            .field("options", &self.options)
            .finish()
    }
}

/// Compile-time proof of the thread-safety the docs promise.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Engine>();
    send_sync::<PendingDecode>();
    send_sync::<Latents<'static>>();
};

impl Engine {
    /// Loads the VAE `vae` (a diffusers folder, a `.safetensors` file in
    /// diffusers, LDM or TAE layout, or `preset:NAME`; see [`Vae::load`]) onto
    /// the host's device, with default [`EngineOptions`].
    pub fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        vae: &str,
        load: &LoadOptions,
    ) -> Result<Engine> {
        Self::with_options(device, queue, vae, load, EngineOptions::default())
    }

    /// [`Engine::new`] with options.
    pub fn with_options(
        device: wgpu::Device,
        queue: wgpu::Queue,
        vae: &str,
        load: &LoadOptions,
        options: EngineOptions,
    ) -> Result<Engine> {
        Self::build(device, queue, &[], None, vae, load, options)
    }

    /// [`Engine::with_options`] for a device of `adapter`, whose cooperative-matrix
    /// configurations the engine may use (see [`cooperative_matrix_features`] for the device
    /// request and [`EngineOptions::cooperative_matrix`]) and whose device-local memory sets
    /// the default memory budget (see [`crate::tiling::default_max_memory`]).
    pub fn with_adapter(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        vae: &str,
        load: &LoadOptions,
        options: EngineOptions,
    ) -> Result<Engine> {
        let configs = adapter.cooperative_matrix_properties();
        let memory = crate::gpu::device_memory::of_adapter(adapter);
        Self::build(device, queue, &configs, memory, vae, load, options)
    }

    fn build(
        device: wgpu::Device,
        queue: wgpu::Queue,
        matrix_configs: &[wgpu::CooperativeMatrixProperties],
        memory: Option<crate::gpu::device_memory::DeviceMemory>,
        vae: &str,
        load: &LoadOptions,
        options: EngineOptions,
    ) -> Result<Engine> {
        check_device(&device)?;
        let ctx = Context::from_host_device(device, queue, options.policy.new_pool())
            .with_matrices(matrix_configs, options.cooperative_matrix)?
            .with_device_memory(memory);
        // Weights go up with queue writes, which wgpu executes before the
        // next submission on this queue, whoever submits it.
        let vae = Vae::load_image_decoder(&ctx, vae, load)?;
        Ok(Engine {
            ctx,
            vae,
            options,
            bf16: Default::default(),
            recording: Mutex::new(()),
        })
    }

    /// The loaded VAE (name, latent channels, scaling).
    pub fn vae(&self) -> &Vae {
        &self.vae
    }

    /// The loaded image decoder (`Vae::load_image_decoder` loaded no other kind).
    fn decoder(&self) -> Result<&ImageDecoder> {
        self.vae.image_decoder("an Engine")
    }

    /// What the engine knows of the device (limits and features it uses).
    pub fn caps(&self) -> &Capabilities {
        self.ctx.caps()
    }

    /// The engine's options.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Latent channels the VAE expects.
    pub fn latent_channels(&self) -> usize {
        self.vae.latent_channels()
    }

    /// `(width, height)` in pixels of the image decoded from latents of
    /// `latent_shape` (`[N, C, h, w]` or `[C, h, w]`).
    pub fn image_size(&self, latent_shape: &[usize]) -> Result<(u32, u32)> {
        let (h, w) = match *latent_shape {
            [_, h, w] | [_, _, h, w] => (h, w),
            _ => {
                return Err(Error::InvalidInput(format!(
                    "latent shape {latent_shape:?}: expected [N, C, h, w] or [C, h, w]"
                )))
            }
        };
        let up = self.vae.upscale();
        let size = |v: usize| {
            u32::try_from(v * up).map_err(|_| {
                Error::InvalidInput(format!("latent shape {latent_shape:?} is too large"))
            })
        };
        Ok((size(w)?, size(h)?))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        // parking_lot does not poison: a panic while recording leaves
        // nothing half-done in the engine itself.
        self.recording.lock()
    }

    fn prepare<'a>(&self, latents: &'a Latents<'a>) -> Result<Prepared<'a>> {
        match latents {
            Latents::Host(t) => {
                let z = self.vae.decoder_input(t, self.options.raw_latents, None)?;
                Ok(Prepared::Host(z))
            }
            Latents::Device(d) => {
                let z = d.image_decoder_shape(self.decoder()?, self.options.raw_latents)?;
                Ok(Prepared::Device(d, z))
            }
        }
    }

    fn record_raw(
        &self,
        rec: &mut Recorder,
        vae: &ImageDecoder,
        latents: &Prepared,
    ) -> Result<Tensor> {
        match latents {
            Prepared::Host(z) => record_decoder(rec, vae, z),
            // Host latents were unscaled on the host; device latents on the GPU.
            Prepared::Device(d, _) => record_decoder_from_buffer(
                rec,
                vae,
                d.shape,
                Some((d.buffer, d.offset)),
                self.options.raw_latents,
            ),
        }
    }

    /// The model decodes run with: the loaded one, or its bf16 twin after
    /// [`Engine::fall_back_to_bf16`].
    fn active_vae(&self) -> Result<&ImageDecoder> {
        if self.bf16.load(std::sync::atomic::Ordering::Acquire) {
            self.decoder()?.bf16_twin(&self.ctx)
        } else {
            self.decoder()
        }
    }

    /// Storage dtype decodes run in now: the loaded model's, or bf16 after
    /// [`Engine::fall_back_to_bf16`].
    pub fn dtype(&self) -> DType {
        if self.bf16.load(std::sync::atomic::Ordering::Acquire) {
            DType::BF16
        } else {
            self.vae.dtype()
        }
    }

    /// Decodes from now on with a bf16 copy of the model (loaded once from the
    /// same file or preset): what to do when
    /// [`PendingDecode::read_f16_overflows`] reports an f16 overflow. bf16 has
    /// f32's range, at 8 mantissa bits. Fails for models built in memory
    /// (nothing to reload).
    pub fn fall_back_to_bf16(&self) -> Result<()> {
        let _guard = self.lock();
        self.decoder()?.bf16_twin(&self.ctx)?;
        self.bf16.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Decodes one image (`N` = 1) and reads it back: submits to the queue
    /// and waits. Pixels are the decoder's sRGB-encoded output, as the CLI
    /// writes them (for RGB: `image::DynamicImage::from(img).into_rgb8()`).
    pub fn decode_to_image<'a>(&self, latents: impl Into<Latents<'a>>) -> Result<image::RgbaImage> {
        let mut images = self.decode_to_images(latents)?;
        if images.len() != 1 {
            return Err(Error::InvalidInput(format!(
                "decode_to_image decodes one image but the latents hold {}; use decode_to_images",
                images.len()
            )));
        }
        Ok(images.remove(0))
    }

    /// Decodes a batch `[N, C, h, w]` into `N` images (submits and waits).
    /// Host latents take exactly the path of [`crate::decode()`] (the CLI's).
    ///
    /// f16 models: an f16 overflow (counted by the kernels, read back with
    /// the pixels) makes it decode again in bf16, as [`crate::decode()`]
    /// does, with a warning in the log; the images returned are never the
    /// saturated ones.
    pub fn decode_to_images<'a>(
        &self,
        latents: impl Into<Latents<'a>>,
    ) -> Result<Vec<image::RgbaImage>> {
        let latents = latents.into();
        let _guard = self.lock();
        let vae = self.active_vae()?;
        let (rgba, width, height) = match latents {
            Latents::Host(t) => {
                let opts = DecodeOptions {
                    raw_latents: self.options.raw_latents,
                    ..Default::default()
                };
                let out = crate::decode::decode_image(&self.ctx, vae, t, &opts)?;
                (out.rgba, out.width, out.height)
            }
            Latents::Device(_) => {
                let prepared = self.prepare(&latents)?;
                let (rgba, w, h, overflows) = self.decode_device(vae, &prepared)?;
                let rgba = if overflows == 0 {
                    rgba
                } else {
                    let twin = vae.bf16_twin(&self.ctx)?;
                    let redo = || self.decode_device(twin, &prepared);
                    let ((rgba, ..), _) =
                        precision::redo_in_bf16(overflows, &vae.name, "re-decoded", redo)?;
                    rgba
                };
                // Host latents went through `decode`, which checks this.
                if !self.ctx.is_null() {
                    crate::decode::check_finite_pixels(&vae.name, vae.image_channels(), &rgba)?;
                }
                (rgba, w, h)
            }
        };
        rgba.into_iter()
            .map(|px| {
                image::RgbaImage::from_raw(width as u32, height as u32, px).ok_or_else(|| {
                    Error::Readback(format!("{width}×{height} image has the wrong byte count"))
                })
            })
            .collect()
    }

    /// One decode of device latents with `vae`, read back: (RGBA8 bytes per
    /// image, width, height, f16 overflow count), in one submit and one read.
    fn decode_device(
        &self,
        vae: &ImageDecoder,
        prepared: &Prepared,
    ) -> Result<(Vec<Vec<u8>>, usize, usize, u64)> {
        let replay = prepared.replay(&self.ctx, vae, self.options.raw_latents)?;
        let record = |rec: &mut Recorder| {
            let raw = self.record_raw(rec, vae, prepared)?;
            let [n, _, h, w] = dims4(&raw)?;
            let pixels = Tensor::empty(&self.ctx, &[n, h, w], DType::Rgba8, "rgba8 image")?;
            to_rgba8(rec, &raw, vae.output_range(), &pixels)?;
            Ok(pixels)
        };
        let run = run_untiled(&self.ctx, replay, false, record, |p| vec![p])?;
        let [n, h, w] = [run.out.shape()[0], run.out.shape()[1], run.out.shape()[2]];
        let rgba = run.bytes[0]
            .chunks_exact(h * w * 4)
            .take(n)
            .map(|c| c.to_vec())
            .collect();
        Ok((rgba, w, h, run.f16_overflows))
    }

    /// Records a decode of one image (`N` = 1) into the host's `encoder`,
    /// writing texels `(0..width, 0..height)` of mip level 0, array layer 0
    /// of `target` (see [`Engine::image_size`]; the texture may be larger).
    /// Nothing is submitted or read back; submit `encoder` when you like and
    /// keep the returned [`PendingDecode`] until then.
    ///
    /// `target` must be 2-D and single-sampled, in one of these formats:
    /// - `Rgba8Unorm` or `Rgba16Float` with `STORAGE_BINDING` usage: written
    ///   directly by a compute shader;
    /// - `Rgba8Unorm`, `Rgba8UnormSrgb` or `Rgba16Float` with `COPY_DST` usage
    ///   (and no `STORAGE_BINDING`): written through an intermediate
    ///   storage texture and `copy_texture_to_texture`. `*Srgb` formats can
    ///   never be storage textures, so they always take this path.
    ///
    /// Values: `Rgba8*` texels hold exactly the bytes of the CLI's PNG.
    /// Those bytes are sRGB-encoded (VAEs are trained on sRGB images), which
    /// is what an `Rgba8UnormSrgb` texture stores: the copy moves bytes
    /// unchanged, and sampling it yields linear light as a renderer expects;
    /// sampling an `Rgba8Unorm` target yields the encoded values themselves.
    /// `Rgba16Float` texels hold the clamped values in [0, 1] before 8-bit
    /// quantisation, also sRGB-encoded (apply the sRGB transfer function in
    /// your shader if you need linear light). Alpha is 1.
    ///
    /// Everything is validated before the first command is recorded. An
    /// error after that (device out of memory) may leave a partial decode
    /// in `encoder`: discard it.
    pub fn record_decode_to_texture<'a>(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        latents: impl Into<Latents<'a>>,
        target: &wgpu::Texture,
    ) -> Result<PendingDecode> {
        let latents = latents.into();
        let prepared = self.prepare(&latents)?;
        let shape = prepared.shape();
        if shape[0] != 1 {
            return Err(Error::InvalidInput(format!(
                "record_decode_to_texture decodes one image (N = 1), got latents {shape:?}; record one decode per texture"
            )));
        }
        let (width, height) = self.image_size(&shape)?;
        let route = texture_route(target, width, height)?;
        let _guard = self.lock();
        let mut intermediates = Intermediates::new("wgvae intermediate image");
        let vae = self.active_vae()?;
        let mut rec = Recorder::with_encoder(&self.ctx, encoder);
        let replay = prepared.replay(&self.ctx, vae, self.options.raw_latents)?;
        let output = self.record_raw(&mut rec, vae, &prepared).and_then(|raw| {
            let range = vae.output_range();
            intermediates.write(&mut rec, &raw, range, target, route, (width, height))?;
            Ok(raw)
        });
        drop(replay);
        let output = output?;
        // The counter's pool memory is reused by the next decode of this
        // shape (even one recorded into the same encoder): keep a copy.
        let overflows = match rec.range_flag().cloned() {
            Some(counter) => {
                let copy = self.ctx.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgvae f16 overflow count"),
                    size: 4,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                rec.encoder().copy_buffer_to_buffer(
                    counter.buffer()?,
                    counter.block().offset,
                    &copy,
                    0,
                    4,
                );
                Some(copy)
            }
            None => None,
        };
        let dispatches = rec.finish().len();
        Ok(PendingDecode {
            _output: output,
            _intermediates: intermediates.into_textures(),
            width,
            height,
            dispatches,
            overflows,
            ctx: self.ctx.clone(),
        })
    }
}

/// The intermediate storage textures (one per format) that images go
/// through into host textures the image kernel cannot write (see
/// [`texture_route`]); kept until the host's encoder is submitted.
pub(crate) struct Intermediates {
    label: &'static str,
    textures: Vec<wgpu::Texture>,
}

impl Intermediates {
    /// None yet; `label` names those made.
    pub(crate) fn new(label: &'static str) -> Self {
        Intermediates {
            label,
            textures: Vec::new(),
        }
    }

    /// Records the `width × height` image `x` (`[1, C, H, W]`) into `target`
    /// by its `route`: directly, or into the intermediate of that format
    /// (made on first use) copied into `target`.
    pub(crate) fn write(
        &mut self,
        rec: &mut Recorder,
        x: &Tensor,
        range: ImageRange,
        target: &wgpu::Texture,
        route: Option<wgpu::TextureFormat>,
        (width, height): (u32, u32),
    ) -> Result<()> {
        let through = match route {
            None => None,
            Some(format) => {
                let found = self.textures.iter().position(|t| t.format() == format);
                let at = match found {
                    Some(at) => at,
                    None => {
                        let device = rec.ctx().device();
                        let texture = storage_texture(device, self.label, width, height, format);
                        self.textures.push(texture);
                        self.textures.len() - 1
                    }
                };
                self.textures.get(at)
            }
        };
        to_texture(rec, x, range, through.unwrap_or(target))?;
        if let Some(src) = through {
            rec.encoder().copy_texture_to_texture(
                src.as_image_copy(),
                target.as_image_copy(),
                wgpu::Extent3d {
                    width,
                    height,
                    depth_or_array_layers: 1,
                },
            );
        }
        Ok(())
    }

    /// The textures made, to keep until the encoder is submitted.
    pub(crate) fn into_textures(self) -> Vec<wgpu::Texture> {
        self.textures
    }
}

/// How to write `target`: `None` directly, `Some(format)` through an
/// intermediate storage texture of that format.
pub(crate) fn texture_route(
    target: &wgpu::Texture,
    width: u32,
    height: u32,
) -> Result<Option<wgpu::TextureFormat>> {
    use wgpu::{TextureFormat as F, TextureUsages as U};
    if target.dimension() != wgpu::TextureDimension::D2 || target.sample_count() != 1 {
        return Err(Error::Unsupported(format!(
            "the target texture must be 2-D and single-sampled (got {:?}, {} samples)",
            target.dimension(),
            target.sample_count()
        )));
    }
    if target.width() < width || target.height() < height {
        return Err(Error::InvalidInput(format!(
            "a {width}×{height} image does not fit the {}×{} target texture",
            target.width(),
            target.height()
        )));
    }
    let format = target.format();
    let usage = target.usage();
    let storage = format.remove_srgb_suffix();
    if !matches!(format, F::Rgba8Unorm | F::Rgba8UnormSrgb | F::Rgba16Float)
        || !STORAGE_TEXTURE_FORMATS.contains(&storage)
    {
        return Err(Error::Unsupported(format!(
            "decoding into a {format:?} texture; use Rgba8Unorm, Rgba8UnormSrgb or Rgba16Float (copy or render from it into other formats)"
        )));
    }
    if format == storage && usage.contains(U::STORAGE_BINDING) {
        return Ok(None);
    }
    if usage.contains(U::COPY_DST) {
        return Ok(Some(storage));
    }
    Err(Error::Unsupported(format!(
        "the {format:?} target texture needs {} usage (it has {usage:?})",
        if format == storage {
            "STORAGE_BINDING or COPY_DST"
        } else {
            "COPY_DST"
        }
    )))
}
