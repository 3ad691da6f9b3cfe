//! What wgvae needs of a device (features and limits), for hosts that
//! create the device themselves (see [`crate::embed`]).

use crate::error::{Error, Result};

/// Features a device must have for wgvae: none.
pub fn required_features() -> wgpu::Features {
    wgpu::Features::empty()
}

/// Features wgvae uses when the device has them (`SHADER_F16`, timestamp
/// queries, `SUBGROUP`); without them it takes its f32 / untimed paths.
/// Intersect with `adapter.features()` before requesting them.
pub fn optional_features() -> wgpu::Features {
    crate::gpu::optional_features()
}

/// What a host adds to its device request for the engine's cooperative-matrix (tensor-core)
/// kernels: `EXPERIMENTAL_COOPERATIVE_MATRIX` with `SHADER_F16` and `SUBGROUP` (intersect
/// with `adapter.features()`), requested with `wgpu::ExperimentalFeatures::enabled()` (an
/// `unsafe` opt-in: wgpu marks the feature experimental). Then hand the adapter's
/// `cooperative_matrix_properties()` to [`crate::Context::from_device_with_matrices`] (or use
/// [`crate::Engine::with_adapter`]); without them the engine takes its scalar path.
pub fn cooperative_matrix_features() -> wgpu::Features {
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
}

/// Largest `var<workgroup>` footprint of any kernel variant, in bytes: the
/// attention kernel for head dimension 512 (AutoencoderKL's mid-block),
/// above WebGPU's default 16384.
const WORKGROUP_STORAGE_BYTES: u32 = 28672;
/// Largest workgroup (invocations) of any kernel variant.
const WORKGROUP_INVOCATIONS: u32 = 256;
/// Most storage buffers one kernel binds (attention over int8 K/V: q, codes
/// and scales of K and V, output, stats).
const STORAGE_BUFFERS_PER_STAGE: u32 = 7;

/// The limits wgvae needs: the lowest wgpu knows
/// ([`wgpu::Limits::downlevel_webgl2_defaults`]) raised where its compute
/// kernels need more (workgroup size and memory, storage buffers, one
/// storage texture for [`crate::Engine::record_decode_to_texture`]), with WebGPU's
/// default 128 MiB storage bindings and 256 MiB buffers.
///
/// One value exceeds WebGPU's defaults: `max_compute_workgroup_storage_size`
/// is 28672 bytes (the attention kernel of AutoencoderKL decoders, head
/// dimension 512; desktop GPUs and lavapipe offer 32 KiB or more). A device
/// created with `wgpu::Limits::default()` alone fails [`check_device`].
///
/// These suffice to run every kernel. Whether a given image fits depends on
/// `max_storage_buffer_binding_size` (one activation tensor per binding) and
/// `max_buffer_size`; a decode that does not fit fails with
/// [`Error::BindingTooLarge`] / [`Error::BufferTooLarge`]. Request
/// [`recommended_limits`] for large images.
///
/// Combine with your own: `mine.or_better_values_from(&required_limits())`.
pub fn required_limits() -> wgpu::Limits {
    let compute = wgpu::Limits::defaults();
    wgpu::Limits {
        max_bind_groups: 1,
        max_bindings_per_bind_group: 1 + STORAGE_BUFFERS_PER_STAGE,
        max_dynamic_uniform_buffers_per_pipeline_layout: 1,
        max_uniform_buffers_per_shader_stage: 1,
        max_uniform_buffer_binding_size: 16 << 10,
        max_storage_buffers_per_shader_stage: STORAGE_BUFFERS_PER_STAGE,
        max_storage_textures_per_shader_stage: 1,
        max_storage_buffer_binding_size: compute.max_storage_buffer_binding_size,
        max_buffer_size: compute.max_buffer_size,
        max_compute_workgroup_storage_size: WORKGROUP_STORAGE_BYTES,
        max_compute_invocations_per_workgroup: WORKGROUP_INVOCATIONS,
        max_compute_workgroup_size_x: WORKGROUP_INVOCATIONS,
        max_compute_workgroup_size_y: WORKGROUP_INVOCATIONS,
        max_compute_workgroup_size_z: 1,
        max_compute_workgroups_per_dimension: compute.max_compute_workgroups_per_dimension,
        ..wgpu::Limits::downlevel_webgl2_defaults()
    }
}

/// [`required_limits`] with the size limits large decodes need
/// (`max_storage_buffer_binding_size`, `max_buffer_size`) raised to the best
/// the adapter offers. Merge with your own limits the same way.
pub fn recommended_limits(adapter: &wgpu::Adapter) -> wgpu::Limits {
    let a = adapter.limits();
    let mut l = required_limits();
    l.max_storage_buffer_binding_size = l
        .max_storage_buffer_binding_size
        .max(a.max_storage_buffer_binding_size);
    l.max_buffer_size = l.max_buffer_size.max(a.max_buffer_size);
    l
}

/// Checks a device against [`required_features`] and [`required_limits`],
/// naming every shortfall.
pub fn check_device(device: &wgpu::Device) -> Result<()> {
    let mut missing = Vec::new();
    let lacking = required_features() - device.features();
    if !lacking.is_empty() {
        missing.push(format!("features {lacking:?}"));
    }
    required_limits().check_limits_with_fail_fn(&device.limits(), false, |name, want, have| {
        missing.push(format!("{name} = {have} (needs {want})"))
    });
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "this device does not meet wgvae's requirements: {}; create it with wgvae::required_features() and wgvae::required_limits()",
            missing.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::preprocess;
    use crate::kernels::all_variants;

    /// Every kernel variant fits `required_limits()`: workgroup size and
    /// memory, storage buffers and textures, uniform size.
    #[test]
    fn required_limits_cover_every_kernel_variant() {
        let req = required_limits();
        let (mut max_wg_bytes, mut max_inv, mut max_buffers) = (0u32, 0u32, 0u32);
        for (spec, key) in all_variants() {
            let name = format!("{}::{} {:?}", spec.family, spec.entry, key.defines);
            let src = preprocess(spec.source, &key).unwrap();
            let module = naga::front::wgsl::parse_str(&src).unwrap();
            let ep = module
                .entry_points
                .iter()
                .find(|e| e.name == spec.entry)
                .unwrap();
            let [x, y, z] = ep.workgroup_size;
            assert!(x <= req.max_compute_workgroup_size_x, "{name}: x {x}");
            assert!(y <= req.max_compute_workgroup_size_y, "{name}: y {y}");
            assert!(z <= req.max_compute_workgroup_size_z, "{name}: z {z}");
            let inv = x * y * z;
            // Conservative: every workgroup variable of the module, used or not.
            let wg_bytes: u32 = module
                .global_variables
                .iter()
                .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
                .map(|(_, v)| module.types[v.ty].inner.size(module.to_ctx()))
                .sum();
            let buffers = spec
                .bindings
                .iter()
                .filter(|k| !matches!(k, crate::gpu::BindingKind::WriteTexture(_)))
                .count() as u32;
            let textures = spec.bindings.len() as u32 - buffers;
            assert!(
                inv <= req.max_compute_invocations_per_workgroup,
                "{name}: {inv} invocations"
            );
            // Two-stage cooperative conv tiles use what the adapter offers beyond the
            // required limits; on a device with only those the engine takes a one-stage set
            // (conv2d::matrix_tests::matrix_tiles_only_for_f16_on_matrix_devices).
            let optional = spec.entry == "conv2d_coop"
                && key
                    .defines
                    .contains(&crate::gpu::pipeline::Define::Const("STAGES", "2u".into()));
            if optional {
                assert!(
                    wg_bytes <= 48 << 10,
                    "{name}: {wg_bytes} B workgroup memory"
                );
                continue;
            }
            assert!(
                wg_bytes <= req.max_compute_workgroup_storage_size,
                "{name}: {wg_bytes} B workgroup memory"
            );
            assert!(
                buffers <= req.max_storage_buffers_per_shader_stage,
                "{name}: {buffers} buffers"
            );
            assert!(
                textures <= req.max_storage_textures_per_shader_stage,
                "{name}: {textures} textures"
            );
            assert!(
                spec.uniform_size <= req.max_uniform_buffer_binding_size,
                "{name}: uniform"
            );
            if wg_bytes > 16384 {
                println!("{name}: {wg_bytes} B workgroup memory");
            }
            max_wg_bytes = max_wg_bytes.max(wg_bytes);
            max_inv = max_inv.max(inv);
            max_buffers = max_buffers.max(buffers);
        }
        println!("largest kernel needs: {max_wg_bytes} B workgroup memory, {max_inv} invocations, {max_buffers} storage buffers");
        // The constants are what the kernels need, not more.
        assert_eq!(max_inv, WORKGROUP_INVOCATIONS);
        assert_eq!(max_buffers, STORAGE_BUFFERS_PER_STAGE);
        assert_eq!(max_wg_bytes, WORKGROUP_STORAGE_BYTES);
        // Above WebGPU's defaults only in workgroup memory (attention, head dim 512).
        let mut defaults = wgpu::Limits::defaults();
        assert!(!req.check_limits(&defaults));
        defaults.max_compute_workgroup_storage_size = WORKGROUP_STORAGE_BYTES;
        assert!(req.check_limits(&defaults));
        assert!(required_features().is_empty());
    }

    /// The lowest limits wgpu knows fail the check with a message naming them.
    #[test]
    fn device_check_names_missing_limits() {
        let (device, _queue) = wgpu::Device::noop(&wgpu::DeviceDescriptor {
            required_limits: wgpu::Limits::downlevel_webgl2_defaults(),
            ..Default::default()
        });
        match check_device(&device) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("max_compute_invocations_per_workgroup"), "{m}")
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
