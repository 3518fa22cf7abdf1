//! The Redis protocol front (`--resp-listen`) of a real node on 127.0.0.1: the handshake
//! commands answered as Redis answers them, `CL.THROTTLE` with redis-cell's replies, pipelining,
//! `AUTH`, the failure mode, and hostile input answered with errors, never a panic.
//!
//! Limits here are per hour, so the test's own milliseconds move no whole-second field by more
//! than one: `assert_reply` compares the two timing fields within one second.

mod common;

use common::resp::{RespClient, Value, encode, words};
use common::*;
use floodgate_node::{NodeConfig, RespFailureMode, RespSettings};

fn with_resp(config: &mut NodeConfig) {
    config.resp = Some(RespSettings::on(([127, 0, 0, 1], 0).into()));
}

async fn client(node: &TestNode) -> RespClient {
    RespClient::connect(node.node.resp_addr().expect("a RESP listener")).await
}

/// Limited, limit and remaining exactly; retry and reset after within one second (time passes
/// between the calls), -1 exactly.
fn assert_reply(got: &Value, expected: [i64; 5]) {
    let got = got.throttle();
    assert_eq!(got[..3], expected[..3], "{got:?} vs {expected:?}");
    for i in 3..5 {
        let close = if expected[i] == -1 {
            got[i] == -1
        } else {
            (got[i] - expected[i]).abs() <= 1
        };
        assert!(close, "field {i}: {got:?} vs {expected:?}");
    }
}

fn simple(text: &str) -> Value {
    Value::Simple(text.to_owned())
}

fn bulk(text: &str) -> Value {
    Value::Bulk(text.as_bytes().to_vec())
}

fn error_starting(value: &Value, prefix: &str) {
    match value {
        Value::Error(text) => assert!(text.starts_with(prefix), "{text}"),
        other => panic!("expected an error starting {prefix:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn the_handshakes_of_common_clients_pass() {
    let node = start_node(with_resp).await;
    let mut c = client(&node).await;
    assert_eq!(c.call("PING").await, simple("PONG"));
    assert_eq!(c.call("ping hello").await, bulk("hello"));
    assert_eq!(c.call("ECHO hi").await, bulk("hi"));
    assert_eq!(c.call("SELECT 0").await, simple("OK"));
    error_starting(&c.call("SELECT 1").await, "ERR DB index is out of range");
    assert_eq!(
        c.call("CLIENT SETINFO LIB-NAME redis-py").await,
        simple("OK")
    );
    assert_eq!(c.call("CLIENT SETINFO lib-ver 5.0.0").await, simple("OK"));
    assert_eq!(c.call("CLIENT GETNAME").await, Value::Null);
    assert_eq!(c.call("CLIENT SETNAME worker-1").await, simple("OK"));
    assert_eq!(c.call("CLIENT GETNAME").await, bulk("worker-1"));
    let Value::Int(id) = c.call("CLIENT ID").await else {
        panic!("CLIENT ID is an integer")
    };
    assert_eq!(c.call("COMMAND COUNT").await, Value::Int(10));
    assert_eq!(c.call("COMMAND DOCS").await, Value::Array(Vec::new()));
    // HELLO in RESP2: the map as a flat array.
    let Value::Array(hello) = c.call("HELLO").await else {
        panic!("HELLO answers an array in RESP2")
    };
    assert_eq!(hello[4..6], [bulk("proto"), Value::Int(2)]);
    assert_eq!(hello[6..8], [bulk("id"), Value::Int(id)]);
    // HELLO 3: a map, and RESP3 from then on (a null is `_`).
    let Value::Map(hello) = c.call("HELLO 3 SETNAME other").await else {
        panic!("HELLO 3 answers a map")
    };
    assert!(hello.contains(&(bulk("proto"), Value::Int(3))), "{hello:?}");
    assert_eq!(c.call("CLIENT GETNAME").await, bulk("other"));
    assert_eq!(c.call("COMMAND DOCS").await, Value::Map(Vec::new()));
    assert_eq!(c.call("RESET").await, simple("RESET"));
    assert_eq!(c.call("CLIENT GETNAME").await, Value::Null);
    // Unknown commands are refused as Redis refuses them, and the connection stays usable.
    assert_eq!(
        c.call("GET foo").await,
        Value::Error("ERR unknown command 'GET', with args beginning with: 'foo' ".to_owned())
    );
    error_starting(
        &c.call("CLIENT KILL x").await,
        "ERR unknown subcommand 'KILL'",
    );
    error_starting(
        &c.call("ECHO").await,
        "ERR wrong number of arguments for 'echo'",
    );
    error_starting(&c.call("HELLO 4").await, "NOPROTO");
    assert_eq!(c.call("PING").await, simple("PONG"));
    assert_eq!(c.call("QUIT").await, simple("OK"));
    assert!(c.closed().await, "QUIT closes the connection");
    node.node.shutdown().await;
}

#[tokio::test]
async fn cl_throttle_answers_as_redis_cell() {
    let node = start_node(with_resp).await;
    let mut c = client(&node).await;
    // max_burst 4: five at once, then one per hour.
    for remaining in (0..5).rev() {
        let reset = 3600 * (5 - remaining);
        assert_reply(
            &c.call("CL.THROTTLE user:1 4 1 3600").await,
            [0, 5, remaining, -1, reset],
        );
    }
    assert_reply(
        &c.call("CL.THROTTLE user:1 4 1 3600").await,
        [1, 5, 0, 3600, 18000],
    );
    // Quantity 0 peeks; a quantity above the limit is refused for good (retry -1).
    assert_reply(
        &c.call("cl.throttle user:2 4 1 3600 0").await,
        [0, 5, 5, -1, 0],
    );
    assert_reply(
        &c.call("CL.THROTTLE user:2 4 1 3600 3").await,
        [0, 5, 2, -1, 10800],
    );
    assert_reply(
        &c.call("CL.THROTTLE user:2 4 1 3600 6").await,
        [1, 5, 2, -1, 10800],
    );
    assert_reply(
        &c.call("CL.THROTTLE user:2 4 1 3600 3").await,
        [1, 5, 2, 3600, 10800],
    );
    // redis-cell's errors, word for word, and the connection stays usable.
    assert_eq!(
        c.call("CL.THROTTLE user:3 4 1").await,
        Value::Error(
            "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> \
             [<quantity>]"
                .to_owned()
        )
    );
    assert_eq!(
        c.call("CL.THROTTLE user:3 four 1 3600").await,
        Value::Error("Cell error: Couldn't parse as integer: four".to_owned())
    );
    error_starting(&c.call("CL.THROTTLE user:3 4 0 3600").await, "Cell error: ");
    error_starting(
        &c.call("CL.THROTTLE user:3 -1 1 3600").await,
        "Cell error: ",
    );
    assert_eq!(c.call("PING").await, simple("PONG"));
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_pipeline_is_answered_in_order_and_decided_exactly() {
    let node = start_node(with_resp).await;
    let mut c = client(&node).await;
    let mut bytes = Vec::new();
    for i in 0..200 {
        bytes.extend(words("CL.THROTTLE pipelined 9 1 3600"));
        if i % 7 == 0 {
            bytes.extend(words(&format!("ECHO {i}")));
        }
    }
    c.send(&bytes).await;
    let mut allowed = 0;
    for i in 0..200 {
        let reply = c.read().await.throttle();
        let expected_remaining = (9 - i).max(0);
        assert_eq!(reply[2], expected_remaining, "reply {i}: {reply:?}");
        allowed += usize::from(reply[0] == 0);
        if i % 7 == 0 {
            assert_eq!(c.read().await, bulk(&i.to_string()));
        }
    }
    assert_eq!(allowed, 10);
    node.node.shutdown().await;
}

#[tokio::test]
async fn auth_is_required_when_a_password_is_set() {
    let node = start_node(|config| {
        let mut settings = RespSettings::on(([127, 0, 0, 1], 0).into());
        settings.password = Some("s3cret".to_owned());
        config.resp = Some(settings);
    })
    .await;
    let mut c = client(&node).await;
    error_starting(&c.call("PING").await, "NOAUTH");
    error_starting(&c.call("CL.THROTTLE k 1 1 60").await, "NOAUTH");
    error_starting(&c.call("HELLO 3").await, "NOAUTH");
    error_starting(&c.call("AUTH wrong").await, "WRONGPASS");
    error_starting(&c.call("AUTH other s3cret").await, "WRONGPASS");
    let Value::Map(_) = c.call("HELLO 3 AUTH default s3cret").await else {
        panic!("HELLO 3 with AUTH answers a map")
    };
    assert_reply(&c.call("CL.THROTTLE k 1 1 60").await, [0, 2, 1, -1, 60]);
    // RESET forgets the authentication.
    assert_eq!(c.call("RESET").await, simple("RESET"));
    error_starting(&c.call("PING").await, "NOAUTH");
    assert_eq!(c.call("AUTH s3cret").await, simple("OK"));
    assert_eq!(c.call("PING").await, simple("PONG"));
    node.node.shutdown().await;
}

#[tokio::test]
async fn hostile_input_gets_an_error_reply_and_the_node_serves_on() {
    let node = start_node(with_resp).await;
    // A malformed header: a protocol error, then the connection closes (as Redis does).
    let mut c = client(&node).await;
    c.send(b"*x\r\n").await;
    error_starting(&c.read().await, "ERR Protocol error");
    assert!(c.closed().await);
    // An argument over the cap.
    let mut c = client(&node).await;
    c.send(b"*2\r\n$4\r\nECHO\r\n$100000000\r\n").await;
    error_starting(&c.read().await, "ERR Protocol error: invalid bulk length");
    assert!(c.closed().await);
    // Too many arguments.
    let mut c = client(&node).await;
    c.send(b"*100000\r\n").await;
    error_starting(
        &c.read().await,
        "ERR Protocol error: invalid multibulk length",
    );
    assert!(c.closed().await);
    // Commands before the bad bytes are answered first.
    let mut c = client(&node).await;
    let mut bytes = words("PING");
    bytes.extend_from_slice(b"*1\r\n:1\r\n");
    c.send(&bytes).await;
    assert_eq!(c.read().await, simple("PONG"));
    error_starting(&c.read().await, "ERR Protocol error: expected '$'");
    assert!(c.closed().await);
    // A key over the node's cap, binary and non-UTF-8 arguments: errors, and the connection
    // stays usable.
    let mut c = client(&node).await;
    let long = "k".repeat(300);
    error_starting(
        &c.call(&format!("CL.THROTTLE {long} 1 1 60")).await,
        "Cell error: key of 300 bytes",
    );
    c.send(&encode(&[
        b"CL.THROTTLE".as_slice(),
        b"\xff\x00",
        b"\xfe",
        b"1",
        b"1",
    ]))
    .await;
    error_starting(&c.read().await, "Cell error: Couldn't parse as integer");
    c.send(&encode(&[b"\xff\xfe".as_slice()])).await;
    error_starting(&c.read().await, "ERR unknown command");
    assert_reply(
        &c.call("CL.THROTTLE binary-ok 1 1 60").await,
        [0, 2, 1, -1, 60],
    );
    // Inline commands, as telnet sends them.
    c.send(b"PING inline\r\n\r\n").await;
    assert_eq!(c.read().await, bulk("inline"));
    assert_eq!(c.call("PING").await, simple("PONG"));
    node.node.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_allowance_are_told_and_closed() {
    let node = start_node(|config| {
        with_resp(config);
        config.limits.max_connections = 1;
    })
    .await;
    let mut first = client(&node).await;
    assert_eq!(first.call("PING").await, simple("PONG"));
    let mut second = client(&node).await;
    assert_eq!(
        second.read().await,
        Value::Error("ERR max number of clients reached".to_owned())
    );
    assert!(second.closed().await);
    assert_eq!(first.call("PING").await, simple("PONG"));
    node.node.shutdown().await;
}

#[tokio::test]
async fn a_period_past_the_nodes_cap_is_an_error_reply_and_the_connection_stays_usable() {
    let node = start_node(|config| {
        let mut settings = RespSettings::on(([127, 0, 0, 1], 0).into());
        // Open: a refusal that reached the failure mode would be allowed.
        settings.failure_mode = RespFailureMode::Open;
        config.resp = Some(settings);
    })
    .await;
    let mut c = client(&node).await;
    // 32 days per unit: past the default --max-limit-period of 31 days.
    error_starting(
        &c.call("CL.THROTTLE k 0 1 2764800").await,
        "Cell error: period / count per period past this node's --max-limit-period",
    );
    assert_reply(
        &c.call("CL.THROTTLE k 0 1 2592000").await,
        [0, 1, 0, -1, 2592000],
    );
    node.node.shutdown().await;
}

#[tokio::test]
async fn buffered_bytes_count_against_the_node_budget() {
    // The smallest budget the node accepts with 1 KiB frames: room for eight connections'
    // read chunks (16 KiB each), not nine.
    let node = start_node(|config| {
        with_resp(config);
        config.limits.max_frame_bytes = 1024;
        config.limits.max_buffered_bytes = 2 * (1024 + 64 * 1024);
    })
    .await;
    let mut held = Vec::new();
    for i in 0..8 {
        let mut c = client(&node).await;
        assert_eq!(
            c.call("PING").await,
            simple("PONG"),
            "connection {i}: {:?}",
            node.node.buffered_bytes()
        );
        held.push(c);
    }
    let mut ninth = client(&node).await;
    error_starting(&ninth.read().await, "ERR floodgate is buffering too much");
    assert!(ninth.closed().await);
    // A connection closed gives its bytes back.
    drop(held.pop());
    let mut again = client(&node).await;
    let reply = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match again.call("PING").await {
                Value::Simple(pong) => return pong,
                // The closed one's task may not have ended yet: told so, connect again.
                _ => again = client(&node).await,
            }
        }
    })
    .await
    .expect("served once a connection closed");
    assert_eq!(reply, "PONG");
    node.node.shutdown().await;
}

/// `--resp-tls`: the front speaks TLS with the node's certificate, and a plaintext client gets
/// no reply from it. `--resp-client-auth`: only a caller with a certificate of the client CA
/// is served.
#[tokio::test]
async fn over_tls_the_front_presents_the_node_certificate_and_can_require_a_client_one() {
    let node = start_node(|c| {
        with_resp(c);
        c.resp.as_mut().unwrap().tls = true;
    })
    .await;
    let addr = node.node.resp_addr().unwrap();
    let mut c = RespClient::connect_tls(addr, &node.certs.ca, None)
        .await
        .expect("a TLS handshake");
    assert_eq!(c.call("PING").await, simple("PONG"));
    assert_reply(
        &c.call("CL.THROTTLE tls:1 2 3 3600").await,
        [0, 3, 2, -1, 1_200],
    );
    // A plaintext client gets at most a TLS alert, never a reply, and is closed.
    let mut plain = RespClient::connect(addr).await;
    plain.send(&words("PING")).await;
    let sent = plain.rest().await.expect("the connection is closed");
    assert!(
        !sent.starts_with(b"+"),
        "a plaintext client was served: {sent:?}"
    );
    node.node.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let certs = &floodgate_node::ensure_dev_certs(dir.path()).unwrap();
    let mut config = NodeConfig::for_tests(certs);
    config.tls.client_ca = Some(certs.client_ca.clone());
    with_resp(&mut config);
    let resp = config.resp.as_mut().unwrap();
    resp.tls = true;
    resp.client_auth = true;
    let node = floodgate_node::Node::start(config).await.unwrap();
    let addr = node.resp_addr().unwrap();
    let mut c = RespClient::connect_tls(
        addr,
        &certs.ca,
        Some((&certs.client_cert, &certs.client_key)),
    )
    .await
    .expect("a client certificate is accepted");
    assert_eq!(c.call("PING").await, simple("PONG"));
    for identity in [None, Some((&certs.node_cert, &certs.node_key))] {
        let identity = identity.map(|(c, k)| (c.as_path(), k.as_path()));
        let refused = match RespClient::connect_tls(addr, &certs.ca, identity).await {
            Err(_) => true,
            // TLS 1.3: the server's refusal of the certificate arrives after the client's
            // handshake completed, so it shows as a closed connection.
            Ok(mut c) => {
                c.send(&words("PING")).await;
                c.closed().await
            }
        };
        assert!(
            refused,
            "served without a client certificate of the client CA"
        );
    }
    node.shutdown().await;
}
