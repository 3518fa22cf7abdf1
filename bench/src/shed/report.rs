//! The shed demo's results: one row per mode, load and class (the median of the runs), as a
//! markdown table, `report.json` and `shed.svg` (p99 and success per class against load).

use std::fmt::Write as _;
use std::path::Path;

use floodgate::priority::Priority;
use plotters::prelude::*;
use serde::Serialize;

/// One mode, load and class, over one run or (after [`medians`]) over all of them.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `unloaded` (shedding on, a quarter of capacity), `baseline` (the shedder only
    /// watches) or `shedding`.
    pub mode: String,
    /// Offered load as a multiple of the upstream's capacity.
    pub load: f64,
    pub class: String,
    pub sent: u64,
    /// Shares of the class's requests: 2xx, 503 (shed), 429 (refused by a rule), failed.
    pub success: f64,
    pub shed: f64,
    pub refused: f64,
    pub failed: f64,
    /// Latency of the 2xx answers, ms.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The upstream's own load over the recorded part: answers a second, mean queue length
    /// (waiting, not in service), longest queue seen.
    pub upstream_per_s: f64,
    pub upstream_queue_mean: f64,
    pub upstream_queue_max: f64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The median of each field over the runs' rows of the same mode, load and class.
pub fn medians(rows: &[Row]) -> Vec<Row> {
    let mut keys: Vec<(String, u64, String)> = Vec::new();
    for r in rows {
        let key = (r.mode.clone(), r.load.to_bits(), r.class.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(mode, load, class)| {
            let same: Vec<&Row> = rows
                .iter()
                .filter(|r| r.mode == mode && r.load.to_bits() == load && r.class == class)
                .collect();
            let m = |f: fn(&Row) -> f64| median(same.iter().map(|r| f(r)).collect());
            Row {
                mode: mode.clone(),
                load: f64::from_bits(load),
                class: class.clone(),
                sent: m(|r| r.sent as f64) as u64,
                success: m(|r| r.success),
                shed: m(|r| r.shed),
                refused: m(|r| r.refused),
                failed: m(|r| r.failed),
                p50_ms: m(|r| r.p50_ms),
                p99_ms: m(|r| r.p99_ms),
                upstream_per_s: m(|r| r.upstream_per_s),
                upstream_queue_mean: m(|r| r.upstream_queue_mean),
                upstream_queue_max: m(|r| r.upstream_queue_max),
            }
        })
        .collect()
}

/// The table, and the target's verdict: at 4x, critical keeps at least 99% success with a p99
/// under twice its unloaded p99.
pub fn markdown(rows: &[Row], runs: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Medians of {runs} run(s). Upstream: 4 places, 20 ms each (200/s); mix 10% critical, 30% default, 60% sheddable.\n"
    );
    out.push_str("| mode | load | class | sent | ok | 503 shed | 429 | failed | p50 ms | p99 ms | upstream /s | queue mean | queue max |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {}x | {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1} | {:.1} | {:.0} | {:.1} | {:.0} |",
            r.mode,
            r.load,
            r.class,
            r.sent,
            r.success * 100.0,
            r.shed * 100.0,
            r.refused * 100.0,
            r.failed * 100.0,
            r.p50_ms,
            r.p99_ms,
            r.upstream_per_s,
            r.upstream_queue_mean,
            r.upstream_queue_max
        );
    }
    let critical = |mode: &str, load: f64| {
        rows.iter()
            .find(|r| r.mode == mode && r.load == load && r.class == Priority::Critical.name())
    };
    if let (Some(unloaded), Some(at_4x)) = (critical("unloaded", 0.25), critical("shedding", 4.0)) {
        let ratio = at_4x.p99_ms / unloaded.p99_ms.max(0.001);
        let met = at_4x.success >= 0.99 && ratio < 2.0;
        let _ = writeln!(
            out,
            "\nTarget (4x, shedding): critical success {:.2}% (>= 99%), p99 {:.1} ms = {:.2}x its unloaded p99 of {:.1} ms (< 2x): {}",
            at_4x.success * 100.0,
            at_4x.p99_ms,
            ratio,
            unloaded.p99_ms,
            if met { "met" } else { "NOT met" }
        );
        if let Some(base) = critical("baseline", 4.0) {
            let _ = writeln!(
                out,
                "Baseline (4x, no shedding): critical success {:.2}%, p99 {:.1} ms = {:.2}x unloaded.",
                base.success * 100.0,
                base.p99_ms,
                base.p99_ms / unloaded.p99_ms.max(0.001)
            );
        }
    }
    out
}

pub fn write_json(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(rows)?)?;
    Ok(())
}

/// Two panels: p99 latency of admitted requests (log) and success, per class and mode,
/// against load.
pub fn write_svg(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let loaded: Vec<&Row> = rows.iter().filter(|r| r.mode != "unloaded").collect();
    let max_p99 = loaded.iter().map(|r| r.p99_ms).fold(1.0, f64::max);
    let series = |mode: &str, class: Priority| -> Vec<&Row> {
        let mut points: Vec<&Row> = loaded
            .iter()
            .copied()
            .filter(|r| r.mode == mode && r.class == class.name())
            .collect();
        points.sort_by(|a, b| a.load.total_cmp(&b.load));
        points
    };
    let style = |mode: &str, class: Priority| {
        let color = Palette99::pick(class.rank()).to_rgba();
        color.stroke_width(if mode == "shedding" { 3 } else { 1 })
    };
    // One panel: the same lines on another y axis (the two axes are different types).
    macro_rules! panel {
        ($area:expr, $title:expr, $y:expr, $value:expr) => {{
            let mut chart = ChartBuilder::on($area)
                .caption($title, ("sans-serif", 18))
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(55)
                .build_cartesian_2d(0.5f64..4.5, $y)?;
            chart
                .configure_mesh()
                .x_desc("offered load (x capacity); thick: shedding, thin: baseline")
                .draw()?;
            for mode in ["baseline", "shedding"] {
                for class in Priority::ALL {
                    let points: Vec<(f64, f64)> = series(mode, class)
                        .iter()
                        .map(|r| (r.load, $value(r)))
                        .collect();
                    let line = style(mode, class);
                    chart
                        .draw_series(LineSeries::new(points, line))?
                        .label(format!("{class} ({mode})"))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], line));
                }
            }
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()?;
        }};
    }
    panel!(
        &left,
        "p99 of admitted requests (ms, log)",
        (1f64..max_p99 * 2.0).log_scale(),
        |r: &Row| r.p99_ms.max(1.0)
    );
    panel!(&right, "success (2xx share, %)", 0f64..105.0, |r: &Row| r
        .success
        * 100.0);
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, p99_ms: f64) -> Row {
        Row {
            mode: mode.to_owned(),
            load: 4.0,
            class: "critical".to_owned(),
            sent: 100,
            success: 1.0,
            shed: 0.0,
            refused: 0.0,
            failed: 0.0,
            p50_ms: 1.0,
            p99_ms,
            upstream_per_s: 0.0,
            upstream_queue_mean: 0.0,
            upstream_queue_max: 0.0,
        }
    }

    /// Rows of one mode, load and class fold into their medians; the target line compares the
    /// 4x shedding p99 with the unloaded one.
    #[test]
    fn runs_fold_into_medians_and_the_target_is_judged_on_them() {
        let mut rows = vec![
            row("shedding", 179.0),
            row("shedding", 44.0),
            row("shedding", 40.0),
        ];
        let mut unloaded = row("unloaded", 29.0);
        unloaded.load = 0.25;
        rows.push(unloaded);
        let folded = medians(&rows);
        assert_eq!(folded.len(), 2);
        assert_eq!(folded[0].p99_ms, 44.0);
        let table = markdown(&folded, 3);
        assert!(
            table.contains("1.52x its unloaded p99 of 29.0 ms (< 2x): met"),
            "{table}"
        );
        assert_eq!(median(vec![1.0, 3.0]), 2.0);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
