use super::*;
use crate::testing::{rand_vec, test_context};
use wgpu::TextureFormat;

fn gpu(
    ctx: &crate::Context,
    data: &[f32],
    n: usize,
    h: usize,
    w: usize,
    range: ImageRange,
) -> Vec<u8> {
    let x = Tensor::from_f32(ctx, &[n, 3, h, w], data, "x").unwrap();
    let out = Tensor::empty(ctx, &[n, h, w], DType::Rgba8, "rgba").unwrap();
    let mut rec = Recorder::new(ctx);
    to_rgba8(&mut rec, &x, range, &out).unwrap();
    rec.submit().unwrap();
    out.to_bytes(ctx).unwrap()
}

#[test]
fn cpu_reference_rounds_half_to_even_like_numpy() {
    // numpy: np.float32([0.5, 1.5, 2.5, 254.5]).round() == [0, 2, 2, 254]
    for (k, want) in [(0.5f32, 0u8), (1.5, 2), (2.5, 2), (254.5, 254)] {
        assert_eq!(k.round_ties_even() as u8, want);
    }
    // MinusOneToOne: x = 0 -> 0.5 * 255 = 127.5 exactly -> 128 (even).
    assert_eq!(ImageRange::MinusOneToOne.to_byte(0.0), 128);
    assert_eq!(ImageRange::MinusOneToOne.to_byte(-1.0), 0);
    assert_eq!(ImageRange::MinusOneToOne.to_byte(1.0), 255);
}

/// Exact byte equality (no tolerance) with the CPU reference, including
/// values whose f32 product with 255 is exactly k + 0.5.
#[test]
fn rgba8_matches_cpu_exactly_including_halves() {
    let ctx = test_context();
    for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
        for (n, h, w) in [(1, 7, 5), (2, 19, 23)] {
            let len = n * 3 * h * w;
            let mut data = rand_vec(len, 77, 1.3);
            // Exact halves: x with f32(x * 255) == k + 0.5 (in unit space).
            let mut halves = Vec::new();
            for k in 0..255u32 {
                let unit = (k as f32 + 0.5) / 255.0;
                if unit * 255.0 == k as f32 + 0.5 {
                    halves.push(match range {
                        ImageRange::ZeroToOne | ImageRange::ImageNet => unit,
                        // x / 2 + 0.5 == unit exactly when x = 2 * (unit - 0.5) is exact.
                        ImageRange::MinusOneToOne => (unit - 0.5) * 2.0,
                    });
                }
            }
            assert!(halves.len() > 20, "few exact halves: {}", halves.len());
            for (d, v) in data
                .iter_mut()
                .zip(halves.iter().chain([-5.0, 5.0, 0.0, 1.0, -1.0].iter()))
            {
                *d = *v;
            }
            let got = gpu(&ctx, &data, n, h, w, range);
            let want = cpu_to_rgba8(&data, n, h, w, range);
            assert_eq!(got.len(), want.len());
            for (i, (g, wv)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g,
                    wv,
                    "{range:?} {n}x{h}x{w}: byte {i} (pixel {}) from input",
                    i / 4
                );
            }
        }
    }
}

/// RGB8 bytes equal the CPU reference exactly, in every storage type, on
/// sizes whose images end mid-word (3 * H * W not a multiple of 4: words
/// straddle pixels and images) and whose last word is partial (padded with 0).
#[test]
fn rgb8_matches_cpu_exactly_on_odd_sizes() {
    for (ctx, dt) in crate::testing::dtype_contexts() {
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            for (n, h, w) in [(1, 7, 5), (2, 19, 23), (3, 1, 1), (2, 3, 5)] {
                let len = n * 3 * h * w;
                let data: Vec<f32> = rand_vec(len, 91 + n as u64, 1.3)
                    .into_iter()
                    .map(|v| crate::gpu::storage::round_through(v, dt))
                    .collect();
                let x = Tensor::from_f32_as(&ctx, &[n, 3, h, w], &data, dt, "x").unwrap();
                let words = rgb8_words(n, h, w);
                let out = Tensor::empty(&ctx, &[words], DType::Rgba8, "rgb").unwrap();
                let mut rec = Recorder::new(&ctx);
                to_rgb8(&mut rec, &x, range, &out).unwrap();
                rec.submit().unwrap();
                let got = out.to_bytes(&ctx).unwrap();
                let want = cpu_to_rgb8(&data, n, h, w, range);
                let what = format!("{} {range:?} {n}x{h}x{w}", dt.name());
                assert_eq!(got.len(), words * 4, "{what}");
                assert_eq!(&got[..want.len()], &want[..], "{what}");
                assert!(got[want.len()..].iter().all(|&b| b == 0), "{what}: padding");
                // The same bytes as the RGBA8 kernel without alpha.
                let rgba = gpu_rgba(&ctx, &x, range);
                assert_eq!(crate::testing::rgb_of(&rgba), want, "{what}: vs rgba8");
            }
        }
    }
}

/// A pixel with a NaN or infinite channel (in any channel, any image,
/// every storage type) gets alpha 0; every other pixel is exactly the
/// CPU reference, large finite values included.
#[test]
fn non_finite_pixels_get_alpha_zero() {
    for (ctx, dt) in crate::testing::dtype_contexts() {
        let (n, h, w) = (2usize, 7usize, 5usize);
        let plane = h * w;
        let mut data = rand_vec(n * 3 * plane, 5, 1.2);
        let big = if dt == DType::F32 { 3.0e38 } else { 60000.0 };
        // (image, channel, pixel, value)
        let marks = [
            (0, 0, 0, f32::NAN),
            (0, 1, 6, f32::INFINITY),
            (0, 2, 34, f32::NEG_INFINITY),
            (1, 2, 17, f32::NAN),
            (1, 0, 3, big),
            (1, 1, 3, -big),
        ];
        for &(b, ch, i, v) in &marks {
            data[(b * 3 + ch) * plane + i] = v;
        }
        let data: Vec<f32> = data
            .iter()
            .map(|&v| crate::gpu::storage::round_through(v, dt))
            .collect();
        let x = Tensor::from_f32_as(&ctx, &[n, 3, h, w], &data, dt, "x").unwrap();
        let got = gpu_rgba(&ctx, &x, ImageRange::MinusOneToOne);
        let want = cpu_to_rgba8(&data, n, h, w, ImageRange::MinusOneToOne);
        // f16 uploads saturate infinities (NaN stays NaN): 2 or 4 marked.
        let marked = if dt == DType::F16 { 2 } else { 4 };
        assert_eq!(count_non_finite(&want), marked, "{}: reference", dt.name());
        assert_eq!(count_non_finite(&got), marked, "{}", dt.name());
        for p in 0..n * plane {
            let (g, wv) = (&got[p * 4..p * 4 + 4], &want[p * 4..p * 4 + 4]);
            if wv[3] == 0 {
                assert_eq!(g[3], 0, "{}: pixel {p} is non-finite", dt.name());
            } else {
                assert_eq!(g, wv, "{}: pixel {p}", dt.name());
            }
        }
    }
}

fn gpu_rgba(ctx: &crate::Context, x: &Tensor, range: ImageRange) -> Vec<u8> {
    let [n, _, h, w] = *x.shape() else {
        unreachable!()
    };
    let out = Tensor::empty(ctx, &[n, h, w], DType::Rgba8, "rgba").unwrap();
    let mut rec = Recorder::new(ctx);
    to_rgba8(&mut rec, x, range, &out).unwrap();
    rec.submit().unwrap();
    out.to_bytes(ctx).unwrap()
}

#[test]
fn rgb8_rejects_bad_shapes() {
    let ctx = test_context();
    let x = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::F32, "x").unwrap();
    let r = ImageRange::ZeroToOne;
    let mut rec = Recorder::new(&ctx);
    for shape in [[27usize].as_slice(), &[26], &[1, 7, 5]] {
        let out = Tensor::empty(&ctx, shape, DType::Rgba8, "o").unwrap();
        let ok = to_rgb8(&mut rec, &x, r, &out);
        assert_eq!(ok.is_ok(), shape == [27], "{shape:?}");
    }
    let out = Tensor::empty(&ctx, &[27], DType::F32, "o").unwrap();
    assert!(to_rgb8(&mut rec, &x, r, &out).is_err());
    let x4 = Tensor::empty(&ctx, &[1, 4, 7, 5], DType::F32, "x4").unwrap();
    let out = Tensor::empty(&ctx, &[35], DType::Rgba8, "o").unwrap();
    assert!(to_rgb8(&mut rec, &x4, r, &out).is_err());
}

#[test]
fn exact_half_cases_round_to_even() {
    // Inputs whose f32 product with 255 is exactly k + 0.5 must give the
    // even neighbour on the GPU (WGSL round() is round-half-to-even).
    let ctx = test_context();
    let r = ImageRange::ZeroToOne;
    let mut data = Vec::new();
    let mut expected = Vec::new();
    for k in [0u32, 1, 2, 3, 126, 127, 253, 254] {
        let unit = (k as f32 + 0.5) / 255.0;
        if unit * 255.0 == k as f32 + 0.5 {
            data.push(unit);
            expected.push(if k % 2 == 0 { k } else { k + 1 } as u8);
        }
    }
    assert!(!expected.is_empty());
    let w = data.len();
    let mut planar = data.clone();
    planar.extend(&data);
    planar.extend(&data);
    let got = gpu(&ctx, &planar, 1, 1, w, r);
    for (i, e) in expected.iter().enumerate() {
        assert_eq!(
            &got[i * 4..i * 4 + 4],
            &[*e, *e, *e, 255],
            "value {}",
            data[i]
        );
    }
}

/// Reads mip 0 / layer 0 of a `COPY_SRC` texture back: tightly packed rows.
fn read_texture(ctx: &crate::Context, tex: &wgpu::Texture) -> Vec<u8> {
    let bpp = tex.format().block_copy_size(None).unwrap();
    let (w, h) = (tex.width(), tex.height());
    let row =
        (w * bpp).div_ceil(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT) * wgpu::COPY_BYTES_PER_ROW_ALIGNMENT;
    let staging = Tensor::empty(ctx, &[(row * h / 4) as usize], DType::F32, "tex").unwrap();
    let mut enc = ctx.device().create_command_encoder(&Default::default());
    enc.copy_texture_to_buffer(
        tex.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: staging.buffer().unwrap(),
            layout: wgpu::TexelCopyBufferLayout {
                offset: staging.block().offset,
                bytes_per_row: Some(row),
                rows_per_image: None,
            },
        },
        tex.size(),
    );
    ctx.queue().submit([enc.finish()]);
    let padded = staging.to_bytes(ctx).unwrap();
    padded
        .chunks_exact(row as usize)
        .flat_map(|r| r[..(w * bpp) as usize].to_vec())
        .collect()
}

fn storage_texture(
    ctx: &crate::Context,
    w: u32,
    h: u32,
    format: wgpu::TextureFormat,
) -> wgpu::Texture {
    super::storage_texture(ctx.device(), "test target", w, h, format)
}

/// The texels [`to_texture`] writes for `x` into a new `w` x `h` texture
/// of `format`.
fn texture_bytes(
    ctx: &crate::Context,
    x: &Tensor,
    range: ImageRange,
    w: usize,
    h: usize,
    format: wgpu::TextureFormat,
) -> Vec<u8> {
    let tex = storage_texture(ctx, w as u32, h as u32, format);
    let mut rec = Recorder::new(ctx);
    to_texture(&mut rec, x, range, &tex).unwrap();
    rec.submit().unwrap();
    read_texture(ctx, &tex)
}

/// Rgba8Unorm texels are byte-identical to `to_rgba8` (and so to the CPU
/// reference), exact halves included; a larger texture keeps its other
/// texels (zero-initialised by wgpu) untouched.
#[test]
fn texture_rgba8_equals_packed_bytes() {
    let ctx = test_context();
    for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
        let (h, w) = (19usize, 23usize);
        let mut data = rand_vec(3 * h * w, 31, 1.4);
        for (k, d) in data.iter_mut().take(255).enumerate() {
            let unit = (k as f32 + 0.5) / 255.0;
            *d = match range {
                ImageRange::ZeroToOne | ImageRange::ImageNet => unit,
                ImageRange::MinusOneToOne => (unit - 0.5) * 2.0,
            };
        }
        let want = cpu_to_rgba8(&data, 1, h, w, range);
        assert_eq!(gpu(&ctx, &data, 1, h, w, range), want);
        let x = Tensor::from_f32(&ctx, &[1, 3, h, w], &data, "x").unwrap();
        let got = texture_bytes(&ctx, &x, range, w + 3, h + 2, TextureFormat::Rgba8Unorm);
        let tw = w + 3;
        for y in 0..h + 2 {
            for xx in 0..tw {
                let texel = &got[(y * tw + xx) * 4..(y * tw + xx) * 4 + 4];
                if y < h && xx < w {
                    let i = (y * w + xx) * 4;
                    assert_eq!(texel, &want[i..i + 4], "{range:?} texel ({xx}, {y})");
                } else {
                    assert_eq!(texel, &[0, 0, 0, 0], "{range:?} outside texel ({xx}, {y})");
                }
            }
        }
    }
}

/// Rgba16Float texels are the unquantised values converted to f16: one of
/// the two f16 values bracketing the CPU value (Vulkan lets the store round
/// either way; lavapipe truncates), i.e. within one f16 ulp; a 4-channel
/// image's alpha too.
#[test]
fn texture_rgba16f_holds_unquantised_values() {
    let ctx = test_context();
    let (h, w) = (7usize, 5usize);
    for c in IMAGE_CHANNELS {
        let data = rand_vec(c * h * w, 5, 1.3);
        let range = ImageRange::MinusOneToOne;
        let x = Tensor::from_f32(&ctx, &[1, c, h, w], &data, "x").unwrap();
        let texels = texture_bytes(&ctx, &x, range, w, h, TextureFormat::Rgba16Float);
        let got: Vec<f32> = bytemuck::pod_collect_to_vec::<u8, half::f16>(&texels)
            .into_iter()
            .map(f32::from)
            .collect();
        let want = cpu_to_unit_rgba(&data, c, h, w, range);
        let alpha_varies = want.iter().skip(3).step_by(4).any(|&a| a > 0.0 && a < 1.0);
        assert_eq!(alpha_varies, c == 4, "{c} channels");
        assert_eq!(got.len(), want.len());
        for (i, (g, v)) in got.iter().zip(&want).enumerate() {
            let near = half::f16::from_f32(*v);
            let (lo, hi) = if f32::from(near) <= *v {
                (near, half::f16::from_bits(near.to_bits() + 1))
            } else {
                (half::f16::from_bits(near.to_bits() - 1), near)
            };
            assert!(
                *g == f32::from(lo) || *g == f32::from(hi),
                "{c} channels, texel value {i}: got {g}, want {v} (f16 neighbours {lo}, {hi})"
            );
        }
    }
}

/// Half-precision inputs (native f16, packed f16 with shader-f16 hidden,
/// packed bf16) on odd shapes: `to_rgba8` and an Rgba8Unorm `to_texture`
/// give exactly the CPU reference's bytes of the values as stored
/// (inputs rounded through the dtype first, so only the load differs).
#[test]
fn half_inputs_convert_exactly() {
    for (ctx, dt) in crate::testing::dtype_contexts() {
        if dt == DType::F32 {
            continue;
        }
        let what = crate::kernels::storage_path(&ctx, dt);
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            for (n, h, w) in [(1, 7, 5), (2, 19, 23)] {
                let data: Vec<f32> = rand_vec(n * 3 * h * w, 13, 1.3)
                    .into_iter()
                    .map(|v| crate::gpu::storage::round_through(v, dt))
                    .collect();
                let want = cpu_to_rgba8(&data, n, h, w, range);
                let x = Tensor::from_f32_as(&ctx, &[n, 3, h, w], &data, dt, "x").unwrap();
                let out = Tensor::empty(&ctx, &[n, h, w], DType::Rgba8, "rgba").unwrap();
                let mut rec = Recorder::new(&ctx);
                to_rgba8(&mut rec, &x, range, &out).unwrap();
                rec.submit().unwrap();
                assert_eq!(out.to_bytes(&ctx).unwrap(), want, "{what} {range:?} rgba8");
                if n == 1 {
                    let texels = texture_bytes(&ctx, &x, range, w, h, TextureFormat::Rgba8Unorm);
                    assert_eq!(texels, want, "{what} {range:?} texture");
                }
            }
        }
    }
}

#[test]
fn texture_misuse_is_an_error() {
    let ctx = test_context();
    let x = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::F32, "x").unwrap();
    let mut rec = Recorder::new(&ctx);
    let small = storage_texture(&ctx, 4, 5, wgpu::TextureFormat::Rgba8Unorm);
    assert!(matches!(
        to_texture(&mut rec, &x, ImageRange::ZeroToOne, &small),
        Err(Error::Shape { .. })
    ));
    let x2 = Tensor::empty(&ctx, &[2, 3, 5, 5], DType::F32, "x2").unwrap();
    let ok = storage_texture(&ctx, 5, 5, wgpu::TextureFormat::Rgba8Unorm);
    assert!(matches!(
        to_texture(&mut rec, &x2, ImageRange::ZeroToOne, &ok),
        Err(Error::Shape { .. })
    ));
    let r32 = storage_texture(&ctx, 5, 5, wgpu::TextureFormat::R32Float);
    assert!(matches!(
        to_texture(&mut rec, &x, ImageRange::ZeroToOne, &r32),
        Err(Error::Unsupported(_))
    ));
    let not_storage = ctx.device().create_texture(&wgpu::TextureDescriptor {
        label: None,
        size: wgpu::Extent3d {
            width: 5,
            height: 5,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba8Unorm,
        usage: wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    });
    assert!(matches!(
        to_texture(&mut rec, &x, ImageRange::ZeroToOne, &not_storage),
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn bad_shapes_are_errors() {
    let ctx = test_context();
    let x = Tensor::empty(&ctx, &[1, 5, 5, 5], DType::F32, "x").unwrap();
    let out = Tensor::empty(&ctx, &[1, 5, 5], DType::Rgba8, "o").unwrap();
    let mut rec = Recorder::new(&ctx);
    assert!(matches!(
        to_rgba8(&mut rec, &x, ImageRange::ZeroToOne, &out),
        Err(Error::Shape { .. })
    ));
    let x = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::F32, "x").unwrap();
    let wrong = Tensor::empty(&ctx, &[1, 5, 5], DType::F32, "o").unwrap();
    assert!(matches!(
        to_rgba8(&mut rec, &x, ImageRange::ZeroToOne, &wrong),
        Err(Error::Shape { .. })
    ));
    let wrong = Tensor::empty(&ctx, &[1, 5, 6], DType::Rgba8, "o").unwrap();
    assert!(matches!(
        to_rgba8(&mut rec, &x, ImageRange::ZeroToOne, &wrong),
        Err(Error::Shape { .. })
    ));
    let xr = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::Rgba8, "xr").unwrap();
    assert!(matches!(
        to_rgba8(&mut rec, &xr, ImageRange::ZeroToOne, &out),
        Err(Error::Shape { .. })
    ));
}

/// Four-channel images (RGBA decoders): alpha is channel 4 mapped exactly
/// like RGB, in every storage type, on odd shapes, exact halves included; a
/// non-finite value in any channel (alpha too) gives alpha 0. `to_rgba8`,
/// an Rgba8Unorm `to_texture` and the CPU reference agree byte for byte.
#[test]
fn four_channels_keep_alpha() {
    for (ctx, dt) in crate::testing::dtype_contexts() {
        let what = crate::kernels::storage_path(&ctx, dt);
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            for (n, h, w) in [(1, 7, 5), (2, 19, 23), (3, 1, 1)] {
                let plane = h * w;
                let mut data = rand_vec(n * 4 * plane, 29 + n as u64, 1.3);
                // Alpha of image 0: exact halves, the range's ends and beyond.
                for (k, d) in data[3 * plane..4 * plane].iter_mut().enumerate() {
                    let unit = ((k * 37) % 255) as f32 / 255.0 + 0.5 / 255.0;
                    *d = match (k % 5, range) {
                        (0, _) => -7.0,
                        (1, _) => 7.0,
                        (_, ImageRange::ZeroToOne | ImageRange::ImageNet) => unit,
                        (_, ImageRange::MinusOneToOne) => (unit - 0.5) * 2.0,
                    };
                }
                let marks = n > 1 && plane > 5;
                if marks {
                    // A NaN alpha and a NaN red: both marked with alpha 0.
                    data[(4 + 3) * plane + 2] = f32::NAN;
                    data[4 * plane + 5] = f32::NAN;
                }
                let data: Vec<f32> = data
                    .into_iter()
                    .map(|v| crate::gpu::storage::round_through(v, dt))
                    .collect();
                let want = cpu_image_to_rgba8(&data, [n, 4, h, w], range);
                let alphas: Vec<u8> = want.iter().skip(3).step_by(4).copied().collect();
                let distinct: std::collections::BTreeSet<u8> = alphas.iter().copied().collect();
                assert!(
                    plane < 4 || distinct.len() > 3,
                    "{what}: alpha {distinct:?}"
                );
                if marks {
                    assert_eq!(alphas[plane + 2], 0, "{what}: NaN alpha");
                    assert_eq!(alphas[plane + 5], 0, "{what}: NaN red");
                }
                let x = Tensor::from_f32_as(&ctx, &[n, 4, h, w], &data, dt, "x").unwrap();
                let got = gpu_rgba(&ctx, &x, range);
                let tag = format!("{what} {range:?} {n}x4x{h}x{w}");
                assert_eq!(got.len(), want.len(), "{tag}");
                for p in 0..n * plane {
                    let (g, wv) = (&got[p * 4..p * 4 + 4], &want[p * 4..p * 4 + 4]);
                    if marks && (p == plane + 2 || p == plane + 5) {
                        assert_eq!(g[3], 0, "{tag}: pixel {p} is non-finite");
                    } else {
                        assert_eq!(g, wv, "{tag}: pixel {p}");
                    }
                }
                if n == 1 {
                    let texels = texture_bytes(&ctx, &x, range, w, h, TextureFormat::Rgba8Unorm);
                    assert_eq!(texels, want, "{tag}: texture");
                }
            }
        }
    }
}

/// MiniMax-H3's ImageNet-normalised output: each channel through its own
/// std and mean, bytes and RGB8 equal to the CPU reference; y4m frames the same.
#[test]
fn imagenet_range_maps_each_channel() {
    let ctx = test_context();
    let (n, h, w) = (2, 3, 5);
    let data = crate::testing::rand_vec(n * 3 * h * w, 12, 2.5);
    let x = Tensor::from_f32(&ctx, &[n, 3, h, w], &data, "x").unwrap();
    let got = gpu_rgba(&ctx, &x, ImageRange::ImageNet);
    let want = cpu_to_rgba8(&data, n, h, w, ImageRange::ImageNet);
    assert_eq!(got, want);
    // Channel 1 of value 0 is its mean: round(0.456 · 255) = 116.
    assert_eq!(ImageRange::ImageNet.to_byte_at(0.0, 1), 116);
    assert_eq!(ImageRange::ImageNet.to_byte_at(0.0, 2), 104);
}
