//! Plots of a bench report (plotters, SVG and PNG): throughput vs workers,
//! scaling efficiency, and p99 claim latency, one panel per `--work-ms`.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::markdown::thousands;
use super::report::{BenchReport, CaseResult};

/// Plot size in pixels.
const SIZE: (u32, u32) = (1400, 620);
/// Fonts tried, in order, after `SETTLED_PLOT_FONT`.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

#[derive(Clone, Copy)]
enum Metric {
    Throughput,
    Efficiency,
    LatencyP99,
}

fn register_font() -> bool {
    let candidates = std::env::var("SETTLED_PLOT_FONT")
        .ok()
        .into_iter()
        .chain(FONT_PATHS.iter().map(|s| s.to_string()));
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// Writes throughput, efficiency and latency plots (SVG and PNG) into `dir`.
pub(super) fn write_plots(r: &BenchReport, dir: &Path) -> anyhow::Result<()> {
    if !register_font() {
        eprintln!("bench: no TrueType font found (set SETTLED_PLOT_FONT to a .ttf file); plots skipped");
        return Ok(());
    }
    for (name, metric) in [
        ("throughput", Metric::Throughput),
        ("efficiency", Metric::Efficiency),
        ("latency", Metric::LatencyP99),
    ] {
        let svg = dir.join(format!("{name}.svg"));
        draw(SVGBackend::new(&svg, SIZE).into_drawing_area(), r, metric)?;
        let png = dir.join(format!("{name}.png"));
        draw(BitMapBackend::new(&png, SIZE).into_drawing_area(), r, metric)?;
    }
    Ok(())
}

/// A named line: (log2 W, value) points.
type Series = (String, Vec<(f64, f64)>);

fn value(c: &CaseResult, metric: Metric) -> Option<f64> {
    match metric {
        Metric::Throughput => c.rate(),
        Metric::Efficiency => c.efficiency,
        Metric::LatencyP99 => c.ok().then_some(c.claim_p99_ms).flatten(),
    }
}

fn series(r: &BenchReport, metric: Metric, work_ms: u64) -> Vec<Series> {
    let mut names: Vec<(String, String, Option<String>)> = Vec::new();
    for c in &r.cases {
        // Peers appear with their tuned settings only (their defaults are in
        // the tables): a peer stuck at a few jobs per second would squash
        // every other line.
        let wanted = c.work_ms == work_ms
            && match metric {
                Metric::Throughput => {
                    matches!(c.kind.as_str(), "strategy" | "pgbench")
                        || (c.kind == "peer" && c.config.as_deref() == Some("tuned"))
                }
                Metric::Efficiency => matches!(c.kind.as_str(), "strategy" | "pgbench"),
                Metric::LatencyP99 => c.kind == "strategy",
            };
        let key = (c.kind.clone(), c.name.clone(), c.config.clone());
        if wanted && !names.contains(&key) {
            names.push(key);
        }
    }
    names
        .into_iter()
        .map(|(kind, name, config)| {
            let mut points: Vec<(f64, f64)> = r
                .cases
                .iter()
                .filter(|c| c.kind == kind && c.name == name && c.config == config && c.work_ms == work_ms)
                .filter_map(|c| value(c, metric).map(|v| (f64::from(c.workers).log2(), v)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label = match (kind.as_str(), config) {
                ("pgbench", _) => "pgbench floor (same SQL)".to_string(),
                (_, Some(config)) => format!("{name} ({config})"),
                _ => name,
            };
            (label, points)
        })
        .filter(|(_, p)| !p.is_empty())
        .collect()
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &BenchReport, metric: Metric) -> anyhow::Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing a plot: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let title = match metric {
        Metric::Throughput => "Creators settled per second vs workers (log scale)",
        Metric::Efficiency => "Scaling efficiency: throughput at W / (W x throughput at 1)",
        Metric::LatencyP99 => "Claim latency p99 (ms, log scale) vs workers",
    };
    let (top, body) = root.split_vertically(50);
    top.titled(title, ("sans-serif", 24)).map_err(e)?;
    let panels = body.split_evenly((1, r.options.work_ms.len().max(1)));
    let max_x = r
        .options
        .workers
        .iter()
        .map(|&w| f64::from(w).log2())
        .fold(0.0, f64::max)
        .max(1.0);
    let log = !matches!(metric, Metric::Efficiency);
    for (panel, &work_ms) in panels.iter().zip(&r.options.work_ms) {
        let lines: Vec<Series> = series(r, metric, work_ms)
            .into_iter()
            .map(|(label, points)| {
                let points = points
                    .into_iter()
                    .map(|(x, y)| (x, if log { y.max(1e-3).log10() } else { y }))
                    .collect();
                (label, points)
            })
            .collect();
        let ys = lines.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
        let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
        let (lo, hi) = if lo > hi {
            (0.0, 1.0)
        } else if log {
            (lo.floor(), hi.ceil().max(lo.floor() + 1.0))
        } else {
            (0.0, hi.max(1.0) * 1.1)
        };
        // The legend gets its own strip on the right, so it never hides a line.
        let (width, _) = panel.dim_in_pixel();
        let (plot_area, legend_area) = panel.split_horizontally(width * 7 / 10);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(format!("work {work_ms} ms per item"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.2..max_x + 0.2, lo..hi)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("workers (W)")
            .x_labels(8)
            .x_label_formatter(&|x| {
                let w = 2f64.powf(*x);
                if (w - w.round()).abs() < 0.05 && w >= 1.0 {
                    format!("{}", w.round())
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| {
                if log {
                    let v = 10f64.powf(*y);
                    // Two significant digits: 79,433 reads as 79,000.
                    let scale = 10f64.powi(v.log10().floor() as i32 - 1);
                    let v = (v / scale).round() * scale;
                    if v >= 10.0 {
                        thousands(v)
                    } else {
                        format!("{v:.2}")
                    }
                } else {
                    format!("{y:.2}")
                }
            })
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(e)?;
        for (i, (label, points)) in lines.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let thin = label.contains("floor") || label.contains('(');
            let style = ShapeStyle {
                color,
                filled: true,
                stroke_width: if thin { 1 } else { 2 },
            };
            chart.draw_series(LineSeries::new(points.clone(), style)).map_err(e)?;
            chart
                .draw_series(points.into_iter().map(|p| Circle::new(p, 3, style)))
                .map_err(e)?;
            let y = 60 + 20 * i as i32;
            legend_area
                .draw(&PathElement::new(vec![(4, y), (26, y)], style.stroke_width(3)))
                .map_err(e)?;
            legend_area
                .draw(&Text::new(label, (32, y - 7), ("sans-serif", 14)))
                .map_err(e)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}
