//! Decisions back into RLS answers: one status per descriptor, the overall code, and the draft-10
//! `RateLimit-Policy` / `RateLimit` header fields.

use std::sync::Arc;

use crate::decision::Decision;
use crate::limit::NANOS_PER_SEC;

use super::config::{RateRule, Unit};
use super::plan::Planned;

/// The proto's `Code` (UNKNOWN is 0 and never produced here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusCode {
    Ok = 1,
    OverLimit = 2,
}

/// What one descriptor answers.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorAnswer {
    pub code: StatusCode,
    /// The rule that applied, when one counted (it names `current_limit` and metrics).
    pub rule: Option<Arc<RateRule>>,
    /// The limit as the proto states it: (requests_per_unit, unit).
    pub limit: Option<(u32, Unit)>,
    pub remaining: u32,
    pub reset_after_ns: u64,
    /// Over its limit, but the rule is in shadow mode: answered OK.
    pub shadow_denied: bool,
}

impl DescriptorAnswer {
    fn ok(rule: Option<Arc<RateRule>>) -> Self {
        DescriptorAnswer {
            code: StatusCode::Ok,
            rule,
            limit: None,
            remaining: 0,
            reset_after_ns: 0,
            shadow_denied: false,
        }
    }
}

/// The answer for a planned descriptor and, for a check, its decision (`None` when the check
/// could not be decided: it is answered OK, like envoyproxy/ratelimit does when its cache fails,
/// so the limiter never blocks traffic by failing).
pub fn answer_descriptor(planned: &Planned, decision: Option<&Decision>) -> DescriptorAnswer {
    let (rule, counted) = match planned {
        Planned::NoLimit | Planned::Invalid(_) => return DescriptorAnswer::ok(None),
        Planned::Unlimited(rule) => return DescriptorAnswer::ok(Some(rule.clone())),
        Planned::Check {
            rule,
            counted,
            charge,
            ..
        } => {
            if *charge {
                // A charge after the fact is never refused: OK, with the bucket as it stands.
                let mut answer = DescriptorAnswer::ok(Some(rule.clone()));
                answer.limit = Some((counted.requests_per_unit, counted.unit));
                if let Some(decision) = decision {
                    answer.remaining = u32::try_from(decision.remaining()).unwrap_or(u32::MAX);
                    answer.reset_after_ns = decision.reset_after_ns();
                }
                return answer;
            }
            (rule, counted)
        }
    };
    let mut answer = DescriptorAnswer::ok(Some(rule.clone()));
    answer.limit = Some((counted.requests_per_unit, counted.unit));
    let Some(decision) = decision else {
        return answer;
    };
    answer.remaining = u32::try_from(decision.remaining()).unwrap_or(u32::MAX);
    answer.reset_after_ns = decision.reset_after_ns();
    if !decision.is_allowed() {
        if rule.shadow_mode {
            answer.shadow_denied = true;
        } else {
            answer.code = StatusCode::OverLimit;
        }
    }
    answer
}

/// OVER_LIMIT when any descriptor is.
pub fn overall_code(answers: &[DescriptorAnswer]) -> StatusCode {
    if answers.iter().any(|a| a.code == StatusCode::OverLimit) {
        StatusCode::OverLimit
    } else {
        StatusCode::Ok
    }
}

/// The draft-10 fields (`RateLimit-Policy`, `RateLimit`) for the answers that carry a limit: every
/// policy, and the state of the one with the fewest units left. `None` when no limit applied.
pub fn ratelimit_headers(answers: &[DescriptorAnswer]) -> Option<(String, String)> {
    let limited: Vec<(&DescriptorAnswer, &RateRule, (u32, Unit))> = answers
        .iter()
        .filter_map(|a| Some((a, a.rule.as_deref()?, a.limit?)))
        .collect();
    let policies: Vec<String> = limited
        .iter()
        .map(|(_, rule, (quota, unit))| {
            format!(
                "{};q={quota};w={}",
                sf_string(rule.display_name()),
                unit.period_ns() / NANOS_PER_SEC
            )
        })
        .collect();
    let (tightest, rule, _) = limited.iter().min_by_key(|(a, _, _)| a.remaining)?;
    let seconds = tightest.reset_after_ns.div_ceil(NANOS_PER_SEC);
    let state = format!(
        "{};r={};t={seconds}",
        sf_string(rule.display_name()),
        tightest.remaining
    );
    Some((policies.join(", "), state))
}

/// A structured-field string: quoted, with `\` and `"` escaped and non-printable ASCII dropped.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;
    use crate::rls::config::Counted;

    fn check(name: &str, shadow: bool) -> Planned {
        Planned::Check {
            rule: Arc::new(RateRule {
                full_key: format!("d.{name}"),
                name: Some(name.to_owned()),
                replaces: vec![],
                shadow_mode: shadow,
                detailed_metric: false,
                counted: Some(Counted::new(3, Unit::Minute, Algorithm::FixedWindow, None).unwrap()),
            }),
            key: b"k".to_vec(),
            counted: Counted::new(3, Unit::Minute, Algorithm::FixedWindow, None).unwrap(),
            cost: 1,
            refund: false,
            peek: false,
            charge: false,
        }
    }

    const ALLOWED: Decision = Decision::Allowed {
        remaining: 2,
        reset_after_ns: 40 * NANOS_PER_SEC,
    };
    const DENIED: Decision = Decision::Denied {
        remaining: 0,
        retry_after_ns: 20 * NANOS_PER_SEC,
        reset_after_ns: 20 * NANOS_PER_SEC,
    };

    #[test]
    fn a_denied_descriptor_is_over_limit_unless_in_shadow_mode() {
        let over = answer_descriptor(&check("a", false), Some(&DENIED));
        assert_eq!(over.code, StatusCode::OverLimit);
        assert_eq!(
            (over.remaining, over.reset_after_ns),
            (0, 20 * NANOS_PER_SEC)
        );
        let shadow = answer_descriptor(&check("a", true), Some(&DENIED));
        assert_eq!(shadow.code, StatusCode::Ok);
        assert!(shadow.shadow_denied);
        let ok = answer_descriptor(&check("a", false), Some(&ALLOWED));
        assert_eq!(overall_code(&[ok.clone(), shadow]), StatusCode::Ok);
        assert_eq!(overall_code(&[ok, over]), StatusCode::OverLimit);
    }

    #[test]
    fn no_limit_answers_ok_without_a_limit() {
        let a = answer_descriptor(&Planned::NoLimit, None);
        assert_eq!((a.code, a.limit), (StatusCode::Ok, None));
        assert_eq!(ratelimit_headers(&[a]), None);
    }

    #[test]
    fn headers_list_every_policy_and_the_tightest_state() {
        let a = answer_descriptor(&check("wide", false), Some(&ALLOWED));
        let b = answer_descriptor(&check("na\"rrow", false), Some(&DENIED));
        let (policy, state) = ratelimit_headers(&[a, b]).unwrap();
        assert_eq!(policy, "\"wide\";q=3;w=60, \"na\\\"rrow\";q=3;w=60");
        assert_eq!(state, "\"na\\\"rrow\";r=0;t=20");
    }
}
