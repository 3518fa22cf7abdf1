//! The fleet's brownout level, from the gateway's side: each round, report this gateway's own
//! shedding level for a backend into the cluster and read back the fleet's (the core's
//! `priority::brownout` says how it is counted), then set it on the backend's [`ShedGate`].
//!
//! A round is one call of three checks, decided by the keys' owners like any other; when the
//! cluster cannot answer, the gateway sheds on its own signal alone (fleet level 0) until it
//! can. [`read_fleet_level`] reads the same counts without reporting (`floodgate status
//! --brownout BACKEND`).

use std::time::Duration;

use floodgate::Limit;
use floodgate::check::{Check, FailureMode, Source};
use floodgate::priority::brownout::{
    BrownoutReading, MAX_LEVEL, MAX_REPORTS, fleet_level, report_key, report_limit,
};
#[cfg(feature = "tower")]
use tokio::sync::watch;

use crate::Client;
use crate::error::ClientError;
#[cfg(feature = "tower")]
use crate::shed::ShedGate;

/// What is wrong with a brownout set-up.
#[derive(Debug, thiserror::Error)]
pub enum BrownoutError {
    #[error("backend name `{0}`: 1 to 64 of A-Z a-z 0-9 . _ -")]
    Backend(String),
    #[error("report interval: {0}")]
    Interval(floodgate::LimitError),
    #[error("the limiter: {0}")]
    Client(#[from] ClientError),
    #[error("the limiter did not decide every report (a node unreachable)")]
    Undecided,
}

/// Reports one backend's level and reads the fleet's.
#[derive(Debug, Clone)]
pub struct BrownoutReporter {
    client: Client,
    keys: Vec<Vec<u8>>,
    limit: Limit,
    // Only the task that runs rounds (feature `tower`) paces itself by it.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    interval: Duration,
    quorum_bp: u32,
}

impl BrownoutReporter {
    /// A reporter for `backend`, a round every `interval`; the fleet is at a level once
    /// `quorum_bp` (basis points) of the reports are at it or above.
    pub fn new(
        client: Client,
        backend: &str,
        interval: Duration,
        quorum_bp: u32,
    ) -> Result<Self, BrownoutError> {
        let keys = (0..=MAX_LEVEL)
            .map(|level| report_key(backend, level))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| BrownoutError::Backend(backend.to_owned()))?;
        let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        let limit = report_limit(interval_ns).map_err(BrownoutError::Interval)?;
        Ok(BrownoutReporter {
            client,
            keys,
            limit,
            interval,
            quorum_bp,
        })
    }

    /// One round: counts `local_level` in (one report on each level up to it), and returns
    /// the fleet's level with the counts it was read from.
    pub async fn round(&self, local_level: u8) -> Result<(u8, BrownoutReading), BrownoutError> {
        self.count(|level| u64::from(level <= local_level)).await
    }

    /// The fleet's level and its counts, reporting nothing (every check costs 0).
    pub async fn peek(&self) -> Result<(u8, BrownoutReading), BrownoutError> {
        self.count(|_| 0).await
    }

    /// One call of a check per level, each of `cost(level)`.
    async fn count(
        &self,
        cost: impl Fn(u8) -> u64,
    ) -> Result<(u8, BrownoutReading), BrownoutError> {
        let checks: Vec<Check> = self
            .keys
            .iter()
            .zip(0..)
            .map(|(key, level)| {
                let cost = cost(level);
                // Closed: a count from a local fallback bucket would be this gateway's alone.
                Check::new(key.clone(), self.limit)
                    .cost(cost)
                    .failure_mode(FailureMode::Closed)
            })
            .collect();
        let verdicts = self.client.check(&checks).await?;
        let mut reading = BrownoutReading::default();
        for (slot, verdict) in reading.at_least.iter_mut().zip(&verdicts) {
            if verdict.source != Source::Node {
                return Err(BrownoutError::Undecided);
            }
            *slot = MAX_REPORTS.saturating_sub(verdict.decision.remaining());
        }
        Ok((fleet_level(&reading, self.quorum_bp), reading))
    }

    /// Runs rounds every interval with `gate`'s own level until `shutdown` turns true, and
    /// sets the fleet's level on it (0 while the cluster cannot answer). Each round waits for
    /// the one before: at most one call in flight.
    #[cfg(feature = "tower")]
    pub async fn run(self, gate: ShedGate, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.wait_for(|&stop| stop) => return,
            }
            match self.round(gate.local_level()).await {
                Ok((level, _)) => gate.set_fleet_level(level),
                Err(e) => {
                    tracing::debug!("brownout round for {}: {e}", gate.backend());
                    gate.set_fleet_level(0);
                }
            }
        }
    }
}

/// `backend`'s fleet level as the gateways reporting every `interval` with `quorum_bp` see it,
/// with the counts it was read from; nothing is reported. `interval` must be theirs: the
/// counts are kept under the limit it makes.
pub async fn read_fleet_level(
    client: &Client,
    backend: &str,
    interval: Duration,
    quorum_bp: u32,
) -> Result<(u8, BrownoutReading), BrownoutError> {
    BrownoutReporter::new(client.clone(), backend, interval, quorum_bp)?
        .peek()
        .await
}
