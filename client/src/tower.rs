//! `RateLimitLayer`: the policy-driven limiter as a `tower::Layer` (feature `tower`), so an axum or
//! hyper gateway adds every rule, header and problem body in one line:
//!
//! ```ignore
//! let app = axum::Router::new().fallback(proxy).layer(RateLimitLayer::new(limiter));
//! ```
//!
//! Each request's [`RequestInfo`] comes from an extractor: by default [`DefaultExtractor`] (the
//! `X-User-Id`, `X-Api-Key`, `X-Tenant-Id` and `X-Plan` headers an auth step in front sets, the
//! peer from a [`PeerAddr`] or `SocketAddr` request extension, and `X-Forwarded-For`, which the
//! policy's trusted proxies decide about). A passing request goes to the inner service and its
//! response gains `RateLimit-Policy` and `RateLimit`; any other is answered here: `429` or `503`
//! with `Retry-After`, the same fields and an `application/problem+json` body.
//!
//! Metered rules (`cost_from:`): a request header's cost is read before the rules are asked; a
//! response's cost is charged once the inner service has answered, before the response goes
//! back: the value the service put in the response's [`ReportedCosts`], else the response
//! header of that name (missing or not a whole number, or no response because the service
//! failed: the rule's `missing`). A cost not in the head may come as a trailer: map responses
//! through [`charge_at_end_of_body`] outside the layer, and it is charged when the body ends
//! (a key's next request may then pass before it lands); without that, or without the
//! trailer, the rule's `missing` is charged when the response is dropped.
//!
//! Rules with `concurrency:` hold a lease for each request they match: taken before the rate
//! rules are asked (a request they then deny gives it back at once), held (and renewed every
//! half TTL) while the inner service runs, and given back when the response is dropped or the request is dropped before
//! that. A server drops the response once it has sent its head: to hold the lease until the
//! body has been sent too, map responses through [`hold_leases_until_sent`] outside the layer
//! (the example gateway does). When no lease is free the answer is the rate rules' `429` contract, with
//! `Retry-After` the time until the earliest lease expires (whole seconds, at least 1); a
//! fail-closed rule the limiter could not answer gets `503`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::policy::{
    HeldLeases, LeaseEvent, LeaseObserver, RateLimiter, RequestDecision, RequestInfo,
};
use floodgate::policy::HttpResponse;

/// The TCP peer of a request, as a request extension (a hyper server loop inserts it; axum's
/// `ConnectInfo` users can pass their own extractor instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Builds a request's [`RequestInfo`].
pub trait ExtractRequest<B>: Clone + Send + Sync + 'static {
    fn extract(&self, request: &Request<B>) -> RequestInfo;
}

impl<B, F> ExtractRequest<B> for F
where
    F: Fn(&Request<B>) -> RequestInfo + Clone + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> RequestInfo {
        self(request)
    }
}

/// Identity from the headers an auth step sets (`X-User-Id`, `X-Api-Key`, `X-Tenant-Id`,
/// `X-Plan`), the peer from a [`PeerAddr`] or `SocketAddr` extension, and every
/// `X-Forwarded-For` line (believed only through the policy's trusted proxies).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultExtractor;

impl<B> ExtractRequest<B> for DefaultExtractor {
    fn extract(&self, request: &Request<B>) -> RequestInfo {
        let peer = request
            .extensions()
            .get::<PeerAddr>()
            .map(|p| p.0)
            .or_else(|| request.extensions().get::<SocketAddr>().copied());
        request_info(request, peer)
    }
}

/// The [`RequestInfo`] of `request` with `peer` as its TCP peer: what [`DefaultExtractor`] does
/// once it has found the peer. For custom extractors (e.g. reading axum's `ConnectInfo`).
pub fn request_info<B>(request: &Request<B>, peer: Option<SocketAddr>) -> RequestInfo {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    RequestInfo {
        method: request.method().as_str().to_owned(),
        path: request.uri().path().to_owned(),
        user: header("x-user-id"),
        api_key: header("x-api-key"),
        tenant: header("x-tenant-id"),
        plan: header("x-plan"),
        home_region: header("x-home-region"),
        priority: header("x-priority"),
        peer: peer.map(|p| p.ip()),
        forwarded_for: request
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect(),
        // Filled by the layer, which knows the rules' `cost_from` headers.
        cost_headers: Vec::new(),
    }
}

/// Costs a service reports for metered rules (`cost_from: { response_header: NAME }`) in its
/// response's extensions, by name: what it knows as a number (tokens it counted) need not be
/// written into a header. The layer looks a name up here first, then in the response headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportedCosts(Vec<(String, u64)>);

impl ReportedCosts {
    /// Reports `units` under `name` (a metered rule's `response_header`, any case).
    pub fn with(mut self, name: &str, units: u64) -> Self {
        self.0.push((name.to_ascii_lowercase(), units));
        self
    }

    /// The units reported under `name` (lower-case).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(n, _)| n == name).map(|&(_, u)| u)
    }
}

/// The units a response reports under `name`: in its [`ReportedCosts`], else in a header.
fn response_cost<B>(response: &Response<B>, name: &str) -> Option<u64> {
    if let Some(units) = response
        .extensions()
        .get::<ReportedCosts>()
        .and_then(|costs| costs.get(name))
    {
        return Some(units);
    }
    let value = response.headers().get(name)?.to_str().ok()?;
    floodgate::policy::metered::cost_in(value)
}

type Observer = Arc<dyn Fn(&RequestDecision) + Send + Sync>;

/// Rate limits the requests of the service it wraps (see the module docs).
#[derive(Clone)]
pub struct RateLimitLayer<X = DefaultExtractor> {
    limiter: RateLimiter,
    extract: X,
    observer: Option<Observer>,
    lease_observer: Option<LeaseObserver>,
}

impl<X: std::fmt::Debug> std::fmt::Debug for RateLimitLayer<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("extract", &self.extract)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<DefaultExtractor> {
    pub fn new(limiter: RateLimiter) -> Self {
        RateLimitLayer {
            limiter,
            extract: DefaultExtractor,
            observer: None,
            lease_observer: None,
        }
    }
}

impl<X> RateLimitLayer<X> {
    /// The same layer reading requests with `extract`.
    pub fn with_extractor<Y>(self, extract: Y) -> RateLimitLayer<Y> {
        RateLimitLayer {
            limiter: self.limiter,
            extract,
            observer: self.observer,
            lease_observer: self.lease_observer,
        }
    }

    /// Calls `observer` with every lease event of a `concurrency:` rule (granted, refused,
    /// unreachable, released): per-rule leases in use, grants and refusals for metrics.
    pub fn on_lease(mut self, observer: impl Fn(&LeaseEvent) + Send + Sync + 'static) -> Self {
        self.lease_observer = Some(Arc::new(observer));
        self
    }

    /// Calls `observer` with every decision (metrics, logs), before the request goes on.
    pub fn on_decision(
        mut self,
        observer: impl Fn(&RequestDecision) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }
}

impl<S, X: Clone> Layer<S> for RateLimitLayer<X> {
    type Service = RateLimit<S, X>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
            observer: self.observer.clone(),
            lease_observer: self.lease_observer.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
#[derive(Clone)]
pub struct RateLimit<S, X = DefaultExtractor> {
    inner: S,
    limiter: RateLimiter,
    extract: X,
    observer: Option<Observer>,
    lease_observer: Option<LeaseObserver>,
}

impl<S: std::fmt::Debug, X: std::fmt::Debug> std::fmt::Debug for RateLimit<S, X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("extract", &self.extract)
            .finish_non_exhaustive()
    }
}

impl<S, X, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, X>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    X: ExtractRequest<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut info = self.extract.extract(&request);
        info.cost_headers = self
            .limiter
            .cost_headers(|name| request.headers().get(name)?.to_str().ok());
        // The clone is not ready; the ready one goes with this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        let observer = self.observer.clone();
        let lease_observer = self.lease_observer.clone();
        Box::pin(async move {
            // Held by this future: dropped (released) with it if the request is abandoned.
            let leases = limiter.acquire_leases(&info, lease_observer.as_ref()).await;
            if let Some(answer) = &leases.refusal {
                return Ok(answer_with(answer));
            }
            let decision = limiter.check(&info).await;
            if let Some(observer) = &observer {
                observer(&decision);
            }
            if decision.is_allowed() {
                let mut decision = decision;
                let mut response = match inner.call(request).await {
                    Ok(response) => response,
                    Err(e) => {
                        // No response: each metered rule is charged its `missing` cost.
                        limiter.charge(&decision, |_| None).await;
                        return Err(e);
                    }
                };
                if !decision.charges_after.is_empty() {
                    let costs: Vec<(String, Option<u64>)> = decision
                        .charge_names()
                        .map(|name| (name.to_owned(), response_cost(&response, name)))
                        .collect();
                    if costs.iter().all(|(_, units)| units.is_some()) {
                        // Charged before the response goes back, so this gateway's next
                        // request sees it: a key is over its limit by at most one response's
                        // cost per request in flight.
                        let units = |name: &str| costs.iter().find(|(n, _)| n == name)?.1;
                        let charged = limiter.charge(&decision, units).await;
                        decision.record_charges(&charged);
                    } else {
                        // A cost not in the head may come as a trailer: charged when the body
                        // ends (`charge_at_end_of_body`), or when the response is dropped.
                        let pending = PendingCharges::new(limiter.clone(), decision.clone(), costs);
                        response.extensions_mut().insert(pending);
                    }
                }
                add_headers(response.headers_mut(), &decision);
                if !leases.held.is_empty() {
                    // Released when the server drops the response.
                    response
                        .extensions_mut()
                        .insert(LeaseGuard(Arc::new(leases.held)));
                }
                return Ok(response);
            }
            Ok(refusal(&decision))
        })
    }
}

/// The metered charges of a response whose head did not carry every cost: taken when the
/// last copy is dropped (by [`MeteredBody`] at the end of the body, after reading its
/// trailers; else when the server drops the response), each cost from the head or a trailer,
/// else the rule's `missing`.
#[derive(Clone)]
pub struct PendingCharges(Arc<parking_lot::Mutex<Pending>>);

impl std::fmt::Debug for PendingCharges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PendingCharges")
            .field(&self.0.lock().costs)
            .finish()
    }
}

struct Pending {
    limiter: RateLimiter,
    decision: Option<RequestDecision>,
    /// Each metered rule's name and the units found so far.
    costs: Vec<(String, Option<u64>)>,
}

impl PendingCharges {
    fn new(
        limiter: RateLimiter,
        decision: RequestDecision,
        costs: Vec<(String, Option<u64>)>,
    ) -> Self {
        PendingCharges(Arc::new(parking_lot::Mutex::new(Pending {
            limiter,
            decision: Some(decision),
            costs,
        })))
    }

    /// Takes the costs a trailer block carries for names the head did not.
    fn read_trailers(&self, trailers: &http::HeaderMap) {
        let mut pending = self.0.lock();
        for (name, units) in pending.costs.iter_mut().filter(|(_, u)| u.is_none()) {
            *units = trailers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .and_then(floodgate::policy::metered::cost_in);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(decision) = self.decision.take() else {
            return;
        };
        // Dropped outside a runtime (the process ending): nothing to send the charge with.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = self.limiter.clone();
        let costs = std::mem::take(&mut self.costs);
        runtime.spawn(async move {
            let units = |name: &str| costs.iter().find(|(n, _)| n == name)?.1;
            limiter.charge(&decision, units).await;
        });
    }
}

/// A response body that reads its trailers for metered costs the head did not carry, and has
/// them charged when it ends (or fails, or is dropped): see [`charge_at_end_of_body`].
#[derive(Debug)]
pub struct MeteredBody<B> {
    inner: B,
    pending: Option<PendingCharges>,
}

impl<B> http_body::Body for MeteredBody<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(trailers), Some(pending)) = (frame.trailers_ref(), &this.pending) {
                    pending.read_trailers(trailers);
                }
            }
            // The body is over: charge now.
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.pending = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Moves the metered charges the layer left on `response` (costs its head did not carry) into
/// its body, which reads them from the trailers and charges them when it ends. Apply it outside
/// [`RateLimitLayer`], as [`hold_leases_until_sent`]. Without it such charges are taken, at
/// their rules' `missing`, when the server drops the response.
pub fn charge_at_end_of_body<B>(mut response: Response<B>) -> Response<MeteredBody<B>> {
    let pending = response.extensions_mut().remove::<PendingCharges>();
    response.map(|inner| MeteredBody { inner, pending })
}

/// A response's concurrency leases: released when the last copy is dropped.
#[derive(Debug, Clone)]
pub struct LeaseGuard(Arc<HeldLeases>);

impl LeaseGuard {
    /// How many leases the response holds.
    pub fn leases(&self) -> usize {
        self.0.len()
    }
}

/// A response body holding its response's leases until it has been sent to the end (or failed,
/// or was dropped): see [`hold_leases_until_sent`].
#[derive(Debug)]
pub struct LeaseBody<B> {
    inner: B,
    guard: Option<LeaseGuard>,
}

impl<B> http_body::Body for LeaseBody<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // The body is over: the request is done with its leases.
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Moves the leases the layer attached to `response` into its body, so they are given back
/// when the body has been sent (or dropped) rather than when the server drops the response
/// head. Apply it outside [`RateLimitLayer`], e.g. with axum's `middleware::map_response`.
pub fn hold_leases_until_sent<B>(mut response: Response<B>) -> Response<LeaseBody<B>> {
    let guard = response.extensions_mut().remove::<LeaseGuard>();
    response.map(|inner| LeaseBody { inner, guard })
}

fn add_headers(headers: &mut http::HeaderMap, decision: &RequestDecision) {
    add_fields(headers, &decision.response);
}

fn add_fields(headers: &mut http::HeaderMap, response: &HttpResponse) {
    for (name, value) in &response.headers {
        // Names are the policy's lower-case constants; values are ASCII it formatted.
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}

/// The `429` or `503` answer of a request that does not pass.
pub fn refusal<B: From<String>>(decision: &RequestDecision) -> Response<B> {
    answer_with(&decision.response)
}

/// The `429` or `503` answer `answer` describes (a rate or a concurrency refusal).
pub fn answer_with<B: From<String>>(answer: &HttpResponse) -> Response<B> {
    let body = answer.body.clone().unwrap_or_default();
    let mut response = Response::new(B::from(body));
    *response.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    add_fields(response.headers_mut(), answer);
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body::Body;

    use super::*;
    use crate::{Acquire, Client, ClientConfig, RateLimiter};

    /// A completion whose body ends with an `x-usage-tokens` trailer: one data frame, then
    /// the trailer.
    struct TrailerBody {
        frames_sent: u8,
    }

    impl From<String> for TrailerBody {
        fn from(_: String) -> Self {
            TrailerBody { frames_sent: 2 }
        }
    }

    impl http_body::Body for TrailerBody {
        type Data = &'static [u8];
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            self.frames_sent += 1;
            Poll::Ready(match self.frames_sent {
                1 => Some(Ok(http_body::Frame::data(&b"completion"[..]))),
                2 => {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("x-usage-tokens", HeaderValue::from_static("70"));
                    Some(Ok(http_body::Frame::trailers(trailers)))
                }
                _ => None,
            })
        }
    }

    #[derive(Clone)]
    struct Completions;

    impl Service<Request<String>> for Completions {
        type Response = Response<TrailerBody>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<String>) -> Self::Future {
            std::future::ready(Ok(Response::new(TrailerBody { frames_sent: 0 })))
        }
    }

    /// A metered cost that comes as a trailer (not in the response's head) is charged once the
    /// body has ended, through `charge_at_end_of_body`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cost_in_a_trailer_is_charged_when_the_body_ends() {
        let dir = tempfile::tempdir().unwrap();
        let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
        let node = floodgate_node::Node::start(floodgate_node::NodeConfig::for_tests(&certs))
            .await
            .unwrap();
        let mut config = ClientConfig::with_ca_file(&certs.ca);
        config.timeout = Duration::from_secs(5);
        let client = Client::connect(&[node.local_addr()], config).await.unwrap();
        let rules = "rules:\n  - name: tokens\n    method: POST\n    path: /v1/complete\n    \
                     key: api_key\n    limit: 100/h\n    \
                     cost_from: { response_header: x-usage-tokens }\n";
        let policy = floodgate::policy::Policy::from_yaml(rules).unwrap();
        let limiter = RateLimiter::with_policy(client.clone(), Some(policy.clone()));
        let mut service = RateLimitLayer::new(limiter.clone()).layer(Completions);
        let request = || {
            Request::post("/v1/complete")
                .header("x-api-key", "k")
                .body(String::new())
                .unwrap()
        };
        let response = service.call(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.extensions().get::<PendingCharges>().is_some());
        let mut body = charge_at_end_of_body(response).into_body();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(Some(_)) = Pin::new(&mut body).poll_frame(&mut cx) {}
        drop(body);
        // The charge leaves once the body has ended: wait (bounded) until the key's bucket
        // shows it, by peeking as a request would.
        let info = crate::policy::RequestInfo {
            api_key: Some("k".into()),
            ..crate::policy::RequestInfo::new("POST", "/v1/complete")
        };
        let planned = policy.checks_for(&info.attributes(None));
        let peek = planned[0].check().cost(0);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = client.check(std::slice::from_ref(&peek)).await.unwrap()[0]
                .decision
                .remaining();
            if left == 30 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{left} left, not 30"
            );
            tokio::task::yield_now().await;
        }
        limiter.close().await;
        node.shutdown().await;
    }

    /// A lease held by a response body is given back once the body has been read to its end,
    /// not before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_body_gives_its_lease_back_at_the_end_of_the_body() {
        let dir = tempfile::tempdir().unwrap();
        let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
        let node = floodgate_node::Node::start(floodgate_node::NodeConfig::for_tests(&certs))
            .await
            .unwrap();
        let mut config = ClientConfig::with_ca_file(&certs.ca);
        config.timeout = Duration::from_secs(5);
        let client = Client::connect(&[node.local_addr()], config).await.unwrap();
        let Acquire::Granted(lease) = client
            .acquire("k", 1, Duration::from_secs(60))
            .await
            .unwrap()
        else {
            panic!("the only lease is free");
        };
        let (released, mut on_release) = tokio::sync::mpsc::unbounded_channel();
        let observer: LeaseObserver = Arc::new(move |event: &LeaseEvent| {
            let _ = released.send(event.clone());
        });
        let held = HeldLeases::for_tests(client.clone(), vec![(Arc::from("r"), lease)], observer);
        let mut response = Response::new(http_body_util::Full::new(&b"export"[..]));
        response.extensions_mut().insert(LeaseGuard(Arc::new(held)));
        let mut body = hold_leases_until_sent(response).into_body();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        // The body's one frame: the lease is still held.
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(on_release.try_recv().is_err());
        assert_eq!(node.leases_in_use(b"k"), 1);
        // The end of the body: given back.
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(None)
        ));
        let event = tokio::time::timeout(Duration::from_secs(10), on_release.recv())
            .await
            .expect("released within the bound")
            .unwrap();
        assert_eq!(
            event,
            LeaseEvent::Released {
                rule: Arc::from("r")
            }
        );
        assert_eq!(node.leases_in_use(b"k"), 0);
        client.close().await;
        node.shutdown().await;
    }
}
