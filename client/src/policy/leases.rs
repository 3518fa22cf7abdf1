//! A request's concurrency leases: [`RateLimiter::acquire_leases`] takes one lease per
//! `concurrency:` rule that applies, and [`HeldLeases`] renews them every half TTL while it
//! lives (a request slower than the TTL keeps its place) and gives them back when it is dropped
//! (the request finished, failed, or was abandoned), so a gateway never has to release by hand.

use std::sync::Arc;

use floodgate::policy::{HttpResponse, LeaseOutcome, PlannedLease, lease_refusal};

use super::{RateLimiter, RequestInfo};
use crate::client::Client;
use crate::lease::{Acquire, Lease, Renewal};

/// Shortest time between renewals of a request's leases: a TTL of a few milliseconds is renewed
/// no more often than this (and may then expire between renewals).
const MIN_RENEW_PERIOD: std::time::Duration = std::time::Duration::from_millis(50);

/// What happened to one of a request's leases (for metrics and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// Granted: the rule now has one more request in flight.
    Granted { rule: Arc<str> },
    /// Refused: every place is taken (`in_use` of them).
    Refused { rule: Arc<str>, in_use: u64 },
    /// The limiter did not answer (the rule's failure mode decided).
    Unreachable { rule: Arc<str> },
    /// Given back: the request is done.
    Released { rule: Arc<str> },
    /// Renewed for another TTL: the request is still running.
    Renewed { rule: Arc<str> },
    /// A renewal found the lease gone (it expired before it could be renewed): the request runs
    /// on without its place.
    Lost { rule: Arc<str> },
}

/// Observes every [`LeaseEvent`].
pub type LeaseObserver = Arc<dyn Fn(&LeaseEvent) + Send + Sync>;

/// The leases a request holds; dropping this releases them (in a background task).
pub struct HeldLeases {
    client: Client,
    leases: Vec<(Arc<str>, Lease)>,
    observer: Option<LeaseObserver>,
    /// Renews the leases every half TTL; stopped on drop.
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for HeldLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLeases")
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}

impl HeldLeases {
    /// How many leases are held.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Starts renewing the leases every half of the shortest TTL, until dropped.
    fn start_renewing(&mut self) {
        let Some(shortest) = self.leases.iter().map(|(_, l)| l.expires_in()).min() else {
            return;
        };
        let period = (shortest / 2).max(MIN_RENEW_PERIOD);
        let client = self.client.clone();
        let leases = self.leases.clone();
        let observer = self.observer.clone();
        self.renewer = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                for (rule, lease) in &leases {
                    let event = match client.renew(lease, lease.expires_in()).await {
                        Ok(Renewal::Renewed { .. }) => LeaseEvent::Renewed { rule: rule.clone() },
                        Ok(Renewal::NotHeld) => LeaseEvent::Lost { rule: rule.clone() },
                        // Not answered: the next round tries again, within the TTL's other half.
                        Err(_) => continue,
                    };
                    if let Some(observer) = &observer {
                        observer(&event);
                    }
                }
            }
        }));
    }
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if self.leases.is_empty() {
            return;
        }
        let leases = std::mem::take(&mut self.leases);
        let client = self.client.clone();
        let observer = self.observer.clone();
        // Outside a runtime (a process shutting down) the leases expire after their TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for (rule, lease) in leases {
                    // A release that fails leaves the lease to expire: nothing else to do.
                    let _ = client.release(&lease).await;
                    if let Some(observer) = &observer {
                        observer(&LeaseEvent::Released { rule });
                    }
                }
            });
        }
    }
}

#[cfg(test)]
impl HeldLeases {
    /// Leases taken by hand, for tests of what holds them.
    pub(crate) fn for_tests(
        client: Client,
        leases: Vec<(Arc<str>, Lease)>,
        observer: LeaseObserver,
    ) -> Self {
        HeldLeases {
            client,
            leases,
            observer: Some(observer),
            renewer: None,
        }
    }
}

/// The answer to [`RateLimiter::acquire_leases`].
#[derive(Debug)]
pub struct LeaseDecision {
    /// The leases taken: hold this for as long as the request is in flight.
    pub held: HeldLeases,
    /// `Some`: answer this instead (`429`, or `503` for a fail-closed rule); the leases taken
    /// were given back already.
    pub refusal: Option<HttpResponse>,
}

impl RateLimiter {
    /// Takes one lease per `concurrency:` rule that applies to `request` (none: nothing asked,
    /// no cost). When one is refused, the others are given back and `refusal` says what to
    /// answer. A lease the limiter cannot answer follows its rule's failure mode: open passes
    /// without it, closed answers `503`.
    pub async fn acquire_leases(
        &self,
        request: &RequestInfo,
        observer: Option<&LeaseObserver>,
    ) -> LeaseDecision {
        let client = self.client().clone();
        let mut held = HeldLeases {
            client: client.clone(),
            leases: Vec::new(),
            observer: observer.cloned(),
            renewer: None,
        };
        let Some(policy) = self.policy() else {
            return LeaseDecision {
                held,
                refusal: None,
            };
        };
        let attributes = request.attributes(request.client_ip(&policy));
        let planned: Vec<PlannedLease> =
            policy.leases_for_class(&attributes, request.class(&policy));
        let mut outcomes = Vec::with_capacity(planned.len());
        for lease in &planned {
            let ttl = std::time::Duration::from_nanos(lease.limit.ttl_ns());
            let rule = lease.rule.clone();
            let (outcome, event) = match client
                .acquire(lease.key.clone(), lease.limit.max(), ttl)
                .await
            {
                Ok(Acquire::Granted(granted)) => {
                    held.leases.push((rule.clone(), granted));
                    (LeaseOutcome::Granted, LeaseEvent::Granted { rule })
                }
                Ok(Acquire::Refused {
                    in_use,
                    retry_after,
                }) => (
                    LeaseOutcome::Refused {
                        in_use,
                        retry_after_ns: u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX),
                    },
                    LeaseEvent::Refused { rule, in_use },
                ),
                Err(_) => (LeaseOutcome::Unreachable, LeaseEvent::Unreachable { rule }),
            };
            if let Some(observer) = observer {
                observer(&event);
            }
            let refused = matches!(outcome, LeaseOutcome::Refused { .. }) && !lease.shadow;
            outcomes.push(outcome);
            if refused {
                // No need to ask for the rest: the request is refused.
                break;
            }
        }
        let refusal = lease_refusal(&planned, &outcomes);
        if refusal.is_some() {
            // Given back at once: the request will not run.
            drop(HeldLeases {
                client,
                leases: std::mem::take(&mut held.leases),
                observer: observer.cloned(),
                renewer: None,
            });
        } else {
            held.start_renewing();
        }
        LeaseDecision { held, refusal }
    }
}
