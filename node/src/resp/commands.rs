//! A connection's session and the dispatch of its commands: the handshake commands answered here as Redis answers them, runs of `CL.THROTTLE` decided as one batch.

use floodgate::resp::{Protocol, Reply};

use super::Front;
use super::decide::decide;
use super::throttle::{self, Throttle};
use crate::config::RespFailureMode;

/// The version `HELLO` reports: the Redis whose protocol and handshake this front speaks.
const REDIS_VERSION: &str = "7.0.0";
const NOAUTH: &str = "NOAUTH Authentication required.";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// What one connection has set: protocol, authentication, name.
#[derive(Debug)]
pub(crate) struct Session {
    id: u64,
    protocol: Protocol,
    authenticated: bool,
    name: Option<Vec<u8>>,
    /// `QUIT` was served: the connection closes once its replies are written.
    pub(crate) closing: bool,
}

/// A command as received: its name (first argument) and the rest.
type Command = Vec<Vec<u8>>;

impl Session {
    pub(crate) fn new(id: u64, front: &Front) -> Self {
        Session {
            id,
            protocol: Protocol::Resp2,
            authenticated: front.settings.password.is_none(),
            name: None,
            closing: false,
        }
    }

    pub(crate) fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Serves `commands` in order, appending each reply to `out`. Consecutive `CL.THROTTLE`s
    /// are decided together (one batch per run); nothing after `QUIT` is served.
    pub(crate) async fn run(&mut self, front: &Front, commands: Vec<Command>, out: &mut Vec<u8>) {
        let mut run: Vec<Result<Throttle, String>> = Vec::new();
        for command in commands {
            if self.closing {
                break;
            }
            if command[0].eq_ignore_ascii_case(b"cl.throttle") && self.authenticated {
                let limits = &front.shared.config.limits;
                let parsed = throttle::parse(&command[1..], limits.max_key_bytes)
                    .and_then(|t| within_period_cap(t, limits.max_limit_period));
                run.push(parsed);
                continue;
            }
            self.throttle_run(front, std::mem::take(&mut run), out)
                .await;
            let name = command[0].to_ascii_lowercase();
            self.command(front, &name, &command)
                .write(self.protocol, out);
        }
        self.throttle_run(front, run, out).await;
    }

    async fn throttle_run(
        &self,
        front: &Front,
        run: Vec<Result<Throttle, String>>,
        out: &mut Vec<u8>,
    ) {
        if run.is_empty() {
            return;
        }
        let valid: Vec<&Throttle> = run.iter().filter_map(|t| t.as_ref().ok()).collect();
        let mut decisions = decide(&front.shared, &valid).await.into_iter();
        let mut tally = [0u64; RESULTS.len()];
        for parsed in &run {
            let result = match parsed {
                Err(error) => {
                    Reply::Error(error.clone()).write(self.protocol, out);
                    REFUSED
                }
                Ok(throttle) => match decisions.next() {
                    Some(Ok(decision)) => {
                        let reply = throttle::reply(throttle, &decision);
                        write_integers(reply, self.protocol, out);
                        if reply[0] == 0 { ALLOWED } else { LIMITED }
                    }
                    Some(Err(why)) => {
                        let (reply, result) =
                            undecided(front.settings.failure_mode, throttle, &why);
                        reply.write(self.protocol, out);
                        result
                    }
                    None => {
                        Reply::error("ERR floodgate could not decide the key")
                            .write(self.protocol, out);
                        FAILED_CLOSED
                    }
                },
            };
            tally[result] += 1;
        }
        // One metric update per result per run, not per call.
        for (counter, n) in front.throttles.iter().zip(tally) {
            if n > 0 {
                counter.increment(n);
            }
        }
    }

    /// Every command but `CL.THROTTLE` (and that one, when not authenticated).
    fn command(&mut self, front: &Front, name: &[u8], command: &[Vec<u8>]) -> Reply {
        let args = &command[1..];
        let open = matches!(name, b"auth" | b"hello" | b"quit" | b"reset");
        if !self.authenticated && !open {
            return Reply::error(NOAUTH);
        }
        match name {
            b"ping" => match args {
                [] => Reply::Simple("PONG".to_owned()),
                [message] => Reply::bulk(message.clone()),
                _ => arity("ping"),
            },
            b"echo" => match args {
                [message] => Reply::bulk(message.clone()),
                _ => arity("echo"),
            },
            b"auth" => match args {
                [password] => self.auth(front, b"default", password),
                [user, password] => self.auth(front, user, password),
                _ => arity("auth"),
            },
            b"hello" => self.hello(front, args),
            b"select" => match args {
                [db] => match std::str::from_utf8(db)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(0) => Reply::ok(),
                    Some(_) => Reply::error("ERR DB index is out of range"),
                    None => Reply::error("ERR value is not an integer or out of range"),
                },
                _ => arity("select"),
            },
            b"client" => self.client(args),
            b"command" => command_info(args),
            b"quit" => {
                self.closing = true;
                Reply::ok()
            }
            b"reset" => {
                self.protocol = Protocol::Resp2;
                self.name = None;
                self.authenticated = front.settings.password.is_none();
                Reply::Simple("RESET".to_owned())
            }
            b"cl.throttle" => Reply::error(NOAUTH),
            _ => unknown_command(command),
        }
    }

    fn auth(&mut self, front: &Front, user: &[u8], password: &[u8]) -> Reply {
        let Some(expected) = &front.settings.password else {
            return Reply::error(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            );
        };
        if user == b"default" && same_secret(expected.as_bytes(), password) {
            self.authenticated = true;
            Reply::ok()
        } else {
            Reply::error(WRONGPASS)
        }
    }

    /// `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
    fn hello(&mut self, front: &Front, args: &[Vec<u8>]) -> Reply {
        let mut protocol = self.protocol;
        let mut rest = args;
        if let [version, after @ ..] = args {
            protocol = match std::str::from_utf8(version)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
            {
                Some(2) => Protocol::Resp2,
                Some(3) => Protocol::Resp3,
                Some(_) => return Reply::error("NOPROTO unsupported protocol version"),
                None => {
                    return Reply::error("ERR Protocol version is not an integer or out of range");
                }
            };
            rest = after;
        }
        let mut name = None;
        while let [option, after @ ..] = rest {
            match (option.to_ascii_lowercase().as_slice(), after) {
                (b"auth", [user, password, more @ ..]) => {
                    if let Reply::Error(error) = self.auth(front, user, password) {
                        return Reply::Error(error);
                    }
                    rest = more;
                }
                (b"setname", [client_name, more @ ..]) => {
                    if !valid_name(client_name) {
                        return invalid_name();
                    }
                    name = Some(client_name.clone());
                    rest = more;
                }
                _ => {
                    return Reply::error(format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(option)
                    ));
                }
            }
        }
        if !self.authenticated {
            return Reply::error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            );
        }
        self.protocol = protocol;
        if name.is_some() {
            self.name = name;
        }
        let text = |s: &str| Reply::bulk(s.as_bytes());
        Reply::Map(vec![
            (text("server"), text("floodgate")),
            (text("version"), text(REDIS_VERSION)),
            (
                text("proto"),
                Reply::Integer(if protocol == Protocol::Resp3 { 3 } else { 2 }),
            ),
            (text("id"), Reply::Integer(self.id as i64)),
            (text("mode"), text("standalone")),
            (text("role"), text("master")),
            (text("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn client(&mut self, args: &[Vec<u8>]) -> Reply {
        let Some((sub, rest)) = args.split_first() else {
            return arity("client");
        };
        match (sub.to_ascii_lowercase().as_slice(), rest) {
            (b"setname", [name]) => {
                if !valid_name(name) {
                    return invalid_name();
                }
                self.name = (!name.is_empty()).then(|| name.clone());
                Reply::ok()
            }
            (b"getname", []) => match &self.name {
                Some(name) => Reply::bulk(name.clone()),
                None => Reply::Null,
            },
            (b"setinfo", [attribute, value]) => match attribute.to_ascii_lowercase().as_slice() {
                b"lib-name" | b"lib-ver" if valid_name(value) => Reply::ok(),
                b"lib-name" | b"lib-ver" => Reply::error(format!(
                    "ERR {} cannot contain spaces, newlines or special characters.",
                    String::from_utf8_lossy(attribute)
                )),
                _ => Reply::error(format!(
                    "ERR Unrecognized option '{}'",
                    String::from_utf8_lossy(attribute)
                )),
            },
            (b"id", []) => Reply::Integer(self.id as i64),
            (b"setname" | b"getname" | b"setinfo" | b"id", _) => {
                let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
                arity(&format!("client|{sub}"))
            }
            _ => Reply::error(format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(sub)
            )),
        }
    }
}

fn integers(values: [i64; 5]) -> Reply {
    Reply::Array(values.map(Reply::Integer).to_vec())
}

/// [`integers`] written as it is, without building the reply (its bytes are the same in both
/// protocols).
fn write_integers(values: [i64; 5], protocol: Protocol, out: &mut Vec<u8>) {
    out.extend_from_slice(b"*5\r\n");
    for value in values {
        Reply::Integer(value).write(protocol, out);
    }
}

/// `floodgate_resp_throttles_total`'s results, in [`Front::throttles`]' order.
pub(crate) const RESULTS: [&str; 5] = [
    "allowed",
    "limited",
    "refused",
    "failed_closed",
    "failed_open",
];
const ALLOWED: usize = 0;
const LIMITED: usize = 1;
const REFUSED: usize = 2;
const FAILED_CLOSED: usize = 3;
const FAILED_OPEN: usize = 4;

fn arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

fn valid_name(name: &[u8]) -> bool {
    name.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

fn invalid_name() -> Reply {
    Reply::error("ERR Client names cannot contain spaces, newlines or special characters.")
}

/// Compares every byte whatever the first difference, so the time taken tells nothing of where
/// a guess went wrong.
fn same_secret(expected: &[u8], given: &[u8]) -> bool {
    let mut difference = expected.len() ^ given.len();
    for (i, &b) in expected.iter().enumerate() {
        difference |= usize::from(b ^ given.get(i).copied().unwrap_or(!b));
    }
    difference == 0
}

/// Redis's answer to a command it does not know, arguments quoted up to 128 bytes.
fn unknown_command(command: &[Vec<u8>]) -> Reply {
    let mut args = String::new();
    for arg in &command[1..] {
        if args.len() >= 128 {
            break;
        }
        let room = 128 - args.len();
        let text = String::from_utf8_lossy(arg);
        let shown: String = text.chars().take(room).collect();
        args.push_str(&format!("'{shown}' "));
    }
    let name: String = String::from_utf8_lossy(&command[0])
        .chars()
        .take(128)
        .collect();
    Reply::Error(format!(
        "ERR unknown command '{name}', with args beginning with: {args}"
    ))
}

/// A command as `COMMAND` lists it: name, arity (negative: at least), flags, first key, last
/// key, key step.
type CommandInfo = (&'static str, i64, &'static [&'static str], i64, i64, i64);

/// The commands this front serves.
const COMMANDS: [CommandInfo; 10] = [
    ("cl.throttle", -5, &["write"], 1, 1, 1),
    ("ping", -1, &["fast"], 0, 0, 0),
    ("echo", 2, &["fast"], 0, 0, 0),
    (
        "hello",
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    (
        "auth",
        -2,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    ("select", 2, &["loading", "stale", "fast"], 0, 0, 0),
    ("client", -2, &["noscript", "loading", "stale"], 0, 0, 0),
    ("command", -1, &["loading", "stale"], 0, 0, 0),
    (
        "quit",
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    (
        "reset",
        1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
];

fn info_of(name: &[u8]) -> Reply {
    let lower = name.to_ascii_lowercase();
    let Some((name, arity, flags, first, last, step)) =
        COMMANDS.iter().find(|c| c.0.as_bytes() == lower.as_slice())
    else {
        return Reply::Null;
    };
    Reply::Array(vec![
        Reply::bulk(name.as_bytes()),
        Reply::Integer(*arity),
        Reply::Array(
            flags
                .iter()
                .map(|f| Reply::Simple((*f).to_owned()))
                .collect(),
        ),
        Reply::Integer(*first),
        Reply::Integer(*last),
        Reply::Integer(*step),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

/// `COMMAND`, `COMMAND COUNT`, `COMMAND INFO name...`, `COMMAND DOCS [name...]` (no docs).
fn command_info(args: &[Vec<u8>]) -> Reply {
    let Some((sub, names)) = args.split_first() else {
        return Reply::Array(COMMANDS.iter().map(|c| info_of(c.0.as_bytes())).collect());
    };
    match sub.to_ascii_lowercase().as_slice() {
        b"count" if names.is_empty() => Reply::Integer(COMMANDS.len() as i64),
        b"info" => Reply::Array(names.iter().map(|n| info_of(n)).collect()),
        b"docs" => Reply::Map(Vec::new()),
        b"count" => arity("command|count"),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// A throttle whose limit is no longer than the node lets a caller's limit be
/// (`--max-limit-period`), or the error reply: past it the node would refuse the check, and a
/// refusal must not reach the failure mode (an open one would allow it).
fn within_period_cap(throttle: Throttle, cap: std::time::Duration) -> Result<Throttle, String> {
    if u128::from(throttle.limit.period_ns()) > cap.as_nanos() {
        return Err(format!(
            "Cell error: period / count per period past this node's --max-limit-period of {} \
             days",
            cap.as_secs() / 86_400
        ));
    }
    Ok(throttle)
}

/// The reply to a throttle the cluster could not decide (`why`), by the front's failure mode,
/// and the result it is counted under.
fn undecided(mode: RespFailureMode, throttle: &Throttle, why: &str) -> (Reply, usize) {
    match mode {
        RespFailureMode::Open => (integers(throttle::open_reply(throttle)), FAILED_OPEN),
        RespFailureMode::Closed => (
            Reply::Error(format!("ERR floodgate could not decide the key: {why}")),
            FAILED_CLOSED,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_written_as_they_are_read_as_the_reply() {
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let values = [1, 1001, 0, 59, -1];
            let (mut direct, mut built) = (Vec::new(), Vec::new());
            write_integers(values, protocol, &mut direct);
            integers(values).write(protocol, &mut built);
            assert_eq!(direct, built);
        }
    }

    #[test]
    fn an_undecided_throttle_follows_the_failure_mode() {
        let throttle = throttle::parse(&words("k 4 1 3600 2"), 256).unwrap();
        let (closed, result) = undecided(RespFailureMode::Closed, &throttle, "store_full");
        assert_eq!(
            closed,
            Reply::Error("ERR floodgate could not decide the key: store_full".to_owned())
        );
        assert_eq!(RESULTS[result], "failed_closed");
        // Open: allowed as if the bucket were full: limit 5, 2 taken, 3 left, no waits.
        let (open, result) = undecided(RespFailureMode::Open, &throttle, "store_full");
        assert_eq!(open, integers([0, 5, 3, -1, 0]));
        assert_eq!(RESULTS[result], "failed_open");
    }

    #[test]
    fn a_period_past_the_nodes_cap_is_an_error_reply_not_a_failure() {
        let day = std::time::Duration::from_secs(86_400);
        let month = throttle::parse(&words("k 0 1 2592000"), 256).unwrap();
        assert!(within_period_cap(month, 31 * day).is_ok());
        let longer = throttle::parse(&words("k 0 1 2764800"), 256).unwrap();
        let refused = within_period_cap(longer, 31 * day).unwrap_err();
        assert!(
            refused.contains("--max-limit-period of 31 days"),
            "{refused}"
        );
    }

    fn words(text: &str) -> Vec<Vec<u8>> {
        text.split(' ').map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn unknown_commands_are_answered_as_redis_answers_them() {
        assert_eq!(
            unknown_command(&words("FOO a b")),
            Reply::error("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(
            unknown_command(&words("GET")),
            Reply::error("ERR unknown command 'GET', with args beginning with: ")
        );
        let long = format!("X {}", "y".repeat(300));
        match unknown_command(&words(&long)) {
            Reply::Error(text) => assert!(text.len() < 200, "{text}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"s3cret", b"s3cret!"));
        assert!(!same_secret(b"s3cret", b"S3cret"));
        assert!(!same_secret(b"", b"\xff"));
        assert!(same_secret(b"", b""));
    }

    #[test]
    fn command_lists_what_is_served() {
        assert_eq!(command_info(&words("COUNT")), Reply::Integer(10));
        match command_info(&words("INFO cl.throttle nosuch")) {
            Reply::Array(items) => {
                assert_eq!(items.len(), 2);
                assert_eq!(items[1], Reply::Null);
            }
            other => panic!("{other:?}"),
        }
    }
}
