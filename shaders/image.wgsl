// Postprocessing: x [N, 3, H, W] (planar RGB, storage type T) -> out [N, H, W]
// packed RGBA8 (one u32 per pixel, R in the low byte, alpha 255).
//
// RANGE (const from the key):
//   0 MinusOneToOne  diffusers: round(clamp(x / 2 + 0.5, 0, 1) * 255)
//   1 ZeroToOne      TAE:       round(clamp(x, 0, 1) * 255)
// WGSL round() is round-half-to-even (naga emits SPIR-V RoundEven), which is
// what numpy's `.round()` does, so bytes match diffusers exactly.
// x * 0.5 is bit-identical to x / 2 (exact power-of-two scaling) and avoids a
// division whose precision Vulkan does not guarantee.
//
// Grid: workgroups (x, y) tile the pixels of one image, z is the image.
// All storage is read_write: pooled tensors share buffers (see BindingKind).

struct Params {
    plane: u32,   // H * W
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

fn to_byte(v: f32) -> u32 {
    var unit: f32;
    if RANGE == 0u {
        unit = clamp(v * 0.5 + 0.5, 0.0, 1.0);
    } else {
        unit = clamp(v, 0.0, 1.0);
    }
    return u32(round(unit * 255.0));
}

@compute @workgroup_size(WG)
fn to_rgba8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let pixel = (wg.x + wg.y * nwg.x) * WG + li;
    if pixel >= p.plane { return; }
    let base = wg.z * 3u * p.plane + pixel;
    let r = to_byte(f32(x[base]));
    let g = to_byte(f32(x[base + p.plane]));
    let b = to_byte(f32(x[base + 2u * p.plane]));
    out[wg.z * p.plane + pixel] = r | (g << 8u) | (b << 16u) | (255u << 24u);
}
