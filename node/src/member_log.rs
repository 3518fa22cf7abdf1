//! Logs membership changes as they happen: a peer suspected or declared dead at WARN (an operator
//! wants to see those), joins, recoveries and announced leaves at INFO.

use std::collections::HashMap;

use floodgate::cluster::{MemberState, Membership};

/// The state of each member as last logged, to log only transitions. Holds one entry per
/// member the membership knows (bounded by its `max_members`); forgotten members are dropped.
#[derive(Debug, Default)]
pub(crate) struct MemberLog {
    last: HashMap<String, MemberState>,
}

impl MemberLog {
    /// Logs every member whose state differs from the last call, then remembers the states.
    pub(crate) fn observe(&mut self, membership: &Membership) {
        let me = membership.me();
        for (info, state) in membership.members() {
            if info.id == me {
                continue;
            }
            let before = self.last.get(info.id.as_str()).copied();
            if before == Some(state) {
                continue;
            }
            self.last.insert(info.id.clone(), state);
            let (id, addr) = (info.id.as_str(), info.addr.as_str());
            match (before, state) {
                (_, MemberState::Suspect) => tracing::warn!(
                    peer = id,
                    %addr,
                    "peer suspected: no word from it within suspect_after; it keeps its slots for now"
                ),
                (_, MemberState::Dead) => tracing::warn!(
                    peer = id,
                    %addr,
                    "peer declared dead: silent past dead_after; its slots move to their successors"
                ),
                (_, MemberState::Left) => {
                    tracing::info!(peer = id, %addr, "peer left the cluster (announced leave)")
                }
                (None, MemberState::Alive) => tracing::info!(peer = id, %addr, "peer joined"),
                (Some(was), MemberState::Alive) => {
                    tracing::info!(peer = id, %addr, was = was.name(), "peer alive again")
                }
            }
        }
        if self.last.len() > membership.members().count() {
            let known: std::collections::HashSet<&str> =
                membership.members().map(|(m, _)| m.id.as_str()).collect();
            self.last.retain(|id, _| known.contains(id.as_str()));
        }
    }
}
