//! Load shedding in front of one upstream (feature `tower`): [`ShedLayer`] asks the core's
//! [`Shedder`] before each request and answers `503` with `Retry-After` for those it sheds
//! (lowest class first), and tells it how long each admitted one took, so its limit follows
//! the upstream. [`ShedGate`] is the shared shedder: the brownout task reads its level from it
//! and sets the fleet's.
//!
//! The shedder's clock is tokio's (`tokio::time::Instant`), so tests drive it with paused time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use floodgate::policy::priority::shed_response;
use floodgate::priority::shedder::ShedReason;
use floodgate::priority::{Admission, Priority, Shedder, ShedderConfig};
use http::{Request, Response};
use parking_lot::Mutex;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::policy::RateLimiter;
use crate::tower::{answer_with, request_info};

/// One upstream's shedder, shared by the layer, the brownout task and metrics.
#[derive(Debug, Clone)]
pub struct ShedGate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    backend: Arc<str>,
    /// Off: the shedder only watches (never sheds); for a baseline beside shedding.
    enforce: bool,
    // A short lock: every use is a few arithmetic steps, never held across an await.
    shedder: Mutex<Shedder>,
    start: Instant,
}

/// What a gate looks like now (for metrics and status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShedStatus {
    /// The level in force (this gateway's or the fleet's, the higher).
    pub level: u8,
    pub local_level: u8,
    pub fleet_level: u8,
    /// The adaptive limit on requests in flight (critical's, counted alone).
    pub limit: u64,
    /// The limit the lower classes are held to, counted with everything in flight.
    pub lower_limit: u64,
    pub in_flight: u64,
}

/// One request's class and what the gate did with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShedEvent {
    pub class: Priority,
    /// `None`: admitted.
    pub shed: Option<ShedReason>,
}

impl ShedGate {
    /// A gate for `backend` that sheds (`enforce`) or only watches.
    pub fn new(backend: &str, config: ShedderConfig, enforce: bool) -> Self {
        ShedGate {
            inner: Arc::new(GateInner {
                backend: Arc::from(backend),
                enforce,
                shedder: Mutex::new(Shedder::new(config, 0)),
                start: Instant::now(),
            }),
        }
    }

    pub fn backend(&self) -> &str {
        &self.inner.backend
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Decides a request of `class`.
    pub fn admit(&self, class: Priority) -> Admission {
        let now = self.now_ns();
        let mut shedder = self.inner.shedder.lock();
        if self.inner.enforce {
            shedder.admit(now, class)
        } else {
            Admission::Admitted {
                in_flight: shedder.admit_unchecked(now, class),
            }
        }
    }

    /// An admitted request of `class` was answered after `latency`.
    pub fn complete(&self, class: Priority, latency: std::time::Duration, in_flight: u64) {
        let now = self.now_ns();
        let latency_ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.inner
            .shedder
            .lock()
            .complete(now, class, latency_ns, in_flight);
    }

    /// An admitted request of `class` was dropped unanswered.
    pub fn abandon(&self, class: Priority) {
        self.inner.shedder.lock().abandon(class);
    }

    /// This gateway's own level, after closing the windows that have passed.
    pub fn local_level(&self) -> u8 {
        let now = self.now_ns();
        let mut shedder = self.inner.shedder.lock();
        shedder.tick(now);
        shedder.local_level()
    }

    /// The fleet's level, as the brownout task read it.
    pub fn set_fleet_level(&self, level: u8) {
        self.inner.shedder.lock().set_fleet_level(level);
    }

    pub fn status(&self) -> ShedStatus {
        let shedder = self.inner.shedder.lock();
        ShedStatus {
            level: shedder.level(),
            local_level: shedder.local_level(),
            fleet_level: shedder.fleet_level(),
            limit: shedder.limit(),
            lower_limit: shedder.lower_limit(),
            in_flight: shedder.in_flight(),
        }
    }
}

/// A request's class under the limiter's rules in force (`default` without rules).
pub fn request_class<B>(limiter: &RateLimiter, request: &Request<B>) -> Priority {
    let info = request_info(request, None);
    limiter
        .policy()
        .map_or(Priority::Default, |policy| info.class(&policy))
}

type ShedObserver = Arc<dyn Fn(&ShedEvent) + Send + Sync>;

/// Sheds requests to the service it wraps through a [`ShedGate`]; `classify` gives each
/// request's class.
#[derive(Clone)]
pub struct ShedLayer<F> {
    gate: ShedGate,
    classify: F,
    observer: Option<ShedObserver>,
}

impl<F> std::fmt::Debug for ShedLayer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShedLayer")
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

impl<F> ShedLayer<F> {
    pub fn new(gate: ShedGate, classify: F) -> Self {
        ShedLayer {
            gate,
            classify,
            observer: None,
        }
    }

    /// Calls `observer` with every request's class and whether it was shed.
    pub fn on_event(mut self, observer: impl Fn(&ShedEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }
}

impl<S, F: Clone> Layer<S> for ShedLayer<F> {
    type Service = Shed<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Shed {
            inner,
            gate: self.gate.clone(),
            classify: self.classify.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service [`ShedLayer`] makes.
#[derive(Clone)]
pub struct Shed<S, F> {
    inner: S,
    gate: ShedGate,
    classify: F,
    observer: Option<ShedObserver>,
}

impl<S, F> std::fmt::Debug for Shed<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shed")
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

/// An admitted request's place: given back with its latency when answered, without when
/// dropped.
struct InFlight {
    gate: ShedGate,
    class: Priority,
    in_flight: u64,
    started: Instant,
    answered: bool,
}

impl InFlight {
    /// The inner service is done with the request (`answered`: it gave a response).
    fn finish(mut self, answered: bool) {
        self.answered = answered;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.answered {
            self.gate
                .complete(self.class, self.started.elapsed(), self.in_flight);
        } else {
            self.gate.abandon(self.class);
        }
    }
}

impl<S, F, ReqBody, ResBody> Service<Request<ReqBody>> for Shed<S, F>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    F: Fn(&Request<ReqBody>) -> Priority + Clone + Send + Sync + 'static,
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
        let class = (self.classify)(&request);
        let admission = self.gate.admit(class);
        let shed = match admission {
            Admission::Admitted { .. } => None,
            Admission::Shed { reason, .. } => Some(reason),
        };
        if let Some(observer) = &self.observer {
            observer(&ShedEvent { class, shed });
        }
        let in_flight = match admission {
            Admission::Admitted { in_flight } => in_flight,
            Admission::Shed { retry_after_ns, .. } => {
                let answer = shed_response(self.gate.backend(), class, retry_after_ns);
                return Box::pin(async move { Ok(answer_with(&answer)) });
            }
        };
        // The clone is not ready; the ready one goes with this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let place = InFlight {
            gate: self.gate.clone(),
            class,
            in_flight,
            started: Instant::now(),
            answered: false,
        };
        Box::pin(async move {
            let result = inner.call(request).await;
            place.finish(result.is_ok());
            result
        })
    }
}
