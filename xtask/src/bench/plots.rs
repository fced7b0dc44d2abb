//! The suite's plots (plotters, SVG and PNG): forward time against `num_terms` and against
//! `low_rank`, and a heat map of the forward speedup over dense, one panel per layer shape.
//!
//! Each panel shows the largest batch measured for its shape, so that a full run's plots
//! compare like with like; the JSON has every point.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use super::measure::Row;

const SIZE: (u32, u32) = (1400, 1000);

/// Writes `time_vs_terms`, `time_vs_rank` and `speedup_heatmap`, each as `.svg` and `.png`,
/// into `dir`; returns the files written. Plots need at least two values on their axis, so
/// a run of one point writes none.
pub fn write_all(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, String> {
    burn_memory::register_plot_font();
    let panels = panels(rows);
    let mut written = Vec::new();
    let figures: [(&str, &dyn Figure); 3] = [
        (
            "time_vs_terms",
            &TimeVs {
                panels: &panels,
                axis: Axis::Terms,
            },
        ),
        (
            "time_vs_rank",
            &TimeVs {
                panels: &panels,
                axis: Axis::Rank,
            },
        ),
        ("speedup_heatmap", &Heatmap { panels: &panels }),
    ];
    for (name, figure) in figures {
        if !figure.drawable() {
            continue;
        }
        let svg = dir.join(format!("{name}.svg"));
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        figure.draw_svg(&root)?;
        root.present().map_err(|e| e.to_string())?;
        drop(root);
        let png = dir.join(format!("{name}.png"));
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        figure.draw_png(&root)?;
        root.present().map_err(|e| e.to_string())?;
        drop(root);
        written.extend([svg, png]);
    }
    Ok(written)
}

/// The rows of one layer shape at its largest batch.
struct Panel<'a> {
    title: String,
    rows: Vec<&'a Row>,
}

impl Panel<'_> {
    fn terms(&self) -> Vec<usize> {
        distinct(self.rows.iter().map(|r| r.point.num_terms))
    }

    fn ranks(&self) -> Vec<usize> {
        distinct(self.rows.iter().map(|r| r.point.low_rank))
    }

    fn find(&self, num_terms: usize, low_rank: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.point.num_terms == num_terms && r.point.low_rank == low_rank)
            .copied()
    }
}

fn distinct(values: impl Iterator<Item = usize>) -> Vec<usize> {
    values.collect::<BTreeSet<_>>().into_iter().collect()
}

fn panels(rows: &[Row]) -> Vec<Panel<'_>> {
    let shapes = rows
        .iter()
        .map(|r| (r.point.d_input, r.point.d_output))
        .collect::<BTreeSet<_>>();
    shapes
        .into_iter()
        .map(|(d_input, d_output)| {
            let of_shape = || {
                rows.iter()
                    .filter(move |r| r.point.d_input == d_input && r.point.d_output == d_output)
            };
            let batch = of_shape().map(|r| r.point.batch).max().unwrap_or(0);
            Panel {
                title: format!("{d_input}×{d_output}, batch {batch}"),
                rows: of_shape().filter(|r| r.point.batch == batch).collect(),
            }
        })
        .collect()
}

/// A figure drawn the same way on either backend; the two methods exist only because
/// trait objects cannot have generic methods.
trait Figure {
    fn drawable(&self) -> bool;
    fn draw_svg(&self, root: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>;
    fn draw_png(&self, root: &DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String>;
}

fn split<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    n: usize,
) -> Vec<DrawingArea<DB, Shift>> {
    let cols = n.clamp(1, 2);
    let rows = n.div_ceil(cols).max(1);
    root.split_evenly((rows, cols))
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

#[derive(Clone, Copy, PartialEq)]
enum Axis {
    Terms,
    Rank,
}

/// Sketched forward time against one parameter, a line per value of the other, with dense
/// `Linear`'s time as a dashed line.
struct TimeVs<'a> {
    panels: &'a [Panel<'a>],
    axis: Axis,
}

impl TimeVs<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let (name, other) = match self.axis {
            Axis::Terms => ("num_terms T", "k"),
            Axis::Rank => ("low_rank k", "T"),
        };
        for (area, panel) in split(root, self.panels.len()).iter().zip(self.panels) {
            let (xs, lines) = match self.axis {
                Axis::Terms => (panel.terms(), panel.ranks()),
                Axis::Rank => (panel.ranks(), panel.terms()),
            };
            let at = |x: usize, line: usize| match self.axis {
                Axis::Terms => panel.find(x, line),
                Axis::Rank => panel.find(line, x),
            };
            let dense = panel.rows.iter().map(|r| r.dense_forward.median_ms);
            let dense = dense.clone().sum::<f64>() / dense.count().max(1) as f64;
            let times = panel.rows.iter().map(|r| r.sketch_forward.median_ms);
            let lo = times.clone().fold(dense, f64::min) * 0.7;
            let hi = times.fold(dense, f64::max) * 1.4;
            let n = xs.len() as i32;
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 22))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(-1..n, (lo..hi).log_scale())
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_labels(xs.len() + 2)
                .x_label_formatter(&|i| {
                    usize::try_from(*i)
                        .ok()
                        .and_then(|i| xs.get(i))
                        .map_or(String::new(), |v| v.to_string())
                })
                .x_desc(name)
                .y_desc("forward ms (median)")
                .draw()
                .map_err(err)?;
            for (index, &line) in lines.iter().enumerate() {
                let color = Palette99::pick(index).to_rgba();
                let points: Vec<(i32, f64)> = xs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &x)| {
                        at(x, line).map(|r| (i as i32, r.sketch_forward.median_ms))
                    })
                    .collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(format!("sketch {other}={line}"))
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        points
                            .into_iter()
                            .map(|p| Circle::new(p, 4, color.filled())),
                    )
                    .map_err(err)?;
            }
            chart
                .draw_series(DashedLineSeries::new(
                    [(-1, dense), (n, dense)],
                    8,
                    5,
                    BLACK.stroke_width(2),
                ))
                .map_err(err)?
                .label("dense Linear")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(err)?;
        }
        Ok(())
    }
}

impl Figure for TimeVs<'_> {
    fn drawable(&self) -> bool {
        self.panels.iter().any(|p| match self.axis {
            Axis::Terms => p.terms().len() > 1,
            Axis::Rank => p.ranks().len() > 1,
        })
    }
    fn draw_svg(&self, root: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String> {
        self.draw(root)
    }
    fn draw_png(&self, root: &DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String> {
        self.draw(root)
    }
}

/// Forward speedup over dense for each (T, k), coloured from red (slower than dense) to
/// green (the fastest point of the run), with the value written in each cell.
struct Heatmap<'a> {
    panels: &'a [Panel<'a>],
}

impl Heatmap<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let best = self
            .panels
            .iter()
            .flat_map(|p| p.rows.iter().map(|r| r.forward_speedup()))
            .fold(1.0_f64, f64::max);
        for (area, panel) in split(root, self.panels.len()).iter().zip(self.panels) {
            let (terms, ranks) = (panel.terms(), panel.ranks());
            let label = |values: &[usize], i: &i32| {
                usize::try_from(*i)
                    .ok()
                    .and_then(|i| values.get(i))
                    .map_or(String::new(), |v| v.to_string())
            };
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("{}: forward speedup over dense", panel.title),
                    ("sans-serif", 22),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d(0..terms.len() as i32, 0..ranks.len() as i32)
                .map_err(err)?;
            // Cells span one unit; ticks sit on their lower-left corners, so labels shift by
            // half a cell to sit under and beside the cell centres.
            let (left, top) = chart.backend_coord(&(0, 1));
            let (right, bottom) = chart.backend_coord(&(1, 0));
            let (cell_w, cell_h) = (right - left, bottom - top);
            chart
                .configure_mesh()
                .disable_mesh()
                .x_labels(terms.len() + 1)
                .y_labels(ranks.len() + 1)
                .x_label_offset(cell_w / 2)
                .y_label_offset(-cell_h / 2)
                .x_label_formatter(&|i| label(&terms, i))
                .y_label_formatter(&|i| label(&ranks, i))
                .x_desc("num_terms T")
                .y_desc("low_rank k")
                .draw()
                .map_err(err)?;
            for (i, &t) in terms.iter().enumerate() {
                for (j, &k) in ranks.iter().enumerate() {
                    let Some(row) = panel.find(t, k) else {
                        continue;
                    };
                    let speedup = row.forward_speedup();
                    // Hue from red (≤ 1×, no gain) to green (the run's best), on a log scale.
                    let t01 = if best > 1.0 {
                        (speedup.max(1.0).ln() / best.ln()).clamp(0.0, 1.0)
                    } else {
                        0.0
                    };
                    let color = HSLColor(t01 / 3.0, 0.65, 0.55);
                    let (x, y) = (i as i32, j as i32);
                    let text = Text::new(
                        format!("{speedup:.1}×"),
                        (cell_w / 2 - 22, cell_h / 2 - 9),
                        ("sans-serif", 18),
                    );
                    chart
                        .draw_series([Rectangle::new([(x, y), (x + 1, y + 1)], color.filled())])
                        .map_err(err)?;
                    chart
                        .draw_series([EmptyElement::at((x, y + 1)) + text])
                        .map_err(err)?;
                }
            }
        }
        Ok(())
    }
}

impl Figure for Heatmap<'_> {
    fn drawable(&self) -> bool {
        self.panels
            .iter()
            .any(|p| p.terms().len() * p.ranks().len() > 1)
    }
    fn draw_svg(&self, root: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String> {
        self.draw(root)
    }
    fn draw_png(&self, root: &DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String> {
        self.draw(root)
    }
}
