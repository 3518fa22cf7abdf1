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
    /// Returns the changes logged: `(member id, state before, state now)`.
    pub(crate) fn observe(
        &mut self,
        membership: &Membership,
    ) -> Vec<(String, Option<MemberState>, MemberState)> {
        let mut changes = Vec::new();
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
            changes.push((info.id.clone(), before, state));
            let (id, addr) = (info.id.as_str(), info.addr.as_str());
            match (before, state) {
                (_, MemberState::Suspect) => tracing::warn!(
                    peer = id,
                    %addr,
                    "peer suspected: silent longer than --suspect-after; it keeps its slots for now"
                ),
                (_, MemberState::Dead) => tracing::warn!(
                    peer = id,
                    %addr,
                    "peer declared dead: silent longer than --dead-after; its slots move to their successors"
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
        forget_the_forgotten(&mut self.last, membership);
        changes
    }
}

/// Drops from `by_member` the members the membership no longer knows (it forgets the dead and
/// departed after a while): a table kept per member stays within the membership's bound.
pub(crate) fn forget_the_forgotten<V>(by_member: &mut HashMap<String, V>, membership: &Membership) {
    if by_member.len() > membership.members().count() {
        let known: std::collections::HashSet<&str> =
            membership.members().map(|(m, _)| m.id.as_str()).collect();
        by_member.retain(|id, _| known.contains(id.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use floodgate::cluster::membership::MemberDigest;
    use floodgate::cluster::{Gossip, MemberInfo, MembershipConfig};

    use super::*;

    const MS: u64 = 1_000_000;

    fn info(id: &str) -> MemberInfo {
        MemberInfo {
            id: id.to_owned(),
            addr: format!("127.0.0.1:{}", 7100 + id.len()),
            region: "local".to_owned(),
        }
    }

    fn gossip(id: &str, heartbeat: u64, left: bool) -> Gossip {
        Gossip {
            members: vec![MemberDigest {
                info: info(id),
                incarnation: 1,
                heartbeat,
                left,
                versions: None,
                joining: false,
            }],
        }
    }

    #[test]
    fn transitions_are_reported_once_each_and_never_for_this_node() {
        let config = MembershipConfig::default();
        let mut membership = Membership::new(info("me"), 1, Vec::new(), config, 0, 7);
        let mut log = MemberLog::default();
        assert!(log.observe(&membership).is_empty());
        membership.handle_gossip(0, &gossip("peer", 1, false));
        assert_eq!(
            log.observe(&membership),
            [("peer".to_owned(), None, MemberState::Alive)]
        );
        assert!(log.observe(&membership).is_empty(), "no change, no log");
        membership.poll(config.suspect_after_ns);
        assert_eq!(
            log.observe(&membership),
            [(
                "peer".to_owned(),
                Some(MemberState::Alive),
                MemberState::Suspect
            )]
        );
        membership.poll(config.suspect_after_ns + config.dead_after_ns);
        assert_eq!(
            log.observe(&membership),
            [(
                "peer".to_owned(),
                Some(MemberState::Suspect),
                MemberState::Dead
            )]
        );
    }

    #[test]
    fn an_announced_leave_is_reported_as_left() {
        let config = MembershipConfig::default();
        let mut membership = Membership::new(info("me"), 1, Vec::new(), config, 0, 7);
        let mut log = MemberLog::default();
        membership.handle_gossip(0, &gossip("peer", 1, false));
        log.observe(&membership);
        membership.handle_gossip(10 * MS, &gossip("peer", 2, true));
        assert_eq!(
            log.observe(&membership),
            [(
                "peer".to_owned(),
                Some(MemberState::Alive),
                MemberState::Left
            )]
        );
    }
}
