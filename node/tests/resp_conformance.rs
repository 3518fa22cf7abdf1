//! Conformance with redis-cell, through real clients: one sequence of `CL.THROTTLE` calls
//! replayed against redis-server with the redis-cell 0.2.2 module (built by
//! `bench/redis-cell.sh`) and against a floodgate node's Redis front, replies compared (timing
//! fields within one second), by redis-py (`resp_conformance.py`, in a throwaway virtualenv
//! `target/resp-venv`), by go-redis (`resp_conformance_go`, the same sequence over RESP3 and
//! RESP2, built with the machine's Go into `target/resp-go`), by Java's Redisson
//! (`resp_conformance_java`, the same sequence through its command executor over RESP3 and RESP2,
//! jars from Maven Central into `target/resp-java`) and by redis-cli.
//!
//! Ignored by default: it needs redis-server and redis-cli (Debian's `redis-server` and
//! `redis-tools`), Go, a JDK and Maven, and downloads the module's crate, redis-py, go-redis and
//! Redisson. `make resp-conformance` runs it; the Redisson test skips, saying why, without a JDK,
//! Maven or the jars. One test runs with every `cargo test`: redis-py against floodgate alone
//! over TLS (`--resp-tls`), as an application with `rediss://` would connect.
//! The same arithmetic is compared without any of them, on every `cargo test`, by the unit
//! tests of `node/src/resp/throttle.rs` against a port of redis-cell's code.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use floodgate_node::RespSettings;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// redis-server on a free loopback port with the module loaded; killed on drop.
struct RedisCell {
    child: Child,
    port: u16,
}

impl Drop for RedisCell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis_cell() -> RedisCell {
    let built = Command::new("bash")
        .arg(root().join("bench/redis-cell.sh"))
        .output()
        .expect("bash runs bench/redis-cell.sh");
    assert!(
        built.status.success(),
        "redis-cell could not be built: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let module = String::from_utf8(built.stdout).unwrap().trim().to_owned();
    // A port the system just gave out and took back: free unless something races for it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--loadmodule", &module])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-server is installed (apt-get install redis-server)");
    // It says when it is ready; the lines are bounded by its short start-up log.
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .take(200)
        .map_while(Result::ok)
        .any(|line| line.contains("Ready to accept connections"));
    assert!(ready, "redis-server did not start");
    RedisCell { child, port }
}

/// The virtualenv with redis-py, made once and reused.
fn python() -> PathBuf {
    let imports = |venv: &Path| {
        Command::new(venv.join("bin/python"))
            .args(["-c", "import redis"])
            .status()
            .is_ok_and(|s| s.success())
    };
    let venv = python_venv("resp-venv", &["redis==5.2.1"], imports);
    venv.unwrap_or_else(|why| panic!("{why}"))
        .join("bin/python")
}

/// redis-cli's answers (`--no-raw`: one line per array element, numbered) to `commands`.
fn redis_cli(port: u16, commands: &str) -> Vec<String> {
    let mut child = Command::new("redis-cli")
        .args(["--no-raw", "-h", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli is installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `4) (integer) 3599` and `4) (integer) 3600`: the same; other lines must be equal.
fn same_line(expected: &str, got: &str) -> bool {
    let timing = |line: &str| {
        let (position, rest) = line.split_once(") (integer) ")?;
        matches!(position.trim(), "4" | "5").then(|| rest.parse::<i64>().ok())?
    };
    match (timing(expected), timing(got)) {
        (Some(e), Some(g)) => (e == -1) == (g == -1) && (e - g).abs() <= 1,
        _ => expected == got,
    }
}

async fn floodgate() -> (TestNode, SocketAddr) {
    let node = start_node(|config| {
        config.resp = Some(RespSettings::on(([127, 0, 0, 1], 0).into()));
    })
    .await;
    let addr = node.node.resp_addr().unwrap();
    (node, addr)
}

/// Runs one client's replay (`command`, given `stdin`) to its end, within two minutes, and
/// asserts it found no difference; prints what it printed.
async fn replay(command: Command, stdin: Vec<u8>, client: &'static str) {
    let output = run_client(command, Some(stdin), Duration::from_secs(120), client).await;
    println!("{}", String::from_utf8_lossy(&output.stdout));
    // Unsuccessful when the replies differ.
    let stdout = succeeded(&output, client);
    assert!(stdout.contains("\n0 differences"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server and redis-cli, downloads redis-cell and redis-py: make resp-conformance"]
async fn redis_py_sees_the_same_replies_from_floodgate_and_redis_cell() {
    let redis = start_redis_cell();
    let (node, addr) = floodgate().await;
    let mut command = Command::new(python());
    command
        .arg(tests_dir().join("resp_conformance.py"))
        .arg(redis.port.to_string())
        .arg(addr.port().to_string());
    replay(command, Vec::new(), "redis-py").await;
    node.node.shutdown().await;
}

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The Go replay (`resp_conformance_go`, go-redis v9), built into `target/resp-go`.
fn go_client() -> PathBuf {
    common::go_build("resp_conformance_go", ".", "resp-go/resp-conformance-go")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server, Go and the Go module proxy, downloads redis-cell and redis-py: make resp-conformance"]
async fn go_redis_sees_the_same_replies_from_floodgate_and_redis_cell() {
    let redis = start_redis_cell();
    let (node, addr) = floodgate().await;
    let sequence = python_sequence();
    let mut command = Command::new(go_client());
    command
        .arg(redis.port.to_string())
        .arg(addr.port().to_string());
    replay(command, sequence, "go-redis").await;
    node.node.shutdown().await;
}

/// The calls redis-py replays, as JSON, so every other client replays the same ones.
fn python_sequence() -> Vec<u8> {
    let sequence = Command::new(python())
        .arg(tests_dir().join("resp_conformance.py"))
        .arg("--sequence")
        .output()
        .expect("resp_conformance.py --sequence runs");
    assert!(sequence.status.success(), "{sequence:?}");
    sequence.stdout
}

/// The Java replay (`resp_conformance_java`, Redisson), built once into `target/resp-java` by
/// its `build.sh`: the classes directory and the jars' directory, or why it cannot be had.
fn java_client() -> Result<(PathBuf, PathBuf), String> {
    let built = Command::new("bash")
        .arg(tests_dir().join("resp_conformance_java/build.sh"))
        .output()
        .map_err(|e| format!("bash does not run: {e}"))?;
    if !built.status.success() {
        return Err(String::from_utf8_lossy(&built.stderr).trim().to_owned());
    }
    let out = PathBuf::from(String::from_utf8(built.stdout).unwrap().trim());
    Ok((out.join("classes"), out.join("lib")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server, a JDK and Maven, downloads redis-cell, redis-py and Redisson: make resp-conformance"]
async fn redisson_sees_the_same_replies_from_floodgate_and_redis_cell() {
    // Without a JDK, Maven or Maven Central this client is skipped, not failed: it is optional.
    let (classes, lib) = match java_client() {
        Ok(built) => built,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let redis = start_redis_cell();
    let (node, addr) = floodgate().await;
    let sequence = python_sequence();
    let classpath = format!("{}:{}/*", classes.display(), lib.display());
    let mut command = Command::new("java");
    command
        .args(["-cp", &classpath, "RespConformance"])
        .arg(redis.port.to_string())
        .arg(addr.port().to_string());
    replay(command, sequence, "Redisson").await;
    node.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server and redis-cli, downloads redis-cell: make resp-conformance"]
async fn redis_cli_sees_the_same_replies_from_floodgate_and_redis_cell() {
    let redis = start_redis_cell();
    let (node, addr) = floodgate().await;
    let commands = [
        "PING",
        "ECHO hello",
        "CL.THROTTLE cli 2 1 60",
        "CL.THROTTLE cli 2 1 60",
        "CL.THROTTLE cli 2 1 60 2",
        "CL.THROTTLE cli 2 1 60 0",
        "CL.THROTTLE cli 2 1 60 4",
        "CL.THROTTLE cli 2 1 60 1",
        "CL.THROTTLE cli 2 1",
        "CL.THROTTLE cli two 1 60",
        "CL.THROTTLE tenths 9 10 1 3",
        "CL.THROTTLE tenths 9 10 1 3",
        "CL.THROTTLE tenths 9 10 1 3",
        "CL.THROTTLE tenths 9 10 1 3",
        "SELECT 0",
        "CLIENT SETNAME conformance",
        "CLIENT GETNAME",
        "PING",
    ]
    .join("\n");
    let port = redis.port;
    let cli = tokio::task::spawn_blocking(move || {
        (
            redis_cli(port, &commands),
            redis_cli(addr.port(), &commands),
        )
    });
    let (expected, got) = tokio::time::timeout(Duration::from_secs(60), cli)
        .await
        .expect("redis-cli finishes within a minute")
        .unwrap();
    assert!(expected.len() > 30, "{expected:?}");
    assert_eq!(expected.len(), got.len(), "{expected:#?}\n{got:#?}");
    for (e, g) in expected.iter().zip(&got) {
        assert!(
            same_line(e, g),
            "redis-cell {e:?}, floodgate {g:?}\n{expected:#?}\n{got:#?}"
        );
    }
    node.node.shutdown().await;
}

/// redis-py over TLS (`ssl=True`, verifying the node's certificate against the CA) to a node
/// with `--resp-tls`: the handshake and `CL.THROTTLE` as over plain TCP.
#[tokio::test]
async fn redis_py_calls_the_front_over_tls() {
    let imports = |venv: &Path| {
        Command::new(venv.join("bin/python"))
            .args(["-c", "import redis"])
            .status()
            .is_ok_and(|s| s.success())
    };
    let python = match python_venv("resp-venv", &["redis==5.2.1"], imports) {
        Ok(venv) => venv.join("bin/python"),
        // CI must not pass without having run this: only an explicit opt-out skips it.
        Err(why) if std::env::var_os("FLOODGATE_SKIP_PYTHON_RESP").is_some() => {
            println!("skipped: {why} (FLOODGATE_SKIP_PYTHON_RESP is set)");
            return;
        }
        Err(why) => {
            panic!("redis-py is not available: {why}; set FLOODGATE_SKIP_PYTHON_RESP=1 to skip")
        }
    };
    let node = start_node(|config| {
        let mut settings = RespSettings::on(([127, 0, 0, 1], 0).into());
        settings.tls = true;
        config.resp = Some(settings);
    })
    .await;
    let port = node.node.resp_addr().unwrap().port();
    let script = format!(
        "import redis\n\
         r = redis.Redis(host='127.0.0.1', port={port}, ssl=True, ssl_ca_certs={ca:?}, \
         ssl_cert_reqs='required', ssl_check_hostname=True, socket_timeout=10)\n\
         print(r.ping())\n\
         for _ in range(4):\n    print(r.execute_command('CL.THROTTLE', 'py:tls', 2, 3, 3600)[:3])\n",
        ca = node.certs.ca.display().to_string(),
    );
    let mut command = Command::new(python);
    command.args(["-c", &script]);
    let output = run_client(command, None, Duration::from_secs(60), "redis-py").await;
    let stdout = succeeded(&output, "redis-py");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["True", "[0, 3, 2]", "[0, 3, 1]", "[0, 3, 0]", "[1, 3, 0]"]
    );
    node.node.shutdown().await;
}
