//! One SVG per scenario, written by hand (a few polylines and rectangles need no plotting
//! crate): admitted per trailing window against what the limit allows, for the worst keys,
//! with the faults shaded.

use std::fmt::Write as _;
use std::path::Path;

use crate::checker::{CheckResult, FaultSpan, SETTLE_NS};
use crate::keys::KeySpec;
use crate::load::Record;
use crate::scenario::Bound;

/// How many keys a plot shows (the worst by ratio).
const KEYS_SHOWN: usize = 3;
/// Sampling step of the trailing-window counts.
const STEP_NS: u64 = 100_000_000;

/// One key's curve: at each step, admissions answered in the trailing window, and the allowance.
#[derive(Debug, Clone)]
pub struct KeySeries {
    pub key: String,
    /// (seconds, admitted in the window ending there, allowed, allowed + bound).
    pub points: Vec<(f64, u64, u64, u64)>,
}

pub fn series(
    records: &[Record],
    keys: &[KeySpec],
    result: &CheckResult,
    bound: &Bound,
    faults: &[FaultSpan],
) -> Vec<KeySeries> {
    let mut ranked: Vec<(usize, f64)> = result
        .keys
        .iter()
        .enumerate()
        .map(|(i, f)| (i, f.ratio))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let end_ns = records.iter().map(|r| r.done_ns).max().unwrap_or(0);
    ranked
        .into_iter()
        .take(KEYS_SHOWN)
        .map(|(index, _)| {
            let key = &keys[index];
            let window = key.window_ns();
            // A trailing window meets two of a window key's aligned windows (the checker judges
            // each of them on its own): the plot allows it two of each.
            let meets = if key.aligned_period_ns().is_some() {
                2
            } else {
                1
            };
            let allowed = meets * key.allowed_per_window();
            let extra = meets * bound.extra_per_window(key);
            let mut done: Vec<u64> = records
                .iter()
                .filter(|r| r.key as usize == index && r.admitted)
                .map(|r| r.done_ns)
                .collect();
            done.sort_unstable();
            let mut points = Vec::new();
            let (mut lo, mut hi) = (0usize, 0usize);
            let mut t = window.min(end_ns);
            while t <= end_ns {
                while hi < done.len() && done[hi] <= t {
                    hi += 1;
                }
                while lo < hi && done[lo] <= t.saturating_sub(window) {
                    lo += 1;
                }
                let start = t.saturating_sub(window);
                let faulted = faults
                    .iter()
                    .any(|f| start < f.end_ns.saturating_add(SETTLE_NS) && t > f.start_ns);
                let ceiling = allowed + if faulted { extra } else { 0 };
                points.push((t as f64 / 1e9, (hi - lo) as u64, allowed, ceiling));
                t += STEP_NS;
            }
            KeySeries {
                key: key.describe(),
                points,
            }
        })
        .collect()
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
const MARGIN: f64 = 50.0;
const COLOURS: [&str; KEYS_SHOWN] = ["#d62728", "#1f77b4", "#2ca02c"];

pub fn write(
    path: &Path,
    title: &str,
    series: &[KeySeries],
    faults: &[FaultSpan],
    run_ns: u64,
) -> anyhow::Result<()> {
    std::fs::write(path, render(title, series, faults, run_ns))?;
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn render(title: &str, series: &[KeySeries], faults: &[FaultSpan], run_ns: u64) -> String {
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1.max(p.3)))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let scale = Scale {
        seconds: (run_ns as f64 / 1e9).max(1.0),
        top,
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{MARGIN}" y="20" font-size="14">{}: admitted per window (solid) vs allowed (dashed) and bound (dotted)</text>"#,
        escape(title)
    );
    draw_faults(&mut svg, &scale, faults, run_ns);
    draw_axes(&mut svg, &scale);
    draw_series(&mut svg, &scale, series);
    svg.push_str("</svg>\n");
    svg
}

/// Seconds into the run and values to pixels.
struct Scale {
    seconds: f64,
    /// The value at the top of the plot.
    top: f64,
}

impl Scale {
    fn x(&self, s: f64) -> f64 {
        MARGIN + s / self.seconds * (WIDTH - 2.0 * MARGIN)
    }

    fn y(&self, v: f64) -> f64 {
        HEIGHT - MARGIN - v / self.top * (HEIGHT - 2.0 * MARGIN)
    }
}

/// Each fault span as a shaded band, labelled.
fn draw_faults(svg: &mut String, scale: &Scale, faults: &[FaultSpan], run_ns: u64) {
    for fault in faults {
        let start = scale.x(fault.start_ns as f64 / 1e9);
        let end = scale
            .x((fault.end_ns.min(run_ns)) as f64 / 1e9)
            .max(start + 1.0);
        let _ = writeln!(
            svg,
            r##"<rect x="{start:.1}" y="{MARGIN}" width="{:.1}" height="{:.1}" fill="#ffbb78" fill-opacity="0.35"/><text x="{:.1}" y="{:.1}" fill="#a05000">{}</text>"##,
            end - start,
            HEIGHT - 2.0 * MARGIN,
            start + 3.0,
            MARGIN + 12.0,
            escape(&fault.label)
        );
    }
}

/// Axes and ticks.
fn draw_axes(svg: &mut String, scale: &Scale) {
    let _ = writeln!(
        svg,
        r#"<line x1="{MARGIN}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{0}" stroke="black"/>"#,
        HEIGHT - MARGIN,
        WIDTH - MARGIN
    );
    let seconds = scale.seconds;
    let step = (seconds / 10.0).ceil().max(1.0);
    let mut s = 0.0;
    while s <= seconds {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{s}s</text>"#,
            scale.x(s),
            HEIGHT - MARGIN + 15.0
        );
        s += step;
    }
    for fraction in [0.0, 0.5, 1.0] {
        let v = scale.top / 1.1 * fraction;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"#,
            MARGIN - 4.0,
            scale.y(v) + 4.0
        );
    }
}

/// Each key's three curves (admitted solid, allowed dashed, bound dotted) and its name.
fn draw_series(svg: &mut String, scale: &Scale, series: &[KeySeries]) {
    for (i, curve) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let line = |pick: fn(&(f64, u64, u64, u64)) -> u64| -> String {
            curve
                .points
                .iter()
                .map(|p| format!("{:.1},{:.1}", scale.x(p.0), scale.y(pick(p) as f64)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            line(|p| p.1)
        );
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-dasharray="6 3" points="{}"/>"#,
            line(|p| p.2)
        );
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-dasharray="1 3" points="{}"/>"#,
            line(|p| p.3)
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" fill="{colour}">{}</text>"#,
            WIDTH - MARGIN - 260.0,
            MARGIN + 14.0 * (i as f64 + 1.0),
            escape(&curve.key)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_names_its_keys_and_marks_its_faults() {
        let series = vec![KeySeries {
            key: "chaos:gcra:0 gcra 20/1s".into(),
            points: vec![(1.0, 10, 40, 40), (2.0, 45, 40, 61)],
        }];
        let faults = vec![FaultSpan {
            label: "kill -9 node 1".into(),
            start_ns: 1_500_000_000,
            end_ns: 3_000_000_000,
        }];
        let svg = render("kill", &series, &faults, 3_000_000_000);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("kill -9 node 1"));
        assert!(svg.contains("chaos:gcra:0 gcra 20/1s"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
