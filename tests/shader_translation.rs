//! Every shader variant the engine can request translates with naga to the
//! language of each wgpu backend: SPIR-V (Vulkan), MSL (Metal), HLSL (DX12)
//! and GLSL ES 3.10 (GL), with the options wgpu-hal 30 uses, so Metal, DX12
//! and GL users are not the first to meet a translation error. Variants that
//! need `shader-f16` are not translated to GLSL: wgpu's GL backend never
//! offers `SHADER_F16`, so the engine never requests them there.
//!
//! This checks naga's translation only; the platform compilers (Metal's,
//! DXC/FXC, the GL driver) are not on this machine.

use naga::back::{glsl, hlsl, msl, spv};
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use naga::{AddressSpace, Module, ResourceBinding, ShaderStage};

use wgvae::gpu::{preprocess, KernelSpec, PipelineKey};
use wgvae::kernels::all_variants;

/// How many variants each target translated.
#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    variants: usize,
    f16: usize,
    coop: usize,
    spv: usize,
    msl: usize,
    hlsl: usize,
    glsl: usize,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.variants += o.variants;
        self.f16 += o.f16;
        self.coop += o.coop;
        self.spv += o.spv;
        self.msl += o.msl;
        self.hlsl += o.hlsl;
        self.glsl += o.glsl;
    }
}

/// wgpu's bounds checks on Vulkan without robust buffer access and on Metal:
/// indices clamped (`Restrict`).
fn checked() -> BoundsCheckPolicies {
    BoundsCheckPolicies {
        index: BoundsCheckPolicy::Restrict,
        buffer: BoundsCheckPolicy::Restrict,
        image_load: BoundsCheckPolicy::Restrict,
        binding_array: BoundsCheckPolicy::Unchecked,
    }
}

/// Resource bindings of the module (group 0 only: the engine uses no other).
fn bindings(module: &Module) -> Vec<(ResourceBinding, AddressSpace)> {
    let mut v: Vec<_> = module
        .global_variables
        .iter()
        .filter_map(|(_, var)| var.binding.map(|b| (b, var.space)))
        .collect();
    v.sort_by_key(|(b, _)| (b.group, b.binding));
    v
}

fn to_spv(module: &Module, info: &ModuleInfo, entry: &str) -> Result<(), String> {
    // SPIR-V 1.0 (Vulkan 1.0 devices) and workgroup memory zeroed by code, as
    // wgpu does without the zero-initialize extension: the strictest setting.
    let options = spv::Options {
        lang_version: (1, 0),
        bounds_check_policies: checked(),
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::Polyfill,
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: ShaderStage::Compute,
        entry_point: entry.into(),
    };
    spv::write_vec(module, info, &options, Some(&pipeline))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn to_msl(module: &Module, info: &ModuleInfo, entry: &str) -> Result<(), String> {
    // Slots as wgpu-hal's Metal backend assigns them: buffers and textures count
    // separately, and a sizes buffer follows the buffers (runtime-sized arrays
    // under bounds checks).
    let mut resources = msl::BindingMap::default();
    let (mut buffers, mut textures) = (0u8, 0u8);
    for (b, space) in bindings(module) {
        let mut target = msl::BindTarget {
            mutable: true,
            ..Default::default()
        };
        if space == AddressSpace::Handle {
            target.texture = Some(textures);
            textures += 1;
        } else {
            target.buffer = Some(buffers);
            buffers += 1;
        }
        resources.insert(b, target);
    }
    let options = msl::Options {
        lang_version: (2, 4),
        per_entry_point_map: msl::EntryPointResourceMap::from([(
            entry.to_string(),
            msl::EntryPointResources {
                resources,
                immediates_buffer: None,
                sizes_buffer: Some(buffers),
            },
        )]),
        fake_missing_bindings: false,
        bounds_check_policies: checked(),
        ..Default::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((ShaderStage::Compute, entry.into())),
        ..Default::default()
    };
    msl::write_string(module, info, &options, &pipeline)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn to_hlsl(module: &Module, info: &ModuleInfo, entry: &str, f16: bool) -> Result<(), String> {
    // FXC's shader model 5.1 unless the variant needs f16, which DX12 offers
    // only through DXC at shader model 6.2 or later.
    let shader_model = if f16 {
        hlsl::ShaderModel::V6_2
    } else {
        hlsl::ShaderModel::V5_1
    };
    let mut binding_map = hlsl::BindingMap::default();
    for (b, _) in bindings(module) {
        binding_map.insert(
            b,
            hlsl::BindTarget {
                space: b.group as u8,
                register: b.binding,
                ..Default::default()
            },
        );
    }
    let options = hlsl::Options {
        shader_model,
        binding_map,
        fake_missing_bindings: false,
        zero_initialize_workgroup_memory: true,
        restrict_indexing: true,
        ..Default::default()
    };
    let pipeline = hlsl::PipelineOptions {
        entry_point: Some((ShaderStage::Compute, entry.into())),
    };
    let mut out = String::new();
    hlsl::Writer::new(&mut out, &options, &pipeline)
        .write(module, info, None)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn to_glsl(module: &Module, info: &ModuleInfo, entry: &str) -> Result<(), String> {
    // Slots as wgpu-hal's GL backend assigns them: one counter per resource kind.
    let mut binding_map = glsl::BindingMap::default();
    let (mut uniforms, mut storage, mut images) = (0u8, 0u8, 0u8);
    for (b, space) in bindings(module) {
        let counter = match space {
            AddressSpace::Uniform => &mut uniforms,
            AddressSpace::Handle => &mut images,
            _ => &mut storage,
        };
        binding_map.insert(b, *counter);
        *counter += 1;
    }
    let options = glsl::Options {
        version: glsl::Version::Embedded {
            version: 310,
            is_webgl: false,
        },
        writer_flags: glsl::WriterFlags::ADJUST_COORDINATE_SPACE
            | glsl::WriterFlags::FORCE_POINT_SIZE,
        binding_map,
        zero_initialize_workgroup_memory: true,
    };
    let pipeline = glsl::PipelineOptions {
        shader_stage: ShaderStage::Compute,
        entry_point: entry.into(),
        multiview: None,
    };
    // wgpu's GL backend leaves buffer and index checks to GLSL (unchecked here).
    let policies = BoundsCheckPolicies {
        index: BoundsCheckPolicy::Unchecked,
        buffer: BoundsCheckPolicy::Unchecked,
        image_load: BoundsCheckPolicy::Unchecked,
        binding_array: BoundsCheckPolicy::Unchecked,
    };
    let mut out = String::new();
    glsl::Writer::new(&mut out, module, info, &options, &pipeline, policies)
        .and_then(|mut w| w.write())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Cooperative loads and stores need 16-byte-aligned addresses, and drivers place
/// workgroup variables by their natural alignment in an order of their choosing: one 4-byte
/// flag shifted every matrix of the attention kernel by one element on NVIDIA (H100, driver
/// 580). So in a cooperative shader every workgroup variable's size is a multiple of 16
/// bytes.
fn workgroup_sizes_keep_16_byte_alignment(module: &Module) -> Result<(), String> {
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .map_err(|e| format!("layout: {e}"))?;
    let odd: Vec<String> = module
        .global_variables
        .iter()
        .filter(|(_, v)| v.space == AddressSpace::WorkGroup)
        .filter_map(|(_, v)| {
            let size = layouter[v.ty].size;
            (size % 16 != 0).then(|| format!("{} ({size} bytes)", v.name.as_deref().unwrap_or("?")))
        })
        .collect();
    if odd.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "workgroup variables whose size is not a multiple of 16 bytes (they can misalign the cooperative matrices' staging): {}",
            odd.join(", ")
        ))
    }
}

/// Translates one variant to every target; the errors name variant and target.
fn translate(spec: &KernelSpec, key: &PipelineKey, errors: &mut Vec<String>) -> Counts {
    let name = format!("{}::{} {:?}", spec.family, spec.entry, key.defines);
    let mut c = Counts {
        variants: 1,
        ..Default::default()
    };
    let src = match preprocess(&spec.source, key) {
        Ok(s) => s,
        Err(e) => {
            errors.push(format!("{name}: preprocess: {e}"));
            return c;
        }
    };
    let module = match naga::front::wgsl::parse_str(&src) {
        Ok(m) => m,
        Err(e) => {
            errors.push(format!("{name}: parse: {}", e.emit_to_string(&src)));
            return c;
        }
    };
    let f16 = src.starts_with("enable f16;");
    c.f16 = f16 as usize;
    let info = match Validator::new(ValidationFlags::all(), Capabilities::all()).validate(&module) {
        Ok(i) => i,
        Err(e) => {
            errors.push(format!("{name}: validate: {}", e.emit_to_string(&src)));
            return c;
        }
    };
    let mut check = |target: &str, r: Result<(), String>, n: &mut usize| match r {
        Ok(()) => *n += 1,
        Err(e) => errors.push(format!("{name}: {target}: {e}")),
    };
    check("SPIR-V", to_spv(&module, &info, spec.entry), &mut c.spv);
    check("MSL", to_msl(&module, &info, spec.entry), &mut c.msl);
    // Cooperative matrices exist on Vulkan and Metal only (wgpu's DX12 and GL backends
    // never offer EXPERIMENTAL_COOPERATIVE_MATRIX), so those variants are never requested there.
    let coop = src.contains("enable wgpu_cooperative_matrix;");
    c.coop = coop as usize;
    if coop {
        if let Err(e) = workgroup_sizes_keep_16_byte_alignment(&module) {
            errors.push(format!("{name}: {e}"));
        }
        return c;
    }
    check(
        "HLSL",
        to_hlsl(&module, &info, spec.entry, f16),
        &mut c.hlsl,
    );
    if !f16 {
        check("GLSL", to_glsl(&module, &info, spec.entry), &mut c.glsl);
    }
    c
}

#[test]
fn every_shader_variant_translates_to_spirv_msl_hlsl_and_glsl() {
    let variants = all_variants();
    assert!(!variants.is_empty());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = variants.len().div_ceil(threads);
    let (counts, errors) = std::thread::scope(|s| {
        let handles: Vec<_> = variants
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut errors = Vec::new();
                    let mut c = Counts::default();
                    for (spec, key) in part {
                        c += translate(spec, key, &mut errors);
                    }
                    (c, errors)
                })
            })
            .collect();
        let mut total = Counts::default();
        let mut errors = Vec::new();
        for h in handles {
            let (c, e) = h.join().unwrap();
            total += c;
            errors.extend(e);
        }
        (total, errors)
    });
    let families: std::collections::BTreeSet<&str> =
        variants.iter().map(|(s, _)| s.family).collect();
    println!(
        "{} variants ({} need shader-f16, {} cooperative matrices) of {} families: SPIR-V {}, \
         MSL {}, HLSL {}, GLSL {} (f16 variants are not requested on GL, cooperative ones only \
         on Vulkan and Metal)",
        counts.variants,
        counts.f16,
        counts.coop,
        families.len(),
        counts.spv,
        counts.msl,
        counts.hlsl,
        counts.glsl
    );
    assert!(
        errors.is_empty(),
        "{} translation errors; the first ones:\n{}",
        errors.len(),
        errors
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(counts.spv, counts.variants);
    assert_eq!(counts.msl, counts.variants);
    assert_eq!(counts.hlsl, counts.variants - counts.coop);
    assert!(
        counts.coop > 0,
        "the cooperative-matrix conv variants are listed"
    );
    assert_eq!(counts.glsl, counts.variants - counts.f16);
    assert!(counts.f16 > 0, "some variants store f16 natively");
}
