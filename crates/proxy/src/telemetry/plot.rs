//! Small inline SVG plots for the status page, rendered on the server (no script, no external asset:
//! the admin port may have no internet): one `<path>` per series, so a gap (a backend not in the config
//! for a while) breaks its line without making it two series.

use std::fmt::Write;

/// Colours of the series, in order (then again): distinct on white and for most colour blindness
/// (Okabe and Ito's palette).
pub(crate) const COLOURS: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000",
];

/// One line of a plot: its name (the `data-series` attribute) and a value per slot, oldest first.
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) values: Vec<Option<f64>>,
}

const WIDTH: f64 = 240.0;
const HEIGHT: f64 = 60.0;
/// Room for the title above the plot area.
const TOP: f64 = 14.0;

/// A plot titled `title` of `series` over `slots` slots (the newest at the right edge), its y axis from
/// 0 to the largest value (written in the title with `unit`), each series in its colour of
/// [`COLOURS`] by its position. A lone point is drawn as a dot (a zero-length stroke, round caps).
pub(crate) fn svg(title: &str, unit: &str, series: &[Series<'_>], slots: usize) -> String {
    let finite = |v: &Option<f64>| v.filter(|v| v.is_finite());
    let max = (series.iter())
        .flat_map(|s| s.values.iter().filter_map(finite))
        .fold(0.0_f64, f64::max);
    let scale = if max > 0.0 { max } else { 1.0 };
    let step = WIDTH / slots.saturating_sub(1).max(1) as f64;
    let mut out = format!(
        "<svg class=\"plot\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\"><title>{t}</title>\
         <rect x=\"0\" y=\"{TOP}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#fafafa\" \
         stroke=\"#ddd\"/><text x=\"2\" y=\"10\" font-size=\"10\" fill=\"#555\">{t} (max {m}{u})\
         </text>",
        w = WIDTH,
        h = HEIGHT + TOP,
        t = escape(title),
        m = round(max),
        u = escape(unit),
    );
    for (i, line) in series.iter().enumerate() {
        // Right-aligned: the newest slot at the right edge, however few there are yet.
        let first = slots.saturating_sub(line.values.len());
        let mut d = String::new();
        let mut drawing = false;
        for (slot, value) in line.values.iter().enumerate() {
            let Some(value) = finite(value) else {
                drawing = false;
                continue;
            };
            let x = (first + slot) as f64 * step;
            let y = TOP + HEIGHT - value / scale * (HEIGHT - 2.0) - 1.0;
            let command = if drawing { 'L' } else { 'M' };
            let _ = write!(d, "{command}{x:.1} {y:.1}");
            let lone = !drawing
                && line
                    .values
                    .get(slot + 1)
                    .is_none_or(|next| finite(next).is_none());
            if lone {
                d.push_str("h0");
            }
            drawing = true;
        }
        let _ = write!(
            out,
            "<path class=\"series\" data-series=\"{}\" d=\"{d}\" fill=\"none\" stroke=\"{}\" \
             stroke-width=\"1.5\" stroke-linecap=\"round\" stroke-linejoin=\"round\"/>",
            escape(line.name),
            COLOURS[i % COLOURS.len()],
        );
    }
    out.push_str("</svg>");
    out
}

/// Three significant figures at most, without trailing zeros.
fn round(value: f64) -> String {
    let text = if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// Text for HTML and its attributes: a cluster's or route's name is any YAML string.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_is_one_path_broken_at_gaps_and_scaled_to_the_largest_value() {
        let series = [
            Series {
                name: "127.0.0.1:1",
                values: vec![Some(0.0), Some(2.0), None, Some(1.0)],
            },
            Series {
                name: "a<b",
                values: vec![Some(1.0)],
            },
        ];
        let svg = svg("in flight", "", &series, 4);
        assert_eq!(svg.matches("<path ").count(), 2, "{svg}");
        assert!(svg.contains("(max 2)"), "{svg}");
        // x: 80 per slot; y: 0 at the bottom (73), the largest at the top (15).
        assert!(
            svg.contains("data-series=\"127.0.0.1:1\" d=\"M0.0 73.0L80.0 15.0M240.0 44.0h0\""),
            "{svg}"
        );
        // One value of four slots: at the right edge, a dot; the name escaped.
        assert!(
            svg.contains(
                "data-series=\"a&lt;b\" d=\"M240.0 44.0h0\" fill=\"none\" stroke=\"#e69f00\""
            ),
            "{svg}"
        );
        let empty = self::svg("p99", " ms", &[], 30);
        assert!(
            empty.contains("(max 0 ms)") && !empty.contains("<path"),
            "{empty}"
        );
    }

    #[test]
    fn maxima_are_written_short() {
        assert_eq!(round(0.0), "0");
        assert_eq!(round(2.5), "2.5");
        assert_eq!(round(0.333), "0.33");
        assert_eq!(round(12.34), "12.3");
        assert_eq!(round(250.0), "250");
    }
}
