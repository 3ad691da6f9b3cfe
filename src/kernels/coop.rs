//! The generated parts that the cooperative-matrix (tensor-core) kernels share: WGSL has no
//! arrays of cooperative matrices, so a subgroup's block of accumulators is written out as
//! named variables `c{i}_{j}`, and the K steps and the epilogue are unrolled over them.
//! Each kernel supplies its operand loads (their staged layouts differ) and its store.

use std::fmt::Write;

/// A subgroup's `mi` x `nj` block of `size` x `size` f32 accumulators.
pub(crate) struct Block {
    /// Side of the square matrices (8 or 16).
    pub size: u32,
    /// Accumulator rows (the subgroup's rows / size).
    pub mi: u32,
    /// Accumulator columns (the subgroup's columns / size).
    pub nj: u32,
}

/// `alias CA / CB / CC` for `size` x `size` matrices: f16 operands A and B, the f32
/// accumulator C.
pub(crate) fn aliases(size: u32, s: &mut String) {
    for (name, ty, role) in [("CA", "f16", "A"), ("CB", "f16", "B"), ("CC", "f32", "C")] {
        let _ = writeln!(s, "alias {name} = coop_mat{size}x{size}<{ty}, {role}>;");
    }
}

impl Block {
    /// [`aliases`] for this block's matrices.
    pub(crate) fn aliases(&self, s: &mut String) {
        aliases(self.size, s);
    }

    /// The zero-initialised accumulators `c{i}_{j}`.
    pub(crate) fn accumulators(&self, s: &mut String) {
        for i in 0..self.mi {
            for j in 0..self.nj {
                let _ = writeln!(s, "    var c{i}_{j}: CC;");
            }
        }
    }

    /// K step `kk` (at offset `kk * size` of the staged tiles): `load_a(kk, i)` and
    /// `load_b(kk, j)` give the WGSL lines that define `a{kk}_{i}` and `b{kk}_{j}`, then
    /// every accumulator takes its product.
    pub(crate) fn step(
        &self,
        s: &mut String,
        kk: u32,
        load_a: impl Fn(u32, u32) -> String,
        load_b: impl Fn(u32, u32) -> String,
    ) {
        for i in 0..self.mi {
            let _ = writeln!(s, "{}", load_a(kk, i));
        }
        for j in 0..self.nj {
            let _ = writeln!(s, "{}", load_b(kk, j));
        }
        for i in 0..self.mi {
            for j in 0..self.nj {
                let _ = writeln!(
                    s,
                    "        c{i}_{j} = coopMultiplyAdd(a{kk}_{i}, b{kk}_{j}, c{i}_{j});"
                );
            }
        }
    }

    /// The epilogue: each accumulator to the subgroup's scratch matrix at `c_sh[cb]`
    /// (row-major), then `store(i, j)` (a WGSL call through which the subgroup's lanes store
    /// it). The barriers stay in workgroup-uniform control flow: every subgroup runs them.
    pub(crate) fn epilogue(&self, s: &mut String, store: impl Fn(u32, u32) -> String) {
        for i in 0..self.mi {
            for j in 0..self.nj {
                let _ = writeln!(
                    s,
                    "    coopStoreT(c{i}_{j}, &c_sh[cb], S);\n    workgroupBarrier();\n    {};\n    workgroupBarrier();",
                    store(i, j)
                );
            }
        }
    }
}
