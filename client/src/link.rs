//! One node's link: the reconnecting supervisor and the stream tasks that carry frames.
//!
//! The supervisor connects, and reconnects with backoff; stream tasks turn queued calls into
//! frames and answers back into replies.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use floodgate::wire::{
    CheckBatch, ErrorCode, Frame, FrameKind, FrameReader, WireDecision, decode_decisions,
    decode_error_frame, encode_frame,
};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::address::HostPort;
use crate::backoff::Backoff;
use crate::breaker::SharedBreaker;
use crate::config::{BackoffConfig, ClientConfig};
use crate::error::{ConfigError, is_bad_request};
use crate::queue::{Call, CallQueue, Reply};
use crate::slots::TableHint;
use floodgate::check::DegradedReason;

/// Largest answer frame accepted: a full batch of 4,096 decisions is about 130 KiB.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Where a node's connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// The first connection attempt is under way.
    Connecting,
    /// Connected (the handshake completed; with mutual TLS the node may still refuse us).
    Connected,
    /// No connection; reconnecting in the background with backoff.
    Disconnected,
}

/// A snapshot of one node's link, for health checks and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub addr: SocketAddr,
    pub state: LinkState,
    /// Why the last connection attempt failed or the last connection ended.
    pub last_error: Option<String>,
}

/// The link settings every task of every node reads.
#[derive(Debug)]
pub(crate) struct LinkSettings {
    connect_timeout: Duration,
    streams: usize,
    max_checks: usize,
    /// How long a stream waits for a late answer (its callers were answered `Timeout`) before
    /// giving up on the stream: frees a stream stuck on a node that stopped answering on it
    /// while the connection itself looks alive.
    stall_timeout: Duration,
    reconnect: BackoffConfig,
}

impl LinkSettings {
    pub(crate) fn new(config: &ClientConfig) -> Self {
        LinkSettings {
            connect_timeout: config.connect_timeout,
            streams: config.streams_per_connection,
            max_checks: config.max_checks_per_frame,
            stall_timeout: (config.timeout * 4).max(Duration::from_secs(1)),
            reconnect: config.reconnect,
        }
    }
}

/// Everything the client and the link's tasks share about one node.
#[derive(Debug)]
pub(crate) struct NodeLink {
    pub(crate) addr: SocketAddr,
    /// The name the node's certificate must carry (a seed's configured name or host, a
    /// member's node id).
    pub(crate) server_name: String,
    /// A seed given by DNS name: resolved again before every connection attempt (`addr` is
    /// then only what it resolved to first, or the unspecified address if it did not).
    name: Option<HostPort>,
    pub(crate) queue: CallQueue,
    pub(crate) breaker: SharedBreaker,
    state: watch::Sender<LinkState>,
    last_error: Mutex<Option<String>>,
    /// The current connection has answered at least one frame: only then is it healthy enough
    /// to reset the reconnect backoff (a node refusing our certificate completes the handshake
    /// and then closes; without this we would reconnect in a tight loop).
    answered: AtomicBool,
    /// Told the slot-table version of every answer (set once the client routes by tables).
    pub(crate) table_hint: std::sync::OnceLock<Arc<TableHint>>,
}

impl NodeLink {
    pub(crate) fn new(addr: SocketAddr, config: &ClientConfig) -> Self {
        NodeLink {
            addr,
            server_name: crate::tls::seed_server_name(config.server_name.as_deref(), addr),
            name: None,
            queue: CallQueue::new(config.max_queued_checks),
            breaker: SharedBreaker::new(config.breaker, config.timeout),
            state: watch::Sender::new(LinkState::Connecting),
            last_error: Mutex::new(None),
            answered: AtomicBool::new(false),
            table_hint: std::sync::OnceLock::new(),
        }
    }

    /// A link to a seed as given to `connect`, first resolved to `addr`: a name is resolved
    /// again on every connection attempt, and is the default name its certificate must carry.
    pub(crate) fn seed(seed: HostPort, addr: SocketAddr, config: &ClientConfig) -> Self {
        let server_name = config
            .server_name
            .clone()
            .unwrap_or_else(|| seed.host().to_owned());
        let name = seed.socket_addr().is_none().then_some(seed);
        NodeLink {
            name,
            ..NodeLink::new(addr, config).named(server_name)
        }
    }

    /// The same link verifying the node by `server_name` (a member by its node id).
    pub(crate) fn named(mut self, server_name: String) -> Self {
        self.server_name = server_name;
        self
    }

    /// True while the link has a connection (cheap: one watch read).
    pub(crate) fn is_connected(&self) -> bool {
        *self.state.borrow() == LinkState::Connected
    }

    /// True when the link had a connection and lost it (not while a new link first connects:
    /// its node may be up and deciding for others).
    pub(crate) fn is_down(&self) -> bool {
        *self.state.borrow() == LinkState::Disconnected
    }

    pub(crate) fn status(&self) -> NodeStatus {
        NodeStatus {
            addr: self.addr,
            state: *self.state.borrow(),
            last_error: self.last_error.lock().clone(),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// No connection: fail queued calls over and record why. Warns once per outage; repeated
    /// failed reconnect attempts are logged at debug level.
    fn went_down(&self, why: String) {
        self.queue.set_down();
        let state = *self.state.borrow();
        match state {
            LinkState::Disconnected => {
                tracing::debug!(node = %self.addr, "reconnect failed: {why}")
            }
            LinkState::Connecting => {
                tracing::warn!(node = %self.addr, "cannot reach floodgate node: {why}")
            }
            LinkState::Connected => {
                tracing::warn!(node = %self.addr, "lost connection to floodgate node: {why}")
            }
        }
        // The reason first: whoever waits for `Disconnected` may read it at once.
        *self.last_error.lock() = Some(why);
        self.state.send_replace(LinkState::Disconnected);
    }

    /// The client is closing: like `went_down`, but expected.
    fn closed(&self) {
        self.queue.set_down();
        self.state.send_replace(LinkState::Disconnected);
    }
}

/// The address a seed is first known by: itself, or what its name resolves to now (IPv4
/// first). A name that does not resolve yet gives the unspecified IPv4 address: the link keeps
/// trying, resolving again each time, and says why it cannot connect meanwhile.
pub(crate) async fn first_address(seed: &HostPort, timeout: Duration) -> SocketAddr {
    if let Some(addr) = seed.socket_addr() {
        return addr;
    }
    match crate::address::resolve(seed, timeout).await {
        Ok(addrs) => addrs[0],
        Err(why) => {
            tracing::warn!(node = %seed, "{why}; retrying in the background");
            (Ipv4Addr::UNSPECIFIED, seed.port()).into()
        }
    }
}

/// A client endpoint (one UDP socket and its driver task) for one node, so nodes do not share a
/// socket's single driver (quinn drives one endpoint from one task: about one core of work).
pub(crate) fn endpoint_for(
    node: SocketAddr,
    config: quinn::ClientConfig,
) -> Result<quinn::Endpoint, ConfigError> {
    let bind: SocketAddr = if node.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let mut endpoint =
        quinn::Endpoint::client(bind).map_err(|e| ConfigError::Socket(e.to_string()))?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// Resolves when the client is shutting down: the flag was set or every `Client` was dropped.
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

/// Times out queued calls nobody takes in time, until shutdown (see [`CallQueue::reap_expired`]).
pub(crate) async fn reap(link: Arc<NodeLink>, mut shutdown: watch::Receiver<bool>) {
    tokio::select! {
        () = shutdown_requested(&mut shutdown) => {}
        () = link.queue.reap_expired() => {}
    }
}

/// Keeps one node connected until shutdown: connect, start the stream tasks, wait for the
/// connection to end, back off, repeat. While no connection is up, calls fail over at once.
pub(crate) async fn supervise(
    link: Arc<NodeLink>,
    endpoint: quinn::Endpoint,
    settings: Arc<LinkSettings>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(settings.reconnect);
    let mut generation = 0u64;
    loop {
        let attempt = tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => break,
            attempt = dial(&endpoint, &link, settings.connect_timeout) => attempt,
        };
        match attempt {
            Ok(conn) => {
                generation += 1;
                link.answered.store(false, Ordering::Relaxed);
                link.breaker.reset();
                link.queue.set_up(generation);
                link.state.send_replace(LinkState::Connected);
                tracing::info!(node = %link.addr, "connected to floodgate node");
                if let Some(hint) = link.table_hint.get() {
                    // Ends with the connection.
                    tokio::spawn(crate::slots::follow_pushes(
                        conn.clone(),
                        hint.clone(),
                        link.addr,
                    ));
                }
                for _ in 0..settings.streams {
                    tokio::spawn(run_stream(
                        link.clone(),
                        conn.clone(),
                        generation,
                        settings.clone(),
                    ));
                }
                let ended = tokio::select! {
                    biased;
                    () = shutdown_requested(&mut shutdown) => {
                        conn.close(0u32.into(), b"client closed");
                        break;
                    }
                    ended = conn.closed() => ended,
                };
                if link.answered.load(Ordering::Relaxed) {
                    backoff.reset();
                }
                link.went_down(describe_connection_error(&ended));
            }
            Err(why) => link.went_down(why),
        }
        let delay = backoff.next();
        tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => break,
            () = tokio::time::sleep(delay) => {}
        }
    }
    link.closed();
    endpoint.close(0u32.into(), b"client closed");
    // Give the close frames a moment to leave, so nodes free the connection at once instead of
    // after their idle timeout; never hold up shutdown for long.
    let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
}

/// Connects to the link's node: a seed given by name is resolved now (a restarted node may
/// have a new address), the lookup and the handshake each bounded by `timeout`.
async fn dial(
    endpoint: &quinn::Endpoint,
    link: &NodeLink,
    timeout: Duration,
) -> Result<quinn::Connection, String> {
    let addr = match &link.name {
        Some(name) => crate::address::resolve_like(name, link.addr, timeout).await?,
        None => link.addr,
    };
    connect(endpoint, addr, &link.server_name, timeout).await
}

/// Connects to a node, the handshake bounded by `timeout`; the error says why in words.
pub(crate) async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    server_name: &str,
    timeout: Duration,
) -> Result<quinn::Connection, String> {
    let connecting = endpoint
        .connect(addr, server_name)
        .map_err(|e| format!("cannot start a connection: {e}"))?;
    // Awaited in full, never `into_0rtt`: checks must not travel as replayable early data.
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(describe_connection_error(&e)),
        Err(_) => Err(format!(
            "no handshake within {timeout:?} (is a node listening at {addr}?)"
        )),
    }
}

fn describe_connection_error(e: &quinn::ConnectionError) -> String {
    match e {
        quinn::ConnectionError::ApplicationClosed(close) => {
            let code = node_code(close.error_code);
            let reason = String::from_utf8_lossy(&close.reason);
            match code {
                Some(code) => format!("closed by the node: {code}: {reason}"),
                None => format!("closed by the node: {close}"),
            }
        }
        quinn::ConnectionError::ConnectionClosed(close) => {
            // TLS alerts arrive as CRYPTO_ERROR (0x100 + alert, RFC 9001 §4.8); name the two a
            // misconfigured gateway meets.
            let hint = match u64::from(close.error_code) {
                0x174 => " (the node requires a client certificate: set client_auth)",
                0x130 => " (the node does not trust our client certificate's CA)",
                _ => "",
            };
            format!("connection refused by the node: {close}{hint}")
        }
        other => format!("connection failed: {other}"),
    }
}

/// What came back for a frame.
#[derive(Debug)]
enum Answer {
    /// The decisions and the node's slot-table version.
    Decisions(Vec<WireDecision>, u64),
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Why a frame got no answer.
#[derive(Debug)]
struct Failure {
    reason: DegradedReason,
    detail: String,
    /// The stream is still in step: only the answer is late (its callers' deadline passed).
    /// Otherwise the stream is abandoned.
    keep_stream: bool,
}

impl Failure {
    fn new(reason: DegradedReason, detail: impl Into<String>) -> Self {
        Failure {
            reason,
            detail: detail.into(),
            keep_stream: false,
        }
    }

    fn timeout(detail: &str) -> Self {
        Failure::new(DegradedReason::Timeout, detail)
    }

    fn protocol(detail: impl Into<String>) -> Self {
        Failure::new(DegradedReason::Protocol, detail)
    }

    fn read(e: quinn::ReadError) -> Self {
        match e {
            quinn::ReadError::Reset(code) => {
                Failure::new(reason_for_stream_code(code), "stream reset")
            }
            quinn::ReadError::ConnectionLost(e) => {
                Failure::new(DegradedReason::Unreachable, describe_connection_error(&e))
            }
            other => Failure::new(DegradedReason::Unreachable, other.to_string()),
        }
    }

    fn write(e: quinn::WriteError) -> Self {
        match e {
            quinn::WriteError::Stopped(code) => {
                Failure::new(reason_for_stream_code(code), "stream stopped")
            }
            quinn::WriteError::ConnectionLost(e) => {
                Failure::new(DegradedReason::Unreachable, describe_connection_error(&e))
            }
            other => Failure::new(DegradedReason::Unreachable, other.to_string()),
        }
    }
}

/// The failure-mode reason for a code a node refused a frame with.
fn reason_for_code(code: ErrorCode) -> DegradedReason {
    match code {
        ErrorCode::ShuttingDown => DegradedReason::Unreachable,
        code => DegradedReason::Refused(code),
    }
}

/// The same for a QUIC stream error code (a node resetting or stopping a stream).
fn reason_for_stream_code(code: quinn::VarInt) -> DegradedReason {
    node_code(code).map_or(DegradedReason::Protocol, reason_for_code)
}

/// The node's error code a QUIC application code carries, if it is one.
fn node_code(code: quinn::VarInt) -> Option<ErrorCode> {
    u16::try_from(code.into_inner())
        .ok()
        .and_then(ErrorCode::from_u16)
}

/// An open bidirectional stream and the frames read from it so far.
#[derive(Debug)]
struct OpenStream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    reader: FrameReader,
}

/// One stream task's state: the stream (reopened after a failure), its request ids and buffers
/// reused across frames.
#[derive(Debug)]
struct StreamSession {
    conn: quinn::Connection,
    stream: Option<OpenStream>,
    next_id: u64,
    out: Vec<u8>,
    /// The archive of the frame being sent, reused: a fresh buffer per frame (tens of KiB)
    /// costs an allocation and, freed, a consolidation of the allocator's small bins.
    payload: rkyv::util::AlignedVec,
    stall_timeout: Duration,
    /// A frame whose callers were answered `Timeout` while its answer is still due: frames on a
    /// stream are answered in order, so that answer is read and dropped before the next frame.
    late: Option<u64>,
}

/// One stream's loop: take a batch of calls, send it as one frame, read the answer, hand each
/// caller its part; repeat until the connection is gone.
async fn run_stream(
    link: Arc<NodeLink>,
    conn: quinn::Connection,
    generation: u64,
    settings: Arc<LinkSettings>,
) {
    let mut session = StreamSession {
        conn,
        stream: None,
        next_id: 0,
        out: Vec::new(),
        payload: rkyv::util::AlignedVec::new(),
        stall_timeout: settings.stall_timeout,
        late: None,
    };
    let mut calls: Vec<Call> = Vec::new();
    let mut batch = CheckBatch::default();
    loop {
        // Get the stream ready before taking calls: opening one waits for the node's stream
        // credit, and a late answer may be due; a task waiting there must hold no calls.
        if let Err(failure) = session.ready().await {
            tracing::debug!(node = %link.addr, "stream unusable: {}", failure.detail);
            break;
        }
        if !link
            .queue
            .next_batch(generation, settings.max_checks, &mut calls)
            .await
        {
            break;
        }
        batch.groups.clear();
        batch.groups.extend(
            calls
                .iter_mut()
                .map(|call| std::mem::take(&mut call.checks)),
        );
        // Calls are queued in deadline order, so this is the first call's; the frame's answer
        // is waited for until then, and its calls answered `Timeout` after.
        let deadline = calls.iter().map(|c| c.deadline).min();
        let answer = session.round_trip(&batch, deadline).await;
        let alive = match answer {
            Ok(Answer::Error { code, .. }) if is_bad_request(code) && calls.len() > 1 => {
                // One call got the whole shared frame refused (a node stricter than our
                // client-side checks): resend each call alone so only the culprit sees the error.
                session
                    .serve_one_by_one(&link, &mut calls, &mut batch)
                    .await
            }
            answer => session.dispatch(&link, answer, &mut calls, &batch),
        };
        if !alive {
            break;
        }
    }
    session.abandon();
}

impl StreamSession {
    /// An open stream with no answer pending.
    async fn ready(&mut self) -> Result<(), Failure> {
        if let (Some(request_id), Some(stream)) = (self.late.take(), self.stream.as_mut()) {
            let late = tokio::time::timeout(self.stall_timeout, read_answer(stream, request_id));
            if !matches!(late.await, Ok(Ok(_))) {
                // Stuck or broken: a fresh stream is cheaper than waiting longer.
                self.abandon();
            }
        }
        self.ensure_stream().await.map(|_| ())
    }

    async fn ensure_stream(&mut self) -> Result<&mut OpenStream, Failure> {
        if self.stream.is_none() {
            let (send, recv) = self.conn.open_bi().await.map_err(|e| {
                Failure::new(DegradedReason::Unreachable, describe_connection_error(&e))
            })?;
            self.stream = Some(OpenStream {
                send,
                recv,
                reader: FrameReader::new(MAX_ANSWER_BYTES),
            });
        }
        // Unreachable `else`: the stream was set just above if it was missing.
        self.stream
            .as_mut()
            .ok_or_else(|| Failure::new(DegradedReason::Unreachable, "no stream"))
    }

    /// Sends `batch` as one frame and reads its answer, giving up at `deadline` (`None`, for a
    /// batch without calls, which is never sent in practice: the stall timeout).
    async fn round_trip(
        &mut self,
        batch: &CheckBatch,
        deadline: Option<Instant>,
    ) -> Result<Answer, Failure> {
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.stall_timeout);
        self.next_id += 1;
        let request_id = self.next_id;
        // `wire::encode_message` with the archive buffer kept across frames.
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        let payload = rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(batch, payload)
            .map_err(|e| Failure::protocol(format!("cannot encode a frame: {e}")))?;
        self.out.clear();
        encode_frame(&mut self.out, FrameKind::CheckBatch, request_id, &payload);
        self.payload = payload;
        let out = std::mem::take(&mut self.out);
        let result = self.send_and_read(&out, request_id, deadline).await;
        self.out = out;
        result
    }

    async fn send_and_read(
        &mut self,
        frame: &[u8],
        request_id: u64,
        deadline: Instant,
    ) -> Result<Answer, Failure> {
        let stream = match tokio::time::timeout_at(deadline, self.ensure_stream()).await {
            Ok(stream) => stream?,
            Err(_) => return Err(Failure::timeout("no stream before the deadline")),
        };
        match tokio::time::timeout_at(deadline, stream.send.write_all(frame)).await {
            Ok(written) => written.map_err(Failure::write)?,
            // Part of the frame may be out: the stream is out of step and is abandoned.
            Err(_) => return Err(Failure::timeout("frame not sent before the deadline")),
        }
        let read = tokio::time::timeout_at(deadline, read_answer(stream, request_id)).await;
        match read {
            Ok(answer) => answer,
            Err(_) => {
                self.late = Some(request_id);
                Err(Failure {
                    keep_stream: true,
                    ..Failure::timeout("no answer before the deadline")
                })
            }
        }
    }

    /// Hands `answer` to the calls of `batch`. Returns false when the connection is gone.
    fn dispatch(
        &mut self,
        link: &NodeLink,
        answer: Result<Answer, Failure>,
        calls: &mut Vec<Call>,
        batch: &CheckBatch,
    ) -> bool {
        match answer {
            Ok(Answer::Decisions(decisions, table_version)) => {
                if let Some(hint) = link.table_hint.get() {
                    hint.saw(table_version, link.addr);
                }
                let expected: usize = batch.groups.iter().map(Vec::len).sum();
                if decisions.len() != expected {
                    let detail = format!("{} decisions for {expected} checks", decisions.len());
                    self.fail(link, calls, Failure::protocol(detail));
                    return true;
                }
                link.answered.store(true, Ordering::Relaxed);
                let decisions = Arc::new(decisions);
                let mut start = 0;
                for (call, group) in calls.drain(..).zip(&batch.groups) {
                    // A caller that timed out meanwhile is not waiting any more.
                    let _ = call.reply.send(Reply::Decided {
                        decisions: decisions.clone(),
                        start,
                    });
                    start += group.len();
                }
                true
            }
            Ok(Answer::Error { code, message }) => {
                tracing::debug!(node = %link.addr, "node refused a frame: {code}: {message}");
                if code.closes_stream() {
                    self.abandon();
                }
                for call in calls.drain(..) {
                    let reply = if is_bad_request(code) {
                        Reply::Refused {
                            code,
                            message: message.clone(),
                        }
                    } else {
                        Reply::Failed(reason_for_code(code))
                    };
                    let _ = call.reply.send(reply);
                }
                true
            }
            Err(failure) => {
                self.fail(link, calls, failure);
                self.conn.close_reason().is_none()
            }
        }
    }

    async fn serve_one_by_one(
        &mut self,
        link: &NodeLink,
        calls: &mut Vec<Call>,
        batch: &mut CheckBatch,
    ) -> bool {
        let mut single = CheckBatch::default();
        let mut alive = true;
        for (call, group) in calls.drain(..).zip(batch.groups.drain(..)) {
            let deadline = call.deadline;
            let mut one = vec![call];
            if !alive || self.late.is_some() {
                // The connection is gone, or a call before this one ran out of time: the rest
                // were coalesced with it and are as late.
                let failure = if alive {
                    Failure::timeout("an earlier call of the frame timed out")
                } else {
                    Failure::new(DegradedReason::Unreachable, "connection lost")
                };
                self.fail(
                    link,
                    &mut one,
                    Failure {
                        keep_stream: true,
                        ..failure
                    },
                );
                continue;
            }
            single.groups.clear();
            single.groups.push(group);
            let answer = self.round_trip(&single, Some(deadline)).await;
            alive = self.dispatch(link, answer, &mut one, &single);
        }
        alive
    }

    fn fail(&mut self, link: &NodeLink, calls: &mut Vec<Call>, failure: Failure) {
        tracing::debug!(node = %link.addr, "frame failed ({}): {}", failure.reason, failure.detail);
        if !failure.keep_stream {
            self.abandon();
        }
        for call in calls.drain(..) {
            let _ = call.reply.send(Reply::Failed(failure.reason));
        }
    }

    /// Drops the stream, telling the node (its answers to this stream are no longer read).
    fn abandon(&mut self) {
        self.late = None;
        if let Some(mut stream) = self.stream.take() {
            // Already closed streams refuse these; nothing left to tell the node then.
            let _ = stream.send.reset(0u32.into());
            let _ = stream.recv.stop(0u32.into());
        }
    }
}

/// Reads until the answer to `request_id` is complete: whatever bytes are available at a time,
/// cut into frames by the `FrameReader` (one read per arrival beats an exact read per frame).
async fn read_answer(stream: &mut OpenStream, request_id: u64) -> Result<Answer, Failure> {
    loop {
        match stream.reader.next_frame() {
            Ok(Some(frame)) => return answer_from(frame, request_id),
            Ok(None) => {}
            Err(e) => return Err(Failure::protocol(format!("bad frame from the node: {e}"))),
        }
        match stream.recv.read_chunk(usize::MAX, true).await {
            Ok(Some(chunk)) => stream.reader.extend(&chunk.bytes),
            Ok(None) => {
                return Err(Failure::new(
                    DegradedReason::Unreachable,
                    "the node finished the stream",
                ));
            }
            Err(e) => return Err(Failure::read(e)),
        }
    }
}

fn answer_from(frame: Frame, request_id: u64) -> Result<Answer, Failure> {
    // Id 0 is the node speaking about the whole stream (e.g. shutting down).
    if frame.request_id != request_id && frame.request_id != 0 {
        return Err(Failure::protocol(format!(
            "answer to request {} while waiting for {request_id}",
            frame.request_id
        )));
    }
    match frame.kind {
        FrameKind::DecisionBatch => decode_decisions(&frame.payload)
            .map(|(decisions, version)| Answer::Decisions(decisions, version))
            .map_err(|(_, message)| Failure::protocol(message)),
        FrameKind::Error => {
            let error = decode_error_frame(&frame.payload)
                .map_err(|(_, message)| Failure::protocol(message))?;
            let code = ErrorCode::from_u16(error.code).ok_or_else(|| {
                Failure::protocol(format!(
                    "unknown error code {}: {}",
                    error.code, error.message
                ))
            })?;
            Ok(Answer::Error {
                code,
                message: error.message,
            })
        }
        other => Err(Failure::protocol(format!(
            "a node answered a check batch with {other:?}"
        ))),
    }
}
