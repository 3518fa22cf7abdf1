//! The rules file `rules-reload` serves and edits under load: one rule keyed by user, whose
//! limit changes twice (the second change also changes its period).

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

/// Users the load checks the rule for.
pub const USERS: usize = 6;

#[derive(Debug)]
pub struct RulesFile {
    pub path: PathBuf,
}

impl RulesFile {
    pub fn create(path: PathBuf) -> anyhow::Result<RulesFile> {
        let file = RulesFile { path };
        file.write_step(0)?;
        Ok(file)
    }

    /// Writes the file as it is at `step` (atomically: the node never reads half a file).
    pub fn write_step(&self, step: usize) -> anyhow::Result<()> {
        let (limit, _) = steps()[step];
        let text = format!(
            "# floodgate-chaos rules-reload, step {step}\nrules:\n  - name: chaos\n    path: /chaos/**\n    key: user\n    {limit}\n"
        );
        let temporary = self.path.with_extension("tmp");
        std::fs::write(&temporary, text)?;
        std::fs::rename(&temporary, &self.path)?;
        Ok(())
    }

    pub fn describe_step(&self, step: usize) -> String {
        steps()[step].1.to_string()
    }

    /// The keys as the checker sees them: one per user, under every limit of the run.
    pub fn keys() -> Vec<KeySpec> {
        let limits: Vec<Limit> = steps().iter().map(|(_, l)| *l).collect();
        (0..USERS)
            .map(|u| KeySpec {
                name: format!("user-{u}"),
                limits: limits.clone(),
                failure_mode: FailureMode::Open,
                offered_per_second: 60.0,
                region: None,
                scope: Scope::Region,
                lease_extra: 0,
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
}
