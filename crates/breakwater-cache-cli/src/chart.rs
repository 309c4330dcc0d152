//! The charts of `demo` and `simulate`: database queries per second over
//! time, one line per strategy, events marked, written as PNG and SVG.
//!
//! Text is drawn with the DejaVu Sans font embedded in the binary
//! (`assets/`), registered with plotters' `ab_glyph` backend, so a chart
//! renders the same on a machine without fonts or fontconfig.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::failure::Failure;
use crate::histogram::count;

/// The font every chart's text is drawn in.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";
/// Size of the PNG, in pixels (the SVG has the same size).
const SIZE: (u32, u32) = (1100, 560);
/// Line colours, one per series in order.
const COLORS: [RGBColor; 4] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// One line: a strategy's database queries in each second.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// Legend text, e.g. `naive`.
    pub(crate) name: String,
    /// Queries started in second `i` at index `i`.
    pub(crate) per_second: Vec<usize>,
}

/// Something that happened, drawn as a dashed vertical line with a label.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    /// When, in seconds since the start.
    pub(crate) at_s: f64,
    /// What, e.g. `outage starts`.
    pub(crate) label: String,
}

/// A chart of database queries per second.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    /// The caption.
    pub(crate) title: String,
    /// The lines, drawn in order.
    pub(crate) lines: Vec<Line>,
    /// The events.
    pub(crate) events: Vec<Event>,
}

/// Writes `chart` as `<dir>/<stem>.png` and `<dir>/<stem>.svg` (creating
/// `dir`); returns both paths.
///
/// # Errors
///
/// A run-time [`Failure`] naming the file that could not be written.
pub(crate) fn write(chart: &Chart, dir: &Path, stem: &str) -> Result<[PathBuf; 2], Failure> {
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|err| {
        Failure::runtime(format!(
            "cannot create {}: {err}; choose another --out",
            dir.display()
        ))
    })?;
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    let failed = |path: &Path, err: &dyn std::fmt::Display| {
        Failure::runtime(format!("cannot write {}: {err}", path.display()))
    };
    draw(BitMapBackend::new(&png, SIZE).into_drawing_area(), chart)
        .map_err(|err| failed(&png, &err))?;
    draw(SVGBackend::new(&svg, SIZE).into_drawing_area(), chart)
        .map_err(|err| failed(&svg, &err))?;
    Ok([png, svg])
}

/// Registers the embedded font once.
fn register_font() -> Result<(), Failure> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(Failure::runtime("the embedded chart font did not load"))
    }
}

/// The largest value of any line, at least 1.
fn peak(chart: &Chart) -> usize {
    chart
        .lines
        .iter()
        .flat_map(|line| line.per_second.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Draws `chart` on `root` and presents it: the caption, a legend row
/// under it (outside the plot, so it hides no line), then the plot.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let root = root.margin(8, 0, 0, 0).titled(&chart.title, (FAMILY, 22))?;
    let (legend, body) = root.split_vertically(34);
    draw_legend(&legend, chart)?;

    let seconds = chart
        .lines
        .iter()
        .map(|line| line.per_second.len())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let y_max = peak(chart) as f64 * 1.25;
    let mut plot = ChartBuilder::on(&body)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(84)
        .build_cartesian_2d(0f64..seconds, 0f64..y_max)?;
    plot.configure_mesh()
        .x_desc("time (s)")
        .y_desc("database queries per second")
        .y_label_formatter(&|v| count(v.round() as usize))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;

    let grey = RGBColor(90, 90, 90);
    for (i, event) in chart.events.iter().enumerate() {
        plot.draw_series(DashedLineSeries::new(
            [(event.at_s, 0.0), (event.at_s, y_max)],
            6,
            4,
            grey.stroke_width(1),
        ))?;
        // Labels stagger down the headroom so neighbours do not overlap.
        let row = (i % 4) as f64;
        plot.draw_series(std::iter::once(Text::new(
            format!(" {}", event.label),
            (event.at_s, y_max * (0.985 - 0.055 * row)),
            (FAMILY, 14).into_font().color(&grey),
        )))?;
    }

    for (i, line) in chart.lines.iter().enumerate() {
        // A step per second: the count holds for the whole second.
        let steps = line.per_second.iter().enumerate().flat_map(|(s, &n)| {
            let (s, n) = (s as f64, n as f64);
            [(s, n), (s + 1.0, n)]
        });
        plot.draw_series(LineSeries::new(steps, color(i).stroke_width(2)))?;
    }
    root.present()
}

/// The colour of line `i`.
fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// One row: a swatch and `name (peak N/s)` per line.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let font: TextStyle<'_> = (FAMILY, 15).into();
    let mut x = 100;
    for (i, line) in chart.lines.iter().enumerate() {
        let peak = line.per_second.iter().copied().max().unwrap_or(0);
        let text = format!("{} (peak {}/s)", line.name, count(peak));
        area.draw(&PathElement::new(
            [(x, 14), (x + 28, 14)],
            color(i).stroke_width(3),
        ))?;
        area.draw(&Text::new(text.clone(), (x + 36, 6), font.clone()))?;
        let (width, _) = area.estimate_text_size(&text, &font)?;
        x += 36 + i32::try_from(width).unwrap_or(200) + 40;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_and_an_svg() {
        let dir = std::env::temp_dir().join(format!("breakwater-chart-{}", std::process::id()));
        let chart = Chart {
            title: "test".to_owned(),
            lines: vec![
                Line {
                    name: "naive".to_owned(),
                    per_second: vec![0, 10, 0],
                },
                Line {
                    name: "breakwater".to_owned(),
                    per_second: vec![3, 3, 4],
                },
            ],
            events: vec![Event {
                at_s: 1.0,
                label: "outage starts".to_owned(),
            }],
        };
        let [png, svg] = write(&chart, &dir, "test").unwrap();
        let png_bytes = std::fs::read(&png).unwrap();
        assert_eq!(&png_bytes[1..4], b"PNG");
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(svg_text.contains("<svg"), "{svg_text}");
        assert!(svg_text.contains("breakwater (peak 4/s)"), "{svg_text}");
        assert!(svg_text.contains("outage starts"), "{svg_text}");
        assert!(svg_text.contains("database queries per second"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
