// Postprocessing of decoder output x [N, CHANNELS, H, W] (planar RGB, or RGBA when CHANNELS is 4;
// storage type T):
//   to_rgba8    -> out [N, H, W] packed RGBA8 (one u32 per pixel, R in the low byte; alpha 255, or
//                  channel 4 mapped like RGB when CHANNELS is 4; alpha 0 also marks a pixel with a
//                  NaN or infinite channel: hosts of 3-channel images count them and refuse the
//                  image instead of saving whatever bytes the clamps made of NaN)
//   to_rgb8     -> (CHANNELS 3 only) out: the RGB8 byte stream of all N images (H * W * 3 bytes
//                  each, R G B per pixel, row-major), packed 4 bytes per u32 word, little-endian;
//                  flag RGB8. One invocation per word: a word may straddle pixels and images, and
//                  the last word's unused bytes are 0.
//   to_texture  -> the top-left W×H texels of a 2-D storage texture (flag TEXTURE; N = 1):
//                  rgba8unorm (default) gets exactly the bytes to_rgba8 produces, as k / 255
//                  (the unorm store converts back to k: the value is within a few ulp of k / 255);
//                  rgba16float (flag RGBA16F) gets the clamped value before quantisation.
//                  Either way the values are the decoder's sRGB-encoded pixel values, alpha as
//                  to_rgba8's (1, or channel 4; 0 for a non-finite pixel).
//
// RANGE (const from the key):
//   0 MinusOneToOne  diffusers: round(clamp(x / 2 + 0.5, 0, 1) * 255)
//   1 ZeroToOne      TAE:       round(clamp(x, 0, 1) * 255)
//   2 ImageNet       MiniMax-H3: round(clamp(x * std[c] + mean[c], 0, 1) * 255), ImageNet's
//                    per-channel statistics (an alpha channel as ZeroToOne)
// WGSL round() is round-half-to-even (naga emits SPIR-V RoundEven), which is
// what numpy's `.round()` does, so bytes match diffusers exactly.
// x * 0.5 is bit-identical to x / 2 (exact power-of-two scaling) and avoids a
// division whose precision Vulkan does not guarantee.
//
// Grid: workgroups (x, y) tile the pixels of one image, z is the image.
// All storage buffers are read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    plane: u32,   // H * W
    width: u32,   // W (to_texture)
    images: u32,  // N (to_rgb8)
    words: u32,   // output u32 words (to_rgb8)
}

@group(0) @binding(0) var<uniform> p: Params;
#storage x 1 read
#ifdef TEXTURE
#ifdef RGBA16F
@group(0) @binding(2) var out_tex: texture_storage_2d<rgba16float, write>;
#else
@group(0) @binding(2) var out_tex: texture_storage_2d<rgba8unorm, write>;
#endif
#else
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
#endif

fn to_unit(v: f32, ch: u32) -> f32 {
    if RANGE == 0u {
        return clamp(v * 0.5 + 0.5, 0.0, 1.0);
    }
    if RANGE == 2u && ch < 3u {
        var sd = array<f32, 3>(0.229, 0.224, 0.225);
        var mu = array<f32, 3>(0.485, 0.456, 0.406);
        return clamp(v * sd[ch] + mu[ch], 0.0, 1.0);
    }
    return clamp(v, 0.0, 1.0);
}

// On the bits: GLSL compilers may assume no NaN and fold float comparisons
// (`abs(v) <= MAX` passed NaN on wgpu's GL backend); an all-ones exponent is
// NaN or ±Inf whatever the float model.
fn finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

// Alpha in [0, 1] before quantisation of the pixel whose red value is at `base`: channel 4 when
// the image has one, else 1; 0 when a channel is NaN or infinite.
fn alpha(base: u32, r: f32, g: f32, b: f32) -> f32 {
    var ok = finite(r) && finite(g) && finite(b);
    var a = 1.0;
    if CHANNELS == 4u {
        let v = x_ld(base + 3u * p.plane);
        ok = ok && finite(v);
        a = to_unit(v, 3u);
    }
    return select(0.0, a, ok);
}

fn unit_byte(u: f32) -> u32 {
    return u32(round(u * 255.0));
}

fn to_byte(v: f32, ch: u32) -> u32 {
    return unit_byte(to_unit(v, ch));
}

#ifdef TEXTURE
@compute @workgroup_size(WG)
fn to_texture(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let pixel = (wg.x + wg.y * nwg.x) * WG + li;
    if pixel >= p.plane { return; }
    let r = x_ld(pixel);
    let g = x_ld(pixel + p.plane);
    let b = x_ld(pixel + 2u * p.plane);
#ifdef RGBA16F
    let texel = vec4<f32>(to_unit(r, 0u), to_unit(g, 1u), to_unit(b, 2u), alpha(pixel, r, g, b));
#else
    let a = unit_byte(alpha(pixel, r, g, b));
    let texel = vec4<f32>(vec4<f32>(vec4<u32>(to_byte(r, 0u), to_byte(g, 1u), to_byte(b, 2u), a)) / 255.0);
#endif
    textureStore(out_tex, vec2<u32>(pixel % p.width, pixel / p.width), texel);
}
#else
#ifdef RGB8
@compute @workgroup_size(WG)
fn to_rgb8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let word = (wg.x + wg.y * nwg.x) * WG + li;
    if word >= p.words { return; }
    let image_bytes = 3u * p.plane;
    let total = p.images * image_bytes;
    var packed = 0u;
    for (var k = 0u; k < 4u; k++) {
        let byte = word * 4u + k;
        if byte < total {
            let image = byte / image_bytes;
            let within = byte - image * image_bytes;
            let pixel = within / 3u;
            let ch = within - pixel * 3u;
            let v = to_byte(x_ld((image * 3u + ch) * p.plane + pixel), ch);
            packed |= v << (8u * k);
        }
    }
    out[word] = packed;
}
#else
@compute @workgroup_size(WG)
fn to_rgba8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let pixel = (wg.x + wg.y * nwg.x) * WG + li;
    if pixel >= p.plane { return; }
    let base = wg.z * CHANNELS * p.plane + pixel;
    let r = x_ld(base);
    let g = x_ld(base + p.plane);
    let b = x_ld(base + 2u * p.plane);
    let a = unit_byte(alpha(base, r, g, b));
    out[wg.z * p.plane + pixel] = to_byte(r, 0u) | (to_byte(g, 1u) << 8u) | (to_byte(b, 2u) << 16u) | (a << 24u);
}
#endif
#endif
