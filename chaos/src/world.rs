//! One scenario's world: the node processes, their proxies, the fault table, the gateways and
//! the clock of the run. The timeline acts on it; dropping it kills every node.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::watch;

use crate::checker::FaultSpan;
use crate::faults::{Endpoint, FaultTable};
use crate::gateway_procs::{Build, GatewayProcess, Upgrade};
use crate::keys::KeySpec;
use crate::load::Gateway;
use crate::procs::{NodeProcess, NodeSetup, NodeSpec, free_tcp_addr, free_udp_addr};
use crate::proxy::{Directory, Proxy};

/// The shape of the cluster a run starts.
#[derive(Debug, Clone)]
pub struct Layout {
    pub regions: usize,
    pub nodes_per_region: usize,
    /// Nodes laid out (with their proxies) but not started: they join later (churn).
    pub spares: usize,
    pub gateways_per_region: usize,
}

impl Layout {
    pub fn initial_nodes(&self) -> usize {
        self.regions * self.nodes_per_region
    }
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[derive(Debug)]
pub struct World {
    pub layout: Layout,
    pub setup: NodeSetup,
    pub nodes: Vec<NodeProcess>,
    pub proxies: Vec<Proxy>,
    pub faults: Arc<FaultTable>,
    pub directory: Arc<Directory>,
    pub gateways: Vec<Gateway>,
    pub origin: Instant,
    /// Unix time (ns) at `origin`, as the nodes' clocks read it.
    pub origin_unix_ns: u64,
    /// Seeds what the timeline draws (stall lengths and gaps).
    pub seed: u64,
    pub spans: Vec<FaultSpan>,
    /// Everything the timeline did, with its time, for the report.
    pub events: Vec<(u64, String)>,
    pub health: Arc<crate::load::NodeHealth>,
    /// Gateways whose client runs on a runtime of its own, so the timeline can kill them.
    pub gateway_runtimes: Vec<(usize, GatewayRuntime)>,
    /// `rolling-upgrade`: the gateway builds to upgrade to and the gateway processes.
    pub upgrade: Option<Upgrade>,
    /// The upgrade scenarios: the node build the timeline moves every node to.
    pub upgrade_to: Option<PathBuf>,
    /// Each node's or gateway's restart (stop to ready, and the wait after), where a check may
    /// go undecided; outside them none may (`rolling-upgrade`).
    pub restart_windows: Vec<FaultSpan>,
    /// What the timeline measured on the way, for the report's `extra`.
    pub findings: serde_json::Map<String, serde_json::Value>,
    shutdown: watch::Sender<bool>,
}

/// A gateway's own tokio runtime. Killing it (or dropping it) stops every task of the
/// gateway's client at once, as a crash would: nothing it holds is handed back.
#[derive(Debug)]
pub struct GatewayRuntime(Option<tokio::runtime::Runtime>);

impl GatewayRuntime {
    pub fn new() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("starting a gateway's runtime")?;
        Ok(GatewayRuntime(Some(runtime)))
    }

    pub fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.0.as_ref().map(|r| r.handle().clone())
    }

    fn kill(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Never waits, so it is safe inside the harness's own runtime.
            runtime.shutdown_background();
        }
    }
}

impl Drop for GatewayRuntime {
    fn drop(&mut self) {
        self.kill();
    }
}

impl World {
    /// Lays out every node (initial and spare) with a proxy in front, and starts the initial
    /// ones: the first alone, the rest joining through every proxy address (`setup.seeds` is
    /// filled here).
    pub async fn start(
        layout: Layout,
        mut setup: NodeSetup,
        extra_args: impl Fn(usize) -> Vec<String>,
        seed: u64,
    ) -> anyhow::Result<World> {
        std::fs::create_dir_all(&setup.logs)?;
        let faults = Arc::new(FaultTable::default());
        let directory = Arc::new(Directory::default());
        let (shutdown, watcher) = watch::channel(false);
        let total = layout.initial_nodes() + layout.spares;
        let mut specs = Vec::with_capacity(total);
        let mut proxies = Vec::with_capacity(total);
        for index in 0..total {
            let listen = free_udp_addr()?;
            directory.register(listen.port(), Endpoint::Node(index));
            let proxy = Proxy::start(
                index,
                listen,
                faults.clone(),
                directory.clone(),
                seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                watcher.clone(),
            )
            .await?;
            specs.push(NodeSpec {
                index,
                region: (index % (layout.initial_nodes())) / layout.nodes_per_region,
                listen,
                advertise: proxy.addr,
                admin: free_tcp_addr()?,
                extra_args: extra_args(index),
            });
            proxies.push(proxy);
        }
        setup.seeds = specs.iter().map(|s| s.advertise).collect();
        let health = Arc::new(crate::load::NodeHealth::new(
            setup.seeds.clone(),
            faults.clone(),
        ));
        let mut world = World {
            health,
            layout,
            setup,
            nodes: specs.into_iter().map(NodeProcess::new).collect(),
            proxies,
            faults,
            directory,
            gateways: Vec::new(),
            origin: Instant::now(),
            origin_unix_ns: unix_now_ns(),
            seed,
            spans: Vec::new(),
            events: Vec::new(),
            gateway_runtimes: Vec::new(),
            upgrade: None,
            upgrade_to: None,
            restart_windows: Vec::new(),
            findings: serde_json::Map::new(),
            shutdown,
        };
        for index in 0..world.layout.initial_nodes() {
            world.nodes[index].start(&world.setup, index > 0).await?;
        }
        for spare in world.layout.initial_nodes()..total {
            world.health.set_down(spare, true);
        }
        Ok(world)
    }

    /// Proxy addresses of every node, started or spare: every gateway's seeds.
    pub fn seeds(&self) -> Vec<SocketAddr> {
        self.setup.seeds.clone()
    }

    /// Starts the run's clock now.
    pub fn set_origin(&mut self) {
        self.origin = Instant::now();
        self.origin_unix_ns = unix_now_ns();
    }

    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Sleeps until `at` after the origin.
    pub async fn until(&self, at: Duration) {
        tokio::time::sleep_until((self.origin + at).into()).await;
    }

    pub fn note(&mut self, what: impl Into<String>) {
        let at = self.now_ns();
        self.events.push((at, what.into()));
    }

    /// Opens a fault span; returns its index for [`World::end_span`].
    pub fn begin_span(&mut self, label: impl Into<String>) -> usize {
        let label = label.into();
        self.note(format!("fault begins: {label}"));
        let now = self.now_ns();
        self.spans.push(FaultSpan {
            label,
            start_ns: now,
            end_ns: u64::MAX,
        });
        self.spans.len() - 1
    }

    pub fn end_span(&mut self, index: usize) {
        let now = self.now_ns();
        if let Some(span) = self.spans.get_mut(index) {
            span.end_ns = now;
            let label = span.label.clone();
            self.note(format!("fault ends: {label}"));
        }
    }

    /// Closes spans still open at the end of the run.
    pub fn close_spans(&mut self, end_ns: u64) {
        for span in &mut self.spans {
            span.end_ns = span.end_ns.min(end_ns);
        }
    }

    /// The node that owns `key` as gateway 0's table says.
    pub fn owner_of(&self, key: &str) -> anyhow::Result<usize> {
        let gateway = self.gateways.first().context("no gateway")?;
        let addr = gateway.client.node_for(key.as_bytes());
        self.nodes
            .iter()
            .position(|n| n.spec.advertise == addr)
            .with_context(|| format!("owner {addr} of {key} is not a node of this run"))
    }

    /// The node that owns `key` in `region`, as that region's first gateway's table says (each
    /// region has its own ring).
    pub fn owner_in_region(&self, key: &str, region: usize) -> anyhow::Result<usize> {
        let gateway = self
            .gateways
            .iter()
            .find(|g| g.region == region)
            .with_context(|| format!("no gateway in region {region}"))?;
        let addr = gateway.client.node_for(key.as_bytes());
        self.nodes
            .iter()
            .position(|n| n.spec.advertise == addr)
            .with_context(|| format!("owner {addr} of {key} is not a node of this run"))
    }

    /// The node deciding the most offered checks a second of `keys` (each key's offered rate
    /// split evenly between the regions that drive it).
    pub fn busiest_owner(&self, keys: &[KeySpec]) -> anyhow::Result<usize> {
        let mut load = vec![0f64; self.nodes.len()];
        for key in keys {
            let regions: Vec<usize> = match key.region {
                Some(region) => vec![region],
                None => (0..self.layout.regions).collect(),
            };
            for &region in &regions {
                let owner = self.owner_in_region(&key.name, region)?;
                load[owner] += key.offered_per_second / regions.len() as f64;
            }
        }
        load.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(node, _)| node)
            .context("no node")
    }

    pub fn region_nodes(&self, region: usize) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|n| n.spec.region == region)
            .map(|n| n.spec.index)
            .collect()
    }

    pub fn region_gateways(&self, region: usize) -> Vec<usize> {
        self.gateways
            .iter()
            .filter(|g| g.region == region)
            .map(|g| g.index)
            .collect()
    }

    pub async fn kill(&mut self, node: usize) {
        self.note(format!("kill -9 node {node}"));
        self.health.set_down(node, true);
        self.nodes[node].kill().await;
    }

    pub async fn stop(&mut self, node: usize) {
        self.note(format!("SIGTERM node {node}"));
        self.health.set_down(node, true);
        self.nodes[node].stop().await;
        self.note(format!("node {node} stopped"));
    }

    pub async fn start_node(&mut self, node: usize) -> anyhow::Result<()> {
        self.note(format!("start node {node}"));
        let setup = self.setup.clone();
        self.nodes[node].start(&setup, true).await?;
        self.health.set_down(node, false);
        self.note(format!("node {node} ready"));
        Ok(())
    }

    /// Kills gateway `gateway` as a crash would: its load stops, then (once its checks in
    /// flight are answered) every task of its client is dropped with its runtime; its token
    /// leases are never returned.
    pub async fn kill_gateway(&mut self, gateway: usize) {
        self.note(format!("kill gateway {gateway}"));
        self.health.kill_gateway(gateway);
        // Checks in flight end within the client's timeout; killing under them would make them
        // fall back, which is not what a crashed gateway's users see.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for (index, runtime) in &mut self.gateway_runtimes {
            if *index == gateway {
                runtime.kill();
            }
        }
        self.note(format!("gateway {gateway} killed"));
    }

    pub async fn pause(&mut self, node: usize, pause: bool) -> anyhow::Result<()> {
        self.note(format!(
            "{} node {node}",
            if pause { "SIGSTOP" } else { "SIGCONT" }
        ));
        self.health.set_down(node, pause);
        self.nodes[node].pause(pause).await
    }

    /// Records a restart window from `start_ns` to now.
    pub fn restart_window(&mut self, label: impl Into<String>, start_ns: u64) {
        let end_ns = self.now_ns();
        self.restart_windows.push(FaultSpan {
            label: label.into(),
            start_ns,
            end_ns,
        });
    }

    /// Replaces the gateway process serving HTTP place `slot` with this build's: closes the
    /// place (no check sent, those in flight answered), stops the old process with SIGTERM,
    /// starts the new one on the same ports and, once it answers, sends the place's checks to
    /// it. Returns the new gateway's index.
    pub async fn replace_gateway(&mut self, slot: usize) -> anyhow::Result<usize> {
        let start_ns = self.now_ns();
        let index = self.gateways.len() + self.upgrade.as_ref().map_or(0, |u| u.started.len());
        let upgrade = self
            .upgrade
            .as_mut()
            .context("no gateway processes to replace")?;
        let gateway = upgrade
            .gateways
            .get_mut(slot)
            .with_context(|| format!("no gateway process in place {slot}"))?;
        let place = gateway.slot.clone();
        let closed = place.close().await?;
        let old = gateway.process.index;
        let (listen, upstream) = (gateway.process.listen, gateway.process.upstream);
        gateway.process.stop().await;
        let binary = upgrade.new_gateway_bin.clone();
        let process = GatewayProcess::start(
            &upgrade.launch,
            &binary,
            Build::New,
            index,
            listen,
            upstream,
        )
        .await?;
        closed.install(index, listen);
        upgrade.started.push((index, Build::New, binary));
        gateway.process = process;
        self.note(format!(
            "gateway {old} (old build) stopped; gateway {index} (new build) serves in its place on {listen}"
        ));
        self.restart_window(format!("gateway {old} replaced by {index}"), start_ns);
        Ok(index)
    }

    /// Stops the proxies and kills every node (dropping the world does the same).
    pub async fn shutdown(&mut self) {
        if let Some(upgrade) = &mut self.upgrade {
            for gateway in &mut upgrade.gateways {
                gateway.process.kill().await;
            }
        }
        let _ = self.shutdown.send(true);
        for gateway in &self.gateways {
            if !self.health.gateway_killed(gateway.index) {
                gateway.client.close().await;
            }
        }
        for (_, runtime) in &mut self.gateway_runtimes {
            runtime.kill();
        }
        for node in &mut self.nodes {
            node.kill().await;
        }
    }
}
