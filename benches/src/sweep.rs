//! `te-bench sweep`: throughput and latency over block sizes x modes x backends, with plots.

use std::fs;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use plotters::prelude::*;

use crate::args::{fmt_size, parse_size};
use crate::report::print_rows;
use crate::run::{Backend, ModeArg, RunRow, layout_for, measure};

/// Arguments of `te-bench sweep`.
#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    /// Directory for sweep.json, sweep.svg (throughput) and latency.svg (p50/p99 per transfer).
    #[arg(long, default_value = "sweep-out")]
    out: PathBuf,
    /// Backends to sweep; repeat or omit for all.
    #[arg(long, value_enum)]
    backend: Vec<Backend>,
    /// Modes to sweep; repeat or omit for all.
    #[arg(long, value_enum)]
    mode: Vec<ModeArg>,
    /// Smallest block, with a unit (e.g. 4KiB). Sizes go up by 4x.
    #[arg(long, value_parser = parse_size, default_value = "4KiB")]
    min_block: u64,
    /// Largest block, with a unit (e.g. 64MiB).
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    max_block: u64,
    /// Bytes per transfer: at least this, and at least 4 blocks.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    total_bytes: u64,
    /// Slice size of packetized and auto modes; blocks smaller than a slice travel as one slice, so small
    /// blocks pay a header and a frame each.
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    slice_bytes: u64,
    /// Measured transfers per point (after one warm-up).
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn main(args: &SweepArgs) -> anyhow::Result<()> {
    let backends = if args.backend.is_empty() {
        Backend::ALL.to_vec()
    } else {
        args.backend.clone()
    };
    let modes = if args.mode.is_empty() {
        ModeArg::ALL.to_vec()
    } else {
        args.mode.clone()
    };
    let slice = u32::try_from(args.slice_bytes).context("--slice-bytes must fit in 32 bits")?;
    let sizes: Vec<u64> = std::iter::successors(Some(args.min_block), |s| Some(s * 4))
        .take_while(|s| *s <= args.max_block)
        .collect();
    let progress = crate::progress::bar(
        (sizes.len() * modes.len() * backends.len()) as u64,
        args.json,
    );
    let mut rows = Vec::new();
    for &backend in &backends {
        for &mode in &modes {
            for &size in &sizes {
                progress.set_message(format!("{backend:?} {mode:?} {}", fmt_size(size)));
                let layout = layout_for(size, args.total_bytes.max(4 * size))?;
                rows.push(measure(
                    backend,
                    layout,
                    mode.with_slice(slice),
                    args.iterations,
                )?);
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    fs::write(
        args.out.join("sweep.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    plot_throughput(&rows, &args.out.join("sweep.svg"))?;
    plot_latency(&rows, &args.out.join("latency.svg"))?;
    print_rows(
        &rows,
        args.json,
        &[
            "backend",
            "mode",
            "block",
            "gbps",
            "limit_gbps",
            "ratio",
            "p50_ms",
            "p99_ms",
        ],
    )?;
    if !args.json {
        println!(
            "\nwrote {0}/sweep.json, {0}/sweep.svg and {0}/latency.svg",
            args.out.display()
        );
    }
    Ok(())
}

/// One line per (backend, mode), in first-seen order.
fn series(rows: &[RunRow]) -> Vec<((&'static str, &'static str), Vec<&RunRow>)> {
    let mut out: Vec<((&'static str, &'static str), Vec<&RunRow>)> = Vec::new();
    for row in rows {
        let key = (row.backend, row.mode);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(row),
            None => out.push((key, vec![row])),
        }
    }
    out
}

fn x_range(rows: &[RunRow]) -> std::ops::Range<f64> {
    let min = rows.iter().map(|r| r.block_bytes).min().unwrap_or(4096) as f64;
    let max = rows.iter().map(|r| r.block_bytes).max().unwrap_or(1 << 26) as f64;
    min / 1.5..max * 1.5
}

fn plot_throughput(rows: &[RunRow], path: &std::path::Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = rows
        .iter()
        .map(|r| r.gbps.max(r.limit_gbps))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Throughput vs block size (dashed: raw limit of each backend)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range(rows).log_scale(), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("block size (bytes, log scale)")
        .y_desc("GB/s (1e9 bytes/s)")
        .x_label_formatter(&|x| fmt_size(x.round() as u64))
        .draw()?;
    let mut limits_drawn = Vec::new();
    for (i, ((backend, mode), points)) in series(rows).into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|r| (r.block_bytes as f64, r.gbps))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(format!("{backend} {mode}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(line.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
        if !limits_drawn.contains(&backend) {
            limits_drawn.push(backend);
            let limit: Vec<(f64, f64)> = points
                .iter()
                .map(|r| (r.block_bytes as f64, r.limit_gbps))
                .collect();
            chart
                .draw_series(DashedLineSeries::new(limit, 6, 4, color.stroke_width(1)))?
                .label(format!("{backend} raw limit"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1))
                });
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plot_latency(rows: &[RunRow], path: &std::path::Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = rows.iter().map(|r| r.p99_ms).fold(0.001, f64::max) * 2.0;
    let bottom = rows
        .iter()
        .map(|r| r.p50_ms)
        .fold(f64::MAX, f64::min)
        .max(1e-4)
        / 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Transfer latency vs block size (solid p50, dashed p99)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range(rows).log_scale(), (bottom..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("block size (bytes, log scale)")
        .y_desc("ms per transfer (log scale)")
        .x_label_formatter(&|x| fmt_size(x.round() as u64))
        .draw()?;
    for (i, ((backend, mode), points)) in series(rows).into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let p50: Vec<(f64, f64)> = points
            .iter()
            .map(|r| (r.block_bytes as f64, r.p50_ms))
            .collect();
        let p99: Vec<(f64, f64)> = points
            .iter()
            .map(|r| (r.block_bytes as f64, r.p99_ms))
            .collect();
        chart
            .draw_series(LineSeries::new(p50, color.stroke_width(2)))?
            .label(format!("{backend} {mode}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(DashedLineSeries::new(p99, 6, 4, color.stroke_width(1)))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
