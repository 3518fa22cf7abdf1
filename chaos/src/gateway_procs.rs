//! Example-gateway processes (`client/examples/gateway`, of whichever build) that the load
//! drives over HTTP, as an operator's gateways: started against the nodes' proxies, stopped with
//! SIGTERM, and replaced in place by another build's (`rolling-upgrade`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};
use tokio::sync::{RwLock, RwLockWriteGuard, oneshot};

use crate::http::{self, Connection, HttpError, Outcome};

/// Which build a gateway or node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Build {
    /// The build being upgraded from (`--old-*-bin`).
    Old,
    /// This tree's build.
    New,
}

/// Everything every gateway process of a run is started with.
#[derive(Debug, Clone)]
pub struct GatewayLaunch {
    /// The nodes' proxies.
    pub seeds: Vec<SocketAddr>,
    pub ca: PathBuf,
    /// The gateway's limiter timeout (`--timeout`).
    pub timeout: Duration,
    pub logs: PathBuf,
}

/// Longest a gateway may take to say it serves, and then to answer a check.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a graceful stop may take before the gateway is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The user of readiness probes: a key of its own, which the checker does not hold.
const PROBE_USER: &str = "chaos-probe";

/// One gateway process. `kill_on_drop`: nothing outlives the harness.
#[derive(Debug)]
pub struct GatewayProcess {
    /// Its index among the run's gateways (in records and the report).
    pub index: usize,
    pub build: Build,
    pub binary: PathBuf,
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    child: Option<Child>,
}

impl GatewayProcess {
    /// Starts the gateway with only the flags every build of the example has (`--listen
    /// --upstream --seeds --ca --timeout`), and returns once it answers a check (200 or 429).
    pub async fn start(
        launch: &GatewayLaunch,
        binary: &Path,
        build: Build,
        index: usize,
        listen: SocketAddr,
        upstream: SocketAddr,
    ) -> anyhow::Result<GatewayProcess> {
        let seeds: Vec<String> = launch.seeds.iter().map(ToString::to_string).collect();
        let mut child = Command::new(binary)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--upstream")
            .arg(upstream.to_string())
            .arg("--seeds")
            .arg(seeds.join(","))
            .arg("--ca")
            .arg(&launch.ca)
            .arg("--timeout")
            .arg(format!("{}ms", launch.timeout.as_millis()))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let log_path = launch.logs.join(format!("gateway-{index}.log"));
        let stderr = child.stderr.take().context("no stderr")?;
        let log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .await?;
        let (serving_tx, serving_rx) = oneshot::channel();
        tokio::spawn(crate::procs::copy_log(
            stderr,
            log,
            1,
            "gateway: http://",
            serving_tx,
        ));
        let mut process = GatewayProcess {
            index,
            build,
            binary: binary.to_path_buf(),
            listen,
            upstream,
            child: Some(child),
        };
        let serving = tokio::time::timeout(START_TIMEOUT, serving_rx).await;
        if !matches!(serving, Ok(Ok(()))) {
            process.kill().await;
            bail!(
                "gateway {index} did not start serving within {START_TIMEOUT:?}: see {}",
                log_path.display()
            );
        }
        if let Err(e) = probe(listen, START_TIMEOUT).await {
            process.kill().await;
            return Err(e.context(format!(
                "gateway {index} serves but answers no check: see {}",
                log_path.display()
            )));
        }
        Ok(process)
    }

    /// SIGTERM, then wait (bounded) for its graceful stop; killed if it takes too long.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = crate::procs::signal(pid, "TERM").await;
        }
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// Asks the gateway at `addr` for a check until it answers 200 or 429 (a node decided), bounded
/// by `timeout`. A 503 right after a start means its links are not up yet.
pub async fn probe(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let request = http::get_request(crate::rules::PATH, PROBE_USER);
    loop {
        let asked = tokio::time::timeout(http::REQUEST_TIMEOUT, async {
            Connection::connect(addr).await?.exchange(&request).await
        })
        .await;
        let last = match asked {
            Ok(Ok(r)) if matches!(http::outcome(r.status), Outcome::Admitted | Outcome::Denied) => {
                return Ok(());
            }
            Ok(Ok(r)) => format!("status {}", r.status),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        if Instant::now() >= deadline {
            bail!("{addr} answered no check within {timeout:?} (last: {last})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where one place of the load sends its HTTP checks: whichever gateway process serves it now.
/// Replacing the process closes the place first (its requests in flight end, no new one is
/// sent), as an operator drains a gateway from its load balancer before stopping it.
#[derive(Debug)]
pub struct HttpSlot {
    pub slot: usize,
    pub region: usize,
    target: RwLock<Option<Target>>,
}

#[derive(Debug)]
struct Target {
    index: u16,
    addr: SocketAddr,
    /// Keep-alive connections between requests.
    idle: parking_lot::Mutex<Vec<Connection>>,
}

/// Most idle connections kept per gateway.
const MAX_IDLE: usize = 32;

impl Target {
    fn new(index: usize, addr: SocketAddr) -> Self {
        Target {
            index: index as u16,
            addr,
            idle: parking_lot::Mutex::new(Vec::new()),
        }
    }

    async fn exchange(&self, request: &[u8]) -> Result<http::Response, HttpError> {
        let pooled = self.idle.lock().pop();
        if let Some(mut connection) = pooled {
            match connection.exchange(request).await {
                Ok(response) => {
                    self.keep(connection, response);
                    return Ok(response);
                }
                // Closed by the gateway while idle: the GET goes again on a new connection.
                Err(HttpError::Closed) => {}
                Err(e) => return Err(e),
            }
        }
        let mut connection = Connection::connect(self.addr).await?;
        let response = connection.exchange(request).await?;
        self.keep(connection, response);
        Ok(response)
    }

    fn keep(&self, connection: Connection, response: http::Response) {
        let mut idle = self.idle.lock();
        if response.keep_alive && idle.len() < MAX_IDLE {
            idle.push(connection);
        }
    }
}

/// What one HTTP check came to: the gateway that served it, and its outcome or why there was
/// none.
pub type Asked = (u16, Result<Outcome, String>);

impl HttpSlot {
    pub fn new(slot: usize, region: usize, index: usize, addr: SocketAddr) -> Self {
        HttpSlot {
            slot,
            region,
            target: RwLock::new(Some(Target::new(index, addr))),
        }
    }

    /// One check as `user` through the gateway serving this place; `None` while it is closed
    /// for a replacement (nothing was sent).
    pub async fn ask(&self, user: &str) -> Option<Asked> {
        let guard = self.target.try_read().ok()?;
        let target = guard.as_ref()?;
        let request = http::get_request(crate::rules::PATH, user);
        let result =
            match tokio::time::timeout(http::REQUEST_TIMEOUT, target.exchange(&request)).await {
                Ok(Ok(response)) => Ok(http::outcome(response.status)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {:?}", http::REQUEST_TIMEOUT)),
            };
        Some((target.index, result))
    }

    /// Closes the place: waits (bounded) for its requests in flight, drops its connections, and
    /// holds it closed until [`ClosedSlot::install`] or the guard's drop.
    pub async fn close(&self) -> anyhow::Result<ClosedSlot<'_>> {
        // Requests in flight end within their own timeout.
        let mut guard = tokio::time::timeout(http::REQUEST_TIMEOUT * 2, self.target.write())
            .await
            .context("requests through the gateway did not end")?;
        *guard = None;
        Ok(ClosedSlot(guard))
    }
}

/// A place closed for a replacement.
#[derive(Debug)]
pub struct ClosedSlot<'a>(RwLockWriteGuard<'a, Option<Target>>);

impl ClosedSlot<'_> {
    /// Sends the place's checks to gateway `index` at `addr` from now on.
    pub fn install(mut self, index: usize, addr: SocketAddr) {
        *self.0 = Some(Target::new(index, addr));
    }
}

/// A gateway process with the place it serves.
#[derive(Debug)]
pub struct HttpGateway {
    pub slot: std::sync::Arc<HttpSlot>,
    pub process: GatewayProcess,
}

/// What `rolling-upgrade` needs beside the world: this build's gateway to upgrade to, the
/// gateway processes and every gateway process it started (for the report).
#[derive(Debug)]
pub struct Upgrade {
    pub new_gateway_bin: PathBuf,
    pub launch: GatewayLaunch,
    pub gateways: Vec<HttpGateway>,
    /// (index, build, binary) of every gateway process started, in order.
    pub started: Vec<(usize, Build, PathBuf)>,
}

/// The example gateway of this build: `given`, else `examples/gateway` beside this binary
/// (`cargo build --release -p floodgate-client --example gateway --features tower,logging`
/// puts it there).
pub fn gateway_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        anyhow::ensure!(
            path.exists(),
            "--gateway-bin {}: no such file",
            path.display()
        );
        return Ok(path.to_path_buf());
    }
    let me = std::env::current_exe()?;
    let beside = me.with_file_name("examples").join("gateway");
    anyhow::ensure!(
        beside.exists(),
        "this build's example gateway is not at {}: build it with `cargo build --release -p floodgate-client --example gateway --features tower,logging`, or give --gateway-bin PATH",
        beside.display()
    );
    Ok(beside)
}
