//! The `floodgate-node` processes of one run: started on loopback behind their proxies, killed,
//! paused, resumed, stopped and restarted by the timeline, and always killed when dropped.

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// How one node is started.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub index: usize,
    pub region: usize,
    /// The node's real QUIC socket (only its proxy sends here).
    pub listen: SocketAddr,
    /// Its proxy's address: what it advertises, and what everyone dials.
    pub advertise: SocketAddr,
    pub admin: SocketAddr,
    pub extra_args: Vec<String>,
}

/// Everything nodes of one run share.
#[derive(Debug, Clone)]
pub struct NodeSetup {
    pub binary: PathBuf,
    /// Development certificates (`--data-dir`), shared by all nodes.
    pub certs: PathBuf,
    pub logs: PathBuf,
    pub seeds: Vec<SocketAddr>,
    pub max_keys: usize,
    pub rules: Option<PathBuf>,
}

/// A running (or stopped) node process. `kill_on_drop`: nothing outlives the harness.
#[derive(Debug)]
pub struct NodeProcess {
    pub spec: NodeSpec,
    child: Option<Child>,
    pub starts: usize,
}

/// Longest a node may take to say it serves, and then to be ready (joined).
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a graceful stop may take before the node is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl NodeProcess {
    pub fn new(spec: NodeSpec) -> Self {
        NodeProcess {
            spec,
            child: None,
            starts: 0,
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    pub fn log_path(&self, setup: &NodeSetup) -> PathBuf {
        setup.logs.join(format!("node-{}.log", self.spec.index))
    }

    /// Starts the node and returns once it serves (and, when `wait_ready`, once `/readyz` says
    /// it joined the cluster).
    pub async fn start(&mut self, setup: &NodeSetup, wait_ready: bool) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.child.is_none(),
            "node {} already runs",
            self.spec.index
        );
        let spec = &self.spec;
        let mut command = Command::new(&setup.binary);
        command
            .arg("--listen")
            .arg(spec.listen.to_string())
            .arg("--advertise")
            .arg(spec.advertise.to_string())
            .arg("--admin")
            .arg(spec.admin.to_string())
            .arg("--data-dir")
            .arg(&setup.certs)
            .arg("--region")
            .arg(format!("r{}", spec.region))
            .arg("--max-keys")
            .arg(setup.max_keys.to_string())
            .arg("--worker-threads")
            .arg("2");
        let seeds: Vec<String> = setup
            .seeds
            .iter()
            .filter(|s| **s != spec.advertise)
            .map(ToString::to_string)
            .collect();
        if !seeds.is_empty() {
            command.arg("--seeds").arg(seeds.join(","));
        }
        if let Some(rules) = &setup.rules {
            command.arg("--rules").arg(rules);
        }
        command.args(&spec.extra_args);
        let mut child = command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", setup.binary.display()))?;
        self.starts += 1;
        let stderr = child.stderr.take().context("no stderr")?;
        let log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(setup))
            .await?;
        let (serving_tx, serving_rx) = oneshot::channel();
        tokio::spawn(copy_log(stderr, log, self.starts, "serving on", serving_tx));
        self.child = Some(child);
        let serving = tokio::time::timeout(START_TIMEOUT, serving_rx).await;
        if !matches!(serving, Ok(Ok(()))) {
            self.kill().await;
            bail!(
                "node {} did not start serving within {START_TIMEOUT:?}: see {}",
                self.spec.index,
                self.log_path(setup).display()
            );
        }
        if wait_ready {
            wait_ready_on(self.spec.admin, START_TIMEOUT)
                .await
                .with_context(|| format!("node {} never became ready", self.spec.index))?;
        }
        Ok(())
    }

    /// SIGKILL: no leave, no hand-off, no snapshot.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// SIGTERM, then wait (bounded) for the graceful leave; killed if it takes too long.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = signal(pid, "TERM").await;
        }
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// SIGSTOP (`pause: true`) or SIGCONT.
    pub async fn pause(&self, pause: bool) -> anyhow::Result<()> {
        let pid = self.pid().context("node not running")?;
        signal(pid, if pause { "STOP" } else { "CONT" }).await
    }

    /// Resident memory in bytes, from `/proc`.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

/// Sends a signal through `kill(1)` (the workspace forbids `unsafe`, so no libc call).
pub(crate) async fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .await
        .context("running kill(1)")?;
    anyhow::ensure!(status.success(), "kill -{name} {pid} failed");
    Ok(())
}

/// Copies a process's stderr into its log file (prefixing each start), and reports the first
/// line holding `marker` (the one that says it serves).
pub(crate) async fn copy_log(
    stderr: tokio::process::ChildStderr,
    mut log: tokio::fs::File,
    start: usize,
    marker: &'static str,
    serving: oneshot::Sender<()>,
) {
    let mut serving = Some(serving);
    let mut lines = BufReader::new(stderr).lines();
    let _ = log
        .write_all(format!("=== chaos: start {start} ===\n").as_bytes())
        .await;
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains(marker)
            && let Some(tx) = serving.take()
        {
            let _ = tx.send(());
        }
        let _ = log.write_all(line.as_bytes()).await;
        let _ = log.write_all(b"\n").await;
    }
    let _ = log.flush().await;
}

/// Polls `/readyz` until it answers 200 (bounded by `timeout`).
pub async fn wait_ready_on(admin: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let status = tokio::task::spawn_blocking(move || http_status(admin, "/readyz")).await;
        if let Ok(Ok(Some(200))) = status {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("/readyz on {admin} not 200 within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A blocking HTTP/1.0 GET on loopback: status code, or `None` when the answer has none.
fn http_status(addr: SocketAddr, path: &str) -> std::io::Result<Option<u16>> {
    let body = http_get(addr, path)?;
    Ok(body
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok()))
}

/// A blocking HTTP/1.0 GET on loopback, the whole answer as text (bounded by a short timeout).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: chaos\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    stream.take(4 << 20).read_to_string(&mut text)?;
    Ok(text)
}

/// A metric's value from a node's `/metrics` (the first sample whose name matches).
pub async fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let text = tokio::task::spawn_blocking(move || http_get(admin, "/metrics"))
        .await
        .ok()?
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// The sum of a metric's samples on a node's `/metrics` whose labels hold every one of
/// `labels` (e.g. `region="r1"`); `None` when the page cannot be read or no sample matches.
pub async fn metric_sum(admin: SocketAddr, name: &str, labels: &[&str]) -> Option<f64> {
    sum_samples(&metrics_page(admin).await?, name, labels)
}

/// A node's `/metrics` page, or `None` when it cannot be read.
pub async fn metrics_page(admin: SocketAddr) -> Option<String> {
    tokio::task::spawn_blocking(move || http_get(admin, "/metrics"))
        .await
        .ok()?
        .ok()
}

/// As [`metric_sum`], on a page already read.
pub fn sum_samples(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if !labels.iter().all(|l| rest.contains(l)) {
            continue;
        }
        if let Some(value) = line
            .split_whitespace()
            .last()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

/// A loopback port free right now (bound, read, released: another process could take it in
/// between, which the node's start would then report).
pub fn free_udp_addr() -> anyhow::Result<SocketAddr> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

pub fn free_tcp_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The node binary: `--node-bin`, else `floodgate-node` beside this binary, else built with cargo.
pub fn node_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        anyhow::ensure!(path.exists(), "--node-bin {}: no such file", path.display());
        return Ok(path.to_path_buf());
    }
    let me = std::env::current_exe()?;
    let beside = me.with_file_name("floodgate-node");
    if beside.exists() {
        return Ok(beside);
    }
    // Tests run from target/<profile>/deps: the binaries sit one level up.
    if let Some(up) = me.parent().and_then(Path::parent) {
        let candidate = up.join("floodgate-node");
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    eprintln!("floodgate-chaos: building floodgate-node (cargo build --release -p floodgate-node)");
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(["build", "--release", "-p", "floodgate-node"])
        .status()
        .context("running cargo to build floodgate-node; or give --node-bin PATH")?;
    anyhow::ensure!(status.success(), "cargo build -p floodgate-node failed");
    let built = PathBuf::from("target/release/floodgate-node");
    anyhow::ensure!(
        built.exists(),
        "built floodgate-node not found at {}; give --node-bin PATH",
        built.display()
    );
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_summed_by_name_and_labels() {
        let page = "# TYPE x counter\n\
            floodgate_region_frames_sent_total{region=\"r1\",kind=\"deltas\"} 5000\n\
            floodgate_region_frames_sent_total{region=\"r1\",kind=\"ack\"} 70\n\
            floodgate_region_frames_sent_total_other{region=\"r1\",kind=\"deltas\"} 9\n\
            floodgate_region_refused_messages 3\n";
        let sent = "floodgate_region_frames_sent_total";
        assert_eq!(
            sum_samples(page, sent, &["region=\"r1\"", "kind=\"deltas\""]),
            Some(5000.0)
        );
        assert_eq!(sum_samples(page, sent, &[]), Some(5070.0));
        assert_eq!(
            sum_samples(page, "floodgate_region_refused_messages", &[]),
            Some(3.0)
        );
        assert_eq!(sum_samples(page, sent, &["region=\"r9\""]), None);
    }
}
