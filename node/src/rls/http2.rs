//! The RLS listener's gRPC over HTTP/2, on the `h2` crate directly (hyper and tonic are built on
//! it). A connection is one task: each turn it takes every call the connection has read, runs
//! every call that can go on, and only then lets the connection write, so the answers of a
//! connection's concurrent calls leave in one write. A task per call (tonic's server) woke the
//! connection once per answer and wrote about one `writev` per call, the largest part of the
//! front's cost per call.
//!
//! Three methods are served: `ShouldRateLimit`, and gRPC health v1's `Check` and `Watch`. The
//! rest is refused as gRPC says: `UNIMPLEMENTED` for an unknown method or a compressed message,
//! HTTP 405 for a method other than POST, HTTP 415 for a body that is not gRPC,
//! `RESOURCE_EXHAUSTED` for a message over the node's frame limit, `DEADLINE_EXCEEDED` past the
//! caller's `grpc-timeout` (at most `CALL_TIMEOUT`).
//!
//! What a connection can make the node hold is bounded in bytes both ways. A call's message is
//! read without giving the window back until it is whole, so unfinished messages stay within
//! the connection's window. An answer is sent only as the caller's window takes it, at most
//! `MAX_SEND_BUFFER_BYTES` queued per call. A connection idle for `IDLE_TIMEOUT` is closed, so
//! is one whose caller leaves a keepalive PING unanswered (`Keepalive`), and a stopping node
//! interrupts handshakes as well as calls.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::stream::{FuturesUnordered, StreamExt};
use h2::RecvStream;
use h2::SendStream;
use h2::server::{Connection, SendResponse};
use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout, timeout_at};
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::incoming::HeldConnection;
use crate::config::{HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT};

/// Most concurrent calls per HTTP/2 connection (Envoy multiplexes its calls over few).
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
/// A call not answered in this time is refused (Envoy's own timeout is usually 20 ms to 1 s).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a TLS handshake and the HTTP/2 preface may take: a caller that stalls them holds a
/// place of the listener's allowance.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of one call's headers, decoded (Envoy sends a few hundred).
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Most bytes of one call's answer queued at once: h2 assigns a call at most this much of the
/// caller's window, and the rest waits for the window to move. With at most
/// `MAX_STREAMS_PER_CONNECTION` calls, a connection that stops reading holds at most 16 MiB of
/// answers (a stream with queued bytes still counts as open).
const MAX_SEND_BUFFER_BYTES: usize = 16 * 1024;
/// A connection with no call open and nothing arriving for this long is closed (GOAWAY): it
/// would hold a place of `--max-connections`. Envoy opens a new one when it next calls.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A gRPC message's prefix: the compressed flag and the length, big-endian.
const PREFIX_BYTES: usize = 5;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
/// The services health answers SERVING for (the empty name is the server as a whole).
const HEALTHY_SERVICES: [&str; 2] = ["", "envoy.service.ratelimit.v3.RateLimitService"];

const GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// What answers `ShouldRateLimit` (the node's `RlsService`), given the request and its size in
/// bytes as it arrived.
pub(crate) trait RateLimiter: Send + Sync + 'static {
    fn should_rate_limit(
        &self,
        request: RateLimitRequest,
        bytes: usize,
    ) -> impl Future<Output = Result<RateLimitResponse, Status>> + Send;
}

/// What the node's limits allow a connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Http2Limits {
    pub(crate) stream_window: u32,
    pub(crate) connection_window: u32,
    /// Most bytes of one message, either way.
    pub(crate) max_message: usize,
}

/// Serves the connections `incoming` hands over until it ends (the node is stopping), then
/// waits for each to finish its calls.
pub(crate) async fn serve(
    mut incoming: mpsc::Receiver<io::Result<HeldConnection>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    service: Arc<impl RateLimiter>,
    limits: Http2Limits,
    shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    while let Some(accepted) = incoming.recv().await {
        // Reap finished connections so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let connection = match accepted {
            Ok(connection) => connection,
            Err(e) => {
                tracing::debug!(error = %e, "RLS accept failed");
                continue;
            }
        };
        let (service, tls, shutdown) = (service.clone(), tls.clone(), shutdown.clone());
        connections.spawn(async move {
            let served = match tls {
                None => serve_connection(connection, &*service, limits, shutdown).await,
                Some(tls) => {
                    let handshake = timeout(HANDSHAKE_TIMEOUT, tls.accept(connection));
                    match unless_stopping(shutdown.clone(), handshake).await {
                        Some(Ok(Ok(stream))) => {
                            serve_connection(stream, &*service, limits, shutdown).await
                        }
                        Some(Ok(Err(e))) => Err(format!("TLS handshake failed: {e}")),
                        Some(Err(_)) => Err("the TLS handshake did not finish in time".to_owned()),
                        None => Ok(()),
                    }
                }
            };
            if let Err(e) = served {
                metrics::counter!("floodgate_rls_connection_errors_total").increment(1);
                tracing::debug!(error = %e, "an RLS connection ended with an error");
            }
        });
    }
    // Each connection saw the shutdown and drains within CALL_TIMEOUT.
    while connections.join_next().await.is_some() {}
}

/// `work`'s outcome, or `None` once the node begins stopping first.
async fn unless_stopping<F: Future>(
    mut shutdown: watch::Receiver<bool>,
    work: F,
) -> Option<F::Output> {
    tokio::select! {
        done = work => Some(done),
        _ = shutdown.wait_for(|stopping| *stopping) => None,
    }
}

/// One connection: its calls until the caller closes it, it stays idle for `IDLE_TIMEOUT`, or
/// the node stops; then it says GOAWAY and answers the calls already open (for at most
/// CALL_TIMEOUT).
async fn serve_connection<T>(
    io: T,
    service: &impl RateLimiter,
    limits: Http2Limits,
    shutdown: watch::Receiver<bool>,
) -> Result<(), String>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    // A message is read whole before its window is given back (`read_message`), so one of the
    // largest size must fit a stream's window and the connection's.
    let whole_message = u32::try_from(limits.max_message.saturating_add(PREFIX_BYTES))
        .unwrap_or(u32::MAX)
        .min(crate::config::MAX_HTTP2_WINDOW);
    let stream_window = limits.stream_window.max(whole_message);
    let handshake = h2::server::Builder::new()
        .initial_window_size(stream_window)
        .initial_connection_window_size(limits.connection_window.max(stream_window))
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_send_buffer_size(MAX_SEND_BUFFER_BYTES)
        .handshake::<_, Bytes>(io);
    let Some(handshake) =
        unless_stopping(shutdown.clone(), timeout(HANDSHAKE_TIMEOUT, handshake)).await
    else {
        return Ok(());
    };
    let mut connection = handshake
        .map_err(|_| "the HTTP/2 preface did not arrive in time".to_owned())?
        .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    let mut keepalive = Keepalive::new(
        connection
            .ping_pong()
            .ok_or("the HTTP/2 connection's pings were taken already")?,
    );
    let watchers_stop = shutdown.clone();
    let mut start =
        |request, respond| answer_call(service, limits, &watchers_stop, request, respond);
    let mut calls = FuturesUnordered::new();
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    let mut active = false;
    let ended = unless_stopping(
        shutdown,
        poll_fn(|cx| {
            let turned = turn(&mut connection, &mut calls, &mut start, &mut active, cx);
            if let Poll::Ready(ended) = turned {
                return Poll::Ready(Some(ended.map_err(|e| e.to_string())));
            }
            // After the turn, which sends a PING asked for and reads its PONG.
            if let Poll::Ready(gone) = keepalive.poll(cx) {
                return Poll::Ready(Some(Err(gone)));
            }
            // The timer is moved on only when it fires, not at every turn: a connection is
            // closed after one to two IDLE_TIMEOUTs without a call.
            while idle.as_mut().poll(cx).is_ready() {
                if !std::mem::take(&mut active) && calls.is_empty() {
                    return Poll::Ready(None);
                }
                idle.as_mut().reset(Instant::now() + IDLE_TIMEOUT);
            }
            Poll::Pending
        }),
    )
    .await
    .flatten();
    if let Some(ended) = ended {
        return ended;
    }
    connection.graceful_shutdown();
    match timeout(
        CALL_TIMEOUT,
        poll_fn(|cx| turn(&mut connection, &mut calls, &mut start, &mut active, cx)),
    )
    .await
    {
        // A caller that hangs up once told GOAWAY has done nothing wrong.
        Ok(Err(e)) if e.get_io().is_some_and(|io| hung_up(io.kind())) => Ok(()),
        Ok(ended) => ended.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "{} calls were still open {CALL_TIMEOUT:?} after the node began stopping",
            calls.len()
        )),
    }
}

/// A connection's keepalive: a PING every `HTTP2_KEEPALIVE_INTERVAL`, which the caller must
/// answer within `HTTP2_KEEPALIVE_TIMEOUT`. Calls and the idle timer cannot tell a caller that
/// vanished from one holding a `Watch` open: a caller whose machine is gone answers nothing.
struct Keepalive {
    pings: h2::PingPong,
    /// When the next PING goes or, with one out, when its caller is gone.
    due: Pin<Box<tokio::time::Sleep>>,
    awaiting_pong: bool,
}

impl Keepalive {
    fn new(pings: h2::PingPong) -> Self {
        Keepalive {
            pings,
            due: Box::pin(tokio::time::sleep(HTTP2_KEEPALIVE_INTERVAL)),
            awaiting_pong: false,
        }
    }

    /// Ready, saying why, once the caller left a PING unanswered; the connection must be
    /// polled too, to send the PING and read the PONG.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<String> {
        loop {
            if self.awaiting_pong {
                match self.pings.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.awaiting_pong = false;
                        let next = Instant::now() + HTTP2_KEEPALIVE_INTERVAL;
                        self.due.as_mut().reset(next);
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(format!("keepalive: {e}")),
                    Poll::Pending => {}
                }
            }
            if self.due.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.awaiting_pong {
                return Poll::Ready(format!(
                    "the caller left a keepalive PING unanswered for {HTTP2_KEEPALIVE_TIMEOUT:?}"
                ));
            }
            if let Err(e) = self.pings.send_ping(h2::Ping::opaque()) {
                return Poll::Ready(format!("keepalive: {e}"));
            }
            self.awaiting_pong = true;
            let gone_at = Instant::now() + HTTP2_KEEPALIVE_TIMEOUT;
            self.due.as_mut().reset(gone_at);
        }
    }
}

fn hung_up(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
    )
}

/// One turn of a connection: first every call it has read (reading also writes out, at once,
/// what the calls answered since the last turn), then every call that can go on. An answer wakes
/// this task, whose next turn writes it with the others of this turn. Sets `active` when a call
/// arrived or is still open.
fn turn<T, F>(
    connection: &mut Connection<T, Bytes>,
    calls: &mut FuturesUnordered<F>,
    start: &mut impl FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    active: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<Result<(), h2::Error>>
where
    T: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    loop {
        match connection.poll_accept(cx) {
            Poll::Ready(Some(Ok((request, respond)))) => {
                *active = true;
                calls.push(start(request, respond));
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
            Poll::Ready(None) => return Poll::Ready(Ok(())),
            Poll::Pending => break,
        }
    }
    while let Poll::Ready(Some(())) = calls.poll_next_unpin(cx) {}
    *active |= !calls.is_empty();
    Poll::Pending
}

/// The methods served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    ShouldRateLimit,
    HealthCheck,
    HealthWatch,
}

/// What a call gets instead of being served.
#[derive(Debug)]
enum Refusal {
    /// Not gRPC at all: an HTTP status.
    Http(StatusCode),
    Grpc(Status),
}

/// `application/grpc`, alone or with a `+codec` or `;parameters` (not grpc-web's framing).
fn is_grpc_content_type(value: &[u8]) -> bool {
    value
        .strip_prefix(b"application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

fn route(head: &http::request::Parts) -> Result<Route, Refusal> {
    if head.method != Method::POST {
        return Err(Refusal::Http(StatusCode::METHOD_NOT_ALLOWED));
    }
    let grpc = head
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|t| is_grpc_content_type(t.as_bytes()));
    if !grpc {
        return Err(Refusal::Http(StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }
    match head.uri.path() {
        SHOULD_RATE_LIMIT => Ok(Route::ShouldRateLimit),
        HEALTH_CHECK => Ok(Route::HealthCheck),
        HEALTH_WATCH => Ok(Route::HealthWatch),
        other => {
            let shown: String = other.chars().take(200).collect();
            Err(Refusal::Grpc(Status::unimplemented(format!(
                "no method `{shown}` here: this listener serves {SHOULD_RATE_LIMIT} and gRPC health"
            ))))
        }
    }
}

async fn answer_call(
    service: &impl RateLimiter,
    limits: Http2Limits,
    shutdown: &watch::Receiver<bool>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let (head, mut body) = request.into_parts();
    let routed = route(&head).and_then(|route| Ok((route, asked_timeout(&head.headers)?)));
    let (route, asked) = match routed {
        Ok(routed) => routed,
        Err(refusal) => return refuse(&mut respond, &refusal),
    };
    if route == Route::HealthWatch {
        // A watch is not held to CALL_TIMEOUT: it lasts as long as its caller asked, or
        // until the node stops.
        let until = asked.map(|asked| Instant::now() + asked);
        return watch_health(limits, body, respond, shutdown.clone(), until).await;
    }
    let deadline = call_deadline(asked);
    let until = Instant::now() + deadline;
    let answering = timeout_at(until, async {
        let message = read_message(&mut body, limits.max_message).await?;
        match route {
            Route::ShouldRateLimit => {
                let bytes = message.len();
                let request = RateLimitRequest::decode(message).map_err(|e| {
                    Status::invalid_argument(format!("not a RateLimitRequest: {e}"))
                })?;
                let response = service.should_rate_limit(request, bytes).await?;
                encode(&response, limits.max_message)
            }
            Route::HealthCheck | Route::HealthWatch => {
                let status = health_of(&decode_health(message)?, *shutdown.borrow())?;
                encode(&status, limits.max_message)
            }
        }
    });
    // A call its caller reset is dropped at once: h2 no longer counts its stream against the
    // connection's limit, so it must not hold the budget or the check path either.
    let answered = tokio::select! {
        answered = answering => answered.unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!("not answered within {deadline:?}")))
        }),
        _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
    };
    match answered {
        // Past the deadline, or reset, while waiting for the caller's window: the stream is
        // dropped, which resets it and frees what was queued.
        Ok(message) => {
            let _ = timeout_at(until, answer(&mut respond, message)).await;
        }
        Err(status) => refuse(&mut respond, &Refusal::Grpc(status)),
    }
}

/// A unary call's deadline: the caller's `grpc-timeout`, at most CALL_TIMEOUT (CALL_TIMEOUT
/// without one).
fn call_deadline(asked: Option<Duration>) -> Duration {
    asked.map_or(CALL_TIMEOUT, |asked| asked.min(CALL_TIMEOUT))
}

/// The caller's `grpc-timeout`, if it sent one.
fn asked_timeout(headers: &HeaderMap) -> Result<Option<Duration>, Refusal> {
    let Some(value) = headers.get(GRPC_TIMEOUT) else {
        return Ok(None);
    };
    let parsed = parse_timeout(value.as_bytes()).ok_or_else(|| {
        Refusal::Grpc(Status::invalid_argument(format!(
            "grpc-timeout `{}` is not 1 to 8 digits and a unit (H, M, S, m, u or n)",
            String::from_utf8_lossy(&value.as_bytes()[..value.len().min(32)])
        )))
    })?;
    Ok(Some(parsed))
}

/// gRPC's timeout: at most eight ASCII digits, then H, M, S, m, u or n.
fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3_600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The one message of a unary call: the body, whole, refused past `max_message` bytes as it
/// arrives. The window is given back only once the message is whole: what a caller has sent of
/// unfinished messages then stays within the connection's window, where giving it back as it
/// was read let each of a connection's calls hold a message of the largest size. (A call
/// refused midway drops its stream, which gives its window back.)
async fn read_message(body: &mut RecvStream, max_message: usize) -> Result<Bytes, Status> {
    let most = max_message.saturating_add(PREFIX_BYTES);
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut held = 0;
    while let Some(chunk) = body.data().await {
        let chunk =
            chunk.map_err(|e| Status::cancelled(format!("the call's stream failed: {e}")))?;
        held += chunk.len();
        if held > most {
            return Err(over_limit(max_message));
        }
        // A message in one DATA frame (Envoy's usual) is kept as it arrived, without a copy.
        match first.take() {
            None if joined.is_empty() => first = Some(chunk),
            earlier => {
                if let Some(earlier) = earlier {
                    joined.extend_from_slice(&earlier);
                }
                joined.extend_from_slice(&chunk);
            }
        }
    }
    let _ = body.flow_control().release_capacity(held);
    unframe(first.unwrap_or_else(|| joined.freeze()), max_message)
}

fn over_limit(max_message: usize) -> Status {
    Status::resource_exhausted(format!(
        "the message is over {max_message} bytes, the node's --max-frame-bytes"
    ))
}

/// The message inside a unary call's body: exactly one, uncompressed.
fn unframe(body: Bytes, max_message: usize) -> Result<Bytes, Status> {
    let Some((prefix, _)) = body.split_first_chunk::<PREFIX_BYTES>() else {
        return Err(Status::internal("the call carried no message"));
    };
    match prefix[0] {
        0 => {}
        1 => {
            return Err(Status::unimplemented(
                "compressed messages are not accepted: send them uncompressed",
            ));
        }
        flag => {
            return Err(Status::internal(format!(
                "the message's compressed flag is {flag}: 0 or 1"
            )));
        }
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if length > max_message {
        return Err(over_limit(max_message));
    }
    let carried = body.len() - PREFIX_BYTES;
    if carried != length {
        return Err(Status::internal(format!(
            "a unary call carries one message of {length} bytes; this one carried {carried}"
        )));
    }
    Ok(body.slice(PREFIX_BYTES..))
}

/// `message`, prefixed for gRPC.
fn encode(message: &impl Message, max_message: usize) -> Result<Bytes, Status> {
    let length = message.encoded_len();
    if length > max_message {
        return Err(Status::internal(format!(
            "the answer is {length} bytes, over the node's --max-frame-bytes {max_message}"
        )));
    }
    let mut framed = BytesMut::with_capacity(PREFIX_BYTES + length);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message
        .encode(&mut framed)
        .map_err(|e| Status::internal(format!("encoding the answer: {e}")))?;
    Ok(framed.freeze())
}

fn decode_health(message: Bytes) -> Result<HealthCheckRequest, Status> {
    HealthCheckRequest::decode(message)
        .map_err(|e| Status::invalid_argument(format!("not a HealthCheckRequest: {e}")))
}

/// SERVING for the services served here, NOT_SERVING once the node is stopping (a load
/// balancer should send new calls elsewhere while it drains).
fn health_of(request: &HealthCheckRequest, stopping: bool) -> Result<HealthCheckResponse, Status> {
    if !HEALTHY_SERVICES.contains(&request.service.as_str()) {
        return Err(Status::not_found(format!(
            "no service `{}` here",
            request.service.chars().take(200).collect::<String>()
        )));
    }
    Ok(serving(if stopping {
        ServingStatus::NotServing
    } else {
        ServingStatus::Serving
    }))
}

fn serving(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

/// `Watch`: the status now, then NOT_SERVING when the node stops (the stream ends there), or
/// SERVICE_UNKNOWN for a service not served here. A caller's `grpc-timeout` (`until`) ends it
/// with DEADLINE_EXCEEDED.
async fn watch_health(
    limits: Http2Limits,
    mut body: RecvStream,
    mut respond: SendResponse<Bytes>,
    mut shutdown: watch::Receiver<bool>,
    until: Option<Instant>,
) {
    let asked = timeout(CALL_TIMEOUT, read_message(&mut body, limits.max_message))
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(
                "the Watch request did not arrive",
            ))
        })
        .and_then(decode_health);
    let request = match asked {
        Ok(request) => request,
        Err(status) => return refuse(&mut respond, &Refusal::Grpc(status)),
    };
    let now = match health_of(&request, *shutdown.borrow()) {
        Ok(status) => status,
        Err(_) => serving(ServingStatus::ServiceUnknown),
    };
    let (Ok(first), Ok(last)) = (
        encode(&now, limits.max_message),
        encode(&serving(ServingStatus::NotServing), limits.max_message),
    ) else {
        return;
    };
    let Ok(mut stream) = respond.send_response(grpc_head(), false) else {
        return;
    };
    let deadline = async {
        match until {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        // Bounded by the caller's window like any answer; a caller that never takes it is
        // ended by its own deadline or the node's stop.
        sent = async {
            send_within_window(&mut stream, first, false).await?;
            tokio::select! {
                _ = shutdown.wait_for(|stopping| *stopping) => {}
                // The caller cancelled the watch: h2 no longer counts its stream, so neither
                // may this connection's calls.
                reset = poll_fn(|cx| stream.poll_reset(cx)) => {
                    return Err(reset.map_or_else(|e| e, h2::Error::from));
                }
            }
            if now.status != ServingStatus::NotServing as i32 {
                send_within_window(&mut stream, last, false).await?;
            }
            Ok::<_, h2::Error>(())
        } => {
            if sent.is_ok() {
                let _ = stream.send_trailers(ok_trailers());
            }
        }
        () = deadline => {
            let status = Status::deadline_exceeded("the Watch reached the caller's grpc-timeout");
            let _ = stream.send_trailers(status_trailers(&status));
        }
    }
}

fn grpc_head() -> Response<()> {
    let mut head = Response::new(());
    head.headers_mut().insert(CONTENT_TYPE, GRPC_CONTENT_TYPE);
    head
}

/// `status` as gRPC's trailers (or a trailers-only answer's headers).
fn status_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    trailers.insert(GRPC_STATUS, HeaderValue::from(status.code() as i32));
    if let Ok(message) = HeaderValue::from_str(&percent_encoded(status.message())) {
        trailers.insert(GRPC_MESSAGE, message);
    }
    trailers
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    trailers
}

/// A unary call's answer: its message, then the OK trailers. A caller gone meanwhile is not
/// answered.
async fn answer(respond: &mut SendResponse<Bytes>, message: Bytes) {
    let Ok(mut stream) = respond.send_response(grpc_head(), false) else {
        return;
    };
    if send_within_window(&mut stream, message, false)
        .await
        .is_ok()
    {
        let _ = stream.send_trailers(ok_trailers());
    }
}

/// Sends `data` as the caller's window takes it: h2 queues whatever `send_data` is given, so
/// a caller that opens no window would make the node hold every answer. At once when the
/// window has room (the usual case: Envoy's windows are large).
async fn send_within_window(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
) -> Result<(), h2::Error> {
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let mut granted = stream.capacity();
        while granted == 0 {
            granted = match poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(granted) => granted?,
                // The stream was closed (reset by the caller).
                None => return Err(h2::Error::from(h2::Reason::CANCEL)),
            };
        }
        let piece = data.split_to(granted.min(data.len()));
        stream.send_data(piece, end && data.is_empty())?;
    }
    Ok(())
}

/// A refusal: gRPC's trailers-only answer (the status in the headers, the stream ended), or an
/// HTTP status for what is not gRPC.
fn refuse(respond: &mut SendResponse<Bytes>, refusal: &Refusal) {
    let head = match refusal {
        Refusal::Http(code) => {
            let mut head = Response::new(());
            *head.status_mut() = *code;
            head
        }
        Refusal::Grpc(status) => {
            let mut head = grpc_head();
            head.headers_mut().extend(status_trailers(status));
            head
        }
    };
    let _ = respond.send_response(head, true);
}

/// `grpc-message`'s encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encoded(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use tokio::io::ReadBuf;

    use super::*;

    /// Allows every call: these tests are about the transport, not the decisions.
    struct AllowsAll;

    impl RateLimiter for AllowsAll {
        async fn should_rate_limit(
            &self,
            request: RateLimitRequest,
            _bytes: usize,
        ) -> Result<RateLimitResponse, Status> {
            assert_eq!(request.domain, "edge");
            Ok(RateLimitResponse {
                overall_code: Code::Ok as i32,
                ..Default::default()
            })
        }
    }

    /// The server's end of the connection, counting the writes that carried bytes.
    struct CountedWrites {
        io: tokio::io::DuplexStream,
        writes: Arc<AtomicUsize>,
    }

    impl AsyncRead for CountedWrites {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for CountedWrites {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.io).poll_write(cx, buf);
            if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            written
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    const LIMITS: Http2Limits = Http2Limits {
        stream_window: 64 * 1024,
        connection_window: 1024 * 1024,
        max_message: 4_096,
    };

    /// A served connection and an h2 client on it, in memory; the count of the server's writes.
    async fn connected() -> (h2::client::SendRequest<Bytes>, Arc<AtomicUsize>) {
        let mut served = Served::start(LIMITS);
        let client = served.client(&h2::client::Builder::new()).await;
        // Never stopped: the test ends first.
        std::mem::forget(served.stop);
        (client, served.writes)
    }

    /// A connection's server half, not yet spoken to.
    struct Served {
        client_io: Option<tokio::io::DuplexStream>,
        writes: Arc<AtomicUsize>,
        stop: watch::Sender<bool>,
        server: tokio::task::JoinHandle<Result<(), String>>,
    }

    impl Served {
        fn start(limits: Http2Limits) -> Served {
            let (client_io, server_io) = tokio::io::duplex(1 << 20);
            let writes = Arc::new(AtomicUsize::new(0));
            let server_io = CountedWrites {
                io: server_io,
                writes: writes.clone(),
            };
            let (stop, stopping) = watch::channel(false);
            let server = tokio::spawn(async move {
                serve_connection(server_io, &AllowsAll, limits, stopping).await
            });
            Served {
                client_io: Some(client_io),
                writes,
                stop,
                server,
            }
        }

        /// An h2 client made by `builder` on the connection (which it takes).
        async fn client(
            &mut self,
            builder: &h2::client::Builder,
        ) -> h2::client::SendRequest<Bytes> {
            let io = self.client_io.take().expect("one client a connection");
            let (client, connection) = builder.handshake(io).await.unwrap();
            tokio::spawn(connection);
            client
        }
    }

    /// Sends one call with `body` on `path` and returns the pending answer.
    fn send(
        client: &mut h2::client::SendRequest<Bytes>,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> h2::client::ResponseFuture {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://rls{path}"))
            .header(CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap();
        let (answer, mut stream) = client.send_request(request, false).unwrap();
        stream.send_data(body, true).unwrap();
        answer
    }

    fn should_rate_limit() -> Bytes {
        encode(
            &RateLimitRequest {
                domain: "edge".into(),
                ..Default::default()
            },
            LIMITS.max_message,
        )
        .unwrap()
    }

    /// The HTTP status, the grpc-status (from the trailers, or the headers of a trailers-only
    /// answer) and the message's bytes.
    async fn answered(answer: h2::client::ResponseFuture) -> (StatusCode, Option<String>, Bytes) {
        let (head, mut body) = answer.await.unwrap().into_parts();
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            message.extend_from_slice(&chunk.unwrap());
        }
        let trailers = body.trailers().await.unwrap().unwrap_or_default();
        let status = trailers
            .get(GRPC_STATUS)
            .or(head.headers.get(GRPC_STATUS))
            .map(|s| s.to_str().unwrap().to_owned());
        (head.status, status, message.freeze())
    }

    #[tokio::test]
    async fn the_answers_to_a_connections_concurrent_calls_leave_in_one_write() {
        let (mut client, writes) = connected().await;
        // A first call: the handshake's settings and their acknowledgements are behind it.
        let first = send(
            &mut client,
            Method::POST,
            SHOULD_RATE_LIMIT,
            should_rate_limit(),
        );
        assert_eq!(answered(first).await.1.as_deref(), Some("0"));
        let before = writes.load(Ordering::Relaxed);
        let calls: Vec<_> = (0..32)
            .map(|_| {
                send(
                    &mut client,
                    Method::POST,
                    SHOULD_RATE_LIMIT,
                    should_rate_limit(),
                )
            })
            .collect();
        for call in calls {
            let (http, grpc, message) = answered(call).await;
            assert_eq!((http, grpc.as_deref()), (StatusCode::OK, Some("0")));
            let response = RateLimitResponse::decode(unframe(message, 4_096).unwrap()).unwrap();
            assert_eq!(response.overall_code, Code::Ok as i32);
        }
        let writes = writes.load(Ordering::Relaxed) - before;
        assert_eq!(
            writes, 1,
            "32 calls sent together were answered in {writes} writes"
        );
    }

    #[tokio::test]
    async fn what_is_not_a_served_grpc_call_is_refused_on_its_own_stream() {
        let (mut client, _) = connected().await;
        let unknown = send(
            &mut client,
            Method::POST,
            "/pkg.Other/Call",
            should_rate_limit(),
        );
        let not_post = send(
            &mut client,
            Method::PUT,
            SHOULD_RATE_LIMIT,
            should_rate_limit(),
        );
        let mut oversized = vec![0, 0, 0, 0x20, 0];
        oversized.resize(5 + 8_192, 0);
        let too_big = send(
            &mut client,
            Method::POST,
            SHOULD_RATE_LIMIT,
            oversized.into(),
        );
        let garbage = send(
            &mut client,
            Method::POST,
            SHOULD_RATE_LIMIT,
            framed(0, 3, &[0xff; 3]),
        );
        let health = send(
            &mut client,
            Method::POST,
            HEALTH_CHECK,
            encode(&HealthCheckRequest::default(), 4_096).unwrap(),
        );
        let code = |n: tonic::Code| Some((n as i32).to_string());
        assert_eq!(answered(unknown).await.1, code(tonic::Code::Unimplemented));
        assert_eq!(answered(not_post).await.0, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            answered(too_big).await.1,
            code(tonic::Code::ResourceExhausted)
        );
        assert_eq!(
            answered(garbage).await.1,
            code(tonic::Code::InvalidArgument)
        );
        let (_, status, message) = answered(health).await;
        assert_eq!(status, code(tonic::Code::Ok));
        let health = HealthCheckResponse::decode(unframe(message, 4_096).unwrap()).unwrap();
        assert_eq!(health.status, ServingStatus::Serving as i32);
        // The connection still serves after all that.
        let after = send(
            &mut client,
            Method::POST,
            SHOULD_RATE_LIMIT,
            should_rate_limit(),
        );
        assert_eq!(answered(after).await.1, code(tonic::Code::Ok));
    }

    /// A call on `path` with `headers` whose body is sent by the caller (not ended).
    fn open_call(
        client: &mut h2::client::SendRequest<Bytes>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://rls{path}"))
            .header(CONTENT_TYPE, "application/grpc");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        client
            .send_request(request.body(()).unwrap(), false)
            .unwrap()
    }

    /// A ShouldRateLimit message of exactly `bytes` bytes with its prefix (a descriptor's value
    /// pads it).
    fn message_of(bytes: usize) -> Bytes {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
            RateLimitDescriptor, rate_limit_descriptor::Entry,
        };
        let mut padding = bytes;
        loop {
            let request = RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "k".into(),
                        value: "x".repeat(padding),
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            };
            let framed = PREFIX_BYTES + request.encoded_len();
            if framed == bytes {
                return encode(&request, usize::MAX).unwrap();
            }
            // The lengths' varints shrink with the value: a few rounds settle it.
            padding = padding + bytes - framed;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unfinished_message_keeps_its_window_until_its_call_ends() {
        // A stream's window holds one message of the largest size, the connection's HTTP/2's
        // least (65,535 bytes): what callers have sent of unfinished messages is held within
        // it, not a message per call.
        let limits = Http2Limits {
            stream_window: 0,
            connection_window: 0,
            max_message: 40_000,
        };
        let mut served = Served::start(limits);
        let mut client = served.client(&h2::client::Builder::new()).await;
        let whole = message_of(39_500);
        let (first, mut first_body) = open_call(&mut client, SHOULD_RATE_LIMIT, &[]);
        first_body.send_data(whole.slice(..39_000), false).unwrap();
        // 26,535 bytes of the connection's window are left: a call of 30,000 cannot finish.
        let (second, mut second_body) = open_call(&mut client, SHOULD_RATE_LIMIT, &[]);
        second_body.send_data(message_of(30_000), true).unwrap();
        let mut second = std::pin::pin!(answered(second));
        assert!(
            timeout(Duration::from_secs(1), &mut second).await.is_err(),
            "the first call's 39,000 bytes still hold the window"
        );
        // Neither can finish: both end at the call deadline, and their windows come back.
        first_body.send_data(whole.slice(39_000..), true).unwrap();
        let deadline = Some((tonic::Code::DeadlineExceeded as i32).to_string());
        assert_eq!(answered(first).await.1, deadline);
        assert_eq!(second.await.1, deadline);
        let after = send(
            &mut client,
            Method::POST,
            SHOULD_RATE_LIMIT,
            message_of(39_500),
        );
        assert_eq!(answered(after).await.1.as_deref(), Some("0"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_waits_for_the_callers_window_and_ends_at_the_deadline() {
        let mut served = Served::start(LIMITS);
        // The caller opens no window for the answers at all.
        let mut client = served
            .client(h2::client::Builder::new().initial_window_size(0))
            .await;
        let (answer, mut body) =
            open_call(&mut client, SHOULD_RATE_LIMIT, &[("grpc-timeout", "200m")]);
        body.send_data(should_rate_limit(), true).unwrap();
        let (head, mut answer_body) = answer.await.unwrap().into_parts();
        assert_eq!(
            head.status,
            StatusCode::OK,
            "headers are not flow-controlled"
        );
        // The message never fits the window: the call is reset at its deadline rather than
        // left queued.
        let ended = timeout(Duration::from_secs(1), answer_body.data()).await;
        let reset = ended.expect("the call ends at its deadline");
        assert!(
            matches!(&reset, Some(Err(e)) if e.reason() == Some(h2::Reason::CANCEL)),
            "{reset:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_and_one_with_a_call_open_is_not() {
        let mut idle = Served::start(LIMITS);
        let mut client = idle.client(&h2::client::Builder::new()).await;
        let call = send(
            &mut client,
            Method::POST,
            SHOULD_RATE_LIMIT,
            should_rate_limit(),
        );
        assert_eq!(answered(call).await.1.as_deref(), Some("0"));
        let mut server = idle.server;
        assert!(
            timeout(IDLE_TIMEOUT, &mut server).await.is_err(),
            "a connection used within the timeout stays"
        );
        let closed = timeout(2 * IDLE_TIMEOUT, server).await;
        assert_eq!(closed.expect("closed once idle").unwrap(), Ok(()));

        // A Watch is a call open: its connection stays however long it lasts.
        let mut watched = Served::start(LIMITS);
        let mut client = watched.client(&h2::client::Builder::new()).await;
        let mut statuses = watching(&mut client).await;
        assert!(
            timeout(10 * IDLE_TIMEOUT, &mut watched.server)
                .await
                .is_err()
        );
        // Stopping ends the watch with NOT_SERVING, and the connection.
        watched.stop.send(true).unwrap();
        let last = statuses.data().await.unwrap().unwrap();
        let last = HealthCheckResponse::decode(unframe(last, 4_096).unwrap()).unwrap();
        assert_eq!(last.status, ServingStatus::NotServing as i32);
        assert_eq!(watched.server.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_its_caller_cancels_is_no_longer_a_call_open() {
        let mut served = Served::start(LIMITS);
        let mut client = served.client(&h2::client::Builder::new()).await;
        let (answer, mut body) = open_call(&mut client, HEALTH_WATCH, &[]);
        body.send_data(encode(&HealthCheckRequest::default(), 4_096).unwrap(), true)
            .unwrap();
        let (_, mut statuses) = answer.await.unwrap().into_parts();
        assert!(statuses.data().await.unwrap().is_ok());
        body.send_reset(h2::Reason::CANCEL);
        // Nothing open: the connection is idle, and closed as such.
        let closed = timeout(3 * IDLE_TIMEOUT, served.server).await;
        assert_eq!(closed.expect("closed once idle").unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_ends_at_its_callers_deadline() {
        let mut served = Served::start(LIMITS);
        let mut client = served.client(&h2::client::Builder::new()).await;
        let (answer, mut body) = open_call(&mut client, HEALTH_WATCH, &[("grpc-timeout", "30S")]);
        body.send_data(encode(&HealthCheckRequest::default(), 4_096).unwrap(), true)
            .unwrap();
        let started = Instant::now();
        let (_, status, message) = answered(answer).await;
        assert_eq!(
            status,
            Some((tonic::Code::DeadlineExceeded as i32).to_string())
        );
        let lasted = started.elapsed();
        assert!(
            (30..31).contains(&lasted.as_secs()),
            "{lasted:?}: the caller's 30 s, not CALL_TIMEOUT"
        );
        let first = HealthCheckResponse::decode(unframe(message, 4_096).unwrap()).unwrap();
        assert_eq!(first.status, ServingStatus::Serving as i32);
    }

    /// Opens a health Watch on `client` and reads its first answer, SERVING.
    async fn watching(client: &mut h2::client::SendRequest<Bytes>) -> RecvStream {
        let (answer, mut body) = open_call(client, HEALTH_WATCH, &[]);
        body.send_data(encode(&HealthCheckRequest::default(), 4_096).unwrap(), true)
            .unwrap();
        let (_, mut statuses) = answer.await.unwrap().into_parts();
        let first = statuses.data().await.unwrap().unwrap();
        let first = HealthCheckResponse::decode(unframe(first, 4_096).unwrap()).unwrap();
        assert_eq!(first.status, ServingStatus::Serving as i32);
        statuses
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_leaves_a_keepalive_ping_unanswered_loses_its_connection() {
        // A caller that answers PINGs (h2's client does, as Envoy's codec does) keeps its
        // Watch over many keepalive intervals.
        let mut answering = Served::start(LIMITS);
        let mut client = answering.client(&h2::client::Builder::new()).await;
        let _statuses = watching(&mut client).await;
        assert!(
            timeout(5 * HTTP2_KEEPALIVE_INTERVAL, &mut answering.server)
                .await
                .is_err(),
            "answered PINGs keep the connection"
        );

        // The same Watch, then the caller's machine vanishes: its socket stays open, and
        // nothing it receives is answered any more.
        let mut vanishing = Served::start(LIMITS);
        let io = vanishing.client_io.take().unwrap();
        let (mut client, connection) = h2::client::Builder::new().handshake(io).await.unwrap();
        let (vanish, vanished) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = &mut connection => {}
                _ = vanished => std::future::pending::<()>().await,
            }
        });
        let _statuses = watching(&mut client).await;
        let started = Instant::now();
        vanish.send(()).unwrap();
        let ended = timeout(10 * HTTP2_KEEPALIVE_INTERVAL, vanishing.server)
            .await
            .expect("the connection is closed")
            .unwrap();
        let why = ended.unwrap_err();
        assert!(why.contains("keepalive PING unanswered"), "{why}");
        let waited = started.elapsed();
        assert!(
            waited > HTTP2_KEEPALIVE_INTERVAL
                && waited <= HTTP2_KEEPALIVE_INTERVAL + HTTP2_KEEPALIVE_TIMEOUT,
            "{waited:?}: one interval to the PING, then its timeout"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_node_does_not_wait_for_a_preface_that_never_comes() {
        let served = Served::start(LIMITS);
        // The caller connected and sent nothing.
        let _silent = served.client_io;
        served.stop.send(true).unwrap();
        let stopped = timeout(Duration::from_secs(1), served.server).await;
        assert_eq!(stopped.expect("not the handshake's 10 s").unwrap(), Ok(()));
    }

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_refuse_the_rest() {
        assert_eq!(parse_timeout(b"20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"7n"), Some(Duration::from_nanos(7)));
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"12x",
            b"-1S",
            b"1.5S",
            b"S1",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_timeout_is_held_to_the_call_timeout() {
        let mut headers = HeaderMap::new();
        let deadline = |headers: &HeaderMap| asked_timeout(headers).map(call_deadline);
        assert_eq!(deadline(&headers).unwrap(), CALL_TIMEOUT);
        headers.insert(GRPC_TIMEOUT, HeaderValue::from_static("250m"));
        assert_eq!(deadline(&headers).unwrap(), Duration::from_millis(250));
        headers.insert(GRPC_TIMEOUT, HeaderValue::from_static("1H"));
        assert_eq!(deadline(&headers).unwrap(), CALL_TIMEOUT);
        assert_eq!(
            asked_timeout(&headers).unwrap(),
            Some(Duration::from_secs(3_600)),
            "a Watch gets what it asked"
        );
        headers.insert(GRPC_TIMEOUT, HeaderValue::from_static("soon"));
        assert!(matches!(
            deadline(&headers),
            Err(Refusal::Grpc(s)) if s.code() == tonic::Code::InvalidArgument
        ));
    }

    fn framed(flag: u8, length: u32, payload: &[u8]) -> Bytes {
        let mut body = vec![flag];
        body.extend_from_slice(&length.to_be_bytes());
        body.extend_from_slice(payload);
        Bytes::from(body)
    }

    #[test]
    fn a_unary_body_holds_exactly_one_uncompressed_message_within_the_limit() {
        assert_eq!(unframe(framed(0, 3, b"abc"), 10).unwrap(), &b"abc"[..]);
        assert_eq!(unframe(framed(0, 0, b""), 10).unwrap(), &b""[..]);
        let code = |body, max| unframe(body, max).unwrap_err().code();
        assert_eq!(code(Bytes::new(), 10), tonic::Code::Internal, "no message");
        assert_eq!(
            code(Bytes::from_static(b"\0\0\0"), 10),
            tonic::Code::Internal
        );
        assert_eq!(code(framed(1, 3, b"abc"), 10), tonic::Code::Unimplemented);
        assert_eq!(code(framed(2, 3, b"abc"), 10), tonic::Code::Internal);
        assert_eq!(
            code(framed(0, 11, &[0; 11]), 10),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(
            code(framed(0, 4, b"abc"), 10),
            tonic::Code::Internal,
            "cut short"
        );
        assert_eq!(
            code(framed(0, 2, b"abc"), 10),
            tonic::Code::Internal,
            "two messages"
        );
    }

    #[test]
    fn messages_round_trip_through_the_prefix_and_an_oversized_answer_is_refused() {
        let asked = HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        };
        let framed = encode(&asked, 1_000).unwrap();
        assert_eq!(framed[0], 0);
        assert_eq!(framed.len(), PREFIX_BYTES + asked.encoded_len());
        let back = decode_health(unframe(framed, 1_000).unwrap()).unwrap();
        assert_eq!(back, asked);
        assert_eq!(
            health_of(&back, false).unwrap().status,
            ServingStatus::Serving as i32
        );
        assert_eq!(
            encode(&asked, 10).unwrap_err().code(),
            tonic::Code::Internal
        );
    }

    #[test]
    fn health_knows_the_server_and_the_rls_service_only() {
        for served in HEALTHY_SERVICES {
            let asked = HealthCheckRequest {
                service: served.into(),
            };
            assert_eq!(
                health_of(&asked, false).unwrap().status,
                ServingStatus::Serving as i32
            );
            assert_eq!(
                health_of(&asked, true).unwrap().status,
                ServingStatus::NotServing as i32,
                "a draining node sends new calls elsewhere"
            );
        }
        let other = HealthCheckRequest {
            service: "grpc.reflection".into(),
        };
        assert_eq!(
            health_of(&other, false).unwrap_err().code(),
            tonic::Code::NotFound
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded_outside_printable_ascii() {
        assert_eq!(percent_encoded("plain text: ok"), "plain text: ok");
        assert_eq!(percent_encoded("100%"), "100%25");
        assert_eq!(percent_encoded("a\nb"), "a%0Ab");
        assert_eq!(percent_encoded("é"), "%C3%A9");
    }

    #[test]
    fn only_grpc_posts_to_the_served_methods_are_routed() {
        let head = |method: Method, path: &str, content_type: Option<&str>| {
            let mut request = Request::builder().method(method).uri(path);
            if let Some(t) = content_type {
                request = request.header(CONTENT_TYPE, t);
            }
            request.body(()).unwrap().into_parts().0
        };
        let grpc = Some("application/grpc");
        assert_eq!(
            route(&head(Method::POST, SHOULD_RATE_LIMIT, grpc)).unwrap(),
            Route::ShouldRateLimit
        );
        assert_eq!(
            route(&head(
                Method::POST,
                HEALTH_CHECK,
                Some("application/grpc+proto")
            ))
            .unwrap(),
            Route::HealthCheck
        );
        assert_eq!(
            route(&head(Method::POST, HEALTH_WATCH, grpc)).unwrap(),
            Route::HealthWatch
        );
        assert!(matches!(
            route(&head(Method::GET, SHOULD_RATE_LIMIT, grpc)),
            Err(Refusal::Http(StatusCode::METHOD_NOT_ALLOWED))
        ));
        assert!(matches!(
            route(&head(
                Method::POST,
                SHOULD_RATE_LIMIT,
                Some("application/json")
            )),
            Err(Refusal::Http(StatusCode::UNSUPPORTED_MEDIA_TYPE))
        ));
        assert!(matches!(
            route(&head(
                Method::POST,
                SHOULD_RATE_LIMIT,
                Some("application/grpc-web")
            )),
            Err(Refusal::Http(StatusCode::UNSUPPORTED_MEDIA_TYPE))
        ));
        assert!(matches!(
            route(&head(Method::POST, SHOULD_RATE_LIMIT, None)),
            Err(Refusal::Http(StatusCode::UNSUPPORTED_MEDIA_TYPE))
        ));
        assert!(matches!(
            route(&head(Method::POST, "/pkg.Other/Call", grpc)),
            Err(Refusal::Grpc(s)) if s.code() == tonic::Code::Unimplemented
        ));
    }
}
