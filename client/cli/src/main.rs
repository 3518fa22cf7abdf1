//! `floodgate`: send rate-limit checks to a node from a shell and print each decision.

mod acquire;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use floodgate_client::brownout::BrownoutError;
use floodgate_client::core::priority::{BrownoutReading, Priority};
use floodgate_client::core::region::Scope;
use floodgate_client::core::{Algorithm, Decision, Limit, parse_duration_ns, parse_rate};
use floodgate_client::logging::{self, LogFormat};
use floodgate_client::{
    Check, ClientAuth, ClientConfig, ClusterTable, FailureMode, HostPort, Verdict,
};

const CHECK_HELP: &str = "\
Output: one line per decision, starting with `allow` or `deny`:
  allow remaining=9 reset_after=100ms
  deny remaining=0 retry_after=100ms reset_after=1s
  deny cost_exceeds_burst burst=5

Exit status:
  0  the last check was allowed
  1  the last check was denied by the node
  2  error: bad arguments, unreadable certificates, or no decision from the node (unreachable,
     timed out, refused our certificate). A check the node did not decide is never reported as
     `deny`, so a script can tell \"rate limited\" (1) from \"could not ask\" (2).";

/// `--version`: the release and the protocol versions it speaks (what an upgrade must share
/// with the build that runs now).
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{} (protocol versions {})",
        env!("CARGO_PKG_VERSION"),
        floodgate_client::core::protocol::SUPPORTED
    )
});

#[derive(Debug, Parser)]
#[command(
    name = "floodgate",
    version = VERSION.as_str(),
    about = "Talk to floodgate rate-limiter nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The client library's log lines as `text` or `json`, on stderr. `RUST_LOG` chooses them
    /// (default `error`: the command reports its own errors; `RUST_LOG=debug` shows why a node
    /// could not be reached, reconnects and table fetches).
    #[arg(long, global = true, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Consume from a key's bucket COUNT times, one check at a time, printing each decision.
    #[command(after_help = CHECK_HELP)]
    Check(CheckArgs),
    /// Acquire concurrency leases on a key COUNT times, printing each answer; hold the granted
    /// ones for --hold, then release them (or leave them to expire with --abandon).
    #[command(after_help = acquire::ACQUIRE_HELP)]
    Acquire(acquire::AcquireArgs),
    /// Print the cluster as a node sees it: members, the slot table's epoch and version, and
    /// how many slots each member owns.
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Rules files: `floodgate rules check FILE` validates one and prints what it enforces.
    #[command(subcommand)]
    Rules(RulesCommand),
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// Validate a rules file: print its version and rules (exit 0), or the error with its line
    /// and column (exit 2).
    Check {
        /// The rules file (YAML; see rules/example.yaml).
        file: PathBuf,
    },
}

const STATUS_HELP: &str = "\
Output:
  epoch 3, version 9f3a0c12d4e5b6a7, from node-a, cluster protocol 4
  id      region  address         state  protocol  slots
  node-a  local   127.0.0.1:7100  alive  2-6       1372

The protocol column is the range of protocol versions each member speaks (`2` for a node of a
build before versions were negotiated); the cluster speaks the highest version all share.

With --brownout BACKEND (the name gateways' shedders report under, e.g. `work`), one line per
backend reads the fleet's brownout level without reporting anything:
  brownout work: fleet level 1 (sheddable shed); reports at level >= 0/1/2: 30/30/0, quorum 50%
--brownout-interval and --brownout-quorum must be the gateways' own (their defaults are).

Exit status: 0 when a node gave its table, 2 on error (bad arguments, no node answered).";

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    /// Backends whose fleet brownout level to show (the names gateways report their shedding
    /// level under, e.g. `work`); repeat the flag or separate with commas.
    #[arg(long, value_delimiter = ',', value_name = "BACKEND")]
    brownout: Vec<String>,
    /// The gateways' brownout report interval: their counts are kept under the limit it makes.
    #[arg(long, default_value = "100ms", value_parser = parse_duration_arg)]
    brownout_interval: Duration,
    /// The gateways' brownout quorum: the share of reports at a level or above that brings the
    /// fleet to it.
    #[arg(long, default_value = "50%", value_parser = parse_share)]
    brownout_quorum: u32,
}

/// A share such as `50%`, in basis points.
fn parse_share(text: &str) -> Result<u32, String> {
    floodgate_client::core::priority::reserve::parse_share_bp(text).map_err(|e| e.to_string())
}

/// How to reach the nodes: shared by every subcommand that talks to them.
#[derive(Debug, Args)]
struct ConnectionArgs {
    /// Nodes to start from, HOST:PORT (a DNS name or an IP address); repeat the flag or separate
    /// with commas. Any one is enough, the rest are discovered. `--node` is the same flag.
    #[arg(
        long,
        alias = "node",
        required = true,
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    seeds: Vec<HostPort>,
    /// PEM file of the CA that signs the node certificates.
    #[arg(long)]
    ca: PathBuf,
    /// Client certificate (PEM), for nodes that require mutual TLS.
    #[arg(long, requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    #[arg(long, requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Longest wait for each answer and for the connection, e.g. 500ms, 2s.
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    timeout: Duration,
    /// Name the --seeds' certificates must carry (default: each seed's HOST, a DNS name or IP
    /// address). Discovered nodes are verified by their node id.
    #[arg(long)]
    server_name: Option<String>,
    /// This client's region: the --seeds must be nodes of it (a slot table from a node of
    /// another region is ignored).
    #[arg(long)]
    region: Option<String>,
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    /// The key to check; its bytes are the bucket's identity on the node.
    key: String,
    /// The rate: N/s, N/min, N/h, N/d, or N per a duration (5/10s).
    #[arg(long, value_parser = parse_rate_arg)]
    limit: (u64, u64),
    /// gcra, fixed-window, sliding-window or sliding-log.
    #[arg(long, default_value = "gcra", value_parser = parse_algorithm)]
    algorithm: Algorithm,
    /// Most units that may pass at once (gcra only; defaults to the rate's count).
    #[arg(long)]
    burst: Option<u64>,
    /// Units each check consumes (0 peeks).
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Number of checks to send.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Where the check is decided across regions: region (in this client's region), global
    /// (one limit shared by every region) or home:REGION (decided in REGION).
    #[arg(long, default_value = "region", value_parser = parse_scope)]
    scope: Scope,
    /// A pause between checks, e.g. 50ms (default: none).
    #[arg(long, value_parser = parse_duration_arg)]
    interval: Option<Duration>,
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    text.parse()
        .map_err(|e: floodgate_client::core::region::ScopeError| e.to_string())
}

fn parse_rate_arg(text: &str) -> Result<(u64, u64), String> {
    parse_rate(text).map_err(|e| e.to_string())
}

fn parse_algorithm(text: &str) -> Result<Algorithm, String> {
    text.parse()
        .map_err(|e: floodgate_client::core::LimitError| e.to_string())
}

fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    let ns = parse_duration_ns(text).map_err(|e| e.to_string())?;
    if ns == 0 {
        return Err("the timeout must be more than zero".to_owned());
    }
    Ok(Duration::from_nanos(ns))
}

impl CheckArgs {
    fn limit(&self) -> Result<Limit, String> {
        let (rate, period_ns) = self.limit;
        Limit::new(self.algorithm, rate, period_ns, self.burst.unwrap_or(rate))
            .map_err(|e| format!("invalid --limit/--burst: {e}"))
    }
}

impl ConnectionArgs {
    fn seeds(&self) -> &[HostPort] {
        &self.seeds
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::with_ca_file(&self.ca);
        config.client_auth = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some(ClientAuth {
                cert: cert.clone(),
                key: key.clone(),
            }),
            // clap makes each require the other.
            _ => None,
        };
        // Unset: the client verifies each seed by its own host.
        config.server_name = self.server_name.clone();
        config.timeout = self.timeout;
        config.connect_timeout = self.timeout;
        config.region = self.region.clone();
        config
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format, "error");
    match cli.command {
        Command::Rules(RulesCommand::Check { file }) => match check_rules(&file) {
            Ok(described) => {
                print!("{described}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprint!("{message}");
                ExitCode::from(2)
            }
        },
        Command::Status(args) => {
            let status = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the runtime: {e}"))
                .and_then(|runtime| runtime.block_on(run_status(&args, &mut std::io::stdout())));
            match status {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    eprintln!("floodgate: {message}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Acquire(args) => {
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the runtime: {e}"))
                .and_then(|runtime| {
                    runtime.block_on(acquire::run_acquire(&args, &mut std::io::stdout()))
                });
            match outcome {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(message) => {
                    eprintln!("floodgate: {message}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Check(args) => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("floodgate: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            match runtime.block_on(run_check(&args, &mut std::io::stdout())) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(message) => {
                    eprintln!("floodgate: {message}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// Fetches one node's slot table and prints it.
async fn run_status(status: &StatusArgs, out: &mut impl Write) -> Result<(), String> {
    let args = &status.connection;
    let config = args.client_config();
    let table = floodgate_client::fetch_slot_table(args.seeds(), &config)
        .await
        .map_err(|e| e.to_string())?;
    out.write_all(format_status(&table).as_bytes())
        .map_err(|e| e.to_string())?;
    // The rules in force on that node, so a rule change shows here too.
    let mut rules = "rules: unknown (no node answered)\n".to_owned();
    for node in args.seeds() {
        match floodgate_client::policy::fetch_policy(node.clone(), &config).await {
            Ok(message) if message.version.is_empty() => {
                rules = format!("rules: none ({node} runs without --rules)\n");
                break;
            }
            Ok(message) => {
                rules = format!("rules: version {} (from {node})\n", message.version);
                break;
            }
            Err(e) => rules = format!("rules: unknown ({node}: {e})\n"),
        }
    }
    out.write_all(rules.as_bytes()).map_err(|e| e.to_string())?;
    if status.brownout.is_empty() {
        return Ok(());
    }
    let client = floodgate_client::Client::connect(args.seeds(), config)
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = String::new();
    for backend in &status.brownout {
        let read = floodgate_client::brownout::read_fleet_level(
            &client,
            backend,
            status.brownout_interval,
            status.brownout_quorum,
        )
        .await;
        lines.push_str(&format_brownout(backend, read, status.brownout_quorum));
    }
    client.close().await;
    out.write_all(lines.as_bytes()).map_err(|e| e.to_string())
}

/// One backend's brownout line: its fleet level and the counts, or why it is unknown.
fn format_brownout(
    backend: &str,
    read: Result<(u8, BrownoutReading), BrownoutError>,
    quorum_bp: u32,
) -> String {
    match read {
        Ok((level, reading)) => {
            let shed = match level {
                0 => "nothing shed".to_owned(),
                level => {
                    Priority::ALL[..usize::from(level)]
                        .iter()
                        .map(|class| class.name())
                        .collect::<Vec<_>>()
                        .join(" and ")
                        + " shed"
                }
            };
            let counts: Vec<String> = reading.at_least.iter().map(u64::to_string).collect();
            format!(
                "brownout {backend}: fleet level {level} ({shed}); reports at level >= 0/1/2: {}, quorum {}%\n",
                counts.join("/"),
                f64::from(quorum_bp) / 100.0
            )
        }
        Err(e) => format!("brownout {backend}: unknown ({e})\n"),
    }
}

/// `floodgate rules check FILE`: the policy's description, or the rendered error.
fn check_rules(file: &std::path::Path) -> Result<String, String> {
    let name = file.display().to_string();
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("floodgate: cannot read {name}: {e}\n"))?;
    floodgate_client::core::policy::Policy::from_yaml(&text)
        .map(|policy| policy.describe())
        .map_err(|e| e.render(&name, &text))
}

/// The status report: a header line, then one aligned row per member.
fn format_status(table: &ClusterTable) -> String {
    let mut rows = vec![[
        "id".to_owned(),
        "region".to_owned(),
        "address".to_owned(),
        "state".to_owned(),
        "protocol".to_owned(),
        "slots".to_owned(),
    ]];
    for member in table.members() {
        rows.push([
            member.id.clone(),
            member.region.clone(),
            member.addr.clone(),
            member.state.name().to_owned(),
            member
                .versions
                .unwrap_or(floodgate_client::core::protocol::UNKNOWN_MEMBER)
                .to_string(),
            table.slots_owned(&member.id).to_string(),
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let cluster = match table.cluster_version() {
        0 => "none shared (see the protocol column)".to_owned(),
        version => version.to_string(),
    };
    let mut text = format!(
        "epoch {}, version {:016x}, from {}, cluster protocol {cluster}\n",
        table.epoch(),
        table.version(),
        table.from()
    );
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.push_str(&line);
        text.push('\n');
    }
    text.push_str(&format_regions(table));
    text
}

/// One line per region: its members, and the slots it owns as this node's table shows them
/// (each region has its own ring; a node's table holds its own region's).
fn format_regions(table: &ClusterTable) -> String {
    let mut regions: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for member in table.members() {
        let entry = regions.entry(member.region.as_str()).or_default();
        entry.0 += 1;
        entry.1 += table.slots_owned(&member.id);
    }
    let from_region = table
        .members()
        .iter()
        .find(|m| m.id == table.from())
        .map(|m| m.region.as_str());
    let mut text = String::new();
    for (region, (members, slots)) in regions {
        let ring = if Some(region) == from_region {
            format!("{slots} slots in this table")
        } else {
            "its own ring (ask one of its nodes)".to_owned()
        };
        text.push_str(&format!("region {region}: {members} members, {ring}\n"));
    }
    text
}

/// Sends the checks; `Ok(allowed)` is the last decision, `Err` a message for stderr.
async fn run_check(args: &CheckArgs, out: &mut impl Write) -> Result<bool, String> {
    let limit = args.limit()?;
    let client =
        floodgate_client::Client::connect(args.connection.seeds(), args.connection.client_config())
            .await
            .map_err(|e| e.to_string())?;
    // Closed: a node we cannot reach must never look like an `allow`; the source then turns
    // it into an error (exit 2) rather than a `deny`.
    let check = Check::new(args.key.as_bytes(), limit)
        .cost(args.cost)
        .failure_mode(FailureMode::Closed)
        .scope(args.scope.clone());
    let mut allowed = false;
    for i in 0..args.count {
        if let Some(pause) = args.interval.filter(|_| i > 0) {
            tokio::time::sleep(pause).await;
        }
        let verdicts = client
            .check(std::slice::from_ref(&check))
            .await
            .map_err(|e| e.to_string())?;
        let Some(&Verdict { decision, source }) = verdicts.first() else {
            return Err("no verdict for the check".to_owned());
        };
        if let Some(reason) = source.degraded() {
            let detail = client
                .nodes()
                .into_iter()
                .find_map(|n| n.last_error.map(|e| format!(" ({}: {e})", n.addr)))
                .unwrap_or_default();
            client.close().await;
            return Err(format!("no decision from the node: {reason}{detail}"));
        }
        writeln!(out, "{}", format_decision(&decision)).map_err(|e| e.to_string())?;
        allowed = decision.is_allowed();
    }
    client.close().await;
    Ok(allowed)
}

fn format_decision(decision: &Decision) -> String {
    match *decision {
        Decision::Allowed {
            remaining,
            reset_after_ns,
        } => format!(
            "allow remaining={remaining} reset_after={}",
            format_duration(reset_after_ns)
        ),
        Decision::Denied {
            remaining,
            retry_after_ns,
            reset_after_ns,
        } => format!(
            "deny remaining={remaining} retry_after={} reset_after={}",
            format_duration(retry_after_ns),
            format_duration(reset_after_ns)
        ),
        Decision::CostExceedsBurst { burst } => format!("deny cost_exceeds_burst burst={burst}"),
    }
}

/// Milliseconds below a second, seconds above (`250ms`, `1s`, `1.5s`), rounded *up* to the
/// millisecond so a script that waits `retry_after` is never early.
fn format_duration(ns: u64) -> String {
    let ms = ns.div_ceil(1_000_000);
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (secs, frac) = (ms / 1_000, ms % 1_000);
    if frac == 0 {
        return format!("{secs}s");
    }
    let frac = format!("{frac:03}");
    format!("{secs}.{}s", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `floodgate check` with a node, a CA, the rate `limit`, then `extra`.
    fn parse_limit(limit: &str, extra: &[&str]) -> Result<CheckArgs, clap::Error> {
        let base = [
            "floodgate",
            "check",
            "--seeds",
            "127.0.0.1:7100",
            "--ca",
            "ca.pem",
        ];
        let argv = base
            .into_iter()
            .chain(["--limit", limit])
            .chain(extra.iter().copied());
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Check(args) => args,
            other => panic!("not a check: {other:?}"),
        })
    }

    fn parse(extra: &[&str]) -> Result<CheckArgs, clap::Error> {
        parse_limit("10/s", extra)
    }

    #[test]
    fn the_server_name_defaults_to_each_seeds_host() {
        let args = parse(&["user:1"]).unwrap();
        assert_eq!(args.connection.client_config().server_name, None);
        let host = |text: &str| text.parse::<HostPort>().unwrap().host().to_owned();
        assert_eq!(host("localhost:7100"), "localhost");
        assert_eq!(host("[::1]:7100"), "::1");
        let named = parse(&["user:1", "--server-name", "fg-a.internal"]).unwrap();
        assert_eq!(
            named.connection.client_config().server_name.as_deref(),
            Some("fg-a.internal")
        );
    }

    #[test]
    fn defaults_and_a_full_command_line() {
        let args = parse(&["user:1"]).unwrap();
        let seeds: Vec<String> = args
            .connection
            .seeds
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(seeds, ["127.0.0.1:7100"]);
        assert_eq!(args.limit, (10, 1_000_000_000));
        assert_eq!(args.algorithm, Algorithm::Gcra);
        assert_eq!((args.cost, args.count, args.burst), (1, 1, None));
        assert_eq!(args.connection.timeout, Duration::from_secs(2));
        assert_eq!(
            args.limit().unwrap(),
            Limit::gcra(10, 1_000_000_000, 10).unwrap()
        );

        let args = parse(&[
            "k",
            "--algorithm",
            "sliding-window",
            "--cost",
            "3",
            "--count",
            "5",
            "--timeout",
            "250ms",
            "--client-cert",
            "c.pem",
            "--client-key",
            "c.key",
        ])
        .unwrap();
        assert_eq!(args.algorithm, Algorithm::SlidingWindow);
        assert_eq!((args.cost, args.count), (3, 5));
        assert_eq!(args.connection.timeout, Duration::from_millis(250));
        let config = args.connection.client_config();
        assert_eq!(config.timeout, Duration::from_millis(250));
        assert_eq!(config.client_auth.unwrap().key, PathBuf::from("c.key"));
    }

    #[test]
    fn every_rate_unit_parses() {
        for (text, period_s) in [("5/s", 1), ("5/min", 60), ("5/h", 3_600), ("5/d", 86_400)] {
            let args = parse_limit(text, &["k"]).unwrap();
            assert_eq!(args.limit, (5, period_s * 1_000_000_000), "{text}");
        }
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        let err = parse_limit("ten per second", &["k"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(err.to_string().contains("not a rate"), "{err}");
        assert!(parse(&["k", "--count", "0"]).is_err());
        assert!(parse(&["k", "--client-cert", "c.pem"]).is_err());
        assert!(parse(&["k", "--algorithm", "leaky"]).is_err());
        assert!(parse(&["k", "--timeout", "0s"]).is_err());
        assert!(parse(&[]).is_err(), "the key is required");
        // Parses, but a burst on a window algorithm is not a valid limit.
        let args = parse(&["k", "--algorithm", "fixed-window", "--burst", "3"]).unwrap();
        assert!(args.limit().unwrap_err().contains("burst"));
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn decisions_print_as_documented() {
        assert_eq!(
            format_decision(&Decision::Allowed {
                remaining: 9,
                reset_after_ns: 100_000_000
            }),
            "allow remaining=9 reset_after=100ms"
        );
        assert_eq!(
            format_decision(&Decision::Denied {
                remaining: 0,
                retry_after_ns: 100_000_000,
                reset_after_ns: 1_000_000_000
            }),
            "deny remaining=0 retry_after=100ms reset_after=1s"
        );
        assert_eq!(
            format_decision(&Decision::CostExceedsBurst { burst: 5 }),
            "deny cost_exceeds_burst burst=5"
        );
        assert_eq!(format_duration(0), "0ms");
        assert_eq!(format_duration(1), "1ms", "rounded up, never early");
        assert_eq!(format_duration(1_500_000_000), "1.5s");
        assert_eq!(format_duration(1_799_990_000_000), "1799.99s");
        assert_eq!(format_duration(3_600_000_000_000), "3600s");
    }

    #[test]
    fn seeds_repeated_comma_separated_or_as_node_are_one_list_and_need_a_port() {
        let seeds = |argv: &[&str]| {
            let args =
                Cli::try_parse_from(["floodgate", "status", "--ca", "ca.pem"].iter().chain(argv))
                    .map_err(|e| e.to_string())?;
            match args.command {
                Command::Status(s) => Ok(s
                    .connection
                    .seeds
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()),
                other => panic!("not status: {other:?}"),
            }
        };
        let expected = ["localhost:7100", "10.0.0.2:7100"];
        assert_eq!(
            seeds(&["--seeds", "localhost:7100,10.0.0.2:7100"]).unwrap(),
            expected
        );
        assert_eq!(
            seeds(&["--seeds", "localhost:7100", "--seeds", "10.0.0.2:7100"]).unwrap(),
            expected
        );
        assert_eq!(
            seeds(&["--node", "localhost:7100", "--node", "10.0.0.2:7100"]).unwrap(),
            expected
        );
        let error: String = seeds(&["--seeds", "localhost"]).unwrap_err();
        assert!(
            error.contains("--seeds") && error.contains("has no port"),
            "{error}"
        );
    }
}
