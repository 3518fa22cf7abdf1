//! A link's stream tasks: calls from the queue out as frames, the node's answers back to the
//! callers; each task owns one bidirectional stream at a time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use floodgate::check::DegradedReason;
use floodgate::wire::{
    CheckBatch, ErrorCode, Frame, FrameKind, FrameReader, ScopedCheckBatch, WireDecision,
    WireScope, decode_decisions_into, encode_frame,
};
use tokio::time::Instant;

use super::{LinkSettings, NodeLink};
use crate::dial::{describe_connection_error, node_code};
use crate::error::is_bad_request;
use crate::queue::Call;
use crate::reply_slot::Reply;
use crate::request::{AnswerError, expect_answer};

/// Largest answer frame accepted: a full batch of 4,096 decisions is about 130 KiB.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What came back for a frame.
#[derive(Debug)]
enum Answer {
    /// The decisions (the stream's shared buffer, [`OpenStream::decisions`]) and the node's
    /// slot-table version.
    Decisions(Arc<Vec<WireDecision>>, u64),
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

/// An open bidirectional stream and the frames read from it so far.
#[derive(Debug)]
struct OpenStream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    reader: FrameReader,
    /// The last answer's decisions, shared with its callers; refilled in place for the next
    /// answer once they have all let go (the usual case), else replaced.
    decisions: Arc<Vec<WireDecision>>,
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
pub(super) async fn run_stream(
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
        // Held until this frame's callers are answered: the next frame carries what queued
        // meanwhile, unless enough queued to fill one on another stream.
        let Some(_in_flight) = link
            .queue
            .next_batch(generation, settings.max_checks, &mut calls)
            .await
        else {
            break;
        };
        let scopes = batch_scopes(&calls);
        batch.groups.clear();
        batch.groups.extend(
            calls
                .iter_mut()
                .map(|call| std::mem::take(&mut call.checks)),
        );
        // Calls are queued in deadline order, so this is the first call's; the frame's answer
        // is waited for until then, and its calls answered `Timeout` after.
        let deadline = calls.iter().map(|c| c.deadline).min();
        let answer = session.round_trip(&batch, &scopes, deadline).await;
        let alive = match answer {
            Ok(Answer::Error { code, .. }) if is_bad_request(code) && calls.len() > 1 => {
                // One call got the whole shared frame refused (a node stricter than our
                // client-side checks): resend each call alone so only the culprit sees the error.
                session
                    .serve_one_by_one(&link, &mut calls, &mut batch)
                    .await
            }
            answer => {
                // Each group goes back to its call, to return to its caller with the answer.
                for (call, group) in calls.iter_mut().zip(batch.groups.drain(..)) {
                    call.checks = group;
                }
                session.dispatch(&link, answer, &mut calls)
            }
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
                decisions: Arc::default(),
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
        scopes: &[WireScope],
        deadline: Option<Instant>,
    ) -> Result<Answer, Failure> {
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.stall_timeout);
        self.next_id += 1;
        let request_id = self.next_id;
        // `wire::encode_message` with the archive buffer kept across frames.
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        // Kind 12 only when a check has a scope other than `region`: kind 1 otherwise.
        let (kind, encoded) = if scopes.is_empty() {
            (
                FrameKind::CheckBatch,
                rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(batch, payload),
            )
        } else {
            let scoped = ScopedCheckBatch {
                batch: batch.clone(),
                scopes: scopes.to_vec(),
            };
            (
                FrameKind::ScopedCheckBatch,
                rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(&scoped, payload),
            )
        };
        let payload =
            encoded.map_err(|e| Failure::protocol(format!("cannot encode a frame: {e}")))?;
        self.out.clear();
        encode_frame(&mut self.out, kind, request_id, &payload);
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

    /// Hands `answer` to `calls`, each holding the group it sent (which goes back to its caller
    /// with the answer). Returns false when the connection is gone.
    fn dispatch(
        &mut self,
        link: &NodeLink,
        answer: Result<Answer, Failure>,
        calls: &mut Vec<Call>,
    ) -> bool {
        match answer {
            Ok(Answer::Decisions(decisions, table_version)) => {
                if let Some(hint) = link.table_hint.get() {
                    hint.saw(table_version, link.addr);
                }
                let expected: usize = calls.iter().map(|call| call.checks.len()).sum();
                if decisions.len() != expected {
                    let detail = format!("{} decisions for {expected} checks", decisions.len());
                    self.fail(link, calls, Failure::protocol(detail));
                    return true;
                }
                link.answered.store(true, Ordering::Relaxed);
                let mut start = 0;
                for call in calls.drain(..) {
                    let len = call.checks.len();
                    // A caller that timed out meanwhile is not waiting any more.
                    call.answer(Reply::Decided {
                        decisions: decisions.clone(),
                        start,
                    });
                    start += len;
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
                    call.answer(reply);
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
        for (mut call, group) in calls.drain(..).zip(batch.groups.drain(..)) {
            call.checks = group;
            let deadline = call.deadline;
            let scopes = call.scopes.clone();
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
            single.groups.push(std::mem::take(&mut one[0].checks));
            let answer = self.round_trip(&single, &scopes, Some(deadline)).await;
            one[0].checks = single.groups.pop().unwrap_or_default();
            alive = self.dispatch(link, answer, &mut one);
        }
        alive
    }

    fn fail(&mut self, link: &NodeLink, calls: &mut Vec<Call>, failure: Failure) {
        tracing::debug!(node = %link.addr, "frame failed ({}): {}", failure.reason, failure.detail);
        if !failure.keep_stream {
            self.abandon();
        }
        for call in calls.drain(..) {
            call.answer(Reply::Failed(failure.reason));
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
            Ok(Some(frame)) => return answer_from(stream, frame, request_id),
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

fn answer_from(stream: &mut OpenStream, frame: Frame, request_id: u64) -> Result<Answer, Failure> {
    match expect_answer(frame, FrameKind::DecisionBatch, request_id) {
        Ok(payload) => {
            if Arc::get_mut(&mut stream.decisions).is_none() {
                // A caller still holds the last answer: this one gets a buffer of its own.
                stream.decisions = Arc::default();
            }
            // Unique now, so this clones nothing.
            let decisions = Arc::make_mut(&mut stream.decisions);
            let decoded = decode_decisions_into(&payload, decisions);
            stream.reader.recycle(payload);
            decoded
                .map(|version| Answer::Decisions(stream.decisions.clone(), version))
                .map_err(|(_, message)| Failure::protocol(message))
        }
        Err(AnswerError::Refused { code, message }) => Ok(Answer::Error { code, message }),
        Err(AnswerError::Failed(why)) => Err(Failure::protocol(why)),
    }
}

/// The scopes of a frame of `calls`, one per check in order: none when every call's checks are
/// all `region` (the frame is then kind 1), else each call's own or `region` for each check.
fn batch_scopes(calls: &[Call]) -> Vec<WireScope> {
    if calls.iter().all(|c| c.scopes.is_empty()) {
        return Vec::new();
    }
    let mut scopes = Vec::new();
    for call in calls {
        if call.scopes.is_empty() {
            scopes.extend(std::iter::repeat_n(WireScope::default(), call.checks.len()));
        } else {
            scopes.extend(call.scopes.iter().cloned());
        }
    }
    scopes
}
