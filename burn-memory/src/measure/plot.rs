//! Plots of memory over time (plotters), PNG or SVG, with text rendered from an embedded font
//! so that no system font library is needed.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{MemoryError, Timeline};

/// The image format of a plot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlotFormat {
    /// A 1200×600 PNG bitmap.
    Png,
    /// An SVG vector image.
    Svg,
}

impl PlotFormat {
    /// SVG for a `.svg` path, PNG otherwise.
    pub fn from_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("svg") => Self::Svg,
            _ => Self::Png,
        }
    }
}

/// DejaVu Sans, ASCII subset (see `assets/LICENSE.DejaVu`).
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// Registers the font that burn-memory's plots embed as plotters' `sans-serif`, so that any
/// plotters chart in the program renders text without a system font library (plotters keeps
/// one font registry per process). Burn-memory's own plots call it; call it before drawing
/// other charts. Idempotent.
pub fn register_plot_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            tracing::warn!("burn-memory: the embedded plot font could not be loaded");
        }
    });
}

const SIZE: (u32, u32) = (1200, 600);
const MB: f64 = 1e6;

pub(crate) fn plot_timeline(
    timeline: &Timeline,
    path: &Path,
    format: PlotFormat,
    title: &str,
) -> Result<(), MemoryError> {
    register_plot_font();
    let result = match format {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, timeline, title).and_then(|()| root.present().map_err(|e| e.to_string()))
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw(&root, timeline, title).and_then(|()| root.present().map_err(|e| e.to_string()))
        }
    };
    result.map_err(|message| MemoryError::Plot {
        path: path.to_path_buf(),
        message,
    })
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    timeline: &Timeline,
    title: &str,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let end = timeline
        .samples
        .last()
        .map(|s| s.seconds)
        .into_iter()
        .chain(timeline.phases.iter().map(|p| p.end))
        .fold(1e-3_f64, f64::max);
    let top = timeline
        .samples
        .iter()
        .map(|s| s.reserved.max(s.in_use) as f64 / MB)
        .fold(1e-3_f64, f64::max)
        * 1.1;

    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("memory (MB)")
        .draw()
        .map_err(err)?;

    // Phases: alternately shaded bands, each labelled at its top-left corner.
    for (i, phase) in timeline.phases.iter().enumerate() {
        let shade = if i % 2 == 0 {
            RGBColor(230, 236, 250)
        } else {
            RGBColor(250, 240, 225)
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(phase.start, 0.0), (phase.end.max(phase.start), top)],
                shade.filled(),
            )))
            .map_err(err)?;
        // Label only phases wide enough to hold it; the CSV has every phase.
        if (phase.end - phase.start) / end < 0.04 {
            continue;
        }
        chart
            .draw_series(std::iter::once(Text::new(
                phase.label.clone(),
                (phase.start, top * (0.97 - 0.04 * (i % 3) as f64)),
                ("sans-serif", 14),
            )))
            .map_err(err)?;
    }

    let series = [
        (
            "in use",
            BLUE,
            Box::new(|s: &crate::Sample| s.in_use) as Box<dyn Fn(&crate::Sample) -> u64>,
        ),
        ("reserved", RED, Box::new(|s: &crate::Sample| s.reserved)),
    ];
    for (name, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                timeline
                    .samples
                    .iter()
                    .map(|s| (s.seconds, value(s) as f64 / MB)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}
