//! Every shader variant the engine can request parses and validates with
//! naga, and its bindings and uniform size match the Rust side.

use naga::{AddressSpace, ImageClass, ImageDimension, StorageAccess, StorageFormat, TypeInner};

use crate::gpu::{preprocess, BindingKind};
use crate::kernels::all_variants;

fn validate(name: &str, src: &str) -> naga::Module {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name}: parse error:\n{}", e.emit_to_string(src)));
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{name}: validation error:\n{}", e.emit_to_string(src)));
    module
}

#[test]
fn every_shader_variant_validates_and_matches_its_spec() {
    let variants = all_variants();
    assert!(!variants.is_empty());
    // Thousands of variants (conv2d's options x storage combinations): validate them on
    // every core.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = variants.len().div_ceil(threads);
    std::thread::scope(|s| {
        for part in variants.chunks(chunk) {
            s.spawn(move || {
                for (spec, key) in part {
                    check_variant(spec, key);
                }
            });
        }
    });
}

fn check_variant(spec: &crate::gpu::KernelSpec, key: &crate::gpu::PipelineKey) {
    {
        let name = format!("{}::{} {:?}", spec.family, spec.entry, key.defines);
        let src = preprocess(&*spec.source, key).unwrap();
        let module = validate(&name, &src);
        assert!(
            module.entry_points.iter().any(|e| e.name == spec.entry),
            "{name}: no entry point"
        );
        // Bindings the entry point's module declares, by binding index.
        let mut found = std::collections::BTreeMap::new();
        for (_, var) in module.global_variables.iter() {
            if let Some(rb) = &var.binding {
                assert_eq!(rb.group, 0, "{name}: only bind group 0 is used");
                found.insert(rb.binding, var.clone());
            }
        }
        let uniform = found
            .get(&0)
            .unwrap_or_else(|| panic!("{name}: binding 0 missing"));
        assert_eq!(
            uniform.space,
            AddressSpace::Uniform,
            "{name}: binding 0 must be the uniform"
        );
        let size = module.types[uniform.ty].inner.size(module.to_ctx()) as u64;
        assert_eq!(
            size, spec.uniform_size,
            "{name}: uniform struct size WGSL vs Rust"
        );
        assert_eq!(
            found.len(),
            spec.bindings.len() + 1,
            "{name}: binding count"
        );
        for (i, kind) in spec.bindings.iter().enumerate() {
            let var = found
                .get(&(i as u32 + 1))
                .unwrap_or_else(|| panic!("{name}: binding {} missing", i + 1));
            if let BindingKind::WriteTexture(format) = kind {
                check_write_texture(&name, i + 1, &module, var, *format);
                continue;
            }
            let AddressSpace::Storage { access } = var.space else {
                panic!("{name}: binding {} is not a storage buffer", i + 1)
            };
            // Pooled tensors share buffers: every storage binding is read_write (see BindingKind).
            assert_eq!(
                access,
                StorageAccess::LOAD | StorageAccess::STORE,
                "{name}: binding {} must be read_write",
                i + 1
            );
        }
    }
}

/// A `WriteTexture(format)` binding is a write-only `texture_storage_2d` of that format.
fn check_write_texture(
    name: &str,
    binding: usize,
    module: &naga::Module,
    var: &naga::GlobalVariable,
    format: wgpu::TextureFormat,
) {
    assert_eq!(
        var.space,
        AddressSpace::Handle,
        "{name}: binding {binding} must be a texture"
    );
    let want = match format {
        wgpu::TextureFormat::Rgba8Unorm => StorageFormat::Rgba8Unorm,
        wgpu::TextureFormat::Rgba16Float => StorageFormat::Rgba16Float,
        wgpu::TextureFormat::Rgba32Float => StorageFormat::Rgba32Float,
        other => panic!("{name}: add {other:?} to the storage-format table of this test"),
    };
    match module.types[var.ty].inner {
        TypeInner::Image {
            dim: ImageDimension::D2,
            arrayed: false,
            class: ImageClass::Storage { format, access },
        } => {
            assert_eq!(format, want, "{name}: binding {binding} texel format");
            assert_eq!(
                access,
                StorageAccess::STORE,
                "{name}: binding {binding} must be write-only"
            );
        }
        ref other => panic!("{name}: binding {binding} is {other:?}, not a texture_storage_2d"),
    }
}

#[test]
fn preprocessor_handles_nesting_and_rejects_garbage() {
    use crate::gpu::{KernelSpec, PipelineKey};
    let spec = KernelSpec {
        family: "t",
        source: crate::gpu::WgslSource::Static(""),
        entry: "e",
        bindings: &[],
        uniform_size: 0,
        trusted: false,
    };
    let key = PipelineKey::new(&spec).flag("A").constant("N", "4u");
    let src = "#ifdef A\na\n#ifdef B\nb\n#else\nnotb\n#endif\n#else\nnota\n#endif\n#ifndef B\nc\n#endif\n";
    let out = preprocess(src, &key).unwrap();
    assert_eq!(out, "const N = 4u;\na\nnotb\nc\n");
    assert!(preprocess("#ifdef A\n", &key).is_err());
    assert!(preprocess("#endif\n", &key).is_err());
    assert!(preprocess("#include x\n", &key).is_err());
}
