//! A target's verdict (what must hold, the figure measured, the bound it is judged by) and the
//! tables of them: one run's, and the medians of several runs, where the targets are judged.

use std::fmt::Write as _;

/// The side of a bound a measured value must be on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

impl Bound {
    fn holds(self, value: f64) -> bool {
        match self {
            Bound::AtLeast(least) => value >= least,
            Bound::AtMost(most) => value <= most,
        }
    }
}

/// One row: what must hold, what this run measured, and the value judged against its bound
/// (`None`: not measured).
#[derive(Debug, Clone)]
pub(super) struct Verdict {
    pub(super) target: String,
    figure: String,
    judged: Option<(f64, Bound)>,
}

impl Verdict {
    /// A target measured as `value` (shown as `figure`), met when `bound` holds for it.
    pub(super) fn judged(
        target: impl Into<String>,
        figure: impl Into<String>,
        value: f64,
        bound: Bound,
    ) -> Self {
        Verdict {
            target: target.into(),
            figure: figure.into(),
            judged: Some((value, bound)),
        }
    }

    pub(super) fn unmeasured(target: impl Into<String>, why: &str) -> Self {
        Verdict {
            target: target.into(),
            figure: why.to_owned(),
            judged: None,
        }
    }

    pub(super) fn met(&self) -> Option<bool> {
        self.judged.map(|(value, bound)| bound.holds(value))
    }
}

/// `### Targets: M of N met in this run (against)` and the table of `verdicts`.
pub(super) fn verdict_table(out: &mut String, against: &str, verdicts: &[Verdict]) {
    let met = verdicts.iter().filter(|v| v.met() == Some(true)).count();
    let judged = verdicts.iter().filter(|v| v.met().is_some()).count();
    let _ = writeln!(
        out,
        "### Targets: {met} of {judged} met in this run ({against})\n"
    );
    let _ = writeln!(out, "| target | this run | met |\n|---|---|---|");
    for v in verdicts {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            v.target,
            v.figure,
            met_cell(v.met())
        );
    }
}

fn met_cell(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "-",
    }
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The targets judged on the medians of several runs (`runs[k]`: run k's verdicts): per target
/// (matched by its text), each run's value, the median, the spread (lowest to highest) and
/// whether the median meets the bound. Targets measured in no run are left out.
pub(super) fn medians_table(runs: &[Vec<Verdict>]) -> String {
    let mut out = String::new();
    let mut rows: Vec<(&str, Bound, Vec<Option<f64>>)> = Vec::new();
    for (k, run) in runs.iter().enumerate() {
        for verdict in run {
            let Some((value, bound)) = verdict.judged else {
                continue;
            };
            let row = match rows.iter().position(|(t, _, _)| *t == verdict.target) {
                Some(i) => &mut rows[i],
                None => {
                    rows.push((&verdict.target, bound, vec![None; runs.len()]));
                    let last = rows.len() - 1;
                    &mut rows[last]
                }
            };
            row.2[k] = Some(value);
        }
    }
    if rows.is_empty() {
        return out;
    }
    let mut judged = Vec::new();
    for (target, bound, values) in &rows {
        let mut measured: Vec<f64> = values.iter().flatten().copied().collect();
        let Some(mid) = median(&mut measured) else {
            continue;
        };
        let (low, high) = (measured[0], measured[measured.len() - 1]);
        let each: Vec<String> = values
            .iter()
            .map(|v| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}")))
            .collect();
        judged.push((
            *target,
            each.join(" / "),
            format!("{mid:.2}"),
            format!("{low:.2}-{high:.2}"),
            bound.holds(mid),
        ));
    }
    let met = judged.iter().filter(|row| row.4).count();
    let _ = writeln!(
        out,
        "### Targets judged on the medians of {} runs: {met} of {} met\n",
        runs.len(),
        judged.len()
    );
    let _ = writeln!(
        out,
        "| target | each run | median | spread | met |\n|---|---|---|---|---|"
    );
    for (target, each, mid, spread, holds) in judged {
        let _ = writeln!(
            out,
            "| {target} | {each} | {mid} | {spread} | {} |",
            met_cell(Some(holds))
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The medians table takes each target's median over the runs that measured it and judges
    /// that, so one bad run among three does not fail a target, and two do.
    #[test]
    fn targets_are_judged_on_their_medians() {
        let at_least = |ratio: f64| {
            Verdict::judged(
                "throughput",
                format!("{ratio:.2}x"),
                ratio,
                Bound::AtLeast(10.0),
            )
        };
        let at_most = |s: f64| Verdict::judged("cpu", format!("{s} s"), s, Bound::AtMost(0.3));
        let runs = vec![
            vec![at_least(12.0), at_most(0.35)],
            vec![
                at_least(8.0),
                at_most(0.36),
                Verdict::unmeasured("bytes", "not run"),
            ],
            vec![at_least(11.0), at_most(0.20)],
        ];
        let table = medians_table(&runs);
        assert!(
            table.starts_with("### Targets judged on the medians of 3 runs: 1 of 2 met"),
            "{table}"
        );
        assert!(
            table.contains("| throughput | 12.00 / 8.00 / 11.00 | 11.00 | 8.00-12.00 | yes |"),
            "{table}"
        );
        assert!(
            table.contains("| cpu | 0.35 / 0.36 / 0.20 | 0.35 | 0.20-0.36 | **no** |"),
            "{table}"
        );
        assert!(!table.contains("bytes"), "{table}");
    }

    #[test]
    fn a_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }
}
