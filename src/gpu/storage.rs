//! How tensor elements sit in WGSL storage bindings, and the accessor
//! functions generated for them.
//!
//! Kernels never index a tensor binding directly. A shader line
//!
//! ```text
//! #storage NAME BINDING read|write|shared [vec4]
//! ```
//!
//! expands (per pipeline key) into the binding's declaration plus
//! `NAME_ld(i: u32) -> f32` (or `NAME_ld4(i) -> vec4<f32>` with `vec4`) and,
//! for `write`, `NAME_st(i: u32, v: f32)`. Arithmetic stays f32 in every
//! storage type; only loads and stores convert. `shared` is a read-only
//! binding that may alias a written one in the same dispatch (in-place
//! residuals): packed storage then reads it atomically.
//!
//! Packed types hold two 16-bit elements per `u32` (element `2k` in the low
//! half). A store touches only its own half with `atomicAnd` + `atomicOr`,
//! so neighbouring invocations writing the two halves of a word never race,
//! whatever the shape. This is the fallback for f16 without `shader-f16`,
//! and always the bf16 path (WGSL has no bf16 type).

use crate::error::{Error, Result};
use crate::gpu::tensor::DType;
use crate::gpu::Capabilities;

/// Largest finite f16. f16 stores saturate here, so an overflow leaves a
/// value the finiteness check sees instead of an implementation-defined one.
pub(crate) const F16_MAX: f32 = 65504.0;

/// The WGSL representation of one tensor binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StorageType {
    /// `array<f32>`.
    F32,
    /// `array<f16>` (needs `shader-f16`).
    F16,
    /// f16 pairs packed in `array<u32>` (`unpack2x16float`/`pack2x16float`).
    F16Packed,
    /// bf16 pairs packed in `array<u32>`: the high 16 bits of an f32,
    /// rounded to nearest even on store.
    BF16,
}

impl StorageType {
    /// How a tensor of `dtype` is stored on this device.
    pub fn of(dtype: DType, caps: &Capabilities) -> Result<StorageType> {
        match dtype {
            DType::F32 => Ok(StorageType::F32),
            DType::F16 if caps.shader_f16 => Ok(StorageType::F16),
            DType::F16 => Ok(StorageType::F16Packed),
            DType::BF16 => Ok(StorageType::BF16),
            DType::Rgba8 => Err(Error::Unsupported(
                "rgba8 tensors have no float storage accessors".into(),
            )),
        }
    }

    /// Every storage type (for validating all shader variants).
    pub const ALL: [StorageType; 4] = [
        StorageType::F32,
        StorageType::F16,
        StorageType::F16Packed,
        StorageType::BF16,
    ];

    /// Short name (`f32`, `f16`, `f16x2`, `bf16x2`) for keys and reports.
    pub fn name(self) -> &'static str {
        match self {
            StorageType::F32 => "f32",
            StorageType::F16 => "f16",
            StorageType::F16Packed => "f16x2",
            StorageType::BF16 => "bf16x2",
        }
    }

    fn packed(self) -> bool {
        matches!(self, StorageType::F16Packed | StorageType::BF16)
    }
}

/// What a kernel does with a `#storage` binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Read and written (gets a `_st` store accessor).
    Write,
    /// Read only, but may alias a binding written in the same dispatch.
    Shared,
}

/// Helpers the packed accessors call; emitted once per module.
const PACKED_HELPERS: &str = "\
fn storage_f16_decode(w: u32, odd: u32) -> f32 { return unpack2x16float(w)[odd]; }
fn storage_f16_encode(v: f32) -> u32 {
    return pack2x16float(vec2<f32>(clamp(v, -65504.0, 65504.0), 0.0)) & 0xffffu;
}
fn storage_bf16_decode(w: u32, odd: u32) -> f32 {
    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, odd == 1u));
}
fn storage_bf16_encode(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if (b & 0x7fffffffu) > 0x7f800000u { return 0x7fc0u; } // NaN stays NaN
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;     // round to nearest even
}
";

/// True when any of `types` needs [`PACKED_HELPERS`].
pub(crate) fn needs_packed_helpers(types: impl IntoIterator<Item = StorageType>) -> bool {
    types.into_iter().any(StorageType::packed)
}

pub(crate) fn packed_helpers() -> &'static str {
    PACKED_HELPERS
}

/// WGSL declaration and accessors of one `#storage` binding.
pub(crate) fn declare(
    name: &str,
    binding: u32,
    ty: StorageType,
    access: Access,
    vec4: bool,
) -> Result<String> {
    let decl = |elem: &str| {
        format!("@group(0) @binding({binding}) var<storage, read_write> {name}: array<{elem}>;\n")
    };
    if vec4 {
        if access != Access::Read {
            return Err(Error::Shader {
                name: name.into(),
                message: "vec4 storage accessors are read-only".into(),
            });
        }
        return Ok(match ty {
            StorageType::F32 => {
                decl("vec4<f32>")
                    + &format!("fn {name}_ld4(i: u32) -> vec4<f32> {{ return {name}[i]; }}\n")
            }
            StorageType::F16 => {
                decl("vec4<f16>")
                    + &format!(
                        "fn {name}_ld4(i: u32) -> vec4<f32> {{ return vec4<f32>({name}[i]); }}\n"
                    )
            }
            StorageType::F16Packed => {
                decl("vec2<u32>")
                    + &format!(
                        "fn {name}_ld4(i: u32) -> vec4<f32> {{ let w = {name}[i]; \
                     return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)); }}\n"
                    )
            }
            StorageType::BF16 => {
                decl("vec2<u32>")
                    + &format!(
                        "fn {name}_ld4(i: u32) -> vec4<f32> {{ let w = {name}[i]; \
                     return vec4<f32>(storage_bf16_decode(w.x, 0u), storage_bf16_decode(w.x, 1u), \
                     storage_bf16_decode(w.y, 0u), storage_bf16_decode(w.y, 1u)); }}\n"
                    )
            }
        });
    }
    let mut s = String::new();
    match ty {
        StorageType::F32 | StorageType::F16 => {
            let elem = if ty == StorageType::F32 { "f32" } else { "f16" };
            s += &decl(elem);
            s += &format!("fn {name}_ld(i: u32) -> f32 {{ return f32({name}[i]); }}\n");
            if access == Access::Write {
                let v = if ty == StorageType::F32 {
                    "v".to_string()
                } else {
                    format!("f16(clamp(v, -{F16_MAX:.1}, {F16_MAX:.1}))")
                };
                s += &format!("fn {name}_st(i: u32, v: f32) {{ {name}[i] = {v}; }}\n");
            }
        }
        StorageType::F16Packed | StorageType::BF16 => {
            let codec = if ty == StorageType::BF16 {
                "storage_bf16"
            } else {
                "storage_f16"
            };
            let word = if access == Access::Read {
                s += &decl("u32");
                format!("{name}[i >> 1u]")
            } else {
                s += &decl("atomic<u32>");
                format!("atomicLoad(&{name}[i >> 1u])")
            };
            s += &format!(
                "fn {name}_ld(i: u32) -> f32 {{ return {codec}_decode({word}, i & 1u); }}\n"
            );
            if access == Access::Write {
                s += &format!(
                    "fn {name}_st(i: u32, v: f32) {{\n    let s = (i & 1u) * 16u;\n    \
                     atomicAnd(&{name}[i >> 1u], ~(0xffffu << s));\n    \
                     atomicOr(&{name}[i >> 1u], {codec}_encode(v) << s);\n}}\n"
                );
            }
        }
    }
    Ok(s)
}

/// Parses the arguments of a `#storage` line: (name, binding, access, vec4).
pub(crate) fn parse_directive(
    rest: &str,
) -> std::result::Result<(&str, u32, Access, bool), String> {
    let parts: Vec<&str> = rest.split_whitespace().collect();
    let (name, binding, access) = match parts.as_slice() {
        [n, b, a] | [n, b, a, _] => (*n, *b, *a),
        _ => return Err("expected `#storage NAME BINDING read|write|shared [vec4]`".into()),
    };
    let binding = binding
        .parse::<u32>()
        .map_err(|_| format!("binding `{binding}` is not a number"))?;
    let access = match access {
        "read" => Access::Read,
        "write" => Access::Write,
        "shared" => Access::Shared,
        a => return Err(format!("unknown access `{a}`")),
    };
    let vec4 = match parts.get(3) {
        None => false,
        Some(&"vec4") => true,
        Some(o) => return Err(format!("unknown width `{o}`")),
    };
    Ok((name, binding, access, vec4))
}

/// Host-side encoding of f32 values into a tensor dtype's bytes (round to
/// nearest even, like the shaders' stores; f16 saturates at ±65504). f32
/// data is borrowed as it is.
pub(crate) fn encode_f32(data: &[f32], dtype: DType) -> Result<std::borrow::Cow<'_, [u8]>> {
    Ok(match dtype {
        DType::F32 => std::borrow::Cow::Borrowed(bytemuck::cast_slice(data)),
        DType::F16 => data
            .iter()
            .flat_map(|&v| {
                let v = if v.is_nan() {
                    v
                } else {
                    v.clamp(-F16_MAX, F16_MAX)
                };
                half::f16::from_f32(v).to_le_bytes()
            })
            .collect::<Vec<u8>>()
            .into(),
        DType::BF16 => data
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
        DType::Rgba8 => {
            return Err(Error::Unsupported(
                "f32 values cannot be stored as rgba8".into(),
            ))
        }
    })
}

/// `v` rounded through `dtype` (what a store then a load gives).
pub fn round_through(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => {
            let v = if v.is_nan() {
                v
            } else {
                v.clamp(-F16_MAX, F16_MAX)
            };
            half::f16::from_f32(v).to_f32()
        }
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse_and_reject_garbage() {
        assert_eq!(
            parse_directive("x 1 read").unwrap(),
            ("x", 1, Access::Read, false)
        );
        assert_eq!(
            parse_directive("wt 2 read vec4").unwrap(),
            ("wt", 2, Access::Read, true)
        );
        assert!(parse_directive("x one read").is_err());
        assert!(parse_directive("x 1 mutate").is_err());
        assert!(parse_directive("x 1").is_err());
        assert!(parse_directive("x 1 read vec3").is_err());
        assert!(declare("w", 1, StorageType::F32, Access::Write, true).is_err());
    }

    #[test]
    fn host_rounding_matches_half() {
        assert_eq!(round_through(1.0 + 1.0 / 4096.0, DType::F16), 1.0);
        assert_eq!(round_through(1e6, DType::F16), F16_MAX);
        assert_eq!(round_through(-1e6, DType::F16), -F16_MAX);
        assert_eq!(round_through(1e6, DType::BF16), 999424.0);
        assert!(round_through(f32::NAN, DType::BF16).is_nan());
        let bytes = encode_f32(&[1.0, -2.0], DType::BF16).unwrap();
        assert_eq!(&bytes[..], &[0x80, 0x3f, 0x00, 0xc0]);
    }
}
