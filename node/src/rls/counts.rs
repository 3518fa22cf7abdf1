//! The RLS front's metrics, their handles registered once, as the node's others are: the call
//! histogram and the refusal counter when the listener starts, a rule's descriptor counters the
//! first time that rule counts a descriptor with that result. Registering the labelled counter
//! again for each descriptor (its labels' strings, the registry's lookup) cost about a
//! twentieth of a call.

use floodgate::rls::StatusCode;
use metrics::{Counter, Histogram, counter, histogram};
use parking_lot::RwLock;
use rustc_hash::FxHashMap;

/// Most rules whose handles are kept. The label set is bounded by the configuration, but every
/// reload may name new rules; past this many the handles are dropped and registered again as
/// they are used (the registry keeps the counts).
const MAX_RULES_HELD: usize = 4_096;

/// What became of a descriptor a rule counted, `floodgate_rls_descriptors_total`'s `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    /// Over its limit, but the rule is in shadow mode.
    ShadowDenied,
    /// Allowed, then given back because another descriptor denied the request.
    Refunded,
}

impl Outcome {
    /// Of a descriptor answered `code` (`shadow_denied`: over a shadow rule's limit) in a
    /// request answered `overall`.
    pub(crate) fn of(code: StatusCode, shadow_denied: bool, overall: StatusCode) -> Outcome {
        match (code, shadow_denied, overall) {
            (StatusCode::OverLimit, _, _) => Outcome::Denied,
            (_, true, _) => Outcome::ShadowDenied,
            (_, false, StatusCode::OverLimit) => Outcome::Refunded,
            _ => Outcome::Allowed,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::Refunded => "refunded",
        }
    }
}

/// Each rule's counters, by domain and rule name, one per outcome once used. Looked up for
/// every descriptor counted; only names from the configuration are ever inserted (a counted
/// descriptor's domain and rule are configured), so a fast unkeyed hash is safe here.
type RuleCounters = FxHashMap<String, FxHashMap<String, [Option<Counter>; 4]>>;

#[derive(Debug)]
pub(crate) struct RlsMetrics {
    /// `floodgate_rls_request_seconds`: a call from its decoded request to its answer.
    pub(crate) request_seconds: Histogram,
    /// `floodgate_rls_refused_total{reason="over_budget"}`.
    pub(crate) over_budget: Counter,
    /// Read for a handle registered already (every descriptor but a rule's first of each
    /// result), written to register one.
    descriptors: RwLock<(RuleCounters, usize)>,
}

impl RlsMetrics {
    /// Registers the handles with the process's recorder, installing it if nothing has yet: a
    /// handle taken before it is installed would count nowhere.
    pub(crate) fn new() -> Self {
        crate::metrics::recorder();
        RlsMetrics {
            request_seconds: histogram!("floodgate_rls_request_seconds"),
            over_budget: counter!("floodgate_rls_refused_total", "reason" => "over_budget"),
            descriptors: RwLock::new((FxHashMap::default(), 0)),
        }
    }

    /// Counts a descriptor of `domain` that `rule` counted, in
    /// `floodgate_rls_descriptors_total{domain, rule, result}`.
    pub(crate) fn descriptor(&self, domain: &str, rule: &str, outcome: Outcome) {
        let held = self.descriptors.read();
        let registered = held.0.get(domain).and_then(|r| r.get(rule));
        if let Some(counter) = registered.and_then(|handles| handles[outcome as usize].as_ref()) {
            counter.increment(1);
            return;
        }
        drop(held);
        let mut held = self.descriptors.write();
        let (rules, count) = &mut *held;
        let handles = match rules.get_mut(domain).and_then(|r| r.get_mut(rule)) {
            Some(handles) => handles,
            None => {
                if *count >= MAX_RULES_HELD {
                    rules.clear();
                    *count = 0;
                }
                *count += 1;
                rules
                    .entry(domain.to_owned())
                    .or_default()
                    .entry(rule.to_owned())
                    .or_default()
            }
        };
        handles[outcome as usize]
            .get_or_insert_with(|| {
                counter!(
                    "floodgate_rls_descriptors_total",
                    "domain" => domain.to_owned(),
                    "rule" => rule.to_owned(),
                    "result" => outcome.label(),
                )
            })
            .increment(1);
    }

    /// Rules whose handles are held.
    #[cfg(test)]
    fn rules_held(&self) -> usize {
        self.descriptors.read().1
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    fn count(text: &str, domain: &str, rule: &str, result: &str) -> Option<u64> {
        let needle = format!(
            "floodgate_rls_descriptors_total{{domain=\"{domain}\",rule=\"{rule}\",result=\"{result}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(needle.as_str()))
            .and_then(|n| n.trim().parse().ok())
    }

    #[test]
    fn descriptors_are_counted_per_domain_rule_and_result_with_handles_kept_bounded() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let counts = RlsMetrics::new();
            counts.descriptor("edge", "api", Outcome::Allowed);
            counts.descriptor("edge", "api", Outcome::Allowed);
            counts.descriptor("edge", "api", Outcome::Denied);
            counts.descriptor("other", "api", Outcome::Refunded);
            assert_eq!(counts.rules_held(), 2, "one per domain and rule");
            let text = handle.render();
            assert_eq!(count(&text, "edge", "api", "allowed"), Some(2), "{text}");
            assert_eq!(count(&text, "edge", "api", "denied"), Some(1), "{text}");
            assert_eq!(count(&text, "edge", "api", "shadow_denied"), None, "{text}");
            assert_eq!(count(&text, "other", "api", "refunded"), Some(1), "{text}");
            // Past the bound the handles are dropped, not the counts.
            for n in 0..MAX_RULES_HELD {
                counts.descriptor("edge", &format!("rule-{n}"), Outcome::Allowed);
            }
            assert!(counts.rules_held() <= MAX_RULES_HELD);
            counts.descriptor("edge", "api", Outcome::Allowed);
            let text = handle.render();
            assert_eq!(count(&text, "edge", "api", "allowed"), Some(3), "{text}");
        });
    }

    #[test]
    fn outcomes_follow_the_descriptor_and_the_request() {
        use StatusCode::{Ok, OverLimit};
        assert_eq!(Outcome::of(OverLimit, false, OverLimit), Outcome::Denied);
        assert_eq!(Outcome::of(Ok, true, Ok), Outcome::ShadowDenied);
        assert_eq!(Outcome::of(Ok, false, OverLimit), Outcome::Refunded);
        assert_eq!(Outcome::of(Ok, false, Ok), Outcome::Allowed);
    }
}
