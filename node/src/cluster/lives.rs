//! [`Lives`]: the incarnation each member was last seen in. A larger one is a restart, and a
//! connection kept to the member's address belongs to its previous life: after a crash (no
//! close sent) the new process resets it only once a packet of it arrives (signed with keys its
//! lives share; never when its private key changed across the restart), and what was sent on
//! it (gossip, forwards, hand-offs) is lost; the restarted node, hearing nothing back to its
//! join, would wait for it. Closing it at once, on gossip of the new life, loses nothing more.

use std::collections::HashMap;

use floodgate::cluster::{MemberInfo, Membership};

use crate::member_log::forget_the_forgotten;

/// The incarnation of each member as last seen. Holds one entry per member the membership
/// knows (bounded by its `max_members`); forgotten members are dropped.
#[derive(Debug, Default)]
pub(super) struct Lives {
    last: HashMap<String, u64>,
}

impl Lives {
    /// The members seen in a later life than at the last call (not this node, nor a member
    /// seen for the first time), then remembers every member's.
    pub(super) fn restarted<'m>(&mut self, membership: &'m Membership) -> Vec<&'m MemberInfo> {
        let mut lives = Vec::new();
        let me = membership.me();
        for (info, _) in membership.members() {
            if info.id == me {
                continue;
            }
            let Some(incarnation) = membership.incarnation_of(&info.id) else {
                continue;
            };
            // Looked up before inserting: runs on every gossip handled, where an id cloned per
            // member would allocate for nothing.
            match self.last.get_mut(info.id.as_str()) {
                Some(before) => {
                    if *before < incarnation {
                        lives.push(info);
                    }
                    *before = incarnation;
                }
                None => {
                    self.last.insert(info.id.clone(), incarnation);
                }
            }
        }
        forget_the_forgotten(&mut self.last, membership);
        lives
    }
}

#[cfg(test)]
mod tests {
    use floodgate::cluster::membership::MemberDigest;
    use floodgate::cluster::{Gossip, MemberInfo, MembershipConfig};

    use super::*;

    fn info(id: &str) -> MemberInfo {
        MemberInfo {
            id: id.to_owned(),
            addr: format!("127.0.0.1:{}", 7100 + id.len()),
            region: "local".to_owned(),
        }
    }

    fn digest(id: &str, incarnation: u64) -> Gossip {
        Gossip {
            members: vec![MemberDigest {
                info: info(id),
                incarnation,
                heartbeat: 1,
                left: false,
                versions: None,
                joining: false,
            }],
        }
    }

    #[test]
    fn a_later_incarnation_is_a_restart_at_its_address_once() {
        let config = MembershipConfig::default();
        let mut membership = Membership::new(info("me"), 1, Vec::new(), config, 0, 7);
        let mut lives = Lives::default();
        assert!(lives.restarted(&membership).is_empty(), "not this node");
        membership.handle_gossip(0, &digest("peer", 5));
        assert!(lives.restarted(&membership).is_empty(), "first seen");
        membership.handle_gossip(1, &digest("peer", 5));
        assert!(lives.restarted(&membership).is_empty(), "the same life");
        // Its own word of a new life (gossip from the member itself).
        drop(membership.handle_gossip_from(2, &|id| id == "peer", &digest("peer", 9)));
        assert_eq!(membership.incarnation_of("peer"), Some(9));
        assert_eq!(lives.restarted(&membership), [&info("peer")]);
        assert!(lives.restarted(&membership).is_empty(), "told once");
    }
}
