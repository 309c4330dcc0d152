//! The charts of `demo` and `simulate`: counts per second over time
//! (database queries; for the outage, failed requests and stale values
//! too), one series per strategy, events marked, written as PNG and SVG.
//!
//! The y axis is logarithmic, so a series of 1/s stays readable next to
//! one of 100,000/s; zeros sit at the bottom of the axis, labelled `0`.
//! Each series has its own colour, dash pattern and (when sparse) marker,
//! so two series on the same values are both visible.
//!
//! Text is drawn with the DejaVu Sans font embedded in the binary
//! (`assets/`), registered with plotters' `ab_glyph` backend, so a chart
//! renders the same on a machine without fonts or fontconfig.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::failure::Failure;
use crate::report::thousands;

/// The font every chart's text is drawn in.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";
/// Width of the PNG, in pixels (the SVG has the same size).
const WIDTH: u32 = 1100;
/// Height of a one-panel chart; each further panel adds [`PANEL_HEIGHT`].
const HEIGHT: u32 = 600;
/// Height of each panel after the first.
const PANEL_HEIGHT: u32 = 380;
/// Where a zero is drawn on the log scale: the bottom of the axis,
/// labelled `0`.
const ZERO: f64 = 0.5;

/// How series `i` of a panel is drawn: colour, dash pattern, marker. Two
/// series on the same values stay apart: a solid line, a dashed one over
/// it, a dotted one, each with its own marker on a sparse series.
#[derive(Debug, Clone, Copy)]
struct Look {
    color: RGBColor,
    /// Dash and gap in pixels; `None` for a solid line.
    dash: Option<(u32, u32)>,
    width: u32,
    marker: Marker,
}

/// The marker of a sparse series' nonzero points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

/// The looks, one per series in order.
const LOOKS: [Look; 4] = [
    Look {
        color: RGBColor(214, 39, 40),
        dash: None,
        width: 2,
        marker: Marker::Cross,
    },
    Look {
        color: RGBColor(31, 119, 180),
        dash: Some((10, 5)),
        width: 3,
        marker: Marker::Circle,
    },
    Look {
        color: RGBColor(44, 160, 44),
        dash: Some((3, 4)),
        width: 3,
        marker: Marker::Triangle,
    },
    Look {
        color: RGBColor(148, 103, 189),
        dash: Some((14, 4)),
        width: 2,
        marker: Marker::Square,
    },
];

/// A series with at most this many nonzero seconds gets a marker on each.
const SPARSE: usize = 12;

/// One series: a count in each second.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// Legend text, e.g. `naive`.
    pub(crate) name: String,
    /// The count in second `i` at index `i`.
    pub(crate) per_second: Vec<usize>,
}

/// One plot: its series on one log-scale axis, legend above it.
#[derive(Debug, Clone)]
pub(crate) struct Panel {
    /// What is counted, e.g. `database queries per second`; the axis says
    /// `(log scale)` after it.
    pub(crate) y_desc: String,
    /// The series, drawn in order (each with its own look).
    pub(crate) lines: Vec<Line>,
}

/// Something that happened, drawn as a dashed vertical line with a label.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    /// When, in seconds since the start.
    pub(crate) at_s: f64,
    /// What, e.g. `outage starts`.
    pub(crate) label: String,
}

/// A chart: panels stacked on one time axis.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    /// The caption.
    pub(crate) title: String,
    /// The panels, top to bottom.
    pub(crate) panels: Vec<Panel>,
    /// The events, marked on every panel (labelled on the first).
    pub(crate) events: Vec<Event>,
}

impl Chart {
    /// A chart of one panel: database queries per second.
    pub(crate) fn queries(title: String, lines: Vec<Line>, events: Vec<Event>) -> Self {
        Chart {
            title,
            panels: vec![Panel {
                y_desc: "database queries per second".to_owned(),
                lines,
            }],
            events,
        }
    }

    /// Its size in pixels.
    fn size(&self) -> (u32, u32) {
        let more = u32::try_from(self.panels.len().saturating_sub(1)).unwrap_or(0);
        (WIDTH, HEIGHT + more * PANEL_HEIGHT)
    }
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
    let size = chart.size();
    draw(BitMapBackend::new(&png, size).into_drawing_area(), chart)
        .map_err(|err| failed(&png, &err))?;
    draw(SVGBackend::new(&svg, size).into_drawing_area(), chart)
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

/// The largest count of any series of `panel`, at least 1.
fn peak(panel: &Panel) -> usize {
    panel
        .lines
        .iter()
        .flat_map(|line| line.per_second.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Where count `n` is drawn: itself, a zero at [`ZERO`].
fn y_of(n: usize) -> f64 {
    if n == 0 { ZERO } else { n as f64 }
}

/// The top of a panel's axis: 8 × its peak, room for the event labels
/// above every series (at least 10).
fn y_top(panel: &Panel) -> f64 {
    (peak(panel) as f64 * 8.0).max(10.0)
}

/// Whether `line` is sparse enough for a marker on each nonzero second.
fn marked(line: &Line) -> bool {
    (1..=SPARSE).contains(&line.per_second.iter().filter(|n| **n > 0).count())
}

/// `1`, `10`, `1,000`, `100,000` on the axis; the bottom is `0`.
fn y_label(v: f64) -> String {
    if v < 0.9 {
        "0".to_owned()
    } else {
        thousands(v.round() as usize)
    }
}

/// Draws `chart` on `root` and presents it: the caption, then each panel
/// with a legend row above it (outside the plot, so it hides no line).
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let titled = root.margin(8, 0, 0, 0).titled(&chart.title, (FAMILY, 22))?;
    let seconds = chart
        .panels
        .iter()
        .flat_map(|panel| panel.lines.iter().map(|line| line.per_second.len()))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let (_, height) = titled.dim_in_pixel();
    let more = u32::try_from(chart.panels.len().saturating_sub(1)).unwrap_or(0);
    let first = height.saturating_sub(more * PANEL_HEIGHT);
    let mut rest = titled;
    for (p, panel) in chart.panels.iter().enumerate() {
        let area = if p + 1 < chart.panels.len() {
            let split = if p == 0 { first } else { PANEL_HEIGHT };
            let (area, below) = rest.split_vertically(split);
            rest = below;
            area
        } else {
            rest.clone()
        };
        draw_panel(&root, &area, panel, chart, seconds, p == 0)?;
    }
    root.present()
}

/// One panel on `area`: legend row, then the plot; `labels`: whether the
/// events are labelled here.
fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    chart: &Chart,
    seconds: f64,
    labels: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (legend, body) = area.split_vertically(34);
    draw_legend(&legend, panel)?;

    let top = y_top(panel);
    let mut plot = ChartBuilder::on(&body)
        .margin(16)
        .margin_top(4)
        .x_label_area_size(44)
        .y_label_area_size(96)
        .build_cartesian_2d(0f64..seconds, (ZERO..top).log_scale())?;
    plot.configure_mesh()
        .x_desc("time (s)")
        .y_desc(format!("{} (log scale)", panel.y_desc))
        .y_label_formatter(&|v| y_label(*v))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;
    // The bottom of the axis is where zeros are drawn: say so.
    let (x, y) = plot.backend_coord(&(0.0, ZERO));
    root.draw(&Text::new(
        "0",
        (x - 18, y - 8),
        (FAMILY, 14).into_font().color(&BLACK),
    ))?;

    let grey = RGBColor(90, 90, 90);
    for (i, event) in chart.events.iter().enumerate() {
        plot.draw_series(DashedLineSeries::new(
            [(event.at_s, ZERO), (event.at_s, top)],
            6,
            4,
            grey.stroke_width(1),
        ))?;
        if labels {
            // Labels stagger down the headroom (log space) so neighbours
            // do not overlap.
            let row = (i % 4) as f64;
            let at = top / 10f64.powf(0.05 + 0.2 * row);
            plot.draw_series(std::iter::once(Text::new(
                format!(" {}", event.label),
                (event.at_s, at),
                (FAMILY, 14).into_font().color(&grey),
            )))?;
        }
    }

    for (i, line) in panel.lines.iter().enumerate() {
        let look = look(i);
        let style = look.color.stroke_width(look.width);
        // A step per second: the count holds for the whole second.
        let steps: Vec<(f64, f64)> = line
            .per_second
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| {
                let (s, y) = (s as f64, y_of(n));
                [(s, y), (s + 1.0, y)]
            })
            .collect();
        match look.dash {
            None => {
                plot.draw_series(LineSeries::new(steps, style))?;
            }
            Some((dash, gap)) => {
                plot.draw_series(DashedLineSeries::new(steps, dash, gap, style))?;
            }
        }
        if marked(line) {
            for (s, &n) in line.per_second.iter().enumerate().filter(|(_, n)| **n > 0) {
                draw_marker(&mut plot, (s as f64 + 0.5, n as f64), look)?;
            }
        }
    }
    Ok(())
}

/// Draws `look`'s marker at `at`.
fn draw_marker<DB: DrawingBackend, CT: CoordTranslate<From = (f64, f64)>>(
    plot: &mut ChartContext<'_, DB, CT>,
    at: (f64, f64),
    look: Look,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let style = look.color.stroke_width(2);
    let area = plot.plotting_area();
    match look.marker {
        Marker::Circle => area.draw(&Circle::new(at, 7, style)),
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 8, look.color.filled())),
        Marker::Square => {
            area.draw(&(EmptyElement::at(at) + Rectangle::new([(-5, -5), (5, 5)], style)))
        }
        Marker::Cross => area.draw(&Cross::new(at, 5, style)),
    }
}

/// The look of series `i`.
fn look(i: usize) -> Look {
    LOOKS[i % LOOKS.len()]
}

/// One row: a sample of each series' line (and marker) and
/// `name (peak N/s)`.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let font: TextStyle<'_> = (FAMILY, 15).into();
    let mut x = 110;
    for (i, line) in panel.lines.iter().enumerate() {
        let look = look(i);
        let peak = line.per_second.iter().copied().max().unwrap_or(0);
        let text = format!("{} (peak {}/s)", line.name, thousands(peak));
        let style = look.color.stroke_width(look.width);
        let sample = [(x, 14), (x + 40, 14)];
        match look.dash {
            None => area.draw(&PathElement::new(sample, style))?,
            Some((dash, gap)) => area.draw(&plotters::element::DashedPathElement::new(
                sample, dash, gap, style,
            ))?,
        }
        let mid = (x + 20, 14);
        let marker = look.color.stroke_width(2);
        match look.marker {
            _ if !marked(line) => {}
            Marker::Circle => area.draw(&Circle::new(mid, 6, marker))?,
            Marker::Triangle => area.draw(&TriangleMarker::new(mid, 7, look.color.filled()))?,
            Marker::Square => {
                area.draw(&(EmptyElement::at(mid) + Rectangle::new([(-4, -4), (4, 4)], marker)))?
            }
            Marker::Cross => area.draw(&Cross::new(mid, 5, marker))?,
        }
        area.draw(&Text::new(text.clone(), (x + 48, 6), font.clone()))?;
        let (width, _) = area.estimate_text_size(&text, &font)?;
        x += 48 + i32::try_from(width).unwrap_or(200) + 36;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_and_an_svg() {
        let dir = std::env::temp_dir().join(format!("breakwater-chart-{}", std::process::id()));
        let chart = Chart::queries(
            "test".to_owned(),
            vec![
                Line {
                    name: "naive".to_owned(),
                    per_second: vec![0, 10, 0],
                },
                Line {
                    name: "breakwater".to_owned(),
                    per_second: vec![3, 3, 4],
                },
            ],
            vec![Event {
                at_s: 1.0,
                label: "outage starts".to_owned(),
            }],
        );
        let [png, svg] = write(&chart, &dir, "test").unwrap();
        let png_bytes = std::fs::read(&png).unwrap();
        assert_eq!(&png_bytes[1..4], b"PNG");
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(svg_text.contains("<svg"), "{svg_text}");
        assert!(svg_text.contains("breakwater (peak 4/s)"), "{svg_text}");
        assert!(svg_text.contains("outage starts"), "{svg_text}");
        assert!(svg_text.contains("database queries per second (log scale)"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_second_panel_adds_its_own_axis_and_height() {
        let dir = std::env::temp_dir().join(format!("breakwater-panels-{}", std::process::id()));
        let mut chart = Chart::queries(
            "two panels".to_owned(),
            vec![Line {
                name: "naive".to_owned(),
                per_second: vec![100_000, 0, 1],
            }],
            Vec::new(),
        );
        chart.panels.push(Panel {
            y_desc: "requests per second: errors, stale values".to_owned(),
            lines: vec![Line {
                name: "breakwater: stale values".to_owned(),
                per_second: vec![0, 0, 0],
            }],
        });
        assert_eq!(chart.size(), (WIDTH, HEIGHT + PANEL_HEIGHT));
        let [_, svg] = write(&chart, &dir, "panels").unwrap();
        let svg = std::fs::read_to_string(svg).unwrap();
        assert!(svg.contains("errors, stale values (log scale)"), "{svg}");
        assert!(svg.contains("breakwater: stale values (peak 0/s)"), "{svg}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn zeros_sit_at_the_bottom_and_the_top_leaves_room() {
        assert_eq!(y_of(0), ZERO);
        assert_eq!(y_of(3), 3.0);
        assert_eq!(y_label(ZERO), "0");
        assert_eq!(y_label(100_000.0), "100,000");
        let panel = |peak| Panel {
            y_desc: String::new(),
            lines: vec![Line {
                name: String::new(),
                per_second: vec![0, peak],
            }],
        };
        assert_eq!(y_top(&panel(0)), 10.0);
        assert_eq!(y_top(&panel(1_000)), 8_000.0);
    }
}
