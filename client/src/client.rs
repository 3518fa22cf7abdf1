//! `Client`: connects to the nodes and sends each call to the node that decides it (the owner of
//! its first key, or the owner's successor), failing over to the failure modes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use floodgate::wire::WireCheck;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::address::HostPort;
use crate::call::{self, Attempt, Route};
use crate::charge::ChargeOutcome;
use crate::cluster_table::ClusterTable;
use crate::config::{ClientConfig, MAX_KEY_BYTES, validate_nodes};
use crate::dial;
use crate::error::{ClientError, ConfigError};
use crate::fallback::Fallback;
use crate::link::{self, LinkSettings, NodeLink};
use crate::queue::Call;
use crate::refresher::{LinkFactory, Refresher};
use crate::reply_slot::{self, Reply, ReplySlot, reply_pair};
use crate::routing::{Routing, TableChanges};
use crate::status::{LinkState, NodeStatus};
use crate::tls;
use crate::token_leases::TokenLeases;

use floodgate::check::{Check, DegradedReason, Verdict};
use floodgate::protocol::Feature;
use floodgate::wire::ErrorCode;

/// The first pause before a call a node answered `try_again` is sent again; it doubles each
/// time, within the call's deadline. A slot's hand-off between nodes nearby takes about a
/// millisecond (and tokio's timers tick in milliseconds), so at the default 5 ms deadline a
/// call gets three tries: at once, after 1 ms and after 3 ms.
const TRY_AGAIN_PAUSE: Duration = Duration::from_millis(1);

/// A connection to a set of floodgate nodes. Cheap to clone (an `Arc` inside) and safe to use
/// from many tasks at once; concurrent calls to one node are coalesced into shared frames.
///
/// Needs a tokio runtime with time and I/O enabled. When the last clone is dropped, background
/// tasks stop and connections close.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The links to the nodes and which one decides each key (the cluster's slot table).
    routing: Arc<Routing>,
    fallback: Fallback,
    timeout: Duration,
    max_checks: usize,
    /// Hot keys decided here against leased tokens (`None` only in tests that play the node).
    token_leases: Option<Arc<TokenLeases>>,
    /// Dropping it (with the last `Client`) also stops the supervisors.
    shutdown: watch::Sender<bool>,
    /// Each given node's supervisor and reaper tasks, and the table refresher (which stops
    /// the links to the nodes it discovered).
    supervisors: Mutex<Vec<JoinHandle<()>>>,
}

impl Client {
    /// Validates `config`, then connects to every node in the background. Waits for the first
    /// connection attempts to finish (at most `config.connect_timeout`), so calls made right
    /// after find their nodes connected; nodes that could not be reached are retried with
    /// backoff while calls to them follow their failure modes.
    ///
    /// `nodes` may be any of the cluster's nodes: the client asks one for the slot table, links
    /// to every member, and sends each call to the owner of its first key (see
    /// [`Client::slot_table`]); the table is kept current in the background. Until a table is
    /// known, calls spread over `nodes`, which forward what they do not own.
    ///
    /// `nodes` are addresses or [`HostPort`]s: a node given by a DNS name is resolved again on
    /// every connection attempt (IPv4 first), so a node whose address changes (a restarted
    /// pod behind a headless service) is followed; its certificate is verified by that name
    /// unless `config.server_name` says otherwise.
    ///
    /// Fails only for a bad configuration: no nodes, invalid settings, unreadable certificates.
    pub async fn connect<A: Clone + Into<HostPort>>(
        nodes: &[A],
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        let nodes: Vec<HostPort> = nodes.iter().cloned().map(Into::into).collect();
        validate_nodes(&nodes)?;
        config.validate()?;
        let quic = tls::quinn_config(&config)?;
        let cooldown_ns = u64::try_from(config.breaker.cooldown.as_nanos()).unwrap_or(u64::MAX);
        let fallback = Fallback::new(config.fallback_store, cooldown_ns).map_err(|e| {
            ConfigError::Invalid {
                field: "fallback_store",
                problem: e.to_string(),
            }
        })?;
        let settings = Arc::new(LinkSettings::new(&config));
        let shutdown = watch::Sender::new(false);
        let mut endpoints = Vec::with_capacity(nodes.len());
        let mut links = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let addr = dial::first_address(node, config.connect_timeout).await;
            endpoints.push(dial::endpoint_for(addr, quic.clone())?);
            links.push(Arc::new(NodeLink::seed(node.clone(), addr, &config)));
        }
        // Before the links connect: each subscribes to its node's table pushes on connecting.
        let routing = Arc::new(Routing::new(links.clone()));
        let mut supervisors = Vec::with_capacity(2 * nodes.len());
        for (link, endpoint) in links.iter().zip(endpoints) {
            supervisors.push(tokio::spawn(link::supervise(
                link.clone(),
                endpoint,
                settings.clone(),
                shutdown.subscribe(),
            )));
            supervisors.push(tokio::spawn(link::reap(link.clone(), shutdown.subscribe())));
        }
        let token_leases = TokenLeases::new(config.token_leases, routing.clone());
        supervisors.push(tokio::spawn(
            token_leases.clone().run_sweeper(shutdown.subscribe()),
        ));
        let token_leases = Some(token_leases);
        let client = Client {
            inner: Arc::new(Inner {
                routing: routing.clone(),
                fallback,
                timeout: config.timeout,
                max_checks: config.max_checks_per_frame,
                token_leases,
                shutdown,
                supervisors: Mutex::new(supervisors),
            }),
        };
        // Each attempt is bounded by `connect_timeout` already; the margin only guards this wait.
        let settle = config.connect_timeout + Duration::from_millis(100);
        let _ =
            tokio::time::timeout(settle, client.wait_until(|s| s != LinkState::Connecting)).await;
        // The first table, then the links to the members it names, before the first call.
        let factory = LinkFactory {
            quic,
            config,
            settings,
        };
        let mut refresher = Refresher::new(routing, factory, links);
        let reachable = client
            .nodes()
            .iter()
            .any(|n| n.state == LinkState::Connected);
        if reachable && let Ok(true) = tokio::time::timeout(settle, refresher.refresh()).await {
            let _ = tokio::time::timeout(settle, client.wait_until(|s| s != LinkState::Connecting))
                .await;
        }
        let shutdown = client.inner.shutdown.subscribe();
        client
            .inner
            .supervisors
            .lock()
            .push(tokio::spawn(refresher.run(shutdown)));
        Ok(client)
    }

    /// Decides `checks` as one all-or-nothing group on the node that owns the first key: if any
    /// is denied, none consumes. Returns one verdict per check, in order; the request may
    /// proceed only if every verdict is allowed ([`crate::all_allowed`]).
    ///
    /// Returns within the configured timeout whatever the nodes do: a check the node cannot
    /// decide is decided by its failure mode, which the verdict's source shows. Errors are only
    /// for invalid calls (no checks, too many, a key too long) and nodes refusing the request
    /// as invalid.
    pub async fn check(&self, checks: &[Check]) -> Result<Vec<Verdict>, ClientError> {
        let mut verdicts = Vec::with_capacity(checks.len());
        self.check_into(checks, &mut verdicts).await?;
        Ok(verdicts)
    }

    /// [`Client::check`] writing the verdicts into `out` (cleared first) instead of a new
    /// vector: with `out` reused from call to call, a call allocates nothing once the client
    /// is warm (its check groups, key buffers and reply slots are pooled), which is what a
    /// gateway's hot path wants.
    pub async fn check_into(
        &self,
        checks: &[Check],
        out: &mut Vec<Verdict>,
    ) -> Result<(), ClientError> {
        let inner = &*self.inner;
        inner.validate(checks)?;
        out.clear();
        if checks.iter().any(|c| c.peek) && !inner.reads_metered() {
            // A member from before peeks would refuse the frame: ask what a cost of 0 sees.
            let unmetered: Vec<Check> = checks
                .iter()
                .map(|c| match c.peek {
                    true => Check {
                        peek: false,
                        ..c.clone().cost(0)
                    },
                    false => c.clone(),
                })
                .collect();
            return Box::pin(self.check_into(&unmetered, out)).await;
        }
        // A hot key with leased tokens is decided here, without a round trip (a peek asks its
        // owner: a lease holds tokens, not what the bucket owes).
        if let (Some(leases), [single]) = (&inner.token_leases, checks)
            && !single.peek
            && let Some(verdict) = leases.decide(single)
        {
            // Decided without I/O: spend tokio's cooperative budget, so a caller looping on
            // leased checks still lets the runtime's other tasks (timers, streams) run.
            tokio::task::consume_budget().await;
            out.push(verdict);
            return Ok(());
        }
        let slot = reply_slot::take();
        let result = inner.check_with(checks, &slot, out).await;
        // A caller that gives up drops its slot with this future; one that finished returns it.
        reply_slot::give_back(slot);
        result
    }

    /// Index in [`Client::nodes`] of the node that decides `key` now. A [`Client::check`] call
    /// is decided all-or-nothing on one node; a caller whose keys have different owners splits
    /// its checks by owner and gives back what was taken when the request does not pass
    /// ([`Client::refund`]).
    pub fn owner_of(&self, key: &[u8]) -> usize {
        self.inner.routing.routes().route(key)
    }

    /// The address of the node that decides a call whose first key is `key`, now.
    pub fn node_for(&self, key: &[u8]) -> SocketAddr {
        let routes = self.inner.routing.routes();
        routes.links[routes.route(key)].addr
    }

    /// The slot table calls are routed by: its version, the members and each slot's owner.
    /// `None` until a node has given one (calls then spread over the nodes given to
    /// `connect`, which forward what they do not own).
    pub fn slot_table(&self) -> Option<Arc<ClusterTable>> {
        self.inner.routing.table()
    }

    /// Wakes on every change of [`Client::slot_table`] and the links it routes to.
    pub fn table_changes(&self) -> TableChanges {
        self.inner.routing.changes()
    }

    /// Gives back `cost` units to the bucket of each check, on the node that owns its key:
    /// what a request took under rules that allowed it when another rule (possibly on another
    /// node) denied it. Refunds are never denied. Best effort: returns how many checks a node
    /// refunded; a refund that cannot reach its node is dropped (the units come back as the
    /// bucket refills).
    pub async fn refund(&self, checks: &[Check]) -> Result<usize, ClientError> {
        let inner = &*self.inner;
        inner.validate(checks)?;
        let routes = inner.routing.routes();
        let mut by_node: Vec<Vec<WireCheck>> = vec![Vec::new(); routes.links.len()];
        for check in checks {
            by_node[routes.route(&check.key)].push(WireCheck::refund(
                check.key.as_slice(),
                &check.limit,
                check.cost,
            ));
        }
        let mut answers = Vec::new();
        for (node, wire) in by_node.into_iter().enumerate() {
            if wire.is_empty() {
                continue;
            }
            let (reply, answer) = reply_pair();
            let count = wire.len();
            let call = Call {
                checks: wire,
                // Refunds are local to the region that decided them.
                scopes: Vec::new(),
                reply,
                deadline: Instant::now() + inner.timeout,
            };
            if routes.links[node].queue.push(call).is_ok() {
                answers.push((count, answer));
            }
        }
        let mut refunded = 0;
        for (count, answer) in answers {
            if let Reply::Decided { .. } = answer.await {
                refunded += count;
            }
        }
        Ok(refunded)
    }

    /// Takes metered costs known only after the fact (a response's tokens or bytes) from the
    /// buckets of `charges` (each its key, limit and `cost`), never refused: a bucket may be
    /// left owing, which denies the key until the debt is repaid. Each charge is sent to its
    /// key's owner and never counted twice (see [`ChargeOutcome`]); returns one outcome per
    /// charge, in order, within the configured timeout.
    pub async fn charge(&self, charges: &[Check]) -> Result<Vec<ChargeOutcome>, ClientError> {
        let inner = &*self.inner;
        inner.validate(charges)?;
        Ok(crate::charge::charge(&inner.routing, &inner.fallback, inner.timeout, charges).await)
    }

    /// The routing every call reads (for lease calls, `lease.rs`).
    pub(crate) fn routing(&self) -> &Routing {
        &self.inner.routing
    }

    /// The configured call timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// What this client's token leases did and hold (`None` only for a client without a cache).
    pub fn token_lease_stats(&self) -> Option<crate::token_leases::TokenLeaseStats> {
        self.inner
            .token_leases
            .as_ref()
            .map(|leases| leases.stats())
    }

    /// Each node's link: the nodes given to `connect`, in that order, then the members
    /// discovered through the slot table.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        let routes = self.inner.routing.routes();
        routes.links.iter().map(|l| l.status()).collect()
    }

    /// Resolves once every node is connected (wrap it in a timeout). For start-up readiness
    /// checks and tests; `check` never needs it.
    pub async fn wait_connected(&self) {
        self.wait_until(|s| s == LinkState::Connected).await;
    }

    /// Resolves once no node is connected (wrap it in a timeout). For tests and health checks.
    pub async fn wait_disconnected(&self) {
        self.wait_until(|s| s == LinkState::Disconnected).await;
    }

    async fn wait_until(&self, done: impl Fn(LinkState) -> bool) {
        let routes = self.inner.routing.routes();
        for link in &routes.links {
            let mut state = link.subscribe();
            // Fails only if the link is gone, which cannot happen while `self` holds it.
            let _ = state.wait_for(|&s| done(s)).await;
        }
    }

    /// Returns unused leased tokens to their owners, then closes every connection and stops the
    /// background tasks; later calls fail over (`Unreachable`). Dropping the last clone does the same without waiting.
    pub async fn close(&self) {
        // Leased tokens go back while the connections are still up.
        if let Some(leases) = &self.inner.token_leases {
            leases.return_all().await;
        }
        self.inner.shutdown.send_replace(true);
        let supervisors = std::mem::take(&mut *self.inner.supervisors.lock());
        for supervisor in supervisors {
            let _ = supervisor.await;
        }
    }
}

impl Inner {
    /// The routing and failover of one validated call (see [`Client::check`]): sent again,
    /// routed afresh, while a node answers `try_again` (a slot moving, an owner slow for a
    /// moment) or `shutting_down` (a node leaving, its slots about to move), after a pause
    /// doubling from [`TRY_AGAIN_PAUSE`], until the deadline; then its failure mode.
    async fn check_with(
        &self,
        checks: &[Check],
        slot: &Arc<ReplySlot>,
        out: &mut Vec<Verdict>,
    ) -> Result<(), ClientError> {
        // The timeout is a deadline carried by the call: the queue's reaper or the stream task
        // holding the call answers `Timeout` when it passes (one timer per queue or frame, not
        // per call; see `queue`).
        let deadline = Instant::now() + self.timeout;
        let mut pause = TRY_AGAIN_PAUSE;
        loop {
            let code = match self.route_once(checks, deadline, slot, out).await {
                Ok(result) => return result,
                Err(code) => code,
            };
            let resume = Instant::now() + pause;
            if resume >= deadline {
                out.clear();
                let reason = DegradedReason::Refused(code);
                out.extend(self.fallback.resolve_all(checks, reason));
                return Ok(());
            }
            tokio::time::sleep_until(resume).await;
            pause = pause.saturating_mul(2);
        }
    }

    /// One attempt at a call: its answer, or the code of a node that said to send it again
    /// (`try_again`, `shutting_down`).
    async fn route_once(
        &self,
        checks: &[Check],
        deadline: Instant,
        slot: &Arc<ReplySlot>,
        out: &mut Vec<Verdict>,
    ) -> Result<Result<(), ClientError>, ErrorCode> {
        let routes = self.routing.routes();
        let key = &checks[0].key;
        let owner = &routes.links[routes.route(key)];
        // Looked up only when the owner cannot be reached (it hashes the key again).
        let successor = || {
            routes
                .successor(key)
                .map(|i| &routes.links[i])
                .filter(|s| !Arc::ptr_eq(s, owner) && s.is_connected())
        };
        // The owner decides; when it cannot be reached, its successor takes over from its
        // replicas (better than each client's fallback bucket deciding alone). An owner back in
        // the table after a leave (a restart) is alive and deciding for the clients already
        // connected to it: while our link to it reconnects, the successor gets the check
        // unmarked and forwards it to the owner, so the owner stays the one decider.
        let relayed = owner.is_rejoined();
        let takeover = if owner.is_down() { successor() } else { None };
        let (first, route) = match takeover {
            Some(successor) => (successor, Route::Successor { takeover: !relayed }),
            None => (owner, Route::Owner),
        };
        let attempt = call::send(first, &self.fallback, checks, route, deadline, slot, out);
        let (reason, sent) = match attempt.await {
            Attempt::Answered(result) => return Ok(result),
            Attempt::Again(code) => return Err(code),
            Attempt::Failed(reason) => (reason, true),
            Attempt::NotSent(reason) => (reason, false),
        };
        // Only a call the owner never received, because its link is down or its breaker open,
        // goes to the successor: one that was sent may have been decided, and must not consume
        // twice; a backlog means the owner is busy, not gone.
        let owner_gone = matches!(
            reason,
            DegradedReason::Unreachable | DegradedReason::CircuitOpen
        );
        if takeover.is_none()
            && !sent
            && owner_gone
            && let Some(successor) = successor()
            && Instant::now() < deadline
        {
            let attempt = call::send(
                successor,
                &self.fallback,
                checks,
                Route::Successor { takeover: !relayed },
                deadline,
                slot,
                out,
            );
            match attempt.await {
                Attempt::Answered(result) => return Ok(result),
                Attempt::Again(code) => return Err(code),
                Attempt::Failed(_) | Attempt::NotSent(_) => {}
            }
        }
        out.clear();
        out.extend(self.fallback.resolve_all(checks, reason));
        Ok(Ok(()))
    }

    /// True when every member reads peeks and charges (protocol version 6), as the slot
    /// table says.
    fn reads_metered(&self) -> bool {
        self.routing
            .table()
            .is_some_and(|t| Feature::MeteredCosts.readable_at(t.cluster_version()))
    }

    fn validate(&self, checks: &[Check]) -> Result<(), ClientError> {
        if checks.is_empty() {
            return Err(ClientError::BadRequest(
                "a check call needs at least one check".to_owned(),
            ));
        }
        if checks.len() > self.max_checks {
            return Err(ClientError::BadRequest(format!(
                "{} checks in one call; the maximum is {} (max_checks_per_frame)",
                checks.len(),
                self.max_checks
            )));
        }
        if let Some((i, check)) = checks
            .iter()
            .enumerate()
            .find(|(_, c)| c.key.len() > MAX_KEY_BYTES)
        {
            return Err(ClientError::BadRequest(format!(
                "check {i}: key of {} bytes exceeds the maximum of {MAX_KEY_BYTES}",
                check.key.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use floodgate::check::{FailureMode, Source};
    use floodgate::wire::{ErrorCode, WireDecision};
    use floodgate::{Decision, Limit};

    use super::*;
    use crate::config::BreakerConfig;
    use crate::routing::{NONE, Routes};

    /// A client whose links never connect and whose tests play the node by taking calls from
    /// the queues directly: the caller's side (validation, timeouts, breaker, failure modes)
    /// without sockets, so paused time works.
    fn offline_client(config: &ClientConfig, nodes: usize) -> Client {
        let links = (0..nodes)
            .map(|i| {
                Arc::new(NodeLink::new(
                    ([127, 0, 0, 1], 7100 + i as u16).into(),
                    config,
                ))
            })
            .collect::<Vec<_>>();
        let shutdown = watch::Sender::new(false);
        let reapers = links
            .iter()
            .map(|l| tokio::spawn(link::reap(l.clone(), shutdown.subscribe())))
            .collect();
        Client {
            inner: Arc::new(Inner {
                routing: Arc::new(Routing::new(links)),
                fallback: Fallback::new(config.fallback_store, 1_000_000_000).unwrap(),
                timeout: config.timeout,
                max_checks: config.max_checks_per_frame,
                token_leases: None,
                shutdown,
                supervisors: Mutex::new(reapers),
            }),
        }
    }

    impl Inner {
        /// The link to the `i`-th node given.
        fn seed(&self, i: usize) -> Arc<NodeLink> {
            self.routing.routes().links[i].clone()
        }
    }

    fn config() -> ClientConfig {
        let mut config = ClientConfig::with_ca_file("unused.pem");
        config.breaker = BreakerConfig {
            failure_threshold: 2,
            cooldown: Duration::from_secs(1),
        };
        config
    }

    fn limit() -> Limit {
        Limit::gcra(2, 3_600_000_000_000, 2).unwrap()
    }

    /// Plays a node on connection generation 1: answers every frame with "allowed", `frames`
    /// times, and returns the number of calls in each frame.
    fn fake_node(link: Arc<NodeLink>, frames: usize) -> JoinHandle<Vec<usize>> {
        link.queue.set_up(1);
        tokio::spawn(async move {
            let mut sizes = Vec::new();
            let mut calls = Vec::new();
            for _ in 0..frames {
                // Held until this frame is answered, as a stream task does.
                let in_flight = link.queue.next_batch(1, 1_024, &mut calls).await;
                assert!(in_flight.is_some());
                sizes.push(calls.len());
                let total: usize = calls.iter().map(|c| c.checks.len()).sum();
                let decisions = Arc::new(vec![
                    WireDecision::from(Decision::Allowed {
                        remaining: 1,
                        reset_after_ns: 1
                    });
                    total
                ]);
                let mut start = 0;
                for call in calls.drain(..) {
                    let len = call.checks.len();
                    let _ = call.reply.send(Reply::Decided {
                        decisions: decisions.clone(),
                        start,
                    });
                    start += len;
                }
            }
            sizes
        })
    }

    #[test]
    fn a_client_is_shareable_between_tasks_and_threads() {
        fn assert_shareable<T: Send + Sync + Clone + 'static>() {}
        assert_shareable::<Client>();
    }

    #[tokio::test]
    async fn invalid_calls_are_bad_requests() {
        let client = offline_client(&config(), 1);
        let err = client.check(&[]).await.unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::BadRequest);
        let long = Check::new(vec![b'k'; MAX_KEY_BYTES + 1], limit());
        let err = client.check(&[long]).await.unwrap_err();
        assert!(err.to_string().contains("257 bytes"), "{err}");
        let many = vec![Check::new("k", limit()); 1_025];
        let err = client.check(&many).await.unwrap_err();
        assert!(err.to_string().contains("1025 checks"), "{err}");
        // The longest allowed key is fine.
        let mut config = config();
        config.timeout = Duration::from_millis(1);
        let client = offline_client(&config, 1);
        client.inner.seed(0).queue.set_down();
        let ok = Check::new(vec![b'k'; MAX_KEY_BYTES], limit());
        assert!(client.check(&[ok]).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_calls_share_frames_and_get_their_own_decisions() {
        let client = offline_client(&config(), 1);
        // Queue three calls before the node takes anything: they must go out as one frame.
        let calls: Vec<_> = (0..3)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let checks = vec![Check::new(format!("k{i}"), limit()); i + 1];
                    client.check(&checks).await.unwrap()
                })
            })
            .collect();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        let node = fake_node(client.inner.seed(0).clone(), 1);
        for (i, call) in calls.into_iter().enumerate() {
            let verdicts = call.await.unwrap();
            assert_eq!(verdicts.len(), i + 1);
            assert!(verdicts.iter().all(|v| v.source == Source::Node));
        }
        assert_eq!(node.await.unwrap(), [3]);
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_follow_failure_modes_then_open_the_breaker_until_a_probe_succeeds() {
        let client = offline_client(&config(), 1);
        let link = client.inner.seed(0).clone();
        link.queue.set_up(1); // connected, but nobody answers
        let open = [Check::new("a", limit())];
        let closed = [Check::new("b", limit()).failure_mode(FailureMode::Closed)];

        let v = client.check(&open).await.unwrap();
        assert_eq!(v[0].source, Source::Fallback(DegradedReason::Timeout));
        assert!(v[0].is_allowed());
        let v = client.check(&closed).await.unwrap();
        assert_eq!(v[0].source, Source::FailClosed(DegradedReason::Timeout));
        assert_eq!(
            v[0].decision,
            Decision::Denied {
                remaining: 0,
                retry_after_ns: 1_000_000_000,
                reset_after_ns: 1_000_000_000
            }
        );

        // Two consecutive failures opened the circuit: calls fail over without waiting.
        let before = tokio::time::Instant::now();
        let v = client.check(&open).await.unwrap();
        assert_eq!(v[0].source, Source::Fallback(DegradedReason::CircuitOpen));
        assert_eq!(tokio::time::Instant::now(), before);

        // After the cooldown one probe goes to the node; its success closes the circuit.
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = tokio::spawn({
            let client = client.clone();
            async move { client.check(&[Check::new("c", limit())]).await.unwrap() }
        });
        tokio::task::yield_now().await;
        let v = client.check(&open).await.unwrap();
        assert_eq!(
            v[0].source,
            Source::Fallback(DegradedReason::CircuitOpen),
            "only one probe at a time"
        );
        let node = fake_node(link.clone(), 2);
        assert_eq!(probe.await.unwrap()[0].source, Source::Node);
        let v = client.check(&open).await.unwrap();
        assert_eq!(v[0].source, Source::Node);
        node.await.unwrap();
    }

    /// Plays a node on connection generation 1 that answers its `i`-th frame with `answers[i]`
    /// for every check in it.
    fn scripted_node(link: Arc<NodeLink>, answers: Vec<WireDecision>) -> JoinHandle<()> {
        link.queue.set_up(1);
        tokio::spawn(async move {
            let mut calls = Vec::new();
            for answer in answers {
                let in_flight = link.queue.next_batch(1, 1_024, &mut calls).await;
                assert!(in_flight.is_some());
                let total: usize = calls.iter().map(|c| c.checks.len()).sum();
                let decisions = Arc::new(vec![answer; total]);
                let mut start = 0;
                for call in calls.drain(..) {
                    let len = call.checks.len();
                    let _ = call.reply.send(Reply::Decided {
                        decisions: decisions.clone(),
                        start,
                    });
                    start += len;
                }
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_again_answer_is_sent_again_after_a_doubling_pause_and_never_opens_the_breaker() {
        let client = offline_client(&config(), 1);
        assert_eq!(client.inner.timeout, Duration::from_millis(5));
        let link = client.inner.seed(0).clone();
        let try_again = WireDecision::error(ErrorCode::TryAgain);
        let allowed = WireDecision::from(Decision::Allowed {
            remaining: 1,
            reset_after_ns: 1,
        });
        let check = [Check::new("a", limit())];

        let node = scripted_node(link.clone(), vec![try_again, try_again, allowed]);
        let started = tokio::time::Instant::now();
        let v = client.check(&check).await.unwrap();
        assert_eq!(v[0].source, Source::Node);
        assert_eq!(started.elapsed(), Duration::from_millis(1 + 2));
        node.await.unwrap();

        // Still `try_again` when the next pause would end past the deadline (1 + 2 ms spent,
        // 4 more would pass 5): the failure mode decides, naming why.
        let node = scripted_node(link.clone(), vec![try_again; 3]);
        let started = tokio::time::Instant::now();
        let v = client.check(&check).await.unwrap();
        assert_eq!(
            v[0].source,
            Source::Fallback(DegradedReason::Refused(ErrorCode::TryAgain))
        );
        assert_eq!(started.elapsed(), Duration::from_millis(3));
        node.await.unwrap();
        // Six answers, none a failure: the breaker (two failures) stayed closed.
        let node = fake_node(link, 1);
        let v = client.check(&check).await.unwrap();
        assert_eq!(v[0].source, Source::Node);
        node.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_down_node_fails_over_at_once_and_store_full_follows_the_failure_mode() {
        let client = offline_client(&config(), 1);
        let link = client.inner.seed(0).clone();
        link.queue.set_down();
        let before = tokio::time::Instant::now();
        let v = client
            .check(&[Check::new("a", limit()).failure_mode(FailureMode::Closed)])
            .await
            .unwrap();
        assert_eq!(v[0].source, Source::FailClosed(DegradedReason::Unreachable));
        assert_eq!(
            tokio::time::Instant::now(),
            before,
            "did not wait for the timeout"
        );

        // A node answer of StoreFull for one check: that check alone follows its mode.
        let checks = [Check::new("x", limit()), Check::new("y", limit())];
        let decisions = [
            WireDecision::from(Decision::Allowed {
                remaining: 3,
                reset_after_ns: 7,
            }),
            WireDecision::error(ErrorCode::StoreFull),
        ];
        let mut v = Vec::new();
        call::verdicts_from_node(&client.inner.fallback, &checks, Some(&decisions), &mut v);
        assert_eq!(v[0].source, Source::Node);
        assert_eq!(
            v[1].source,
            Source::Fallback(DegradedReason::Refused(ErrorCode::StoreFull))
        );
        assert!(v[1].is_allowed());
    }

    #[tokio::test]
    async fn calls_route_by_their_first_key() {
        let client = offline_client(&config(), 3);
        let router = client.inner.routing.routes();
        let first = router.route(b"user:1");
        let check = |key: &str| Check::new(key.to_owned(), limit());
        // Every link down except the first key's: that call reaches a queue that accepts it.
        for (i, link) in router.links.iter().enumerate() {
            if i == first {
                link.queue.set_up(1);
            } else {
                link.queue.set_down();
            }
        }
        let node = fake_node(router.links[first].clone(), 1);
        let other = (0..100)
            .map(|i| format!("other:{i}"))
            .find(|k| router.route(k.as_bytes()) != first)
            .unwrap();
        let v = client
            .check(&[check("user:1"), check(&other)])
            .await
            .unwrap();
        assert!(v.iter().all(|v| v.source == Source::Node));
        node.await.unwrap();
    }

    /// Plays the node of a connected `link` for one frame: answers "allowed" and returns
    /// whether each call's checks were marked as a takeover.
    fn takeover_marks(link: Arc<NodeLink>) -> JoinHandle<Vec<bool>> {
        link.queue.set_up(1);
        link.set_state(LinkState::Connected);
        tokio::spawn(async move {
            let mut calls = Vec::new();
            assert!(link.queue.next_batch(1, 1_024, &mut calls).await.is_some());
            let total: usize = calls.iter().map(|c| c.checks.len()).sum();
            let allowed = WireDecision::from(Decision::Allowed {
                remaining: 1,
                reset_after_ns: 1,
            });
            let decisions = Arc::new(vec![allowed; total]);
            let mut marks = Vec::new();
            let mut start = 0;
            for call in calls.drain(..) {
                marks.push(call.checks.iter().all(|c| c.takeover));
                let len = call.checks.len();
                let _ = call.reply.send(Reply::Decided {
                    decisions: decisions.clone(),
                    start,
                });
                start += len;
            }
            marks
        })
    }

    /// An owner lost while the table kept naming it (a crash, a cut) is taken over by its
    /// successor: the check goes there marked. An owner the table names again after it had
    /// left (a restart) is alive: while our link to it reconnects, the check goes to the
    /// successor unmarked, which forwards it to the owner instead of deciding it beside it.
    /// A client of two nodes routing by their table; returns a key the first owns, with the
    /// links to its owner (down) and its successor.
    fn owner_lost(client: &Client) -> (String, Arc<NodeLink>, Arc<NodeLink>) {
        let table =
            ClusterTable::from_message(crate::cluster_table::tests::message(&["node-a", "node-b"]))
                .unwrap();
        let links = client.inner.routing.routes().links.clone();
        let link_of = |member: Option<usize>| member.map_or(NONE, |m| m as u16);
        let slots = 0..floodgate::cluster::SLOTS as u16;
        let routes = Routes {
            fallback: crate::router::Router::new(links.len()),
            links: links.clone(),
            table: Some(Arc::new(table.clone())),
            slot_link: slots
                .clone()
                .map(|s| link_of(table.owner_member(s)))
                .collect(),
            successor_link: slots.map(|s| link_of(table.successor_member(s))).collect(),
        };
        client.inner.routing.replace(routes);
        let key = (0..1_000)
            .map(|i| format!("k{i}"))
            .find(|k| client.owner_of(k.as_bytes()) == 0)
            .unwrap();
        let (owner, successor) = (links[0].clone(), links[1].clone());
        owner.queue.set_down();
        owner.set_state(LinkState::Disconnected);
        (key, owner, successor)
    }

    #[tokio::test]
    async fn a_lost_owner_is_taken_over_but_a_rejoined_one_is_reached_through_its_successor() {
        let client = offline_client(&config(), 2);
        let (key, owner, successor) = owner_lost(&client);
        let node = takeover_marks(successor.clone());
        let v = client
            .check(&[Check::new(key.clone(), limit())])
            .await
            .unwrap();
        assert_eq!(v[0].source, Source::Node);
        assert_eq!(node.await.unwrap(), vec![true], "a lost owner: a takeover");

        owner.mark_rejoined();
        assert!(owner.is_rejoined());
        let node = takeover_marks(successor);
        let v = client.check(&[Check::new(key, limit())]).await.unwrap();
        assert_eq!(v[0].source, Source::Node);
        assert_eq!(
            node.await.unwrap(),
            vec![false],
            "a rejoined owner: relayed, not taken over"
        );
    }

    /// A takeover that times out at the successor waited on the owner behind it (the successor
    /// passes it on while it hears from the owner): it does not open the successor's breaker,
    /// which its own keys need.
    #[tokio::test(start_paused = true)]
    async fn takeovers_timing_out_at_the_successor_do_not_open_its_breaker() {
        let client = offline_client(&config(), 2);
        let (key, _owner, successor) = owner_lost(&client);
        successor.queue.set_up(1);
        successor.set_state(LinkState::Connected);
        // Three takeovers whose deadline passed at the successor (its stream task answers
        // them `Timeout`, as here), one more than the breaker's threshold of two.
        let queued = tokio::spawn({
            let successor = successor.clone();
            async move {
                let mut calls = Vec::new();
                for _ in 0..3 {
                    assert!(
                        successor
                            .queue
                            .next_batch(1, 1_024, &mut calls)
                            .await
                            .is_some()
                    );
                    for call in calls.drain(..) {
                        let _ = call.reply.send(Reply::Failed(DegradedReason::Timeout));
                    }
                }
            }
        });
        for _ in 0..3 {
            let v = client
                .check(&[Check::new(key.clone(), limit())])
                .await
                .unwrap();
            assert_eq!(v[0].source, Source::Fallback(DegradedReason::Timeout));
        }
        queued.await.unwrap();
        let node = takeover_marks(successor);
        let v = client.check(&[Check::new(key, limit())]).await.unwrap();
        assert_eq!(
            v[0].source,
            Source::Node,
            "the successor's breaker stayed closed"
        );
        assert_eq!(node.await.unwrap(), vec![true]);
    }
}
