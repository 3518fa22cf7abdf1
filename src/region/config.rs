//! Settings of the delta exchange, every bound in one place.

use crate::NANOS_PER_SEC;

const MS: u64 = 1_000_000;

/// How often deltas are sent, how long unacknowledged ones wait before being sent again, and
/// the bounds on everything the exchange holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeConfig {
    /// Regions in the deployment (at least 1): a global key's local share of its burst is
    /// `burst / regions` (at least 1 unit).
    pub regions: usize,
    /// Deltas admitted since the last message are sent every interval (`--region-sync-interval`).
    pub sync_interval_ns: u64,
    /// A message not acknowledged after this is sent again; the wait doubles each time, up to
    /// `max_retransmit_ns`.
    pub retransmit_ns: u64,
    pub max_retransmit_ns: u64,
    /// A destination that has acknowledged nothing for this long while deltas are outstanding
    /// is unreachable: it no longer holds back local admissions (a cut-off region keeps
    /// enforcing with what it knows), and its deltas wait, aggregated per key.
    pub unreachable_after_ns: u64,
    /// Messages sent and not yet acknowledged, per destination; past it new deltas wait in the
    /// pending table, aggregated per key.
    pub max_in_flight: usize,
    /// Deltas in one message.
    pub max_deltas_per_message: usize,
    /// Keys with pending deltas, per destination. A global check that would add a key beyond
    /// it is denied (counted as `refused_outbox_full`), so admitted consumption is never
    /// dropped.
    pub max_pending_keys: usize,
    /// Senders whose sequence numbers a receiver tracks; deltas from more are refused (not
    /// acknowledged, so they are sent again later, not lost).
    pub max_senders: usize,
    /// GCRA keys holding remote units their bucket could not take yet.
    pub max_backlog_keys: usize,
    /// A sender's inbox that has received nothing for this long is forgotten (when a new
    /// sender needs its place, and when the node sweeps). Safe because every message carries
    /// the sender's settled point: an inbox made again starts where the sender's
    /// unacknowledged messages start, and after far longer than `max_retransmit_ns` of silence
    /// nothing was in flight (a sender sends what is unacknowledged again at least that
    /// often). A sender cut off for longer with messages applied here but not acknowledged
    /// would have those applied again (as after a restart of this node).
    pub inbox_idle_ns: u64,
    /// How far above the first missing sequence number a sender's message may be (at least
    /// `max_in_flight`): [`super::DEDUPE_WINDOW`], smaller in simulations so a run passes it.
    pub dedupe_window: u64,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            regions: 1,
            sync_interval_ns: 100 * MS,
            retransmit_ns: 400 * MS,
            max_retransmit_ns: 2 * NANOS_PER_SEC,
            unreachable_after_ns: 2 * NANOS_PER_SEC,
            max_in_flight: 16,
            max_deltas_per_message: 1_024,
            max_pending_keys: 65_536,
            max_senders: 1_024,
            max_backlog_keys: 65_536,
            inbox_idle_ns: 600 * NANOS_PER_SEC,
            dedupe_window: super::DEDUPE_WINDOW,
        }
    }
}

impl ExchangeConfig {
    /// A configuration for `regions` regions, everything else default.
    pub fn for_regions(regions: usize) -> Self {
        ExchangeConfig {
            regions: regions.max(1),
            ..ExchangeConfig::default()
        }
    }

    /// This configuration with every setting brought into its working range: intervals of at
    /// least 1 ms (a zero wait would resend forever within one `poll_transmit` loop), the
    /// longest retransmission wait at least the first, every count at least 1, an idle inbox
    /// kept at least four of the longest retransmission waits, the window at least the
    /// messages in flight.
    pub fn sanitized(self) -> Self {
        const MIN_NS: u64 = MS;
        let retransmit_ns = self.retransmit_ns.max(MIN_NS);
        let max_retransmit_ns = self.max_retransmit_ns.max(retransmit_ns);
        let max_in_flight = self.max_in_flight.max(1);
        ExchangeConfig {
            regions: self.regions.max(1),
            sync_interval_ns: self.sync_interval_ns.max(MIN_NS),
            retransmit_ns,
            max_retransmit_ns,
            unreachable_after_ns: self.unreachable_after_ns.max(MIN_NS),
            max_in_flight,
            max_deltas_per_message: self.max_deltas_per_message.max(1),
            max_pending_keys: self.max_pending_keys.max(1),
            max_senders: self.max_senders.max(1),
            max_backlog_keys: self.max_backlog_keys,
            inbox_idle_ns: self.inbox_idle_ns.max(max_retransmit_ns.saturating_mul(4)),
            dedupe_window: self.dedupe_window.max(max_in_flight as u64),
        }
    }

    /// The most a region may admit for a global key of `burst` beyond what every other region
    /// has confirmed: `burst / regions`, at least 1.
    pub fn share(&self, burst: u64) -> u64 {
        (burst / self.regions.max(1) as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_settings_are_brought_into_range() {
        let config = ExchangeConfig {
            regions: 0,
            sync_interval_ns: 0,
            retransmit_ns: 0,
            max_retransmit_ns: 0,
            unreachable_after_ns: 0,
            max_in_flight: 0,
            max_deltas_per_message: 0,
            max_pending_keys: 0,
            max_senders: 0,
            max_backlog_keys: 0,
            inbox_idle_ns: 0,
            dedupe_window: 0,
        }
        .sanitized();
        assert_eq!(config.inbox_idle_ns, 4 * MS);
        assert_eq!(config.dedupe_window, 1);
        assert_eq!(config.regions, 1);
        assert_eq!(config.retransmit_ns, MS);
        assert_eq!(config.max_retransmit_ns, MS);
        assert_eq!(config.max_in_flight, 1);
        assert_eq!(config.share(10), 10);
        assert_eq!(ExchangeConfig::for_regions(3).share(10), 3);
        assert_eq!(ExchangeConfig::for_regions(3).share(2), 1);
    }
}
