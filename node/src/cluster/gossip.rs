//! The driver's gossip: the round (a node whose seeds are all itself founds its cluster,
//! suspicion fed to the ownership machine, gossip out), a peer's gossip in, readiness, and a
//! graceful leave. Each change of owners goes through the table update (`table_switch`).

use floodgate::Clock;
use floodgate::cluster::Gossip;

use super::Cluster;

impl Cluster {
    /// Takes a peer's gossip; `own` says which members' digests are the sender's own word (the
    /// members its certificate names), the others being relays.
    pub(crate) fn handle_gossip(&self, now_ns: u64, own: &dyn Fn(&str) -> bool, gossip: &Gossip) {
        let mut conflicts = Vec::new();
        drop(self.update_table(now_ns, |membership| {
            conflicts = membership.handle_gossip_from(now_ns, own, gossip)
        }));
        self.members.publish_versions();
        self.members.tell_conflicts(conflicts, now_ns);
    }

    /// Why this node is not ready to serve with the cluster, or `None` when it is.
    pub(crate) fn not_ready_reason(&self) -> Option<String> {
        if let Some(reason) = self.members.refusal() {
            return Some(format!("refused: {reason}"));
        }
        if self.slots.is_joining() && !self.config.allow_alone {
            return Some("not joined: no seed answered".to_owned());
        }
        None
    }

    /// One gossip round: the join looked at, suspicion fed to the machine, gossip sent, and the
    /// owners it changed switched to.
    pub(super) fn gossip_round(&self, now_ns: u64) {
        if self.slots.is_joining()
            && self
                .peers
                .seeds_are_all_me(&self.config.seeds, &self.members.me().addr)
        {
            // Every seed name turned out to be this node: like a node without seeds, it is the
            // first of its cluster and has nobody to wait for. Under the update lock, so no
            // table update sees the flag change halfway (busy: the next round retries).
            if let Some(_one_at_a_time) = self.updating.try_lock() {
                self.members.found();
                let actions = self.slots.no_one_to_join(now_ns);
                drop(self.carry_out(actions, now_ns));
            }
        }
        if self.slots.is_joining() {
            self.members.complain_not_joined(&self.config.seeds, now_ns);
        }
        {
            // Waits for members newly suspected shorten (those alive again lengthen); waits
            // that ran out end in the machine too (checks already look lazily). Read before
            // the ownership lock: the membership lock is never taken inside it.
            let suspected = self.members.suspected_members();
            self.slots.follow_suspicion(suspected, now_ns);
        }
        self.members.gossip(now_ns);
        self.members.publish_versions();
        // Members declared suspect or dead by `poll` change the owners.
        drop(self.update_table(now_ns, |_| {}));
    }

    /// Announces a graceful leave and hands every bucket to its owner without this node.
    pub(crate) async fn leave(&self) {
        let now_ns = self.clock.now_ns();
        let mut outgoing = Vec::new();
        // From the switch on, checks that arrive are forwarded to the new owners, and forwarded
        // checks for these slots are answered `not_owner`; the new owners hold checks on them
        // until the hand-off arrives (they see the leave as `Left`, not dead).
        let sends = self.update_table(now_ns, |membership| outgoing = membership.leave(now_ns));
        for message in outgoing {
            drop(self.members.send_gossip(message));
        }
        // Each hand-off frame is tried a few times, each try bounded by PEER_TIMEOUT; the
        // endpoint must not close before they land.
        let mut lost = 0;
        for send in sends {
            lost += usize::from(!matches!(send.await, Ok(true)));
        }
        if lost > 0 {
            // Their new owners decide those slots once their wait for it runs out.
            tracing::warn!(
                lost,
                "leave: hand-off messages not delivered to the new owners"
            );
        }
    }
}
