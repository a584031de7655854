//! SVG plots of the experiments, for `docs/` and the README: goodput against offered load (the
//! source's policy and ours), the wait distribution per routing strategy, and tokens served per
//! team per window in the worked example.
//!
//! `plotters` is built without fonts or bitmap backends: the SVG names a generic `sans-serif`
//! family and the viewer renders the text.

use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::{cascade, replay, routing, worked_example};

/// A plot could not be written.
pub type PlotResult = Result<PathBuf, Box<dyn Error>>;

const SIZE: (u32, u32) = (860, 520);
const FONT: &str = "sans-serif";
const SOURCE: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const OURS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const IDEAL: RGBColor = RGBColor(0x99, 0x99, 0x99);
const TEAM_A: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const TEAM_B: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
/// One colour per routing row, in [`routing::RUNS`] order.
const PALETTE: [RGBColor; 9] = [
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Goodput (served, % of capacity) against offered load for the source's policy and ours.
pub fn cascade(report: &cascade::Report, dir: &Path) -> PlotResult {
    let path = dir.join("cascade-goodput.svg");
    draw_cascade(report, &path)?;
    Ok(path)
}

fn draw_cascade(report: &cascade::Report, path: &Path) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let points = |rows: &[cascade::Row]| {
        let mut p: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| {
                (
                    f64::from(r.load_pct),
                    r.served_share(report.minutes) * 100.0,
                )
            })
            .collect();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        p
    };
    let (source, ours) = (points(&report.source), points(&report.ours));
    let max_load = source.iter().map(|p| p.0).fold(120.0, f64::max) + 5.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Cascade: 4 deployments × 600/min, {} minutes — goodput vs offered load",
                report.minutes
            ),
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_load, 0f64..110f64)?;
    chart
        .configure_mesh()
        .x_desc("offered load (% of capacity)")
        .y_desc("served (% of capacity)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style((FONT, 14))
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, 0.0), (100.0, 100.0), (max_load, 100.0)],
            IDEAL.stroke_width(1),
        ))?
        .label("ideal: min(offered, capacity)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], IDEAL));
    for (points, color, label) in [
        (
            &source,
            SOURCE,
            "source: remove a deployment for a minute when it hits its limit",
        ),
        (
            &ours,
            OURS,
            "ours: skip full deployments, refuse only the excess",
        ),
    ] {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The cumulative distribution of waits, one line per routing row.
pub fn routing(report: &routing::Report, dir: &Path) -> PlotResult {
    let path = dir.join("routing-waits.svg");
    draw_routing(report, &path)?;
    Ok(path)
}

fn draw_routing(report: &routing::Report, path: &Path) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = 3000.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Routing: wait before service, {} req/s over 4 deployments ({:.0}% busy)",
                report.rate,
                report.rate * report.mean_service / routing::DEPLOYMENTS as f64 * 100.0
            ),
            (FONT, 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..1.0f64)?;
    chart
        .configure_mesh()
        .x_desc("wait (ms)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("share of requests that waited at most this long")
        .label_style((FONT, 14))
        .draw()?;
    for (row, color) in report.rows.iter().zip(PALETTE) {
        let n = row.waits.len().max(1) as f64;
        // ~400 points per curve: every quantile step of 1/400 plus the curve's ends.
        let step = (row.waits.len() / 400).max(1);
        let mut curve: Vec<(f64, f64)> = row
            .waits
            .iter()
            .enumerate()
            .step_by(step)
            .map(|(i, w)| ((w * 1000.0).min(x_max), (i + 1) as f64 / n))
            .take_while(|p| p.0 < x_max)
            .collect();
        curve.push((
            x_max,
            row.waits.partition_point(|w| w * 1000.0 <= x_max) as f64 / n,
        ));
        let dashed = row.processes > 1;
        let style = color.stroke_width(if dashed { 1 } else { 2 });
        let label = format!(
            "{}{}: mean {:.0} ms, p95 {:.0} ms",
            row.strategy,
            if dashed { ", 4 gateways" } else { "" },
            row.mean_wait * 1000.0,
            row.p95_wait * 1000.0
        );
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(curve, 6, 4, style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        } else {
            chart
                .draw_series(LineSeries::new(curve, style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 12))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Tokens served to A and B per window, one panel per threshold, the worked example's figures
/// marked.
pub fn worked_example(report: &worked_example::Report, dir: &Path) -> PlotResult {
    let path = dir.join("worked-example.svg");
    draw_worked_example(report, &path)?;
    Ok(path)
}

fn draw_worked_example(report: &worked_example::Report, path: &Path) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(
        "Worked example: tokens served per team per 60 s window, tpm 1000, 50/50 floors",
        (FONT, 18),
    )?;
    let panels = body.split_evenly((1, report.runs.len().max(1)));
    for (run, panel) in report.runs.iter().zip(&panels) {
        let windows = run.windows.len() as f64;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("saturation_threshold {}", run.threshold),
                (FONT, 16),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..windows, 0f64..1000f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(run.windows.len() * 2 + 1)
            .x_label_formatter(&|x| {
                // Label only the middle of each window's pair of bars.
                let centre = x - x.floor();
                if (centre - 0.5).abs() < 1e-6 {
                    format!("window {}", x.floor() as u32 + 1)
                } else {
                    String::new()
                }
            })
            .y_desc("tokens served")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, 13))
            .draw()?;
        for (i, w) in run.windows.iter().enumerate() {
            let x = i as f64;
            for (offset, served, expected, color, team) in [
                (0.12, w.a_served, w.expected_a, TEAM_A, "A"),
                (0.52, w.b_served, w.expected_b, TEAM_B, "B"),
            ] {
                let (x0, x1) = (x + offset, x + offset + 0.36);
                chart.draw_series([Rectangle::new(
                    [(x0, 0.0), (x1, served as f64)],
                    color.filled(),
                )])?;
                chart.draw_series([Text::new(
                    format!("{team} {served}"),
                    (x0, served as f64 + 40.0),
                    (FONT, 12),
                )])?;
                if let Some(expected) = expected {
                    chart.draw_series([PathElement::new(
                        [(x0 - 0.02, expected as f64), (x1 + 0.02, expected as f64)],
                        BLACK.stroke_width(2),
                    )])?;
                }
            }
        }
    }
    body.draw(&Text::new(
        "bars: served by the real limiter (A blue, B orange); black marks: the expected values",
        (60, SIZE.1 as i32 - 58),
        (FONT, 12),
    ))?;
    root.present()?;
    Ok(())
}

/// The replay's plot: for each config, its models' saturation over time (top) and the requests
/// each priority was answered per bucket (bottom), written to `path`.
pub fn replay(runs: &[(&str, &replay::Timeline)], path: &Path) -> PlotResult {
    draw_replay(runs, path)?;
    Ok(path.to_owned())
}

fn draw_replay(runs: &[(&str, &replay::Timeline)], path: &Path) -> Result<(), Box<dyn Error>> {
    let height = 300 * 2 * runs.len().max(1) as u32;
    let root = SVGBackend::new(path, (SIZE.0, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((2 * runs.len().max(1), 1));
    for (i, (name, t)) in runs.iter().enumerate() {
        let secs = |b: usize| (b as u64 + 1) as f64 * t.bucket_ms as f64 / 1000.0;
        let len = t
            .saturation
            .values()
            .map(Vec::len)
            .chain(t.by_priority.values().map(Vec::len))
            .max()
            .unwrap_or(1);
        let x_max = secs(len.saturating_sub(1)).max(1.0);
        let s_max = t
            .saturation
            .values()
            .flatten()
            .copied()
            .fold(1.0_f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&areas[2 * i])
            .caption(format!("{name}: saturation"), (FONT, 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_max, 0.0..s_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the first arrival")
            .y_desc("use of capacity")
            .label_style((FONT, 12))
            .draw()?;
        for (k, (model, line)) in t.saturation.iter().enumerate() {
            let color = PALETTE[k % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    line.iter().enumerate().map(|(b, &v)| (secs(b), v)),
                    color.stroke_width(2),
                ))?
                .label(model.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 12))
            .border_style(BLACK)
            .draw()?;
        let u_max = t
            .by_priority
            .values()
            .flatten()
            .copied()
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.1;
        let mut chart = ChartBuilder::on(&areas[2 * i + 1])
            .caption(format!("{name}: answered per priority"), (FONT, 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_max, 0.0..u_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the first arrival")
            .y_desc(format!("requests per {} s", t.bucket_ms as f64 / 1000.0))
            .label_style((FONT, 12))
            .draw()?;
        for (k, (priority, line)) in t.by_priority.iter().enumerate() {
            let color = PALETTE[(k + 2) % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    line.iter().enumerate().map(|(b, &v)| (secs(b), v as f64)),
                    color.stroke_width(2),
                ))?
                .label(priority.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 12))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
