//! SVG plots (plotters, SVG backend only): calls and completion time against the
//! number of clients, per policy; the delays the component drew for one retry.

use std::path::Path;

use plotters::prelude::*;

use crate::contention::ContentionRow;

const COLORS: [RGBColor; 9] = [
    RGBColor(0x44, 0x44, 0x44),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x99, 0x99, 0x99),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
];

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e}")
}

/// One line per row of `value` against clients, on a log scale.
fn contention_plot(
    path: &Path,
    title: &str,
    y_label: &str,
    rows: &[ContentionRow],
    value: fn(&crate::contention::ContentionPoint) -> f64,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let xs: Vec<u32> = rows.first().map(|r| r.points.iter().map(|p| p.clients).collect()).unwrap_or_default();
    let (x_min, x_max) = (f64::from(*xs.first().unwrap_or(&10)), f64::from(*xs.last().unwrap_or(&100)));
    let values = rows.iter().flat_map(|r| r.points.iter().map(value));
    let (y_min, y_max) = values.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_min..x_max, ((y_min * 0.8).max(1.0)..y_max * 1.25).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("clients")
        .y_desc(y_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err)?;
    for (i, row) in rows.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: if row.name.starts_with("account") { 3 } else { 2 } };
        let points: Vec<(f64, f64)> = row.points.iter().map(|p| (f64::from(p.clients), value(p))).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(err)?
            .label(row.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// `contention-calls.svg` and `contention-time.svg`.
pub fn contention(dir: &Path, rows: &[ContentionRow]) -> anyhow::Result<()> {
    contention_plot(&dir.join("contention-calls.svg"), "Writes that reached the row (mean per simulation)", "calls", rows, |p| p.calls)?;
    contention_plot(&dir.join("contention-time.svg"), "Time until the last client wrote (ms, simulated)", "completion time (ms)", rows, |p| p.time_ms)?;
    Ok(())
}

/// `outage.svg`: the attempts the server got in each second, per scenario.
pub fn outage(dir: &Path, rows: &[crate::outage::OutageRow]) -> anyhow::Result<()> {
    let path = dir.join("outage.svg");
    let root = SVGBackend::new(&path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let seconds = rows.iter().map(|r| r.per_second.len()).max().unwrap_or(1) as f64;
    let top = f64::from(rows.iter().flat_map(|r| r.per_second.iter().copied()).max().unwrap_or(1)) * 1.15;
    let title = format!(
        "Attempts the server got per second; it answers 503 from {} s to {} s",
        crate::outage::DOWN_FROM_MS / 1000,
        crate::outage::DOWN_UNTIL_MS / 1000
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..seconds, 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc("attempts")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err)?;
    for (i, row) in rows.iter().enumerate() {
        let color = COLORS[(i + 1) % COLORS.len()];
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: 2 };
        let points: Vec<(f64, f64)> = row.per_second.iter().enumerate().map(|(s, n)| (s as f64, f64::from(*n))).collect();
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(err)?
            .label(row.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// `delays.svg`: a histogram of the delays the component gave for one retry,
/// whose ceiling is the cap: full jitter is uniform on [0, cap].
pub fn delays(dir: &Path, delays: &[u64], retry: u32, cap_ms: u64) -> anyhow::Result<()> {
    let bins = 20u64;
    let width = cap_ms.div_ceil(bins);
    let mut counts = vec![0u32; bins as usize];
    for d in delays {
        counts[((d / width) as usize).min(bins as usize - 1)] += 1;
    }
    let top = f64::from(*counts.iter().max().unwrap_or(&1)) * 1.25;
    let path = dir.join("delays.svg");
    let root = SVGBackend::new(&path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = format!("{} delays the component drew for retry {retry} (cap {cap_ms} ms), in {bins} bins", delays.len());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..cap_ms as f64, 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("delay (ms)")
        .y_desc("draws")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err)?;
    let blue = RGBColor(0x1f, 0x77, 0xb4);
    chart
        .draw_series(counts.iter().enumerate().map(|(i, c)| {
            let x0 = (i as u64 * width) as f64;
            Rectangle::new([(x0, 0.0), (x0 + width as f64, f64::from(*c))], blue.mix(0.7).filled())
        }))
        .map_err(err)?;
    let expected = delays.len() as f64 / bins as f64;
    chart.draw_series(LineSeries::new(vec![(0.0, expected), (cap_ms as f64, expected)], BLACK.stroke_width(1))).map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
