//! The RLS listener's gRPC over HTTP/2, served by the node's own HTTP/2 (`connection`), not a
//! general-purpose server. A connection is one task: each turn it reads what the caller sent,
//! decides every call that arrived whole, and writes every answer of the turn in one write.
//! The calls Envoy sends are small and unary, and a general server's per-stream machinery
//! (stream handles, header maps, a task or waker per call) was most of the front's cost per
//! call.
//!
//! Three methods are served: `ShouldRateLimit`, and gRPC health v1's `Check` and `Watch`. The
//! rest is refused as gRPC says: `UNIMPLEMENTED` for an unknown method or a compressed message,
//! HTTP 405 for a method other than POST, HTTP 415 for a body that is not gRPC, HTTP 431 for
//! headers over `MAX_HEADER_LIST_BYTES`, `RESOURCE_EXHAUSTED` for a message over the node's
//! frame limit, `DEADLINE_EXCEEDED` past the caller's `grpc-timeout` (at most `CALL_TIMEOUT`).
//!
//! What a connection can make the node hold is bounded in bytes both ways. A call's message is
//! read without giving the window back until it is whole, so unfinished messages stay within
//! the connection's window. An answer is sent only as the caller's window takes it, and at most
//! `MAX_STREAMS_PER_CONNECTION` calls are open; the node stops reading from a caller that does
//! not read what it is sent (`connection::MAX_UNWRITTEN_BYTES`). A connection idle for `IDLE_TIMEOUT` is
//! closed, so is one whose caller leaves a keepalive PING unanswered, and a stopping node
//! interrupts handshakes as well as calls.

mod connection;
mod frame;
mod grpc;
mod hpack;
mod stream;

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep, timeout};
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;

use self::connection::{Broken, Call, Connection};
use self::grpc::{Refusal, Route};
use super::incoming::HeldConnection;
use crate::config::{HANDSHAKE_TIMEOUT, HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT};

pub(crate) use self::grpc::CALL_TIMEOUT;

/// Most concurrent calls per HTTP/2 connection (Envoy multiplexes its calls over few).
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
/// Most bytes of one call's headers, decoded (Envoy sends a few hundred).
const MAX_HEADER_LIST_BYTES: usize = 16 * 1024;
/// A connection with no call open and none arriving for this long is closed (GOAWAY): it
/// would hold a place of `--max-connections`. Envoy opens a new one when it next calls.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Most bytes taken from the socket in one read.
const READ_BYTES: usize = 64 * 1024;
/// How long a closing connection may take to write its last frames (its GOAWAY).
const CLOSING_TIMEOUT: Duration = Duration::from_secs(1);

/// What answers `ShouldRateLimit` (the node's `RlsService`).
pub(crate) trait RateLimiter: Send + Sync + 'static {
    /// Answers one call; `message` is its request as it arrived, without the gRPC prefix, in a
    /// buffer of its own (read, it is held until answered).
    fn should_rate_limit(
        &self,
        message: Bytes,
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

/// How a connection ended.
enum Ended {
    /// As it should: the caller left, or the node closed it (idle, stopped).
    Closed,
    /// The caller broke HTTP/2: the node says GOAWAY with the reason.
    Broken(Broken),
    /// Anything else, said.
    Failed(String),
}

/// One connection: its calls until the caller closes it, it stays idle for `IDLE_TIMEOUT`, or
/// the node stops; then it says GOAWAY and answers the calls already open (for at most
/// CALL_TIMEOUT).
async fn serve_connection<T>(
    mut io: T,
    service: &impl RateLimiter,
    limits: Http2Limits,
    shutdown: watch::Receiver<bool>,
) -> Result<(), String>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    // A message is read whole before its window is given back, so one of the largest size
    // must fit a stream's window and the connection's.
    let whole_message = u32::try_from(limits.max_message.saturating_add(grpc::PREFIX_BYTES))
        .unwrap_or(u32::MAX)
        .min(crate::config::MAX_HTTP2_WINDOW);
    let stream_window = limits.stream_window.max(whole_message);
    let mut connection = Connection::new(connection::Limits {
        stream_window,
        connection_window: limits.connection_window.max(stream_window),
        max_message: limits.max_message,
        max_streams: MAX_STREAMS_PER_CONNECTION,
        max_header_list: MAX_HEADER_LIST_BYTES,
    });
    let mut driver = Driver {
        connection: &mut connection,
        input: BytesMut::with_capacity(READ_BYTES),
        start: |stream, message| {
            let deciding = service.should_rate_limit(message);
            async move { (stream, deciding.await) }
        },
        calls: FuturesUnordered::new(),
        unread: false,
        arrived: Vec::new(),
        max_message: limits.max_message,
        stopping: false,
        stop_by: None,
        shutdown: shutdown.clone(),
        handshake_by: Box::pin(tokio::time::sleep(HANDSHAKE_TIMEOUT)),
        deadline: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
        deadline_at: None,
        keepalive: Box::pin(tokio::time::sleep(HTTP2_KEEPALIVE_INTERVAL)),
        awaiting_pong: false,
        idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
        active: false,
        unflushed: false,
    };
    let mut stopped = std::pin::pin!(async move {
        let mut shutdown = shutdown;
        let _ = shutdown.wait_for(|stopping| *stopping).await;
    });
    let ended = poll_fn(|cx| driver.turn(&mut io, stopped.as_mut(), cx)).await;
    drop(driver);
    let outcome = match ended {
        Ended::Closed => Ok(()),
        Ended::Broken(broken) => {
            connection.go_away_broken(&broken);
            Err(format!("the caller broke HTTP/2: {}", broken.why))
        }
        Ended::Failed(why) => Err(why),
    };
    // The last frames (GOAWAY), then the close; a caller that does not take them is left.
    let _ = timeout(CLOSING_TIMEOUT, async {
        io.write_all(&connection.out).await?;
        io.shutdown().await
    })
    .await;
    outcome
}

/// A connection's task state around its `Connection`: the socket's turns, the calls being
/// decided, and the timers.
struct Driver<'a, F, G> {
    connection: &'a mut Connection,
    input: BytesMut,
    /// Starts deciding a `ShouldRateLimit` call.
    start: G,
    /// The decisions under way, each stopped if its stream closes first.
    calls: FuturesUnordered<Abortable<F>>,
    /// Frames left in `input` while the caller's answers waited to be written.
    unread: bool,
    /// The calls a read completed, taken from the connection.
    arrived: Vec<Call>,
    max_message: usize,
    stopping: bool,
    /// When a closing connection (stopping, or idle) gives up on its open calls, and why it
    /// is closing.
    stop_by: Option<(Instant, &'static str)>,
    shutdown: watch::Receiver<bool>,
    handshake_by: Pin<Box<Sleep>>,
    /// Fires at the earliest deadline of the calls open (`deadline_at`).
    deadline: Pin<Box<Sleep>>,
    deadline_at: Option<Instant>,
    /// When the next keepalive PING goes or, with one out, when its caller is gone.
    keepalive: Pin<Box<Sleep>>,
    awaiting_pong: bool,
    idle: Pin<Box<Sleep>>,
    /// A call arrived since the idle timer last fired.
    active: bool,
    /// Bytes written that a flush has not yet seen through.
    unflushed: bool,
}

type Decided = (u32, Result<RateLimitResponse, Status>);

impl<F, G> Driver<'_, F, G>
where
    F: Future<Output = Decided>,
    G: FnMut(u32, Bytes) -> F,
{
    /// Turns until the connection ends: reads what arrived, starts and answers calls, minds
    /// the timers, and writes the turn's bytes.
    fn turn<T: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut T,
        mut stopped: Pin<&mut impl Future<Output = ()>>,
        cx: &mut Context<'_>,
    ) -> Poll<Ended> {
        loop {
            let mut again = false;
            if !self.stopping && stopped.as_mut().poll(cx).is_ready() {
                if !self.connection.established() {
                    return Poll::Ready(Ended::Closed);
                }
                self.stopping = true;
                self.close_within("the node began stopping");
            }
            let reading = self.connection.out.len() < connection::MAX_UNWRITTEN_BYTES;
            if reading && std::mem::take(&mut self.unread) {
                if let Err(broken) = self.read_frames() {
                    return Poll::Ready(Ended::Broken(broken));
                }
                again = true;
            } else if reading {
                self.input.reserve(READ_BYTES);
                match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, &mut self.input) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Ended::Closed),
                    Poll::Ready(Ok(_)) => {
                        if let Err(broken) = self.read_frames() {
                            return Poll::Ready(Ended::Broken(broken));
                        }
                        again = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(io_ended("reading", &e)),
                    Poll::Pending => {}
                }
            }
            self.start_calls();
            while let Poll::Ready(Some(decided)) = self.calls.poll_next_unpin(cx) {
                match decided {
                    Ok((stream, Ok(response))) => self.connection.answer(stream, &response),
                    Ok((stream, Err(status))) => {
                        self.connection.refuse(stream, &Refusal::Grpc(status));
                    }
                    // Its stream closed first.
                    Err(_aborted) => {}
                }
            }
            if self.stopping {
                self.connection.end_watches(&self.not_serving());
            }
            if let Poll::Ready(ended) = self.timers(cx) {
                return Poll::Ready(ended);
            }
            self.connection.give_back_window();
            let mut wrote = false;
            while !self.connection.out.is_empty() {
                match Pin::new(&mut *io).poll_write(cx, &self.connection.out) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Ended::Failed(
                            "the connection took no more bytes".to_owned(),
                        ));
                    }
                    Poll::Ready(Ok(n)) => {
                        self.connection.out.advance(n);
                        wrote = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(io_ended("writing", &e)),
                    Poll::Pending => break,
                }
            }
            // TLS may hold what it was given until flushed; a flush the socket put off is
            // tried again on the next turn.
            if wrote || self.unflushed {
                match Pin::new(&mut *io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(e)) => return Poll::Ready(io_ended("writing", &e)),
                    Poll::Pending => self.unflushed = true,
                }
            }
            again |= wrote && !reading;
            if self.connection.finished() && self.connection.out.is_empty() {
                return Poll::Ready(Ended::Closed);
            }
            if !again {
                return Poll::Pending;
            }
        }
    }

    /// Reads the frames in `input`; `unread` when some wait for the caller to read first.
    fn read_frames(&mut self) -> Result<(), Broken> {
        self.unread = self.connection.receive(&mut self.input, Instant::now())?;
        Ok(())
    }

    /// From now the connection closes once its calls are done, or fails them after
    /// CALL_TIMEOUT.
    fn close_within(&mut self, why: &'static str) {
        if self.stop_by.is_none() {
            self.stop_by = Some((Instant::now() + CALL_TIMEOUT, why));
        }
        self.connection.go_away();
    }

    /// Starts or answers each call the last read completed.
    fn start_calls(&mut self) {
        self.connection.take_calls(&mut self.arrived);
        for call in self.arrived.drain(..) {
            let stream = call.stream;
            // Reset in the same read it arrived in: nothing to decide.
            if !self.connection.deciding(stream) {
                continue;
            }
            match call.route {
                Route::ShouldRateLimit => {
                    // Read by the service in the call's own future: what it borrows from the
                    // message lives as long as the call.
                    let (stop, stopped) = AbortHandle::new_pair();
                    let deciding = (self.start)(stream, call.message);
                    self.calls.push(Abortable::new(deciding, stopped));
                    self.connection.decide_with(stream, stop);
                }
                Route::HealthCheck => {
                    let health = grpc::decode_health(call.message)
                        .and_then(|asked| grpc::health_of(&asked, *self.shutdown.borrow()));
                    match health {
                        Ok(health) => self.connection.answer(stream, &health),
                        Err(status) => self.connection.refuse(stream, &Refusal::Grpc(status)),
                    }
                }
                Route::HealthWatch => {
                    let asked = match grpc::decode_health(call.message) {
                        Ok(asked) => asked,
                        Err(status) => {
                            self.connection.refuse(stream, &Refusal::Grpc(status));
                            continue;
                        }
                    };
                    let now = grpc::health_of(&asked, *self.shutdown.borrow())
                        .unwrap_or_else(|_| grpc::serving(ServingStatus::ServiceUnknown));
                    match grpc::encode(&now, self.max_message) {
                        Ok(first) => {
                            let not_serving = now.status == ServingStatus::NotServing as i32;
                            self.connection.watch(stream, first, not_serving);
                        }
                        Err(status) => self.connection.refuse(stream, &Refusal::Grpc(status)),
                    }
                }
            }
        }
    }

    fn not_serving(&self) -> Bytes {
        grpc::encode(&grpc::serving(ServingStatus::NotServing), usize::MAX).unwrap_or_default()
    }

    /// The handshake's, the calls', the keepalive's and the idle timers; ready when one ends
    /// the connection.
    fn timers(&mut self, cx: &mut Context<'_>) -> Poll<Ended> {
        if !self.connection.established() && self.handshake_by.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ended::Failed(
                "the HTTP/2 preface did not arrive in time".to_owned(),
            ));
        }
        // The calls' deadlines and the stopping connection's, on one timer. Each firing ends
        // every call due, so this settles within a few rounds.
        for _ in 0..4 {
            let stop_by = self.stop_by.map(|(by, _)| by);
            let due = match (self.connection.next_deadline(), stop_by) {
                (Some(call), Some(stop)) => call.min(stop),
                (call, stop) => match call.or(stop) {
                    Some(due) => due,
                    None => break,
                },
            };
            if self.deadline_at != Some(due) {
                self.deadline.as_mut().reset(due);
                self.deadline_at = Some(due);
            }
            if self.deadline.as_mut().poll(cx).is_pending() {
                break;
            }
            let now = Instant::now();
            if let Some((_, why)) = self.stop_by.filter(|(by, _)| *by <= now) {
                let open = self.connection.open_streams();
                if open == 0 {
                    // Only the caller's answer to the GOAWAY's PING was missing.
                    return Poll::Ready(Ended::Closed);
                }
                return Poll::Ready(Ended::Failed(format!(
                    "{open} calls were still open {CALL_TIMEOUT:?} after {why}"
                )));
            }
            self.connection.expire(now);
            self.deadline_at = None;
        }
        // Keepalive: a PING every HTTP2_KEEPALIVE_INTERVAL, which the caller must answer within
        // HTTP2_KEEPALIVE_TIMEOUT. Calls and the idle timer cannot tell a caller that vanished
        // from one holding a Watch open: a caller whose machine is gone answers nothing.
        loop {
            if self.awaiting_pong && self.connection.take_pong() {
                self.awaiting_pong = false;
                let next = Instant::now() + HTTP2_KEEPALIVE_INTERVAL;
                self.keepalive.as_mut().reset(next);
            }
            if self.keepalive.as_mut().poll(cx).is_pending() {
                break;
            }
            if self.awaiting_pong {
                return Poll::Ready(Ended::Failed(format!(
                    "the caller left a keepalive PING unanswered for {HTTP2_KEEPALIVE_TIMEOUT:?}"
                )));
            }
            self.connection.ping();
            self.awaiting_pong = true;
            let gone_at = Instant::now() + HTTP2_KEEPALIVE_TIMEOUT;
            self.keepalive.as_mut().reset(gone_at);
        }
        // The idle timer is moved on only when it fires, not at every turn: a connection is
        // closed after one to two IDLE_TIMEOUTs without a call.
        self.active |= self.connection.take_opened();
        while self.stop_by.is_none() && self.idle.as_mut().poll(cx).is_ready() {
            if !std::mem::take(&mut self.active) && self.connection.open_streams() == 0 {
                // Closed as a stopping node closes it: calls already on their way are served.
                self.close_within("the connection went idle");
                break;
            }
            self.idle.as_mut().reset(Instant::now() + IDLE_TIMEOUT);
        }
        Poll::Pending
    }
}

/// An I/O error's end: a caller that hung up has done nothing wrong.
fn io_ended(doing: &str, e: &io::Error) -> Ended {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::UnexpectedEof => Ended::Closed,
        _ => Ended::Failed(format!("{doing}: {e}")),
    }
}
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use h2::RecvStream;
    use http::header::CONTENT_TYPE;
    use http::{Method, Request, StatusCode};
    use prost::Message;
    use tokio::io::ReadBuf;
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

    use super::grpc::{
        HEALTH_CHECK, HEALTH_WATCH, PREFIX_BYTES, SHOULD_RATE_LIMIT, encode, unframe,
    };
    use super::*;

    /// Allows every call: these tests are about the transport, not the decisions.
    struct AllowsAll;

    impl RateLimiter for AllowsAll {
        async fn should_rate_limit(&self, message: Bytes) -> Result<RateLimitResponse, Status> {
            let request = RateLimitRequest::decode(message)
                .map_err(|e| Status::invalid_argument(format!("not a RateLimitRequest: {e}")))?;
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
            .get("grpc-status")
            .or(head.headers.get("grpc-status"))
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
            Bytes::from_static(b"\0\0\0\0\x03\xff\xff\xff"),
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
}
