//! SVG line charts (plotters' SVG backend; no system fonts needed).

use plotters::prelude::*;
use std::{ops::Range, path::Path};

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// Axis options.
#[derive(Debug, Clone, Copy, Default)]
pub struct Axes {
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The axes' ranges: every point shown, room above the highest, and what a log scale can draw.
fn bounds(series: &[Series], axes: Axes) -> Result<(Range<f64>, Range<f64>), String> {
    let points = || series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points() {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if x_min > x_max {
        return Err("nothing to plot".into());
    }
    if axes.log_x {
        x_min = x_min.max(1e-3);
    }
    if axes.log_y {
        y_min = y_min.max(1e-3);
    } else {
        y_min = y_min.min(0.0);
    }
    let y_max = if y_max <= y_min {
        y_min + 1.0
    } else {
        y_max * 1.05
    };
    let x_max = if x_max <= x_min { x_min + 1.0 } else { x_max };
    Ok((x_min..x_max, y_min..y_max))
}

/// Writes a line chart of `series` to `path` as SVG.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    axes: Axes,
) -> Result<(), String> {
    let (x, y) = bounds(series, axes)?;
    let (x_min, x_max, y_min, y_max) = (x.start, x.end, y.start, y.end);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(|e| e.to_string())?;
            for (i, s) in series.iter().enumerate() {
                let colour = COLOURS[i % COLOURS.len()];
                chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        colour.stroke_width(2),
                    ))
                    .map_err(|e| e.to_string())?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| e.to_string())?;
        }};
    }
    match (axes.log_x, axes.log_y) {
        (false, false) => draw!(builder.build_cartesian_2d(x_min..x_max, y_min..y_max)),
        (true, false) => {
            draw!(builder.build_cartesian_2d((x_min..x_max).log_scale(), y_min..y_max))
        }
        (false, true) => {
            draw!(builder.build_cartesian_2d(x_min..x_max, (y_min..y_max).log_scale()))
        }
        (true, true) => {
            draw!(builder.build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale()))
        }
    }
    root.present().map_err(|e| e.to_string())
}
