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
