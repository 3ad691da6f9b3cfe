//! SVG line charts for the reports (linear or log-log axes).

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use wgvae::error::{Error, Result};

/// Characters of a chart title that fit the 800-pixel width at the caption's font size.
const TITLE_CHARS: usize = 72;

/// `title` shortened to [`TITLE_CHARS`] with an ellipsis (a caption is not wrapped).
fn fit_title(title: &str) -> String {
    if title.chars().count() <= TITLE_CHARS {
        return title.to_string();
    }
    let mut t: String = title.chars().take(TITLE_CHARS - 1).collect();
    t.push('…');
    t
}

/// An SVG line chart with points and a legend; non-finite points are left
/// out. Series `i` is drawn dashed with hollow, larger points when
/// `dashed[i]` (`&[]`: none), so a series lying on another (reserved =
/// allocated) leaves the one under it visible.
pub(crate) fn line_chart(
    path: &Path,
    title: &str,
    axes: (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    dashed: &[bool],
) -> Result<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, data)| {
            let finite = data.iter().filter(|p| p.0.is_finite() && p.1.is_finite());
            (name.clone(), finite.copied().collect())
        })
        .collect();
    let (xmax, ymax) = series
        .iter()
        .flat_map(|s| s.1.iter())
        .fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let layout = Layout {
        size: (800, 500),
        y_label_area: 60,
        color: |i| {
            let palette = [
                RED,
                BLUE,
                GREEN,
                MAGENTA,
                CYAN,
                BLACK,
                RGBColor(255, 140, 0),
            ];
            palette[i % palette.len()].to_rgba()
        },
    };
    let x = 0.0..xmax.max(1e-3) * 1.05;
    let y = 0.0..ymax.max(1e-3) * 1.1;
    draw(
        path,
        &layout,
        &fit_title(title),
        axes,
        (x, y),
        &series,
        dashed,
    )
}

/// An SVG chart with both axes logarithmic, points and a legend.
pub(crate) fn loglog_chart(
    path: &Path,
    title: &str,
    axes: (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let pts = || series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, 0.0f64, f64::MAX, 0.0f64);
    for p in pts() {
        x0 = x0.min(p.0);
        x1 = x1.max(p.0);
        y0 = y0.min(p.1);
        y1 = y1.max(p.1);
    }
    if x1 <= 0.0 {
        (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
    }
    let layout = Layout {
        size: (900, 600),
        y_label_area: 70,
        color: |i| Palette99::pick(i).to_rgba(),
    };
    let x = (x0 / 1.3..x1 * 1.3).log_scale();
    let y = (y0 / 1.5..y1 * 1.5).log_scale();
    draw(path, &layout, title, axes, (x, y), series, &[])
}

/// What differs between the chart kinds besides their axes.
struct Layout {
    size: (u32, u32),
    y_label_area: u32,
    color: fn(usize) -> RGBAColor,
}

/// Draws `series` over axes `x` × `y` into the SVG `path`: series `i` dashed
/// with hollow points when `dashed[i]`, else solid with filled points.
fn draw<X, Y>(
    path: &Path,
    layout: &Layout,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    (x, y): (X, Y),
    series: &[(String, Vec<(f64, f64)>)],
    dashed: &[bool],
) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: String| Error::BadFile {
        path: path.to_path_buf(),
        message: format!("could not draw the plot: {e}"),
    };
    // Drawn into memory, written as every report file is (a link planted
    // at `path` is replaced, not followed).
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, layout.size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(layout.y_label_area)
            .build_cartesian_2d(x, y)
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(|e| err(e.to_string()))?;
        for (i, (name, data)) in series.iter().enumerate() {
            let color = (layout.color)(i);
            if dashed.get(i).copied().unwrap_or(false) {
                chart
                    .draw_series(DashedLineSeries::new(
                        data.clone(),
                        8,
                        6,
                        color.stroke_width(2),
                    ))
                    .map_err(|e| err(e.to_string()))?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        data.iter()
                            .map(|p| Circle::new(*p, 6, color.stroke_width(2))),
                    )
                    .map_err(|e| err(e.to_string()))?;
                continue;
            }
            chart
                .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
                .map_err(|e| err(e.to_string()))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(data.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    super::write(path, &svg)
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_titles_are_shortened_to_fit() {
        let long = "decode memory (vae ../shared/weights/taef2/decoder.safetensors, sizes [256, 512], dtypes [\"f32\"])";
        let t = super::fit_title(long);
        assert_eq!(t.chars().count(), super::TITLE_CHARS);
        assert!(t.ends_with('…') && long.starts_with(t.trim_end_matches('…')));
        assert_eq!(super::fit_title("short"), "short");
    }
}
