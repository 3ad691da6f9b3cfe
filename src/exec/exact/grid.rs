//! Tile grids of one resolution level and the input spans of a tile's conv.

use crate::kernels::tensor_ops::Window;

/// Square tiles of `tile` pixels over an `h x w` plane (the last row and
/// column are smaller); a single tile when `tile` is `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    h: usize,
    w: usize,
    th: usize,
    tw: usize,
    rows: usize,
    cols: usize,
}

impl Grid {
    pub(crate) fn new(h: usize, w: usize, tile: Option<usize>) -> Grid {
        let (th, tw) = match tile {
            Some(t) => (t.clamp(1, h.max(1)), t.clamp(1, w.max(1))),
            None => (h.max(1), w.max(1)),
        };
        Grid {
            h,
            w,
            th,
            tw,
            rows: h.div_ceil(th),
            cols: w.div_ceil(tw),
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.rows * self.cols
    }
    /// Tiles in a row.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }
    pub(crate) fn rect(&self, i: usize) -> Window {
        let (r, c) = (i / self.cols, i % self.cols);
        let (y, x) = (r * self.th, c * self.tw);
        Window::new(y, x, self.th.min(self.h - y), self.tw.min(self.w - x))
    }
    /// Tiles overlapping `win`, in raster order.
    pub(super) fn overlapping(&self, win: &Window) -> Vec<usize> {
        if win.h == 0 || win.w == 0 {
            return Vec::new();
        }
        let (r0, r1) = (win.y / self.th, (win.bottom() - 1) / self.th);
        let (c0, c1) = (win.x / self.tw, (win.right() - 1) / self.tw);
        let mut v = Vec::new();
        for r in r0..=r1.min(self.rows - 1) {
            for c in c0..=c1.min(self.cols - 1) {
                v.push(r * self.cols + c);
            }
        }
        v
    }
}

/// For a 3×3 conv on the 2× nearest upsample of an `n`-long axis, output
/// span `[o0, o1)`: the low-resolution input span `[a, b)`, the zero padding
/// before and after, the offset of `o0` in the conv output and its length.
pub(super) fn upsample_span(
    o0: usize,
    o1: usize,
    n: usize,
) -> (usize, usize, u32, u32, usize, usize) {
    let a = o0.saturating_sub(1) / 2;
    let b = ((o1 + 2) / 2).min(n);
    let before = (o0 == 0) as usize;
    let after = (o1 == 2 * n) as usize;
    // Output index j is centred on upsampled row 2a + j + 1 - before.
    let first = 2 * a + 1 - before;
    let len = 2 * (b - a) + before + after - 2;
    (a, b, before as u32, after as u32, o0 - first, len)
}

/// For a conv with kernel `k` and stride `s` over an `n`-long axis zero-padded
/// by `pad_before` (and as much after as the whole-image conv has), output
/// span `[o0, o1)`: the input span `[a, b)` it reads and the zero padding
/// before and after it. Inside the image the halo is real data, so the
/// conv of the padded span is the whole-image conv restricted to the span.
pub(super) fn conv_span(
    o0: usize,
    o1: usize,
    n: usize,
    k: usize,
    s: usize,
    pad_before: usize,
) -> (usize, usize, u32, u32) {
    // Output j reads padded rows [s·j, s·j + k), i.e. input rows shifted by pad_before.
    let lo = (s * o0) as isize - pad_before as isize;
    let hi = (s * (o1 - 1) + k) as isize - pad_before as isize;
    let a = lo.max(0) as usize;
    let b = (hi.min(n as isize) as usize).max(a);
    (a, b, (a as isize - lo) as u32, (hi - b as isize) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_the_plane_once() {
        for (h, w, t) in [
            (40, 48, Some(16)),
            (7, 5, Some(3)),
            (9, 9, None),
            (3, 20, Some(8)),
        ] {
            let g = Grid::new(h, w, t);
            let mut seen = vec![0; h * w];
            for i in 0..g.len() {
                let r = g.rect(i);
                for y in r.y..r.bottom() {
                    for x in r.x..r.right() {
                        seen[y * w + x] += 1;
                    }
                }
                assert_eq!(g.overlapping(&r), vec![i]);
            }
            assert!(seen.iter().all(|&s| s == 1), "{h}x{w} tile {t:?}");
        }
        let g = Grid::new(40, 48, Some(16));
        assert_eq!(g.overlapping(&Window::new(15, 15, 2, 2)), vec![0, 1, 3, 4]);
    }

    /// 1-D conv of `x` zero-padded by (`before`, `after`) with kernel `kern`, stride `s`.
    fn conv1d(x: &[f32], kern: &[f32], s: usize, before: usize, after: usize) -> Vec<f32> {
        let mut p = vec![0.0; before];
        p.extend_from_slice(x);
        p.extend(std::iter::repeat_n(0.0, after));
        let k = kern.len();
        (0..)
            .map(|j| s * j)
            .take_while(|&i| i + k <= p.len())
            .map(|i| (0..k).map(|t| p[i + t] * kern[t]).sum())
            .collect()
    }

    /// Every output span of stride-1 and stride-2 convs (same padding,
    /// diffusers' (0, 1) and TAE's (1, 1) downsampling padding), computed
    /// from the span `conv_span` names with its padding, equals the
    /// whole-axis conv there: the halo rule the tiled encoder relies on.
    #[test]
    fn conv_spans_reproduce_the_whole_conv() {
        let kern3 = [0.5f32, -1.25, 2.0];
        for n in 1..=13usize {
            let x: Vec<f32> = (0..n).map(|i| (i * 7 % 5) as f32 - 1.5).collect();
            for (k, s, before, after) in [(1, 1, 0, 0), (3, 1, 1, 1), (3, 2, 0, 1), (3, 2, 1, 1)] {
                let kern = &kern3[..k];
                let whole = conv1d(&x, kern, s, before, after);
                for o0 in 0..whole.len() {
                    for o1 in o0 + 1..=whole.len() {
                        let (a, b, pb, pa) = conv_span(o0, o1, n, k, s, before);
                        assert!(a <= b && b <= n);
                        assert!(pb as usize <= before && pa as usize <= after);
                        let part = conv1d(&x[a..b], kern, s, pb as usize, pa as usize);
                        assert_eq!(
                            part,
                            whole[o0..o1],
                            "n {n} k {k} s {s} pad ({before}, {after}) [{o0}, {o1})"
                        );
                    }
                }
            }
        }
    }

    /// The upsample span covers exactly the output rows the tile needs.
    #[test]
    fn upsample_spans_cover_their_tiles() {
        for n in [1usize, 2, 5, 8] {
            for o0 in 0..2 * n {
                for o1 in o0 + 1..=2 * n {
                    let (a, b, before, after, off, len) = upsample_span(o0, o1, n);
                    assert!(a < b && b <= n);
                    // Conv output j covers upsampled rows centred at c = 2a + j + 1 - before.
                    let first = 2 * a + 1 - before as usize;
                    assert_eq!(first + off, o0);
                    assert!(off + (o1 - o0) <= len, "n {n} [{o0}, {o1})");
                    // Its 3 taps stay inside the window or hit the zero padding.
                    let (lo, hi) = (first as isize - 1, (first + len) as isize);
                    assert!(lo >= 2 * a as isize - before as isize);
                    assert!(hi <= 2 * b as isize + after as isize);
                    assert_eq!(before == 1, o0 == 0);
                    assert_eq!(after == 1, o1 == 2 * n && b == n);
                }
            }
        }
    }
}
