//! The gateway's parts, shared by `main.rs` and the tests (`client/tests/gateway.rs` includes this
//! file): the proxy app with its rate-limit layer, the shedder in front of `/v1/work` and
//! `/metrics`, the demo upstream, and serving.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use floodgate_client::RateLimiter;
use floodgate_client::RequestDecision;
use floodgate_client::core::policy::RuleState;
use floodgate_client::policy::LeaseEvent;
use floodgate_client::shed::{ShedEvent, ShedGate, ShedLayer, request_class};
use floodgate_client::tower::{
    RateLimitLayer, charge_at_end_of_body, hold_leases_until_sent, request_info,
};
use hyper_util::rt::TokioIo;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The gateway's own metrics, in a recorder of its own (not the process-wide one), so several
/// gateways in one test process count apart.
#[derive(Clone)]
pub struct GatewayMetrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    /// The rules version last published, set back to 0 when another takes over.
    version: Arc<Mutex<Option<String>>>,
    /// Leases given back so far: a watch, so tests await a release instead of polling.
    released: watch::Sender<u64>,
    /// Lease renewals so far (a watch, as `released`).
    renewed: watch::Sender<u64>,
    /// The shedder and the demo upstream's work queue, read at each scrape.
    gate: Arc<OnceLock<ShedGate>>,
    work: Arc<OnceLock<Arc<Work>>>,
}

impl GatewayMetrics {
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("floodgate_gateway_limiter_seconds".into()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ],
            )
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        GatewayMetrics {
            recorder: Arc::new(recorder),
            handle,
            version: Arc::default(),
            released: watch::Sender::new(0),
            renewed: watch::Sender::new(0),
            gate: Arc::default(),
            work: Arc::default(),
        }
    }

    /// Shows the demo upstream's work queue in the metrics (its own load).
    pub fn watch_work(&self, work: Arc<Work>) {
        let _ = self.work.set(work);
    }

    /// Counts leases given back (see `record_lease`).
    pub fn watch_released(&self) -> watch::Receiver<u64> {
        self.released.subscribe()
    }

    /// Counts lease renewals (see `record_lease`).
    pub fn watch_renewed(&self) -> watch::Receiver<u64> {
        self.renewed.subscribe()
    }

    pub fn render(&self) -> String {
        metrics::with_local_recorder(&*self.recorder, || {
            if let Some(gate) = self.gate.get() {
                let status = gate.status();
                let backend = gate.backend().to_owned();
                for (name, value) in [
                    ("floodgate_gateway_shed_level", status.level),
                    ("floodgate_gateway_shed_local_level", status.local_level),
                    ("floodgate_gateway_shed_fleet_level", status.fleet_level),
                ] {
                    gauge!(name, "backend" => backend.clone()).set(f64::from(value));
                }
                for (name, value) in [
                    ("floodgate_gateway_shed_limit", status.limit),
                    ("floodgate_gateway_shed_lower_limit", status.lower_limit),
                    ("floodgate_gateway_shed_in_flight", status.in_flight),
                ] {
                    gauge!(name, "backend" => backend.clone()).set(value as f64);
                }
            }
            if let Some(work) = self.work.get() {
                let stats = work.stats();
                gauge!("floodgate_demo_work_in_service").set(stats.in_service as f64);
                gauge!("floodgate_demo_work_queued").set(stats.queued as f64);
                gauge!("floodgate_demo_work_queued_max").set(stats.queued_max as f64);
                gauge!("floodgate_demo_work_served").set(stats.served as f64);
                gauge!("floodgate_demo_work_queue_wait_seconds_sum")
                    .set(stats.queue_wait_ns as f64 / 1e9);
            }
        });
        self.handle.render()
    }

    /// Counts one request the shedder saw: per backend, class and outcome (admitted, or shed
    /// by the level or by the limit).
    pub fn record_shed(&self, backend: &str, event: &ShedEvent) {
        let outcome = match event.shed {
            None => "admitted",
            Some(floodgate_client::core::priority::shedder::ShedReason::Level) => "shed_level",
            Some(floodgate_client::core::priority::shedder::ShedReason::Limit) => "shed_limit",
        };
        metrics::with_local_recorder(&*self.recorder, || {
            counter!(
                "floodgate_gateway_shed_requests_total",
                "backend" => backend.to_owned(),
                "class" => event.class.name(),
                "outcome" => outcome
            )
            .increment(1);
        });
    }

    /// Folds the latency samples recorded since the last scrape into their buckets every 5 s,
    /// until `shutdown` changes: the recorder keeps each sample until a scrape or an upkeep,
    /// so a gateway nobody scrapes would keep one per request for ever.
    pub async fn upkeep(self, mut shutdown: watch::Receiver<bool>) {
        let period = Duration::from_secs(5);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.handle.run_upkeep(),
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Counts one decision: per rule and outcome (shadow rules under `mode="shadow"`), rules
    /// that applied their default to an undeclared plan, checks decided by fallback, the limiter's latency and the rules version in force.
    pub fn record(&self, decision: &RequestDecision) {
        metrics::with_local_recorder(&*self.recorder, || {
            for rule in &decision.verdict.rules {
                let outcome = match rule.state {
                    RuleState::Allowed => "allowed",
                    RuleState::Denied { .. } => "denied",
                    RuleState::Unreachable => "unreachable",
                };
                let mode = if rule.shadow { "shadow" } else { "enforce" };
                counter!(
                    "floodgate_gateway_verdicts_total",
                    "rule" => rule.rule.to_string(),
                    "mode" => mode,
                    "outcome" => outcome
                )
                .increment(1);
                if rule.unknown_plan {
                    // The request's plan is not declared: this rule applied its default.
                    counter!(
                        "floodgate_gateway_unknown_plan_total",
                        "rule" => rule.rule.to_string()
                    )
                    .increment(1);
                }
            }
            let status = decision.response.status.to_string();
            // Per class too: a 429 of a lower class under a rule's `reserve:` shows here.
            counter!(
                "floodgate_gateway_class_requests_total",
                "class" => decision.class.name(),
                "status" => status.clone()
            )
            .increment(1);
            counter!("floodgate_gateway_requests_total", "status" => status).increment(1);
            if decision.fallbacks > 0 {
                counter!("floodgate_gateway_fallbacks_total").increment(decision.fallbacks as u64);
            }
            if !decision.waited.is_zero() {
                counter!("floodgate_gateway_waited_total").increment(1);
            }
            histogram!("floodgate_gateway_limiter_seconds").record(decision.latency.as_secs_f64());
            let mut published = self.version.lock().unwrap_or_else(PoisonError::into_inner);
            if decision.policy_version.is_some() && *published != decision.policy_version {
                if let Some(old) = published.take() {
                    gauge!("floodgate_gateway_rules_version_info", "version" => old).set(0.0);
                }
                let new = decision.policy_version.clone().unwrap_or_default();
                gauge!("floodgate_gateway_rules_version_info", "version" => new).set(1.0);
                *published = decision.policy_version.clone();
            }
        });
    }
}

impl GatewayMetrics {
    /// Counts one lease event of a `concurrency:` rule: leases in use per rule (a gauge),
    /// grants, refusals, renewals, leases lost (expired before a renewal) and leases the
    /// limiter could not answer.
    pub fn record_lease(&self, event: &LeaseEvent) {
        metrics::with_local_recorder(&*self.recorder, || match event {
            LeaseEvent::Granted { rule } => {
                counter!("floodgate_gateway_lease_grants_total", "rule" => rule.to_string())
                    .increment(1);
                gauge!("floodgate_gateway_leases_in_use", "rule" => rule.to_string())
                    .increment(1.0);
            }
            LeaseEvent::Released { rule } => {
                gauge!("floodgate_gateway_leases_in_use", "rule" => rule.to_string())
                    .decrement(1.0);
                self.released.send_modify(|n| *n += 1);
            }
            LeaseEvent::Refused { rule, .. } => {
                counter!("floodgate_gateway_lease_refusals_total", "rule" => rule.to_string())
                    .increment(1);
            }
            LeaseEvent::Unreachable { rule } => {
                counter!("floodgate_gateway_lease_unreachable_total", "rule" => rule.to_string())
                    .increment(1);
            }
            LeaseEvent::Renewed { rule } => {
                counter!("floodgate_gateway_lease_renewals_total", "rule" => rule.to_string())
                    .increment(1);
                self.renewed.send_modify(|n| *n += 1);
            }
            LeaseEvent::Lost { rule } => {
                counter!("floodgate_gateway_leases_lost_total", "rule" => rule.to_string())
                    .increment(1);
            }
        });
    }
}

/// The backend the shedder guards: the demo upstream's `/v1/work`.
pub const WORK_BACKEND: &str = "work";

/// The gateway: `/metrics`, and every other request rate limited, then proxied to `upstream`;
/// `/v1/work` through a shedder that sheds.
pub fn app(limiter: RateLimiter, upstream: SocketAddr, metrics: GatewayMetrics) -> Router {
    let gate = ShedGate::new(WORK_BACKEND, Default::default(), true);
    app_with_gate(limiter, upstream, metrics, gate)
}

/// [`app`] with the shedder in front of `/v1/work` given (shedding, or only watching).
pub fn app_with_gate(
    limiter: RateLimiter,
    upstream: SocketAddr,
    metrics: GatewayMetrics,
    gate: ShedGate,
) -> Router {
    let _ = metrics.gate.set(gate.clone());
    let shed_observed = metrics.clone();
    let classifier = limiter.clone();
    // Inside the rate limits: a request they refuse never takes a place at the upstream.
    let shed = ShedLayer::new(gate, move |request: &Request| {
        request_class(&classifier, request)
    })
    .on_event(move |event| shed_observed.record_shed(WORK_BACKEND, event));
    let observed = metrics.clone();
    let leases_observed = metrics.clone();
    // The one line a gateway adds; the extractor reads the peer from axum's `ConnectInfo`.
    let layer = RateLimitLayer::new(limiter)
        .with_extractor(|request: &Request| {
            let peer = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0);
            request_info(request, peer)
        })
        .on_decision(move |decision| observed.record(decision))
        .on_lease(move |event| leases_observed.record_lease(event));
    let proxied = Router::new()
        .route("/v1/work", any(proxy).layer(shed))
        .fallback(proxy)
        .with_state(upstream)
        .layer(layer)
        // Outside the limiter: a concurrency lease is held until the body has been sent, and a
        // metered cost the upstream sends as a trailer is charged when the body ends.
        .layer(axum::middleware::map_response(
            |response: Response| async move {
                let response = hold_leases_until_sent(response).map(Body::new);
                charge_at_end_of_body(response).map(Body::new)
            },
        ));
    Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(metrics)
        .fallback_service(proxied)
}

async fn render_metrics(State(metrics): State<GatewayMetrics>) -> String {
    metrics.render()
}

/// Forwards the request to the upstream over a fresh HTTP/1.1 connection (a demo proxy: no pool).
async fn proxy(State(upstream): State<SocketAddr>, mut request: Request) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    // Origin form towards the upstream; the Host header goes along unchanged.
    *request.uri_mut() = path.parse::<Uri>().unwrap_or_default();
    match forward(upstream, request).await {
        Ok(response) => response,
        Err(e) => (StatusCode::BAD_GATEWAY, format!("upstream: {e}\n")).into_response(),
    }
}

async fn forward(upstream: SocketAddr, request: Request) -> Result<Response, String> {
    let stream = TcpStream::connect(upstream)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.map(Body::new))
}

/// How long the demo upstream's `POST /v1/exports` takes: the slow endpoint the example rules
/// limit to a few requests at once (`concurrency:`).
pub const EXPORT_TAKES: Duration = Duration::from_secs(2);

/// What holds the answer to an export: a fixed time (the demo), or a gate a test opens one
/// export at a time (tests never wait on the clock).
#[derive(Clone)]
pub enum ExportPace {
    Takes(Duration),
    Gate(Arc<ExportGate>),
}

/// Exports that arrived (a watch tests await) and permits to answer them.
#[derive(Debug)]
pub struct ExportGate {
    pub arrived: watch::Sender<usize>,
    pub answer: tokio::sync::Semaphore,
}

impl ExportGate {
    pub fn new() -> Arc<Self> {
        Arc::new(ExportGate {
            arrived: watch::Sender::new(0),
            answer: tokio::sync::Semaphore::new(0),
        })
    }
}

/// How many `GET /v1/work` the demo upstream serves at once, and how long each takes: a
/// backend of fixed capacity (200 a second); beyond it, requests queue.
pub const WORK_PLACES: usize = 4;
pub const WORK_TAKES: Duration = Duration::from_millis(20);

/// The demo upstream's `/v1/work`: a fixed number of places, a fixed time each, a FIFO queue
/// beyond (tokio's semaphore is fair), and counts of its own load.
#[derive(Debug)]
pub struct Work {
    places: tokio::sync::Semaphore,
    takes: Duration,
    in_service: AtomicU64,
    queued: AtomicU64,
    queued_max: AtomicU64,
    served: AtomicU64,
    queue_wait_ns: AtomicU64,
}

/// The work queue's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkStats {
    pub in_service: u64,
    pub queued: u64,
    pub queued_max: u64,
    pub served: u64,
    /// Time requests spent queued, summed.
    pub queue_wait_ns: u64,
}

impl Work {
    pub fn new(places: usize, takes: Duration) -> Arc<Self> {
        Arc::new(Work {
            places: tokio::sync::Semaphore::new(places),
            takes,
            in_service: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            queued_max: AtomicU64::new(0),
            served: AtomicU64::new(0),
            queue_wait_ns: AtomicU64::new(0),
        })
    }

    /// The demo's: [`WORK_PLACES`] places, [`WORK_TAKES`] each.
    pub fn demo() -> Arc<Self> {
        Work::new(WORK_PLACES, WORK_TAKES)
    }

    pub fn stats(&self) -> WorkStats {
        WorkStats {
            in_service: self.in_service.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            queued_max: self.queued_max.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            queue_wait_ns: self.queue_wait_ns.load(Ordering::Relaxed),
        }
    }

    /// Serves one request: waits for a place, holds it for the work's time. Dropped part way
    /// (the caller went away), it leaves the counts as they would be had it never come.
    pub async fn serve(&self) {
        let queued = self.queued.fetch_add(1, Ordering::Relaxed) + 1;
        self.queued_max.fetch_max(queued, Ordering::Relaxed);
        let waiting = Counted(&self.queued);
        let arrived = tokio::time::Instant::now();
        // Never closed: the semaphore lives as long as the work.
        let permit = self.places.acquire().await;
        drop(waiting);
        let waited = u64::try_from(arrived.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.queue_wait_ns.fetch_add(waited, Ordering::Relaxed);
        self.in_service.fetch_add(1, Ordering::Relaxed);
        let serving = Counted(&self.in_service);
        tokio::time::sleep(self.takes).await;
        drop(serving);
        self.served.fetch_add(1, Ordering::Relaxed);
        drop(permit);
    }
}

/// One unit of a count, taken back when dropped: a request's place in the queue or in
/// service is given back however its future ends.
struct Counted<'a>(&'a AtomicU64);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The demo upstream: answers every request with `{"ok":true,...}` naming its method and path;
/// `POST /v1/exports` answers only after [`EXPORT_TAKES`], `GET /v1/work` as [`Work::demo`],
/// `POST /v1/complete` with a token count in [`USAGE_HEADER`].
pub fn upstream_app() -> Router {
    upstream_app_with(ExportPace::Takes(EXPORT_TAKES))
}

/// The demo upstream with exports paced by `pace`.
pub fn upstream_app_with(pace: ExportPace) -> Router {
    upstream_app_with_work(pace, Work::demo())
}

/// The demo upstream with exports paced by `pace` and `/v1/work` served by `work`.
pub fn upstream_app_with_work(pace: ExportPace, work: Arc<Work>) -> Router {
    let work_route = move |request: Request| {
        let work = work.clone();
        async move {
            work.serve().await;
            echo(request).await
        }
    };
    let export = move |request: Request| {
        let pace = pace.clone();
        async move {
            match pace {
                ExportPace::Takes(time) => tokio::time::sleep(time).await,
                ExportPace::Gate(gate) => {
                    gate.arrived.send_modify(|n| *n += 1);
                    if let Ok(permit) = gate.answer.acquire().await {
                        permit.forget();
                    }
                }
            }
            echo(request).await
        }
    };
    let tokens = Arc::new(Tokens::seeded());
    let complete = move |request: Request| {
        let tokens = tokens.clone();
        async move { complete(&tokens, request) }
    };
    Router::new()
        .route("/v1/exports", post(export).fallback(echo))
        .route("/v1/work", get(work_route).fallback(echo))
        .route("/v1/complete", post(complete).fallback(echo))
        .fallback(echo)
}

/// The header the demo upstream's completions report their token count in (what the example
/// rules' `tokens` rule charges).
pub const USAGE_HEADER: &str = "x-usage-tokens";
/// Most tokens one demo completion uses.
pub const MOST_TOKENS: u64 = 100;

/// Token counts of the demo completions: 1 to [`MOST_TOKENS`], from a xorshift generator (no
/// need for a good one: it stands in for a model's output length).
struct Tokens(AtomicU64);

impl Tokens {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
        Tokens(AtomicU64::new(u64::from(nanos) | 1))
    }

    fn next(&self) -> u64 {
        let mut x = 0;
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mut s| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                x = s;
                Some(s)
            });
        x % MOST_TOKENS + 1
    }
}

/// `POST /v1/complete`: a completion that used a random 1 to [`MOST_TOKENS`] tokens, reported
/// in [`USAGE_HEADER`] (as an LLM API reports its usage).
fn complete(tokens: &Tokens, request: Request) -> Response {
    let used = tokens.next();
    (
        [
            ("content-type", "application/json".to_owned()),
            (USAGE_HEADER, used.to_string()),
        ],
        format!(
            "{{\"ok\":true,\"method\":\"{}\",\"path\":\"{}\",\"tokens\":{used}}}\n",
            request.method(),
            request.uri().path().replace('"', "")
        ),
    )
        .into_response()
}

async fn echo(request: Request) -> impl IntoResponse {
    (
        [("content-type", "application/json")],
        format!(
            "{{\"ok\":true,\"method\":\"{}\",\"path\":\"{}\"}}\n",
            request.method(),
            request.uri().path().replace('"', "")
        ),
    )
}

/// Serves `app` on `listener` until `shutdown` turns true, with peer addresses for the layer.
pub async fn serve(listener: TcpListener, app: Router, mut shutdown: watch::Receiver<bool>) {
    let stop = async move {
        let _ = shutdown.wait_for(|&stop| stop).await;
    };
    if let Err(e) = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stop)
    .await
    {
        tracing::warn!("gateway server stopped: {e}");
    }
}

/// How long a limiter call may take before a rule's failure mode decides, unless told.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
