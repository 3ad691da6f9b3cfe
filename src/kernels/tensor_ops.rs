//! `shaders/tensor_ops.wgsl`: copies of 2-D windows between NCHW tensors
//! (crop and paste), the data movement of tiled decoding.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, KernelSpec, PipelineKey, Recorder, StorageType};
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/tensor_ops.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 256;
/// Consecutive row elements per invocation.
pub const ITEMS: u32 = 4;

/// Uniform block of `copy_window` (WGSL `Params`, 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    /// Channel planes (`N · C`).
    pub planes: u32,
    /// Rows copied.
    pub h: u32,
    /// Columns copied.
    pub w: u32,
    /// Invocations per row (`ceil(w / ITEMS)`).
    pub row_chunks: u32,
    /// The source window (WGSL `src_h`, `src_w`, `sy`, `sx`).
    pub src: PlacedWindow,
    /// The destination window (WGSL `dst_h`, `dst_w`, `dy`, `dx`).
    pub dst: PlacedWindow,
}

/// A window's planes and origin, one side of [`Params`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct PlacedWindow {
    /// Plane height.
    pub plane_h: u32,
    /// Plane width.
    pub plane_w: u32,
    /// The window's first row.
    pub y: u32,
    /// The window's first column.
    pub x: u32,
}

/// Copies a window of every plane into a window of another tensor.
pub const COPY_WINDOW: KernelSpec =
    spec::<Params>("tensor_ops", SOURCE, "copy_window", &[Read, ReadWrite]);

/// `None`: raw 32-bit words (f32, rgba8); else 16-bit elements of this storage.
fn key(half: Option<StorageType>) -> PipelineKey {
    let key = PipelineKey::new(&COPY_WINDOW)
        .constant("WG", format!("{WG}u"))
        .constant("ITEMS", format!("{ITEMS}u"));
    match half {
        None => key.flag("WORDS"),
        Some(t) => key.storage("src", t).storage("dst", t),
    }
}

fn element_storage(rec: &Recorder, dtype: DType) -> Result<Option<StorageType>> {
    Ok(match dtype {
        DType::F32 | DType::Rgba8 => None,
        d => Some(StorageType::of(d, rec.ctx().caps())?),
    })
}

/// A window of a tensor's `H x W` planes: origin and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Window {
    /// First row.
    pub y: usize,
    /// First column.
    pub x: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

impl Window {
    /// The window of `h` rows and `w` columns at `(y, x)`.
    pub fn new(y: usize, x: usize, h: usize, w: usize) -> Self {
        Window { y, x, h, w }
    }
    /// One past the last row.
    pub fn bottom(&self) -> usize {
        self.y + self.h
    }
    /// One past the last column.
    pub fn right(&self) -> usize {
        self.x + self.w
    }
    /// Pixels (`h · w`).
    pub fn area(&self) -> usize {
        self.h * self.w
    }
    /// The overlap of two windows, if not empty.
    pub fn intersect(&self, o: &Window) -> Option<Window> {
        let y = self.y.max(o.y);
        let x = self.x.max(o.x);
        let b = self.bottom().min(o.bottom());
        let r = self.right().min(o.right());
        (b > y && r > x).then(|| Window::new(y, x, b - y, r - x))
    }
}

/// `[N, C, H, W]` of a rank-4 tensor, `[N, 1, H, W]` for a rank-3 (image) one.
fn planes_hw(op: &str, t: &Tensor) -> Result<(usize, usize, usize)> {
    match *t.shape() {
        [n, c, h, w] => Ok((n * c, h, w)),
        [n, h, w] => Ok((n, h, w)),
        _ => Err(Error::shape(
            op,
            format!("expected an [N, C, H, W] or [N, H, W] tensor, got {t:?}"),
        )),
    }
}

/// Copies the `size` window at `(sy, sx)` of every plane of `src` to
/// `(dy, dx)` of the same plane of `dst`. src `[N, C, Hs, Ws]`, dst
/// `[N, C, Hd, Wd]` (or `[N, H, W]` images): same `N * C`, same dtype (f32,
/// f16, bf16 or rgba8). `src` and `dst` must not overlap.
pub fn copy_window(
    rec: &mut Recorder,
    src: &Tensor,
    (sy, sx): (usize, usize),
    dst: &Tensor,
    (dy, dx): (usize, usize),
    (h, w): (usize, usize),
) -> Result<()> {
    const OP: &str = "copy_window";
    let (sp, sh, sw) = planes_hw(OP, src)?;
    let (dp, dh, dw) = planes_hw(OP, dst)?;
    if src.dtype() != dst.dtype() {
        return Err(Error::shape(
            OP,
            format!("src {src:?} and dst {dst:?} must share a dtype"),
        ));
    }
    if sp != dp {
        return Err(Error::shape(
            OP,
            format!("src {src:?} and dst {dst:?} have different N * C"),
        ));
    }
    if sy + h > sh || sx + w > sw || dy + h > dh || dx + w > dw {
        return Err(Error::shape(
            OP,
            format!("{h}x{w} window at ({sy}, {sx}) of {src:?} to ({dy}, {dx}) of {dst:?} is out of bounds"),
        ));
    }
    if src.overlaps(dst) {
        return Err(Error::shape(OP, "src and dst overlap".to_string()));
    }
    if h == 0 || w == 0 || sp == 0 {
        return Ok(());
    }
    let row_chunks = w.div_ceil(ITEMS as usize);
    let total = (sp * h * row_chunks) as u64;
    let u = |v: usize| {
        u32::try_from(v).map_err(|_| Error::shape(OP, format!("{v} exceeds u32 indexing")))
    };
    u(src.numel())?;
    u(dst.numel())?;
    let placed = |plane_h, plane_w, y, x| -> Result<PlacedWindow> {
        Ok(PlacedWindow {
            plane_h: u(plane_h)?,
            plane_w: u(plane_w)?,
            y: u(y)?,
            x: u(x)?,
        })
    };
    let params = Params {
        planes: u(sp)?,
        h: u(h)?,
        w: u(w)?,
        row_chunks: u(row_chunks)?,
        src: placed(sh, sw, sy, sx)?,
        dst: placed(dh, dw, dy, dx)?,
    };
    let groups = linear_groups(rec.ctx(), total.div_ceil(WG as u64))?;
    let key = key(element_storage(rec, src.dtype())?);
    rec.dispatch(&COPY_WINDOW, &key, &params, &[src, dst], groups, 0)
}

/// CPU reference of [`copy_window`] on plane-major data: `src` has `planes`
/// planes of `sh x sw`, `dst` of `dh x dw`.
#[allow(clippy::too_many_arguments)]
pub fn cpu_copy_window<T: Copy>(
    src: &[T],
    (sh, sw): (usize, usize),
    (sy, sx): (usize, usize),
    dst: &mut [T],
    (dh, dw): (usize, usize),
    (dy, dx): (usize, usize),
    (h, w): (usize, usize),
    planes: usize,
) {
    for p in 0..planes {
        for y in 0..h {
            let s = (p * sh + sy + y) * sw + sx;
            let d = (p * dh + dy + y) * dw + dx;
            dst[d..d + w].copy_from_slice(&src[s..s + w]);
        }
    }
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = vec![(COPY_WINDOW, key(None))];
    for t in &StorageType::ALL[1..] {
        v.push((COPY_WINDOW, key(Some(*t))));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{rand_vec, test_context};

    /// Windows of odd sizes, at odd offsets, between tensors of different
    /// plane sizes, batch 2 x 3 channels; exact (bit) equality with the CPU.
    #[test]
    fn copy_window_matches_cpu_on_odd_windows() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            copy_windows_exactly(&ctx, dt);
        }
    }

    fn copy_windows_exactly(ctx: &crate::Context, dt: DType) {
        let ctx = ctx.clone();
        let (n, c) = (2, 3);
        let (sh, sw, dh, dw) = (19, 23, 13, 11);
        let round = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .map(|x| crate::gpu::storage::round_through(x, dt))
                .collect()
        };
        let src_data = round(rand_vec(n * c * sh * sw, 7, 3.0));
        let dst_data = round(rand_vec(n * c * dh * dw, 8, 3.0));
        for (s, d, size) in [
            ((0, 0), (0, 0), (13, 11)),
            ((5, 7), (2, 3), (9, 5)),
            ((18, 22), (12, 10), (1, 1)),
            ((3, 1), (0, 4), (7, 7)),
            ((6, 12), (1, 0), (12, 11)),
        ] {
            let src = Tensor::from_f32_as(&ctx, &[n, c, sh, sw], &src_data, dt, "src").unwrap();
            let dst = Tensor::from_f32_as(&ctx, &[n, c, dh, dw], &dst_data, dt, "dst").unwrap();
            let mut rec = Recorder::new(&ctx);
            copy_window(&mut rec, &src, s, &dst, d, size).unwrap();
            rec.submit().unwrap();
            let mut want = dst_data.clone();
            cpu_copy_window(&src_data, (sh, sw), s, &mut want, (dh, dw), d, size, n * c);
            let got = dst.to_f32(&ctx).unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} copy {size:?} from {s:?} to {d:?}",
                dt.name()
            );
        }
    }

    #[test]
    fn out_of_bounds_and_mismatches_are_errors() {
        let ctx = test_context();
        let a = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::F32, "a").unwrap();
        let b = Tensor::empty(&ctx, &[1, 3, 4, 4], DType::F32, "b").unwrap();
        let c = Tensor::empty(&ctx, &[1, 2, 4, 4], DType::F32, "c").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(matches!(
            copy_window(&mut rec, &a, (2, 2), &b, (0, 0), (4, 4)),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            copy_window(&mut rec, &a, (0, 0), &c, (0, 0), (2, 2)),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            copy_window(&mut rec, &a, (0, 0), &a, (1, 1), (2, 2)),
            Err(Error::Shape { .. })
        ));
    }

    #[test]
    fn window_intersection() {
        let a = Window::new(2, 3, 4, 5);
        assert_eq!(
            a.intersect(&Window::new(4, 0, 10, 4)),
            Some(Window::new(4, 3, 2, 1))
        );
        assert_eq!(a.intersect(&Window::new(6, 3, 1, 1)), None);
    }
}
