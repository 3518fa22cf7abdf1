//! Load shedding at the gateway: the shed layer turns away the lowest class first with a 503
//! and `Retry-After` while higher classes go through (on tokio's paused clock), and two
//! gateways reporting through one real node converge on one brownout level.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use floodgate::priority::{MAX_LEVEL, Priority, ShedderConfig};
use floodgate_client::brownout::BrownoutReporter;
use floodgate_client::shed::{ShedEvent, ShedGate, ShedLayer};
use floodgate_client::{Client, ClientConfig};
use http::{Request, Response};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tower_layer::Layer;
use tower_service::Service;

/// An upstream that answers each request only when the test says (no clock involved).
#[derive(Clone, Default)]
struct HeldUpstream {
    waiting: Arc<Mutex<VecDeque<oneshot::Sender<()>>>>,
}

impl HeldUpstream {
    fn answer_all(&self) -> usize {
        let mut waiting = self.waiting.lock();
        let n = waiting.len();
        for tx in waiting.drain(..) {
            let _ = tx.send(());
        }
        n
    }
}

impl Service<Request<String>> for HeldUpstream {
    type Response = Response<String>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().push_back(tx);
        Box::pin(async move {
            let _ = rx.await;
            Ok(Response::new("ok".to_owned()))
        })
    }
}

fn request(class: &str) -> Request<String> {
    Request::builder()
        .uri("/v1/work")
        .header("x-priority", class)
        .body(String::new())
        .unwrap()
}

fn class_of(request: &Request<String>) -> Priority {
    request
        .headers()
        .get("x-priority")
        .and_then(|v| v.to_str().ok())
        .and_then(Priority::from_name)
        .unwrap_or_default()
}

/// With the upstream holding every request, lower-class requests past the lower limit (8 in
/// flight, every class counted) get a 503 with Retry-After and a problem body naming the
/// class, while critical ones, counted alone, still get in. A window without room sheds
/// nothing outright; once default requests have lost their place in every window of the
/// escalation span (5), the level sheds sheddable outright, with the restore time (3 s) as its
/// Retry-After.
#[tokio::test(start_paused = true)]
async fn the_lowest_class_is_shed_first_with_a_503_and_retry_after() {
    let upstream = HeldUpstream::default();
    let gate = ShedGate::new("work", ShedderConfig::default(), true);
    let events: Arc<Mutex<Vec<ShedEvent>>> = Arc::default();
    let seen = events.clone();
    let mut service = ShedLayer::new(gate.clone(), class_of)
        .on_event(move |e| seen.lock().push(*e))
        .layer(upstream.clone());
    let mut pending = Vec::new();
    for _ in 0..8 {
        pending.push(tokio::spawn(service.call(request("sheddable"))));
    }
    let shed = service.call(request("sheddable")).await.unwrap();
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["retry-after"], "1");
    assert!(
        shed.body().contains("\"priority\":\"sheddable\""),
        "{}",
        shed.body()
    );
    for _ in 0..5 {
        pending.push(tokio::spawn(service.call(request("critical"))));
    }
    assert_eq!(gate.status().in_flight, 13);
    for window in 0..5 {
        assert_eq!(gate.local_level(), 0, "window {window}");
        for _ in 0..4 {
            let refused = service.call(request("default")).await.unwrap();
            assert_eq!(refused.status(), 503);
            assert_eq!(refused.headers()["retry-after"], "1");
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert_eq!(gate.local_level(), 1);
    let outright = service.call(request("sheddable")).await.unwrap();
    assert_eq!(outright.status(), 503);
    assert_eq!(outright.headers()["retry-after"], "3");
    // Answered: every place is given back.
    tokio::task::yield_now().await;
    assert_eq!(upstream.answer_all(), 13);
    for task in pending {
        assert_eq!(task.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(gate.status().in_flight, 0);
    let events = events.lock();
    let shed_of = |class: Priority| {
        events
            .iter()
            .filter(|e| e.class == class && e.shed.is_some())
            .count()
    };
    assert_eq!(
        (
            shed_of(Priority::Sheddable),
            shed_of(Priority::Default),
            shed_of(Priority::Critical)
        ),
        (2, 20, 0)
    );
}

/// A gate that only watches never sheds, however far past its limit.
#[tokio::test(start_paused = true)]
async fn a_watching_gate_never_sheds() {
    let upstream = HeldUpstream::default();
    let gate = ShedGate::new("work", ShedderConfig::default(), false);
    let mut service = ShedLayer::new(gate.clone(), class_of).layer(upstream.clone());
    let mut pending = Vec::new();
    for _ in 0..50 {
        pending.push(tokio::spawn(service.call(request("sheddable"))));
    }
    tokio::task::yield_now().await;
    assert_eq!(gate.status().in_flight, 50);
    assert_eq!(upstream.answer_all(), 50);
    for task in pending {
        assert_eq!(task.await.unwrap().unwrap().status(), 200);
    }
}

/// Two gateways, one overloaded (level 2) and one calm (level 0), report through one real
/// node: after a round of each, both read fleet level 2 and the calm one sheds default
/// requests too, though its own signal says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_converge_on_one_brownout_level() {
    let dir = tempfile::tempdir().unwrap();
    let certs = floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    let node = floodgate_node::Node::start(floodgate_node::NodeConfig::for_tests(&certs))
        .await
        .unwrap();
    let mut config = ClientConfig::with_ca_file(&certs.ca);
    config.timeout = Duration::from_secs(5);
    // The quorum counts reports, not gateways: the calm gateway reports once more than the
    // busy one below (a third of the reports are at level 2), so it is a third here.
    // An hour's interval: the counting period's boundaries (every 3 h from the epoch) fall
    // between two rounds of this test with odds of about one in a million.
    let reporter = |client: Client| {
        BrownoutReporter::new(client, "work", Duration::from_secs(3_600), 3_000).unwrap()
    };
    let client_a = Client::connect(&[node.local_addr()], config.clone())
        .await
        .unwrap();
    let client_b = Client::connect(&[node.local_addr()], config).await.unwrap();
    let (a, b) = (reporter(client_a.clone()), reporter(client_b.clone()));
    // The busy gateway's shedder is at the top level (how a shedder gets there is the core's
    // unit tests'); the calm one's at 0.
    let busy = ShedGate::new("work", ShedderConfig::default(), true);
    let calm = ShedGate::new("work", ShedderConfig::default(), true);

    // The calm gateway reports first: nobody is shedding yet.
    let (level, reading) = b.round(calm.local_level()).await.unwrap();
    assert_eq!((level, reading.at_least), (0, [1, 0, 0]));

    let (level_a, _) = a.round(MAX_LEVEL).await.unwrap();
    let (level_b, reading) = b.round(calm.local_level()).await.unwrap();
    assert_eq!(reading.at_least, [3, 1, 1]);
    assert_eq!((level_a, level_b), (MAX_LEVEL, MAX_LEVEL));
    busy.set_fleet_level(level_a);
    calm.set_fleet_level(level_b);
    for gate in [&busy, &calm] {
        assert_eq!(gate.status().level, MAX_LEVEL);
        assert!(matches!(
            gate.admit(Priority::Default),
            floodgate::priority::Admission::Shed { .. }
        ));
        assert!(matches!(
            gate.admit(Priority::Critical),
            floodgate::priority::Admission::Admitted { .. }
        ));
    }
    assert_eq!(
        calm.local_level(),
        0,
        "the fleet's level is not reported as its own"
    );

    // A backend name the keys cannot hold is refused up front.
    assert!(
        BrownoutReporter::new(client_a.clone(), "a b", Duration::from_millis(100), 5_000).is_err()
    );
    client_a.close().await;
    client_b.close().await;
    node.shutdown().await;
}
