//! Output: a human table by default, one JSON object per line with `--json`.

use serde::Serialize;

/// Prints rows as JSON lines, or as an aligned table under `columns` (taken from each row's JSON keys).
pub(crate) fn print_rows<T: Serialize>(
    rows: &[T],
    json: bool,
    columns: &[&str],
) -> anyhow::Result<()> {
    let values: Vec<serde_json::Value> = rows
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    if json {
        for v in &values {
            println!("{}", serde_json::to_string(v)?);
        }
        return Ok(());
    }
    let cells: Vec<Vec<String>> = values
        .iter()
        .map(|v| columns.iter().map(|c| cell(&v[*c])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].len())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |items: Vec<&str>| {
        items
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:>w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(columns.to_vec()));
    for row in &cells {
        println!("{}", line(row.iter().map(String::as_str).collect()));
    }
    Ok(())
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.abs() >= 100.0 {
                format!("{f:.1}")
            } else {
                format!("{f:.3}")
            }
        }
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The value at quantile `q` (0..=1) of `samples` (sorted here).
pub(crate) fn quantile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let idx = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[idx]
}
