//! `RateLimiter`: the policy-driven request path. A request's attributes → the policy's checks →
//! the nodes' decisions → the verdict and its HTTP answer, with refunds and bounded waiting.
//!
//! The policy comes from the nodes (`floodgate-node --rules FILE`): fetched at start, then asked
//! for every [`LimiterConfig::refresh_interval`] with the version the limiter holds, so a rule
//! edit reaches every gateway within about a refresh interval plus the node's file poll (250 ms).
//! That is a pull standing in for the design's push: nodes answer an unchanged version with a
//! few bytes, and a gateway that cannot reach any node keeps the rules it has.
//!
//! A gateway may also start from local rules (a file it ships, or a cache of what the nodes
//! served last: [`RateLimiter::connect_with`]) when no node answers; every rule's failure mode
//! applies meanwhile. [`RateLimiter::policy_source`] says where the rules in force came from, and
//! the switch to a node's rules is logged.
//!
//! All-or-nothing across rules: the core groups a request's checks into calls, one per owning
//! node, each shadow check alone ([`floodgate::policy::grouping`]); when they span nodes and the
//! request does not pass, what the other nodes took is refunded before the answer is returned.

mod feed;
mod leases;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use floodgate::check::{Check, Verdict};
use floodgate::policy::{
    self, Action, CheckGroup, HttpResponse, PlannedCheck, Policy, RequestAttributes,
    RequestVerdict, RoundOutcomes, WaitBound, client_ip,
};
use floodgate::priority::Priority;
use floodgate::wire::PolicyMessage;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::feed::PolicyFetcher;
pub use self::feed::fetch_policy;
pub use self::leases::{HeldLeases, LeaseDecision, LeaseEvent, LeaseObserver};
use crate::address::HostPort;
use crate::charge::ChargeOutcome;
use crate::client::Client;
use crate::config::ClientConfig;
use crate::error::ClientError;

/// How the limiter keeps its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterConfig {
    /// How often the nodes are asked whether the rules changed.
    pub refresh_interval: Duration,
    /// Longest `connect` waits for the first policy from the nodes.
    pub policy_timeout: Duration,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            refresh_interval: Duration::from_millis(500),
            policy_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a limiter could not start.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error(transparent)]
    Client(#[from] ClientError),
    /// No node served rules in time (or none runs with `--rules`) and no local policy was given.
    #[error("no rules: no node served rules ({0}), and no local rules were given to start from")]
    NoPolicy(String),
}

/// What the gateway knows about one request, owned: the auth step's identity headers, the peer
/// address and the `X-Forwarded-For` values. The client IP is worked out against the trusted
/// proxies of the policy in force when the request is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub method: String,
    /// The request target's path (a query is dropped by the policy's normalization).
    pub path: String,
    pub user: Option<String>,
    pub api_key: Option<String>,
    pub tenant: Option<String>,
    pub plan: Option<String>,
    /// The request's home region (`X-Home-Region` at the example gateway), for `scope: home`
    /// rules; believed only if the rules file declares it among its `regions:`.
    pub home_region: Option<String>,
    /// The TCP peer's address.
    pub peer: Option<IpAddr>,
    /// Every `X-Forwarded-For` field line, in order.
    pub forwarded_for: Vec<String>,
    /// The class the request names (`X-Priority` at the example gateway): believed as the
    /// rules' `priority:` says.
    pub priority: Option<String>,
    /// The headers metered rules read a request's cost from (lower-case name, value; see
    /// [`RateLimiter::cost_headers`]).
    pub cost_headers: Vec<(String, String)>,
}

impl RequestInfo {
    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Self {
        RequestInfo {
            method: method.into(),
            path: path.into(),
            ..RequestInfo::default()
        }
    }

    /// The client's address: the peer, or what trusted proxies vouch for (see
    /// [`floodgate::policy::client_ip()`]).
    pub fn client_ip(&self, policy: &Policy) -> Option<IpAddr> {
        let peer = self.peer?;
        let xff: Vec<&str> = self.forwarded_for.iter().map(String::as_str).collect();
        Some(client_ip(peer, &xff, policy.trusted_proxies()))
    }

    /// The request's class under `policy` (the one it names, a route's, or the default).
    pub fn class(&self, policy: &Policy) -> Priority {
        policy.priority_of(&self.attributes(None), self.priority.as_deref())
    }

    /// The attributes the policy plans checks from.
    pub fn attributes(&self, client_ip: Option<IpAddr>) -> RequestAttributes<'_> {
        RequestAttributes {
            method: &self.method,
            path: &self.path,
            user: self.user.as_deref(),
            client_ip,
            api_key: self.api_key.as_deref(),
            tenant: self.tenant.as_deref(),
            plan: self.plan.as_deref(),
            home_region: self.home_region.as_deref(),
            cost_headers: &self.cost_headers,
        }
    }
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDecision {
    /// Every applying rule's report and the action (allow, deny, unavailable; a wait has been
    /// served already, so it never shows here).
    pub verdict: RequestVerdict,
    /// Status, `Retry-After`, `RateLimit-Policy`, `RateLimit` and the problem body.
    pub response: HttpResponse,
    /// How long the request was held for quota (`max_wait`).
    pub waited: Duration,
    /// Checks not decided by their node (local fallback bucket, or fail-closed).
    pub fallbacks: usize,
    /// The client address used for `ip` keys.
    pub client_ip: Option<IpAddr>,
    /// The version of the rules that decided, `None` without rules.
    pub policy_version: Option<String>,
    /// Time spent asking the limiter (waiting included).
    pub latency: Duration,
    /// The request's class: its checks went with the share of each limit this class may use.
    pub class: Priority,
    /// An allowed request's metered checks whose cost the response reports: charge them once
    /// it is done ([`RateLimiter::charge`]). Empty otherwise.
    pub charges_after: Vec<PlannedCheck>,
}

impl RequestDecision {
    pub fn is_allowed(&self) -> bool {
        self.verdict.is_allowed()
    }

    /// Takes in what the charges of [`RequestDecision::charges_after`] left their buckets at
    /// (`outcomes`, in that order, as [`RateLimiter::charge`] returns them): the response's
    /// `RateLimit` fields then say what is left after this request's own cost.
    pub fn record_charges(&mut self, outcomes: &[ChargeOutcome]) {
        for (planned, outcome) in self.charges_after.iter().zip(outcomes) {
            if let ChargeOutcome::Taken(decision) | ChargeOutcome::Checked(decision) = outcome {
                self.verdict.after_charge(&planned.rule, decision);
            }
        }
        self.response = self.verdict.http();
    }

    /// The names metered rules read the response's cost under (lower-case): response headers
    /// or trailers, or values the service reports.
    pub fn charge_names(&self) -> impl Iterator<Item = &str> {
        self.charges_after
            .iter()
            .filter_map(|p| p.charge_after.as_ref().map(|c| &*c.name))
    }
}

/// Where the rules in force came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// Given by the caller (a rules file, a cache, a test): no node has served rules since.
    Local,
    /// Served by this node. `text` is the rules file as it was served, e.g. to cache it for a
    /// start when no node answers.
    Node { addr: SocketAddr, text: Arc<str> },
}

/// Wakes each time the limiter installs new rules.
#[derive(Debug)]
pub struct PolicyChanges(watch::Receiver<PolicyState>);

impl PolicyChanges {
    /// Waits for the next change; false once the limiter is gone.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

/// A [`Client`] with a policy: cheap to clone, shared by every request of a gateway.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    /// The rules in force; a watch, so callers can await a change ([`PolicyChanges`]).
    state: watch::Sender<PolicyState>,
    /// Stops the refresh task (also stopped when the last limiter is dropped).
    shutdown: watch::Sender<bool>,
    refresher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Clone)]
struct PolicyState {
    policy: Option<Arc<Policy>>,
    source: Option<PolicySource>,
    /// Requests waiting (`max_wait`) now; replaced when the policy's `max_waiting` changes.
    waiting: Arc<WaitBound>,
}

impl RateLimiter {
    /// Connects to the nodes and takes the rules they serve: waits for the first policy (at
    /// most `limiter.policy_timeout`), then refreshes it in the background.
    pub async fn connect<A: Clone + Into<HostPort>>(
        nodes: &[A],
        config: ClientConfig,
        limiter: LimiterConfig,
    ) -> Result<RateLimiter, LimiterError> {
        Self::connect_with(nodes, config, limiter, None).await
    }

    /// Like [`RateLimiter::connect`], starting from `local` (e.g. a rules file shipped with the
    /// gateway) until, and unless, the nodes serve rules: it never fails for want of rules.
    pub async fn connect_with<A: Clone + Into<HostPort>>(
        nodes: &[A],
        config: ClientConfig,
        limiter: LimiterConfig,
        local: Option<Policy>,
    ) -> Result<RateLimiter, LimiterError> {
        let client = Client::connect(nodes, config.clone()).await?;
        let has_local = local.is_some();
        let this = RateLimiter::with_policy(client, local);
        let mut fetcher =
            PolicyFetcher::new(nodes.iter().cloned().map(Into::into).collect(), &config)?;
        let deadline = Instant::now() + limiter.policy_timeout;
        let mut last_error = String::from("no node answered");
        loop {
            match fetcher.fetch("").await {
                Ok((message, from)) if !message.version.is_empty() => {
                    this.inner.apply(&message, from);
                    break;
                }
                Ok(_) => last_error = "the nodes run without --rules".to_owned(),
                Err(e) => last_error = e,
            }
            if has_local || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if this.policy().is_none() {
            return Err(LimiterError::NoPolicy(last_error));
        }
        let task = tokio::spawn(refresh(
            Arc::downgrade(&this.inner),
            fetcher,
            limiter.refresh_interval,
            this.inner.shutdown.subscribe(),
        ));
        *this.inner.refresher.lock() = Some(task);
        Ok(this)
    }

    /// A limiter with a fixed policy (or none: every request passes, without fields) over an
    /// existing client; nothing is fetched. For tests and gateways that own their rules.
    pub fn with_policy(client: Client, policy: Option<Policy>) -> RateLimiter {
        let waiting = WaitBound::new(
            policy
                .as_ref()
                .map_or(policy::DEFAULT_MAX_WAITING, Policy::max_waiting),
        );
        let source = policy.as_ref().map(|_| PolicySource::Local);
        RateLimiter {
            inner: Arc::new(Inner {
                client,
                state: watch::Sender::new(PolicyState {
                    policy: policy.map(Arc::new),
                    source,
                    waiting,
                }),
                shutdown: watch::Sender::new(false),
                refresher: Mutex::new(None),
            }),
        }
    }

    /// Replaces the policy (a fetched one replaces it again on the next change on the nodes).
    pub fn set_policy(&self, policy: Policy) {
        self.inner.install(policy, PolicySource::Local);
    }

    /// Where the rules in force came from; `None` without rules.
    pub fn policy_source(&self) -> Option<PolicySource> {
        self.inner.state.borrow().source.clone()
    }

    /// The rules in force.
    pub fn policy(&self) -> Option<Arc<Policy>> {
        self.inner.state.borrow().policy.clone()
    }

    /// Wakes on every change of [`RateLimiter::policy`].
    pub fn policy_changes(&self) -> PolicyChanges {
        PolicyChanges(self.inner.state.subscribe())
    }

    pub fn policy_version(&self) -> Option<String> {
        self.policy().map(|p| p.version().to_owned())
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Requests waiting for quota now (`max_wait`).
    pub fn waiting(&self) -> usize {
        self.inner.state.borrow().waiting.waiting()
    }

    /// Stops the refresh task and closes the client.
    pub async fn close(&self) {
        self.inner.shutdown.send_replace(true);
        let task = self.inner.refresher.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.inner.client.close().await;
    }

    /// Decides one request: plans its checks under the policy in force, asks the nodes, waits
    /// when a rule allows it (at most once, and only while fewer than `max_waiting` requests
    /// wait), refunds what a request that does not pass took, and builds the HTTP answer.
    pub async fn check(&self, request: &RequestInfo) -> RequestDecision {
        let started = Instant::now();
        let PolicyState {
            policy, waiting, ..
        } = self.inner.state.borrow().clone();
        let Some(policy) = policy else {
            let verdict = RequestVerdict {
                action: Action::Allow,
                rules: Vec::new(),
            };
            return RequestDecision {
                response: verdict.http(),
                verdict,
                waited: Duration::ZERO,
                fallbacks: 0,
                client_ip: request.peer,
                policy_version: None,
                latency: started.elapsed(),
                class: Priority::Default,
                charges_after: Vec::new(),
            };
        };
        let ip = request.client_ip(&policy);
        let class = request.class(&policy);
        let planned = policy.checks_for_class(&request.attributes(ip), class);
        let (mut verdict, mut fallbacks) = self.decide(&policy, &planned).await;
        let mut waited = Duration::ZERO;
        if let Action::Wait { wait_ns } = verdict.action {
            verdict = match waiting.try_enter() {
                Some(_permit) => {
                    let wait_started = Instant::now();
                    tokio::time::sleep(Duration::from_nanos(wait_ns)).await;
                    waited = wait_started.elapsed();
                    let (again, more) = self.decide(&policy, &planned).await;
                    fallbacks += more;
                    // One wait per request: a second `Wait` is the denial it stands for.
                    again.into_denial()
                }
                None => verdict.into_denial(),
            };
        }
        let charges_after = match verdict.is_allowed() {
            true => planned
                .into_iter()
                .filter(|p| p.charge_after.is_some())
                .collect(),
            false => Vec::new(),
        };
        RequestDecision {
            response: verdict.http(),
            verdict,
            waited,
            fallbacks,
            client_ip: ip,
            policy_version: Some(policy.version().to_owned()),
            latency: started.elapsed(),
            class,
            charges_after,
        }
    }

    /// The headers of a request that metered rules read its cost from (`cost_from: {
    /// request_header: NAME }`), found by `header` (a lookup by lower-case name): what goes in
    /// [`RequestInfo::cost_headers`].
    pub fn cost_headers<'h>(
        &self,
        header: impl Fn(&str) -> Option<&'h str>,
    ) -> Vec<(String, String)> {
        let Some(policy) = self.policy() else {
            return Vec::new();
        };
        policy
            .request_cost_headers()
            .filter_map(|name| Some((name.to_owned(), header(name)?.to_owned())))
            .collect()
    }

    /// Charges an allowed request's metered costs once its response is done (see
    /// [`floodgate::policy::metered`]): each check of [`RequestDecision::charges_after`] takes
    /// the units `units` gives for its name (read from a response header or trailer with
    /// [`floodgate::policy::metered::cost_in`], or what the service reported; `None`: the
    /// rule's `missing`). Never refused; a bucket may be left owing, which its next requests
    /// wait out. Returns one outcome per charge.
    pub async fn charge(
        &self,
        decision: &RequestDecision,
        units: impl Fn(&str) -> Option<u64>,
    ) -> Vec<ChargeOutcome> {
        let charges: Vec<Check> = decision
            .charges_after
            .iter()
            .filter_map(|p| {
                let name = &p.charge_after.as_ref()?.name;
                p.charge(units(name))
            })
            .collect();
        if charges.is_empty() {
            return Vec::new();
        }
        // Checks of a valid policy: a refusal as invalid cannot happen; nothing is charged.
        self.inner.client.charge(&charges).await.unwrap_or_default()
    }

    /// One round: the checks, the verdict, and the refunds it calls for. Returns the verdict and
    /// how many checks were not decided by their node.
    async fn decide(&self, policy: &Policy, planned: &[PlannedCheck]) -> (RequestVerdict, usize) {
        if planned.is_empty() {
            return (policy.verdict(planned, &[]), 0);
        }
        let client = &self.inner.client;
        let groups = policy::group_by_owner(planned, |key| client.owner_of(key));
        let answers = run_calls(client, &groups).await;
        let mut round = RoundOutcomes::new(planned.len());
        for (group, answer) in groups.iter().zip(&answers) {
            // A refused call (never expected: keys and limits come from a valid policy) leaves
            // its checks unreachable.
            round.add(group, answer.as_deref().ok());
        }
        let verdict = policy.verdict(planned, &round.outcomes);
        let refunds: Vec<Check> = verdict.refunds(planned).iter().map(|p| p.check()).collect();
        if !refunds.is_empty() {
            // Before answering, so the next request sees the other rules' buckets as they were.
            let _ = client.refund(&refunds).await;
        }
        let fallbacks = round.not_by_node;
        (verdict, fallbacks)
    }
}

/// Decides each call, concurrently when there are several; the answers in the calls' order.
async fn run_calls(
    client: &Client,
    groups: &[CheckGroup],
) -> Vec<Result<Vec<Verdict>, ClientError>> {
    if let [group] = groups {
        return vec![client.check(&group.checks).await];
    }
    let mut set = JoinSet::new();
    for (i, group) in groups.iter().enumerate() {
        let (client, checks) = (client.clone(), group.checks.clone());
        set.spawn(async move { (i, client.check(&checks).await) });
    }
    // A call task only panics if the runtime is shutting down; its checks stay unreachable.
    let mut answers: Vec<Result<Vec<Verdict>, ClientError>> = (0..groups.len())
        .map(|_| {
            Err(ClientError::Unavailable(
                "the call did not finish".to_owned(),
            ))
        })
        .collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, answer)) = joined {
            answers[i] = answer;
        }
    }
    answers
}

impl Inner {
    /// Takes a policy message fetched from node `from`; returns true when the rules changed.
    fn apply(&self, message: &PolicyMessage, from: SocketAddr) -> bool {
        if message.is_unchanged() {
            return false;
        }
        match Policy::from_yaml(&message.text) {
            Ok(policy) => {
                let (was_local, same_version) = {
                    let state = self.state.borrow();
                    (
                        matches!(state.source, Some(PolicySource::Local)),
                        state
                            .policy
                            .as_ref()
                            .is_some_and(|p| p.version() == policy.version()),
                    )
                };
                if was_local && same_version {
                    tracing::info!(
                        version = policy.version(),
                        node = %from,
                        "floodgate rules received from a node: the same version as the local rules"
                    );
                } else if was_local {
                    tracing::info!(
                        version = policy.version(),
                        node = %from,
                        "floodgate rules received from a node: they replace the local rules"
                    );
                } else {
                    tracing::info!(
                        version = policy.version(),
                        node = %from,
                        "floodgate rules received from a node"
                    );
                }
                let source = PolicySource::Node {
                    addr: from,
                    text: Arc::from(message.text.as_str()),
                };
                self.install(policy, source);
                true
            }
            Err(e) => {
                // A node validated it, so this is a version skew between node and client.
                tracing::warn!("rules from the node refused: {e}; keeping the rules in force");
                false
            }
        }
    }

    fn install(&self, policy: Policy, source: PolicySource) {
        self.state.send_modify(|state| {
            if state.waiting.max_waiting() != policy.max_waiting() {
                state.waiting = WaitBound::new(policy.max_waiting());
            }
            state.policy = Some(Arc::new(policy));
            state.source = Some(source);
        });
    }
}

/// Asks the nodes for changes every `interval`, until shutdown or the limiter is dropped.
async fn refresh(
    inner: Weak<Inner>,
    mut fetcher: PolicyFetcher,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|&stop| stop) => break,
        }
        // Local rules ask for the full text (version ""): a node serving the same version is
        // then recorded as the source, so the gateway can say so and cache it.
        let Some(version) = inner.upgrade().map(|i| {
            let state = i.state.borrow();
            match state.source {
                Some(PolicySource::Node { .. }) => {
                    state.policy.as_ref().map(|p| p.version().to_owned())
                }
                _ => None,
            }
        }) else {
            break;
        };
        let fetched = tokio::select! {
            fetched = fetcher.fetch(version.as_deref().unwrap_or("")) => fetched,
            _ = shutdown.wait_for(|&stop| stop) => break,
        };
        match fetched {
            Ok((message, from)) => {
                let Some(inner) = inner.upgrade() else { break };
                inner.apply(&message, from);
            }
            Err(e) => tracing::debug!("rules refresh failed: {e}"),
        }
    }
    fetcher.close().await;
}

/// The policy's planned checks for `request` as client checks: for tools and tests that peek at
/// buckets (cost 0) the way the limiter fills them.
pub fn planned_checks(policy: &Policy, request: &RequestInfo) -> Vec<(PlannedCheck, Check)> {
    let ip = request.client_ip(policy);
    policy
        .checks_for_class(&request.attributes(ip), request.class(policy))
        .into_iter()
        .map(|p| {
            let check = p.check();
            (p, check)
        })
        .collect()
}
