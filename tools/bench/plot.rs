//! The bench's PNG: one horizontal bar per configuration (decode tok/s), labelled with the
//! figure and, for GPU rows, the fraction of the memory-bandwidth bound. plotters draws it with
//! an embedded font (DejaVu Sans Mono, assets/fonts/), so no system fonts are needed.

use super::Row;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSansMono.ttf");

pub fn decode_bars(rows: &[Row], title: &str, path: &Path) -> Result<(), String> {
    let timed: Vec<&Row> = rows.iter().filter(|r| r.refused.is_none()).collect();
    let rows = &timed[..];
    let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    let n = rows.len().max(1);
    let height = 120 + 40 * n as u32;
    let root = BitMapBackend::new(path, (1200, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let max = rows
        .iter()
        .map(|r| r.decode_tok_per_s)
        .fold(1.0f64, f64::max)
        * 1.35;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(0f64..max, 0f64..n as f64)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("decode tokens/s")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, r) in rows.iter().enumerate() {
        let y0 = (n - 1 - i) as f64 + 0.15;
        let color = if r.backend == "cuda" { &BLUE } else { &RED };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y0), (r.decode_tok_per_s, y0 + 0.7)],
                color.mix(0.5).filled(),
            )))
            .map_err(|e| err(&e))?;
        let mut text = format!("{}  {:.1} tok/s", r.label, r.decode_tok_per_s);
        if let Some(f) = r.fraction_of_bound {
            text.push_str(&format!(" ({:.1}% of bound)", f * 100.0));
        }
        chart
            .draw_series(std::iter::once(Text::new(
                text,
                (max * 0.01, y0 + 0.5),
                ("sans-serif", 14).into_font(),
            )))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// One streamed run for [`budget_lines`]: its series (placement and policy, or sets and
/// policy), budget (percent), decode speed, and the right panel's figure with its floor
/// (Belady's, on the same requests).
pub struct StreamPoint {
    pub series: String,
    pub budget: f64,
    pub tok_per_s: f64,
    pub right: f64,
    pub floor: f64,
}

/// What [`budget_lines`] draws besides the points: flat reference speeds (each a value and a
/// name; black, then red), whether the speed axis is logarithmic (references far above the
/// points), and the right panel's axis name and top (1 for a ratio).
pub struct BudgetPlot<'a> {
    pub title: &'a str,
    pub references: &'a [(f64, &'a str)],
    pub log_speed: bool,
    pub right_desc: &'a str,
    pub right_max: f64,
}

/// Two panels against the FFN budget: decode tok/s per series, with the references as flat
/// lines; and the right figure per series (miss ratio, or bytes read), each with its floor
/// (dashed, same colour).
pub fn budget_lines(points: &[StreamPoint], plot: &BudgetPlot, path: &Path) -> Result<(), String> {
    let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(plot.title, ("sans-serif", 20))
        .map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(700);
    let mut series: Vec<&str> = Vec::new();
    for p in points {
        if !series.contains(&p.series.as_str()) {
            series.push(&p.series);
        }
    }
    let max_budget = points.iter().map(|p| p.budget).fold(100.0, f64::max);
    let speeds = || {
        points
            .iter()
            .map(|p| p.tok_per_s)
            .chain(plot.references.iter().map(|r| r.0))
    };
    let max_tps = speeds().fold(1.0, f64::max) * 1.15;
    let min_tps = speeds().filter(|v| *v > 0.0).fold(max_tps, f64::min) / 1.5;
    // Past the first two picks, which are the reference lines' black and red.
    let colour = |i: usize| Palette99::pick(i + 2).to_rgba();
    let line = |s: &str, f: &dyn Fn(&StreamPoint) -> f64| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.series == s)
            .map(|p| (p.budget, f(p)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };

    let speed_desc = if plot.log_speed {
        "decode tokens/s (log)"
    } else {
        "decode tokens/s"
    };
    macro_rules! speed_panel {
        ($c:expr) => {{
            let mut c = $c;
            c.configure_mesh()
                .x_desc("FFN budget (% of the FFN's bytes)")
                .y_desc(speed_desc)
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| err(&e))?;
            for (&(value, name), col) in plot.references.iter().zip([BLACK, RED]) {
                c.draw_series(LineSeries::new(
                    [(0.0, value), (max_budget, value)],
                    col.stroke_width(1),
                ))
                .map_err(|e| err(&e))?
                .label(format!("{name} {value:.1}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col));
            }
            for (i, s) in series.iter().enumerate() {
                let col = colour(i);
                c.draw_series(LineSeries::new(
                    line(s, &|p| p.tok_per_s),
                    col.stroke_width(2),
                ))
                .map_err(|e| err(&e))?
                .label(*s)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col));
                c.draw_series(
                    line(s, &|p| p.tok_per_s)
                        .into_iter()
                        .map(|xy| Circle::new(xy, 3, col.filled())),
                )
                .map_err(|e| err(&e))?;
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 12))
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    let chart = || {
        let mut b = ChartBuilder::on(&left);
        b.margin(15).x_label_area_size(35).y_label_area_size(55);
        b
    };
    if plot.log_speed {
        speed_panel!(chart()
            .build_cartesian_2d(0f64..max_budget, (min_tps..max_tps).log_scale())
            .map_err(|e| err(&e))?);
    } else {
        speed_panel!(chart()
            .build_cartesian_2d(0f64..max_budget, 0f64..max_tps)
            .map_err(|e| err(&e))?);
    }

    let mut c = ChartBuilder::on(&right)
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..max_budget, 0f64..plot.right_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("FFN budget (% of the FFN's bytes)")
        .y_desc(plot.right_desc)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let col = colour(i);
        c.draw_series(LineSeries::new(line(s, &|p| p.right), col.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(*s)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col));
        c.draw_series(DashedLineSeries::new(
            line(s, &|p| p.floor),
            6,
            4,
            col.stroke_width(1),
        ))
        .map_err(|e| err(&e))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
