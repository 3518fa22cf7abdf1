//! Gateways driving load through the real client (or, over HTTP, through example-gateway
//! processes): several tasks per gateway, each offering its share of every key's rate,
//! recording each decision with its time and who made it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_client::policy::RequestInfo;
use floodgate_client::{
    Check, Client, ClientConfig, LimiterConfig, LinkState, RateLimiter, Source,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::faults::Endpoint;
use crate::gateway_procs::HttpSlot;
use crate::http::Outcome;
use crate::keys::KeySpec;
use crate::proxy::Directory;

/// Who decided a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Via {
    /// The key's owner (as the client's table names it, link up).
    Node,
    /// A node while the client's link to the owner was down: the successor's takeover.
    Takeover,
    /// The client's local fallback bucket (failure mode open).
    Fallback,
    /// Denied without a node (failure mode closed).
    FailClosed,
    /// `check` returned an error (never expected: errors are for invalid calls).
    Error,
}

impl Via {
    pub fn by_a_node(self) -> bool {
        matches!(self, Via::Node | Via::Takeover)
    }
}

/// One decision.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub key: u16,
    pub gateway: u16,
    /// Nanoseconds since the run's origin when the check was sent and when its answer came.
    pub sent_ns: u64,
    pub done_ns: u64,
    pub admitted: bool,
    pub via: Via,
    /// The node the client routed the check to (its table's owner), by index; `u16::MAX` when
    /// it is not one of the run's nodes.
    pub routed_to: u16,
    /// Why no node decided it (a failure mode's reason), where the front says.
    pub reason: Option<floodgate_client::DegradedReason>,
}

/// How gateways ask: the client with explicit limits, or the rules the nodes serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    Client,
    /// `RateLimiter` over the nodes' `--rules`: a request per check, the key's name as user.
    Rules,
}

/// A connected gateway.
#[derive(Debug, Clone)]
pub struct Gateway {
    pub index: usize,
    pub region: usize,
    pub client: Client,
    pub limiter: Option<RateLimiter>,
}

/// Connects a gateway to every proxy and registers the ports its client sends from, so the
/// proxies can cut it apart from the others.
pub async fn connect_gateway(
    index: usize,
    region: usize,
    seeds: &[SocketAddr],
    config: ClientConfig,
    front: Front,
    directory: &Directory,
) -> anyhow::Result<Gateway> {
    // The census works because gateways connect one at a time and the client binds one socket
    // per node given (every node of its region is a seed, so no link is added later).
    let before = crate::sockets::own_udp_ports();
    let (client, limiter) = match front {
        Front::Client => (Client::connect(seeds, config).await?, None),
        Front::Rules => {
            let limiter = RateLimiter::connect(
                seeds,
                config,
                LimiterConfig {
                    refresh_interval: Duration::from_millis(200),
                    policy_timeout: Duration::from_secs(10),
                },
            )
            .await?;
            (limiter.client().clone(), Some(limiter))
        }
    };
    for port in crate::sockets::own_udp_ports().difference(&before) {
        if !directory.is_proxy_port(*port) {
            directory.register(*port, Endpoint::Gateway(index));
        }
    }
    Ok(Gateway {
        index,
        region,
        client,
        limiter,
    })
}

/// What the harness knows of each node right now, to tell a takeover from the owner's own
/// decision: a check the client routed to an owner that is down (killed, paused, stopped) or
/// cut from its gateway was decided by someone else.
#[derive(Debug)]
pub struct NodeHealth {
    /// Proxy address of each node, by index.
    pub addrs: Vec<SocketAddr>,
    pub down: Vec<std::sync::atomic::AtomicBool>,
    pub faults: Arc<crate::faults::FaultTable>,
    /// Gateways the timeline killed: their load stops.
    killed_gateways: parking_lot::Mutex<Vec<usize>>,
}

impl NodeHealth {
    pub fn new(addrs: Vec<SocketAddr>, faults: Arc<crate::faults::FaultTable>) -> Self {
        let down = addrs
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        NodeHealth {
            addrs,
            down,
            faults,
            killed_gateways: parking_lot::Mutex::new(Vec::new()),
        }
    }

    pub fn kill_gateway(&self, gateway: usize) {
        self.killed_gateways.lock().push(gateway);
    }

    pub fn gateway_killed(&self, gateway: usize) -> bool {
        self.killed_gateways.lock().contains(&gateway)
    }

    pub fn set_down(&self, node: usize, down: bool) {
        if let Some(flag) = self.down.get(node) {
            flag.store(down, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.addrs.iter().position(|a| *a == addr)
    }

    fn unreachable(&self, gateway: usize, addr: SocketAddr) -> bool {
        let Some(node) = self.index_of(addr) else {
            return false;
        };
        self.down[node].load(std::sync::atomic::Ordering::Relaxed)
            || self
                .faults
                .is_cut(Endpoint::Gateway(gateway), Endpoint::Node(node))
    }
}

/// What the drivers share.
#[derive(Debug)]
pub struct LoadPlan {
    pub health: Arc<NodeHealth>,
    pub keys: Vec<KeySpec>,
    pub origin: Instant,
    /// Driving tasks per gateway.
    pub tasks_per_gateway: usize,
    /// Most checks one task has in flight; more are not sent (the offered rate is a ceiling).
    pub max_in_flight: usize,
    /// An in-process gateway whose slot table and rules name the owner of an HTTP gateway's
    /// check in its record (the process's own table is not visible; the tables agree once
    /// settled).
    pub router: Option<Gateway>,
}

/// What one driving task sends its checks through.
#[derive(Debug, Clone)]
pub enum Driver {
    /// An in-process gateway (this build's client).
    Client(Gateway),
    /// An example-gateway process, over HTTP.
    Http(Arc<HttpSlot>),
}

impl Driver {
    fn region(&self) -> usize {
        match self {
            Driver::Client(g) => g.region,
            Driver::Http(s) => s.region,
        }
    }

    /// Tells the driving tasks' seeds apart (HTTP places after every in-process gateway).
    fn id(&self) -> u64 {
        match self {
            Driver::Client(g) => g.index as u64,
            Driver::Http(s) => 1_000 + s.slot as u64,
        }
    }

    fn killed(&self, health: &NodeHealth) -> bool {
        match self {
            Driver::Client(g) => health.gateway_killed(g.index),
            Driver::Http(_) => false,
        }
    }
}

/// How often a driving task wakes to send what its share of each key's rate owes.
const TICK: Duration = Duration::from_millis(5);

/// Drives load from every gateway (in-process and HTTP) until `stop` (or `deadline`), returning
/// every record.
pub async fn drive(
    plan: Arc<LoadPlan>,
    gateways: Vec<Gateway>,
    http: Vec<Arc<HttpSlot>>,
    seed: u64,
    stop: watch::Receiver<bool>,
    deadline: Instant,
) -> Vec<Record> {
    let drivers: Vec<Driver> = gateways
        .into_iter()
        .map(Driver::Client)
        .chain(http.into_iter().map(Driver::Http))
        .collect();
    // Tasks driving each region's keys (a key of no region: every task).
    let mut tasks_by_region: Vec<usize> = Vec::new();
    for driver in &drivers {
        let region = driver.region();
        if tasks_by_region.len() <= region {
            tasks_by_region.resize(region + 1, 0);
        }
        tasks_by_region[region] += plan.tasks_per_gateway;
    }
    let total_tasks = (drivers.len() * plan.tasks_per_gateway).max(1);
    let tasks_per_key: Arc<Vec<usize>> = Arc::new(
        plan.keys
            .iter()
            .map(|k| match k.region {
                None => total_tasks,
                Some(r) => tasks_by_region.get(r).copied().unwrap_or(0).max(1),
            })
            .collect(),
    );
    let mut tasks = JoinSet::new();
    for driver in drivers {
        for t in 0..plan.tasks_per_gateway {
            let seed = seed ^ (driver.id() << 32) ^ t as u64;
            tasks.spawn(drive_task(
                plan.clone(),
                driver.clone(),
                tasks_per_key.clone(),
                seed,
                stop.clone(),
                deadline,
            ));
        }
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(mut part) = done {
            records.append(&mut part);
        }
    }
    records.sort_by_key(|r| r.sent_ns);
    records
}

async fn drive_task(
    plan: Arc<LoadPlan>,
    driver: Driver,
    drivers: Arc<Vec<usize>>,
    seed: u64,
    mut stop: watch::Receiver<bool>,
    deadline: Instant,
) -> Vec<Record> {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Random starting credit, so tasks do not all send on the same tick.
    let mut credit: Vec<f64> = plan.keys.iter().map(|_| rng.random::<f64>()).collect();
    // This task's share of each key's offered rate: none of another region's keys.
    let shares: Vec<f64> = plan
        .keys
        .iter()
        .zip(drivers.iter())
        .map(|(k, &drivers)| match k.region {
            Some(r) if r != driver.region() => 0.0,
            _ => k.offered_per_second * TICK.as_secs_f64() / drivers as f64,
        })
        .collect();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut in_flight = JoinSet::new();
    let mut records = Vec::new();
    loop {
        tokio::select! {
            _ = stop.wait_for(|&s| s) => break,
            _ = tokio::time::sleep_until(deadline.into()) => break,
            _ = ticker.tick() => {}
        }
        if driver.killed(&plan.health) {
            break;
        }
        while let Some(done) = in_flight.try_join_next() {
            if let Ok(Some(record)) = done {
                records.push(record);
            }
        }
        let now_ns = plan.origin.elapsed().as_nanos() as u64;
        for (key, owed) in credit.iter_mut().enumerate() {
            // A pulsed key owes nothing while off (and does not save up for its next pulse).
            if let Some(pulse) = plan.keys[key].pulse
                && !pulse.is_on(driver.region(), now_ns)
            {
                continue;
            }
            *owed += shares[key];
            while *owed >= 1.0 {
                *owed -= 1.0;
                if in_flight.len() < plan.max_in_flight {
                    match &driver {
                        Driver::Client(gateway) => {
                            let check = check_once(plan.clone(), gateway.clone(), key);
                            in_flight.spawn(async move { Some(check.await) })
                        }
                        Driver::Http(slot) => {
                            in_flight.spawn(check_http(plan.clone(), slot.clone(), key))
                        }
                    };
                }
            }
        }
    }
    // Answers in flight come back within the client's timeout (an HTTP check's: its own).
    while let Some(done) = in_flight.join_next().await {
        if let Ok(Some(record)) = done {
            records.push(record);
        }
    }
    records
}

/// The bucket key the rules give a request of `user`'s (`None` before the limiter has rules),
/// so a record names the node the check really went to.
fn rules_key(limiter: &RateLimiter, user: &str) -> Option<Vec<u8>> {
    let policy = limiter.policy()?;
    let mut request = RequestInfo::new("GET", crate::rules::PATH);
    request.user = Some(user.to_owned());
    floodgate_client::policy::planned_checks(&policy, &request)
        .into_iter()
        .next()
        .map(|(planned, _)| planned.key)
}

/// The key a gateway routes `spec`'s check by: its name, or under rules the rule's bucket key.
fn routing_key(gateway: &Gateway, spec: &KeySpec) -> Vec<u8> {
    gateway
        .limiter
        .as_ref()
        .and_then(|l| rules_key(l, &spec.name))
        .unwrap_or_else(|| spec.name.as_bytes().to_vec())
}

async fn check_once(plan: Arc<LoadPlan>, gateway: Gateway, key: usize) -> Record {
    let spec = &plan.keys[key];
    let routing = routing_key(&gateway, spec);
    let owner = gateway.client.node_for(&routing);
    let owner_down =
        plan.health.unreachable(gateway.index, owner) || owner_link_down(&gateway.client, &routing);
    let sent_ns = plan.origin.elapsed().as_nanos() as u64;
    let (admitted, source) = match &gateway.limiter {
        None => {
            let check = Check::new(spec.name.as_bytes(), spec.limits[0])
                .failure_mode(spec.failure_mode)
                .scope(spec.scope.clone());
            match gateway.client.check(&[check]).await {
                Ok(verdicts) => match verdicts.first() {
                    Some(v) => (v.is_allowed(), Some(v.source)),
                    None => (false, None),
                },
                Err(_) => (false, None),
            }
        }
        Some(limiter) => {
            let mut request = RequestInfo::new("GET", crate::rules::PATH);
            request.user = Some(spec.name.clone());
            let decision = limiter.check(&request).await;
            // `fallbacks` counts fail-closed checks too; a 503 is what a closed rule answers.
            let source = if decision.response.status == 503 {
                Source::FailClosed(floodgate_client::DegradedReason::Timeout)
            } else if decision.fallbacks > 0 {
                Source::Fallback(floodgate_client::DegradedReason::Timeout)
            } else {
                Source::Node
            };
            (decision.is_allowed(), Some(source))
        }
    };
    let done_ns = plan.origin.elapsed().as_nanos() as u64;
    let (via, reason) = match source {
        None => (Via::Error, None),
        Some(Source::Node) if owner_down => (Via::Takeover, None),
        Some(Source::Node) => (Via::Node, None),
        Some(Source::Fallback(why)) => (Via::Fallback, Some(why)),
        Some(Source::FailClosed(why)) => (Via::FailClosed, Some(why)),
    };
    Record {
        key: key as u16,
        gateway: gateway.index as u16,
        sent_ns,
        done_ns,
        admitted,
        via,
        routed_to: plan.health.index_of(owner).map_or(u16::MAX, |i| i as u16),
        reason,
    }
}

/// One check through an example-gateway process: `GET` as the key's user; 200 admitted, 429
/// denied (a node decided either: the rule fails closed), 503 fail-closed, anything else or no
/// answer an error. `None` while the place is closed for a replacement (nothing sent).
async fn check_http(plan: Arc<LoadPlan>, slot: Arc<HttpSlot>, key: usize) -> Option<Record> {
    let spec = &plan.keys[key];
    let owner = plan.router.as_ref().map(|router| {
        let routing = routing_key(router, spec);
        router.client.node_for(&routing)
    });
    let owner_down = owner.is_some_and(|o| {
        plan.health
            .index_of(o)
            .is_some_and(|n| plan.health.down[n].load(std::sync::atomic::Ordering::Relaxed))
    });
    let sent_ns = plan.origin.elapsed().as_nanos() as u64;
    let (gateway, answer) = slot.ask(&spec.name).await?;
    let done_ns = plan.origin.elapsed().as_nanos() as u64;
    let (admitted, via) = match answer {
        Ok(Outcome::Admitted) => (true, Via::Node),
        Ok(Outcome::Denied) => (false, Via::Node),
        Ok(Outcome::Unavailable) => (false, Via::FailClosed),
        Ok(Outcome::Unexpected(_)) | Err(_) => (false, Via::Error),
    };
    let via = if via == Via::Node && owner_down {
        Via::Takeover
    } else {
        via
    };
    Some(Record {
        key: key as u16,
        gateway,
        sent_ns,
        done_ns,
        admitted,
        via,
        routed_to: owner
            .and_then(|o| plan.health.index_of(o))
            .map_or(u16::MAX, |i| i as u16),
        // An HTTP answer does not say why.
        reason: None,
    })
}

/// Whether the client's link to the key's owner is down now (its checks then go to the
/// successor as a takeover). Approximate: an open breaker on a connected link is not seen.
fn owner_link_down(client: &Client, key: &[u8]) -> bool {
    let owner = client.owner_of(key);
    client
        .nodes()
        .get(owner)
        .is_some_and(|n| n.state != LinkState::Connected)
}

/// Floods random keys (never the known ones) through `client` until stop: `rate` checks a
/// second, at most `max_in_flight` at once. Returns how many were sent.
pub async fn flood_random_keys(
    client: Client,
    limit: floodgate::Limit,
    rate: u64,
    seed: u64,
    mut stop: watch::Receiver<bool>,
    deadline: Instant,
) -> u64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let per_tick = (rate as f64 * TICK.as_secs_f64()).ceil() as usize;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut in_flight = JoinSet::new();
    let mut sent = 0u64;
    loop {
        tokio::select! {
            _ = stop.wait_for(|&s| s) => break,
            _ = tokio::time::sleep_until(deadline.into()) => break,
            _ = ticker.tick() => {}
        }
        while in_flight.try_join_next().is_some() {}
        let checks: Vec<Check> = (0..per_tick)
            .map(|_| Check::new(format!("flood:{:016x}", rng.random::<u64>()), limit))
            .collect();
        if in_flight.len() < 64 {
            let client = client.clone();
            in_flight.spawn(async move {
                // Each its own call: random keys have random owners.
                for check in checks {
                    let _ = client.check(std::slice::from_ref(&check)).await;
                }
            });
            sent += per_tick as u64;
        }
    }
    in_flight.shutdown().await;
    sent
}

/// Checks `key` (a `scope: global` limit it never reaches) through `client` once per `every`
/// until stop, each call on its own task, at most 64 at once: a steady stream of admissions
/// for the region exchange to send. Returns (sent, admitted by a node).
pub async fn pump(
    client: Client,
    key: &'static str,
    limit: floodgate::Limit,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    deadline: Instant,
) -> (u64, u64) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut in_flight = JoinSet::new();
    let (mut sent, mut admitted) = (0u64, 0u64);
    loop {
        tokio::select! {
            _ = stop.wait_for(|&s| s) => break,
            _ = tokio::time::sleep_until(deadline.into()) => break,
            _ = ticker.tick() => {}
        }
        while let Some(done) = in_flight.try_join_next() {
            admitted += u64::from(done.unwrap_or(false));
        }
        if in_flight.len() >= 64 {
            continue;
        }
        let client = client.clone();
        in_flight.spawn(async move {
            let check = Check::new(key, limit).scope(floodgate::region::Scope::Global);
            client
                .check(std::slice::from_ref(&check))
                .await
                .ok()
                .and_then(|v| {
                    v.first()
                        .map(|v| v.is_allowed() && v.source == Source::Node)
                })
                .unwrap_or(false)
        });
        sent += 1;
    }
    while let Some(done) = in_flight.join_next().await {
        admitted += u64::from(done.unwrap_or(false));
    }
    (sent, admitted)
}
