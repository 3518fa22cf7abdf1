//! The UDP fault proxy in front of one node: every datagram to the node's advertised address,
//! from a gateway or another node, passes through it and meets the fault table on the way in
//! and on the way back.
//!
//! Each source gets its own upstream socket (a "flow"), so the node sees one peer per source,
//! as it would without the proxy. Sources are told apart by port: nodes send from their listen
//! port, gateways from ports the directory learned when they connected.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::faults::{Endpoint, FaultTable};

/// Which endpoint sends from which loopback port.
#[derive(Debug, Default)]
pub struct Directory {
    ports: RwLock<HashMap<u16, Endpoint>>,
    /// Ports of the proxies' own sockets, so a gateway's socket census can leave them out.
    proxy_ports: RwLock<Vec<u16>>,
}

impl Directory {
    pub fn register(&self, port: u16, endpoint: Endpoint) {
        self.ports.write().insert(port, endpoint);
    }

    pub fn endpoint(&self, addr: SocketAddr) -> Endpoint {
        self.ports
            .read()
            .get(&addr.port())
            .copied()
            .unwrap_or(Endpoint::Other)
    }

    pub fn is_proxy_port(&self, port: u16) -> bool {
        self.proxy_ports.read().contains(&port)
    }

    fn add_proxy_port(&self, port: u16) {
        self.proxy_ports.write().push(port);
    }
}

/// Most distinct sources one proxy relays for; packets from more are dropped (and counted).
const MAX_FLOWS: usize = 4_096;
/// Largest datagram relayed (loopback's MTU).
const MAX_DATAGRAM: usize = 65_536;

/// Counters of what a proxy did, for the report.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub relayed: AtomicU64,
    pub dropped: AtomicU64,
    pub refused_flows: AtomicU64,
}

/// A running proxy; its tasks stop on `shutdown` or when it is dropped.
#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    pub stats: Arc<ProxyStats>,
    _tasks: JoinSet<()>,
}

struct Shared {
    node: usize,
    upstream: SocketAddr,
    front: Arc<UdpSocket>,
    faults: Arc<FaultTable>,
    directory: Arc<Directory>,
    stats: Arc<ProxyStats>,
}

impl Proxy {
    /// Binds a front socket on loopback and relays to `upstream`, the node's real listen
    /// address.
    pub async fn start(
        node: usize,
        upstream: SocketAddr,
        faults: Arc<FaultTable>,
        directory: Arc<Directory>,
        seed: u64,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Proxy> {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
        let addr = front.local_addr()?;
        directory.add_proxy_port(addr.port());
        let stats = Arc::new(ProxyStats::default());
        let shared = Arc::new(Shared {
            node,
            upstream,
            front,
            faults,
            directory,
            stats: stats.clone(),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(run_front(shared, seed, shutdown));
        Ok(Proxy {
            addr,
            stats,
            _tasks: tasks,
        })
    }
}

/// Receives on the front socket until shutdown and relays each datagram through its flow.
async fn run_front(shared: Arc<Shared>, seed: u64, mut shutdown: watch::Receiver<bool>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut flows: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut flow_tasks = JoinSet::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (len, source) = tokio::select! {
            _ = shutdown.wait_for(|&stop| stop) => return,
            received = shared.front.recv_from(&mut buf) => match received {
                Ok(r) => r,
                // An ICMP error from an earlier send: nothing to relay, keep going.
                Err(_) => continue,
            },
        };
        let flow = match flows.get(&source) {
            Some(flow) => flow.clone(),
            None => {
                if flows.len() >= MAX_FLOWS {
                    shared.stats.refused_flows.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Ok(flow) = open_flow(&shared).await else {
                    continue;
                };
                flows.insert(source, flow.clone());
                flow_tasks.spawn(run_back(
                    shared.clone(),
                    flow.clone(),
                    source,
                    rng.random_seed(),
                    shutdown.clone(),
                ));
                flow
            }
        };
        let from = shared.directory.endpoint(source);
        let fate = shared
            .faults
            .fate(from, Endpoint::Node(shared.node), &mut rng);
        send_with_fate(&shared.stats, fate, &buf[..len], move |data| {
            let flow = flow.clone();
            async move {
                let _ = flow.send(&data).await;
            }
        })
        .await;
    }
}

/// Relays the node's answers on one flow back to its source, through the fault table.
async fn run_back(
    shared: Arc<Shared>,
    flow: Arc<UdpSocket>,
    source: SocketAddr,
    seed: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let to = shared.directory.endpoint(source);
    loop {
        let len = tokio::select! {
            _ = shutdown.wait_for(|&stop| stop) => return,
            received = flow.recv(&mut buf) => match received {
                Ok(len) => len,
                // The node is down (ICMP port unreachable): keep the flow for its restart.
                Err(_) => continue,
            },
        };
        // A gateway registered after its first packets is known by now: look again each time.
        let to = match to {
            Endpoint::Other => shared.directory.endpoint(source),
            known => known,
        };
        let fate = shared
            .faults
            .fate(Endpoint::Node(shared.node), to, &mut rng);
        let front = shared.front.clone();
        send_with_fate(&shared.stats, fate, &buf[..len], move |data| {
            let front = front.clone();
            async move {
                let _ = front.send_to(&data, source).await;
            }
        })
        .await;
    }
}

async fn open_flow(shared: &Shared) -> anyhow::Result<Arc<UdpSocket>> {
    let flow = UdpSocket::bind("127.0.0.1:0").await?;
    shared.directory.add_proxy_port(flow.local_addr()?.port());
    flow.connect(shared.upstream).await?;
    Ok(Arc::new(flow))
}

/// Sends `data` once per delay in `fate`: at once when the delay is zero, else from a task
/// that sleeps first (so one slow packet never holds the others back).
async fn send_with_fate<F, Fut>(stats: &ProxyStats, fate: Vec<Duration>, data: &[u8], send: F)
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if fate.is_empty() {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    stats.relayed.fetch_add(1, Ordering::Relaxed);
    for delay in fate {
        let sending = send(data.to_vec());
        if delay.is_zero() {
            sending.await;
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                sending.await;
            });
        }
    }
}

trait SeedSource {
    fn random_seed(&mut self) -> u64;
}

impl SeedSource for SmallRng {
    fn random_seed(&mut self) -> u64 {
        rand::Rng::random(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Side;

    /// Waits (bounded) until `counter` passes `above`: the proxy's own account of what it did.
    async fn counted(counter: &AtomicU64, above: u64) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while counter.load(Ordering::Relaxed) <= above {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the proxy never counted the datagram");
    }

    #[tokio::test]
    async fn datagrams_are_relayed_both_ways_and_a_partition_drops_them() {
        let node = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let faults = Arc::new(FaultTable::default());
        let directory = Arc::new(Directory::default());
        let (_stop, shutdown) = watch::channel(false);
        let proxy = Proxy::start(
            0,
            node.local_addr().unwrap(),
            faults.clone(),
            directory.clone(),
            1,
            shutdown,
        )
        .await
        .unwrap();
        let gateway = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        directory.register(gateway.local_addr().unwrap().port(), Endpoint::Gateway(0));
        let mut buf = [0u8; 64];

        gateway.send_to(b"check", proxy.addr).await.unwrap();
        let (len, from) = node.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..len], b"check");
        assert!(
            directory.is_proxy_port(from.port()),
            "the node sees the proxy's flow"
        );
        node.send_to(b"answer", from).await.unwrap();
        let (len, back) = gateway.recv_from(&mut buf).await.unwrap();
        assert_eq!((&buf[..len], back), (&b"answer"[..], proxy.addr));

        faults.partition(Side::Gateways(vec![0]), Side::Nodes(vec![0]));
        let dropped = proxy.stats.dropped.load(Ordering::Relaxed);
        gateway.send_to(b"cut", proxy.addr).await.unwrap();
        counted(&proxy.stats.dropped, dropped).await;
        faults.clear();
        gateway.send_to(b"healed", proxy.addr).await.unwrap();
        let (len, _) = node.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..len], b"healed", "the cut datagram never arrived");
    }
}
