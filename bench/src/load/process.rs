//! The server processes under test: a floodgate node and redis-server, started on free loopback
//! ports, read from /proc for CPU time and resident memory, and stopped at the end.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A child server process, killed when dropped, with the processes that serve beside it (the
/// other nodes of a cluster, a peer's Redis): its CPU and memory are theirs summed.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    child: Child,
    companions: Vec<Server>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// A server process started on `addr`, alone.
    pub fn new(addr: SocketAddr, child: Child) -> Self {
        Server {
            addr,
            child,
            companions: Vec::new(),
        }
    }

    /// This server measured together with `others`, which stop with it.
    pub fn with(mut self, others: Vec<Server>) -> Self {
        self.companions.extend(others);
        self
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process (not its companions) has exited, and how.
    pub fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// User + system CPU seconds used so far, companions included.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let mut seconds = self.own_cpu_seconds()?;
        for other in &self.companions {
            seconds += other.cpu_seconds()?;
        }
        Ok(seconds)
    }

    /// User + system CPU seconds this process alone used so far (its companions left out).
    pub fn own_cpu_seconds(&self) -> anyhow::Result<f64> {
        cpu_seconds_of(&format!("/proc/{}/stat", self.pid()))
    }

    /// True when other processes serve beside this one.
    pub fn has_companions(&self) -> bool {
        !self.companions.is_empty()
    }

    /// Resident memory in bytes, companions included.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let mut bytes = self.own_rss_bytes()?;
        for other in &self.companions {
            bytes += other.rss_bytes()?;
        }
        Ok(bytes)
    }

    fn own_rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .context("no VmRSS")?;
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .context("bad VmRSS")?
            .parse()?;
        Ok(kib * 1024)
    }
}

/// User + system CPU seconds this process (the load generator and the clients under test)
/// used so far.
pub fn own_cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/self/stat").unwrap_or(0.0)
}

/// User + system CPU seconds of the process whose `stat` file is `path`.
fn cpu_seconds_of(path: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(path)?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, so 11 and 12 counted from field 3.
    Ok((ticks(11) + ticks(12)) / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    // Linux reports CPU time in USER_HZ ticks, 100 on every mainstream architecture.
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

pub fn free_port(udp: bool) -> anyhow::Result<u16> {
    // Bind port 0, read the port, release it: another process could take it in between, which
    // the start-up check below would then report.
    Ok(if udp {
        UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port()
    } else {
        std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
    })
}

/// A loopback port free for both TCP and UDP at the time of the call (member-list gossip binds
/// both on one port): a port free for TCP may be held by a UDP socket, a QUIC endpoint say.
pub fn free_port_both() -> anyhow::Result<u16> {
    for _ in 0..64 {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = tcp.local_addr()?.port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no loopback port free for both TCP and UDP in 64 tries")
}

/// The `floodgate-node` binary beside this one (both are built into the same target folder).
pub fn default_node_binary() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    me.with_file_name("floodgate-node")
}

/// A free loopback TCP address for the node's RLS listener (the node logs the address it
/// binds only at info level, so the harness picks the port).
pub fn free_tcp_addr() -> anyhow::Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], free_port(false)?)))
}

/// Starts a node with development certificates in `data_dir`; returns once it serves. With
/// `rls` (configuration file, listen address) it also serves Envoy's rate limit service there.
pub fn start_node(
    binary: &Path,
    data_dir: &Path,
    worker_threads: Option<usize>,
    rls: Option<(&Path, SocketAddr)>,
) -> anyhow::Result<Server> {
    start_node_with(binary, data_dir, worker_threads, rls, &[])
}

/// [`start_node`] with more flags (`--seeds`, `--region`: a node of a cluster).
pub fn start_node_with(
    binary: &Path,
    data_dir: &Path,
    worker_threads: Option<usize>,
    rls: Option<(&Path, SocketAddr)>,
    flags: &[String],
) -> anyhow::Result<Server> {
    let port = free_port(true)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut command = Command::new(binary);
    command.args(flags);
    if let Some((config, listen)) = rls {
        command
            .arg("--rls-config")
            .arg(config)
            .args(["--rls-listen", &listen.to_string()]);
    }
    let mut child = command
        .args([
            "--listen",
            &addr.to_string(),
            "--admin",
            "off",
            "--max-keys",
            "8388608",
        ])
        .args(
            worker_threads
                .map(|n| vec!["--worker-threads".to_owned(), n.to_string()])
                .unwrap_or_default(),
        )
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (build it with `cargo build --release -p floodgate-node`)",
                binary.display()
            )
        })?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    // The node prints "serving on" once it accepts connections, or exits with an error (EOF).
    for line in lines.by_ref() {
        let line = line?;
        if line.contains("serving on") {
            // Keep draining its stderr so the node never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return Ok(Server::new(addr, child));
        }
    }
    let status = child.wait()?;
    bail!("floodgate-node exited during start-up ({status})");
}

/// Where `bench/redis-cell.sh` puts the redis-cell module: `target/redis-cell/`, beside the
/// `target/release/` folder holding this binary.
pub fn default_redis_cell_module() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    let target = me
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("target"));
    target.join("redis-cell").join("libredis_cell.so")
}

/// Starts redis-server on a free loopback port (with `module` loaded, if given); returns once
/// it answers there. A port found free can be taken before the server binds it (by a test
/// running beside this one, say): the server then exits while the other answers at the address,
/// and calls made there fail once that one stops. So the start-up check asks whoever answers for
/// its process id, and a server that could not bind is started again on another port.
pub fn start_redis(module: Option<&Path>) -> anyhow::Result<Server> {
    if let Some(module) = module {
        anyhow::ensure!(
            module.is_file(),
            "{} is missing: build it with `bash bench/redis-cell.sh` (`make bench-load` does)",
            module.display()
        );
    }
    const ATTEMPTS: usize = 3;
    for _ in 0..ATTEMPTS {
        if let Some(server) = start_redis_on_a_free_port(module)? {
            return Ok(server);
        }
    }
    bail!("redis-server found its port taken {ATTEMPTS} times in a row")
}

/// One try of [`start_redis`]: the server, or `None` when another process took its port.
fn start_redis_on_a_free_port(module: Option<&Path>) -> anyhow::Result<Option<Server>> {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port(false)?));
    start_redis_at(addr, module)
}

/// Starts redis-server at `addr`: the server once it answers there, or `None` when another
/// process holds the address.
fn start_redis_at(addr: SocketAddr, module: Option<&Path>) -> anyhow::Result<Option<Server>> {
    let port = addr.port();
    let mut command = Command::new("redis-server");
    if let Some(module) = module {
        command.arg("--loadmodule").arg(module);
    }
    let child = command
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--daemonize", "no", "--loglevel", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("redis-server is not on PATH: install it with `apt-get install redis-server`")?;
    let pid = child.id();
    let mut server = Server::new(addr, child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answering = redis_process_id(addr);
        if answering == Some(pid) {
            return Ok(Some(server));
        }
        if let Some(status) = server.child.try_wait()? {
            if answering.is_some() {
                return Ok(None);
            }
            bail!(
                "redis-server exited during start-up ({status}){}",
                module.map_or(String::new(), |m| format!(
                    "; could it load the module {}?",
                    m.display()
                ))
            );
        }
        if Instant::now() > deadline {
            bail!("redis-server did not answer on {addr} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process id of the Redis answering at `addr` (`INFO server`), if one does.
fn redis_process_id(addr: SocketAddr) -> Option<u32> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    // The section is a few KiB; its process id is near the top.
    while text.len() < 64 * 1024 {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
        // Whole lines only: a read may end inside the number.
        let whole = &text[..text.iter().rposition(|b| *b == b'\n').unwrap_or(0)];
        let found = String::from_utf8_lossy(whole)
            .lines()
            .find_map(|line| line.strip_prefix("process_id:")?.trim().parse().ok());
        if found.is_some() {
            return found;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken by another Redis between the pick and the start is not mistaken for ours:
    /// the start reports it taken (it was taken as its own, and calls failed once the other
    /// stopped). Skipped without redis-server.
    #[test]
    fn a_port_another_redis_holds_is_reported_taken() {
        let other = match start_redis(None) {
            Ok(server) => server,
            Err(e) => {
                eprintln!("skipped: {e:#}");
                return;
            }
        };
        let started = start_redis_at(other.addr, None).unwrap();
        assert!(started.is_none(), "took the other Redis for its own");
        assert_eq!(redis_process_id(other.addr), Some(other.child.id()));
    }
}
