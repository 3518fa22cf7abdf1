//! The rules file the nodes serve in `rules-reload`, which edits it under load (one rule keyed
//! by user, whose limit changes twice, the second change also changing its period), and in
//! `rolling-upgrade`, where it stays as written and fails closed.

use std::path::PathBuf;

use floodgate::Limit;
use floodgate::region::Scope;
use floodgate_client::FailureMode;

use crate::keys::KeySpec;

const SECOND_NS: u64 = 1_000_000_000;

/// The rule's limit at each step: (text in the file, the limit it means). Each step's rate is
/// below what the step before admits in steady state, so a window under a step that still
/// admitted at the old rate fails the phase check: the edit is proven to have taken effect.
fn steps() -> [(&'static str, Limit); 3] {
    let gcra = |rate, period, burst| {
        Limit::gcra(rate, period, burst)
            .unwrap_or_else(|e| panic!("the rules steps are valid limits: {e}"))
    };
    [
        ("limit: 20/s\n    burst: 20", gcra(20, SECOND_NS, 20)),
        ("limit: 10/2s\n    burst: 5", gcra(10, 2 * SECOND_NS, 5)),
        ("limit: 5/s\n    burst: 5", gcra(5, SECOND_NS, 5)),
    ]
}

/// The one limit of `rolling-upgrade`'s rule. It fails closed: an old example gateway's answer
/// does not say whether a node or its local fallback bucket decided, so with a fallback an
/// admission could not be held to the exact bound; failing closed, every `200` was decided by a
/// node and a check no node decided shows as a `503`.
fn fixed() -> (&'static str, Limit) {
    let limit = Limit::gcra(20, SECOND_NS, 20)
        .unwrap_or_else(|e| panic!("the fixed rule's limit is valid: {e}"));
    (
        "limit: 20/s\n    burst: 20\n    failure_mode: closed",
        limit,
    )
}

/// The path of every request the gateways check (the rule matches `/chaos/**`).
pub const PATH: &str = "/chaos/requests";

/// Users the load checks the rule for.
pub const USERS: usize = 6;

#[derive(Debug)]
pub struct RulesFile {
    pub path: PathBuf,
    /// The fixed rule of `rolling-upgrade`, never edited; else `rules-reload`'s steps.
    fixed: bool,
}

impl RulesFile {
    /// `rules-reload`'s file, at its first step.
    pub fn create(path: PathBuf) -> anyhow::Result<RulesFile> {
        let file = RulesFile { path, fixed: false };
        file.write_step(0)?;
        Ok(file)
    }

    /// `rolling-upgrade`'s file: one rule, one limit, failing closed.
    pub fn create_fixed(path: PathBuf) -> anyhow::Result<RulesFile> {
        let file = RulesFile { path, fixed: true };
        file.write(&format!(
            "# floodgate-chaos rolling-upgrade\nrules:\n  - name: chaos\n    path: /chaos/**\n    key: user\n    {}\n",
            fixed().0
        ))?;
        Ok(file)
    }

    /// Writes the file as it is at `step` (atomically: the node never reads half a file).
    pub fn write_step(&self, step: usize) -> anyhow::Result<()> {
        anyhow::ensure!(!self.fixed, "the fixed rules file is never edited");
        let (limit, _) = steps()[step];
        self.write(&format!(
            "# floodgate-chaos rules-reload, step {step}\nrules:\n  - name: chaos\n    path: /chaos/**\n    key: user\n    {limit}\n"
        ))
    }

    fn write(&self, text: &str) -> anyhow::Result<()> {
        let temporary = self.path.with_extension("tmp");
        std::fs::write(&temporary, text)?;
        std::fs::rename(&temporary, &self.path)?;
        Ok(())
    }

    pub fn describe_step(&self, step: usize) -> String {
        steps()[step].1.to_string()
    }

    /// The keys as the checker sees them: one per user, under every limit of the run.
    pub fn keys(&self) -> Vec<KeySpec> {
        let (limits, failure_mode) = if self.fixed {
            (vec![fixed().1], FailureMode::Closed)
        } else {
            (steps().iter().map(|(_, l)| *l).collect(), FailureMode::Open)
        };
        (0..USERS)
            .map(|u| KeySpec {
                name: format!("user-{u}"),
                limits: limits.clone(),
                failure_mode,
                offered_per_second: 60.0,
                region: None,
                scope: Scope::Region,
                lease_extra: 0,
                pulse: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_a_rules_file_the_core_accepts_with_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let file = RulesFile::create(dir.path().join("rules.yaml")).unwrap();
        for (step, (_, limit)) in steps().iter().enumerate() {
            file.write_step(step).unwrap();
            let text = std::fs::read_to_string(&file.path).unwrap();
            let policy = floodgate::policy::Policy::from_yaml(&text)
                .unwrap_or_else(|e| panic!("step {step}: {e}\n{text}"));
            let mut request = floodgate_client::RequestInfo::new("GET", "/chaos/rules");
            request.user = Some("user-0".into());
            let planned = floodgate_client::policy::planned_checks(&policy, &request);
            assert_eq!(planned.len(), 1, "step {step}: one rule applies");
            assert_eq!(planned[0].1.limit, *limit, "step {step}");
        }
    }

    #[test]
    fn the_fixed_file_holds_one_closed_rule_and_its_keys_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = RulesFile::create_fixed(dir.path().join("rules.yaml")).unwrap();
        let text = std::fs::read_to_string(&file.path).unwrap();
        let policy =
            floodgate::policy::Policy::from_yaml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut request = floodgate_client::RequestInfo::new("GET", PATH);
        request.user = Some("user-0".into());
        let planned = floodgate_client::policy::planned_checks(&policy, &request);
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].0.failure_mode, FailureMode::Closed);
        let keys = file.keys();
        assert_eq!(keys.len(), USERS);
        assert_eq!(keys[0].limits, [planned[0].1.limit]);
        assert!(keys.iter().all(|k| k.failure_mode == FailureMode::Closed));
        assert!(
            file.write_step(1).is_err(),
            "the fixed file is never edited"
        );
    }
}
