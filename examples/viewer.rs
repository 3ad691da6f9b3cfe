//! A winit window that owns its wgpu device, decodes a latent file with
//! wgvae straight into a texture it samples, and presents it. `R` or `Space`
//! decodes again; the title shows the last decode's time (wall time of
//! submit + wait). `Esc` quits.
//!
//! ```text
//! cargo run --release --example viewer -- LATENTS.npy --vae VAE
//! ```

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use winit::application::ApplicationHandler;
use winit::dpi::PhysicalSize;
use winit::event::{ElementState, KeyEvent, WindowEvent};
use winit::event_loop::{ActiveEventLoop, EventLoop};
use winit::keyboard::{Key, NamedKey};
use winit::window::{Window, WindowId};

/// Draws one full-window triangle sampling the decoded texture.
const BLIT: &str = r#"
@group(0) @binding(0) var image: texture_2d<f32>;
@group(0) @binding(1) var image_sampler: sampler;

struct VertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) uv: vec2<f32>,
};

@vertex
fn vs(@builtin(vertex_index) i: u32) -> VertexOut {
    let uv = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u));
    var out: VertexOut;
    out.position = vec4<f32>(uv * vec2<f32>(2.0, -2.0) + vec2<f32>(-1.0, 1.0), 0.0, 1.0);
    out.uv = uv;
    return out;
}

@fragment
fn fs(v: VertexOut) -> @location(0) vec4<f32> {
    return textureSample(image, image_sampler, v.uv);
}
"#;

struct Args {
    latents: String,
    vae: String,
}

struct Gfx {
    window: Arc<Window>,
    surface: wgpu::Surface<'static>,
    config: wgpu::SurfaceConfiguration,
    device: wgpu::Device,
    queue: wgpu::Queue,
    engine: wgvae::Engine,
    latents: wgvae::io::HostTensor,
    texture: wgpu::Texture,
    pipeline: wgpu::RenderPipeline,
    bind_group: wgpu::BindGroup,
    decode_ms: f64,
    /// Frames presented (the first is announced on stdout, for screenshots).
    presented: u64,
}

impl Gfx {
    fn new(window: Arc<Window>, args: &Args) -> Result<Gfx, Box<dyn Error>> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let surface = instance.create_surface(window.clone())?;
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            compatible_surface: Some(&surface),
            ..Default::default()
        }))?;
        // The application's device, with what wgvae needs merged in.
        let (device, queue) = pollster::block_on(
            adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("viewer"),
                required_features: wgvae::required_features()
                    | (adapter.features() & wgvae::optional_features()),
                required_limits: wgpu::Limits::default()
                    .or_better_values_from(&wgvae::recommended_limits(&adapter)),
                ..Default::default()
            }),
        )?;
        let engine = wgvae::Engine::new(
            device.clone(),
            queue.clone(),
            &args.vae,
            &wgvae::LoadOptions::default(),
        )?;
        let latents =
            wgvae::io::load_latents(args.latents.as_ref(), None, engine.latent_channels())?;
        let (width, height) = engine.image_size(&latents.shape)?;
        let _ = window.request_inner_size(PhysicalSize::new(width, height));

        let caps = surface.get_capabilities(&adapter);
        let format = caps
            .formats
            .iter()
            .copied()
            .find(|f| f.is_srgb())
            .unwrap_or(caps.formats[0]);
        let size = window.inner_size();
        let mut config = surface
            .get_default_config(&adapter, size.width.max(1), size.height.max(1))
            .ok_or("the surface is not supported by the adapter")?;
        config.format = format;
        config.present_mode = wgpu::PresentMode::AutoVsync;
        surface.configure(&device, &config);

        // The decoded pixels are sRGB-encoded. On an sRGB surface, sample
        // them from an Rgba8UnormSrgb texture (wgvae writes it through an
        // intermediate + copy); on a linear surface, pass them through an
        // Rgba8Unorm texture (wgvae writes it as a storage texture).
        let (image_format, usage) = if format.is_srgb() {
            (
                wgpu::TextureFormat::Rgba8UnormSrgb,
                wgpu::TextureUsages::COPY_DST,
            )
        } else {
            (
                wgpu::TextureFormat::Rgba8Unorm,
                wgpu::TextureUsages::STORAGE_BINDING,
            )
        };
        let texture = device.create_texture(&wgpu::TextureDescriptor {
            label: Some("decoded image"),
            size: wgpu::Extent3d {
                width,
                height,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: image_format,
            usage: usage | wgpu::TextureUsages::TEXTURE_BINDING,
            view_formats: &[],
        });
        let view = texture.create_view(&Default::default());
        let sampler = device.create_sampler(&wgpu::SamplerDescriptor {
            mag_filter: wgpu::FilterMode::Linear,
            min_filter: wgpu::FilterMode::Linear,
            ..Default::default()
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("blit"),
            source: wgpu::ShaderSource::Wgsl(BLIT.into()),
        });
        let pipeline = device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
            label: Some("blit"),
            layout: None,
            vertex: wgpu::VertexState {
                module: &module,
                entry_point: Some("vs"),
                compilation_options: Default::default(),
                buffers: &[],
            },
            fragment: Some(wgpu::FragmentState {
                module: &module,
                entry_point: Some("fs"),
                compilation_options: Default::default(),
                targets: &[Some(format.into())],
            }),
            primitive: Default::default(),
            depth_stencil: None,
            multisample: Default::default(),
            multiview_mask: None,
            cache: None,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("blit"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::TextureView(&view),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Sampler(&sampler),
                },
            ],
        });
        Ok(Gfx {
            window,
            surface,
            config,
            device,
            queue,
            engine,
            latents,
            texture,
            pipeline,
            bind_group,
            decode_ms: 0.0,
            presented: 0,
        })
    }

    /// Records the decode into our own encoder, submits, waits: the title
    /// shows that wall time.
    fn decode(&mut self) -> Result<(), Box<dyn Error>> {
        let start = Instant::now();
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("decode"),
            });
        let pending =
            self.engine
                .record_decode_to_texture(&mut encoder, &self.latents, &self.texture)?;
        self.queue.submit([encoder.finish()]);
        // Waits for the device (the decode just submitted); 0 unless f16.
        let overflows = pending.read_f16_overflows()?;
        drop(pending);
        if overflows > 0 {
            eprintln!("f16 overflow ({overflows} values): decoding again in bf16");
            self.engine.fall_back_to_bf16()?;
            return self.decode();
        }
        self.device.poll(wgpu::PollType::wait_indefinitely())?;
        self.decode_ms = start.elapsed().as_secs_f64() * 1e3;
        let (w, h) = (self.texture.width(), self.texture.height());
        self.window.set_title(&format!(
            "wgvae viewer — {w}×{h} — decode {:.0} ms — R: decode again",
            self.decode_ms
        ));
        println!(
            "decoded {w}×{h} in {:.1} ms (submit + wait)",
            self.decode_ms
        );
        self.window.request_redraw();
        Ok(())
    }

    fn resize(&mut self, size: PhysicalSize<u32>) {
        self.config.width = size.width.max(1);
        self.config.height = size.height.max(1);
        self.surface.configure(&self.device, &self.config);
        self.window.request_redraw();
    }

    fn draw(&mut self) {
        let frame = match self.surface.get_current_texture() {
            wgpu::CurrentSurfaceTexture::Success(f)
            | wgpu::CurrentSurfaceTexture::Suboptimal(f) => f,
            // Hidden or busy: the next expose / resize redraws.
            wgpu::CurrentSurfaceTexture::Timeout | wgpu::CurrentSurfaceTexture::Occluded => return,
            _ => {
                // Outdated (or worse): reconfigure and try once more.
                self.surface.configure(&self.device, &self.config);
                self.window.request_redraw();
                return;
            }
        };
        let view = frame.texture.create_view(&Default::default());
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
                label: Some("blit"),
                color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                    view: &view,
                    depth_slice: None,
                    resolve_target: None,
                    ops: wgpu::Operations {
                        load: wgpu::LoadOp::Clear(wgpu::Color::BLACK),
                        store: wgpu::StoreOp::Store,
                    },
                })],
                ..Default::default()
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind_group, &[]);
            pass.draw(0..3, 0..1);
        }
        self.queue.submit([encoder.finish()]);
        self.window.pre_present_notify();
        self.queue.present(frame);
        self.presented += 1;
        if self.presented == 1 {
            println!("presented the first frame");
        }
    }
}

struct App {
    args: Args,
    gfx: Option<Gfx>,
    error: Option<Box<dyn Error>>,
}

impl App {
    fn fail(&mut self, event_loop: &ActiveEventLoop, e: Box<dyn Error>) {
        self.error = Some(e);
        event_loop.exit();
    }
}

impl ApplicationHandler for App {
    fn resumed(&mut self, event_loop: &ActiveEventLoop) {
        if self.gfx.is_some() {
            return;
        }
        let attrs = Window::default_attributes().with_title("wgvae viewer — loading");
        let window = match event_loop.create_window(attrs) {
            Ok(w) => Arc::new(w),
            Err(e) => return self.fail(event_loop, e.into()),
        };
        match Gfx::new(window, &self.args) {
            Ok(mut gfx) => {
                if let Err(e) = gfx.decode() {
                    return self.fail(event_loop, e);
                }
                self.gfx = Some(gfx);
            }
            Err(e) => self.fail(event_loop, e),
        }
    }

    fn window_event(&mut self, event_loop: &ActiveEventLoop, _id: WindowId, event: WindowEvent) {
        let Some(gfx) = self.gfx.as_mut() else { return };
        match event {
            WindowEvent::CloseRequested => event_loop.exit(),
            WindowEvent::Resized(size) => gfx.resize(size),
            WindowEvent::RedrawRequested => gfx.draw(),
            WindowEvent::KeyboardInput {
                event:
                    KeyEvent {
                        logical_key,
                        state: ElementState::Pressed,
                        repeat: false,
                        ..
                    },
                ..
            } => match logical_key.as_ref() {
                Key::Named(NamedKey::Escape) => event_loop.exit(),
                Key::Named(NamedKey::Space) | Key::Character("r" | "R") => {
                    if let Err(e) = gfx.decode() {
                        self.fail(event_loop, e);
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let usage = "usage: viewer LATENTS --vae VAE";
    let mut args = std::env::args().skip(1);
    let (mut latents, mut vae) = (None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--vae" => vae = args.next(),
            "-h" | "--help" => {
                println!("{usage}");
                return Ok(());
            }
            _ => latents = Some(a),
        }
    }
    let args = Args {
        latents: latents.ok_or(usage)?,
        vae: vae.ok_or(usage)?,
    };
    let event_loop = EventLoop::new()?;
    let mut app = App {
        args,
        gfx: None,
        error: None,
    };
    event_loop.run_app(&mut app)?;
    match app.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
