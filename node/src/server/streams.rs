//! Long-lived bidirectional streams: whatever bytes arrive are read into frames, every complete
//! frame is answered (checks decided or forwarded, leases, rules, the table, RLQS reports and
//! claims from peers), and the answers are written before more is read. Both the partial frames
//! and the answers not yet written are counted in the node's buffer budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate::Clock;
use floodgate::wire::{ErrorCode, Frame, FrameKind};
use tokio::sync::watch;

use crate::budget::{BudgetedAnswers, BudgetedReader, Counted};
use crate::caller::Caller;
use crate::check_path::CheckPath;
use crate::cluster::TableMessages;
use crate::forward;
use crate::service::{answer_frame, encode_error};

use super::Connections;
use super::remote::Remote;

/// What answers the frames of a bidirectional stream: the check path (checks, leases, token
/// leases), the slot-table message, the rules, and the RLQS hub (peers' reports and claims).
#[derive(Debug)]
pub(super) struct Answering {
    pub(super) checks: Arc<CheckPath>,
    pub(super) tables: Arc<TableMessages>,
    /// The rules file in force (`--rules`), served to clients.
    pub(super) rules: Option<Arc<crate::rules::RulesHandle>>,
    pub(super) rlqs: Arc<crate::rlqs::Hub>,
}

/// Serves one long-lived stream: reads whatever bytes arrive, answers every complete frame, and
/// writes the answers of one read [`ANSWER_BYTES`] at a time before reading more.
pub(super) async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    remote: Remote,
    connections: Arc<Connections>,
    answering: Arc<Answering>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Buffered bytes are reserved from the node-wide budget, the answers' as the requests';
    // quinn's chunks are read directly, so a stream holds no read buffer of its own.
    let mut reader = BudgetedReader::new(&connections.budget, connections.limits.max_frame_bytes);
    let mut answers = BudgetedAnswers::new(&connections.budget, remote.is_peer());
    loop {
        let read = tokio::select! {
            read = recv.read_chunk(crate::budget::READ_BYTES, true) => read,
            _ = shutdown.changed() => {
                // Everything read so far has been answered (answers are written before the next
                // read), so finishing here drops nothing the node accepted. Wait until the peer
                // has the answers (the connection is closed right after), bounded by the drain.
                let _ = send.finish();
                let _ = tokio::time::timeout(Duration::from_millis(250), send.stopped()).await;
                return;
            }
        };
        let mut pass = match read {
            Ok(Some(ref chunk)) => match reader.extend(&chunk.bytes) {
                Ok(()) => {
                    let pass =
                        answer_available(&answering, &remote, &mut reader, &mut answers).await;
                    reader.settle();
                    pass
                }
                Err(e) => {
                    connections.metrics.over_buffer_budget.increment(1);
                    connections.metrics.frame_error(e.code);
                    encode_error(answers.out(), e.request_id, e.code, e.message);
                    Pass::fatal(e.code)
                }
            },
            Ok(None) => match reader.finish() {
                Ok(()) => Pass::default(),
                Err(e) => {
                    connections.metrics.frame_error(e.code);
                    encode_error(answers.out(), e.request_id, e.code, e.message);
                    Pass::fatal(e.code)
                }
            },
            Err(_) => return,
        };
        // Answers go out ANSWER_BYTES at a time: the frames of one read left unanswered when
        // that much was held are answered once it is written, before anything more is read.
        loop {
            if !write_answers(&mut send, &mut recv, &remote, &connections, &mut answers).await {
                return;
            }
            if !pass.more || pass.fatal.is_some() {
                break;
            }
            pass = answer_available(&answering, &remote, &mut reader, &mut answers).await;
            reader.settle();
        }
        let fatal = pass.fatal;
        if fatal == Some(ErrorCode::Forbidden) {
            return;
        }
        if let Some(code) = fatal {
            let _ = send.finish();
            let _ = recv.stop(quinn::VarInt::from_u32(code as u32));
            return;
        }
        if matches!(read, Ok(None)) {
            let _ = send.finish();
            return;
        }
    }
}

/// Writes the answers (emptied after) within the write timeout; false when the stream is done:
/// it failed, or the caller took no answer in time and the stream was reset.
async fn write_answers(
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    remote: &Remote,
    connections: &Connections,
    answers: &mut BudgetedAnswers<'_>,
) -> bool {
    if answers.is_empty() {
        return true;
    }
    // Held until written: counted (an error encoded outside a pass was not yet).
    answers.count(0, false);
    let timeout = connections.limits.write_timeout;
    match tokio::time::timeout(timeout, send.write_all(answers.bytes())).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return false,
        Err(_) => {
            // The caller stopped reading its answers: what it sent stays decided, but the node
            // holds no more of its bytes for it.
            connections.metrics.write_timeouts.increment(1);
            tracing::debug!(from = %remote.connection.remote_address(), "a caller took no answer for {timeout:?}: stream reset");
            let _ = send.reset(quinn::VarInt::from_u32(ErrorCode::Overloaded as u32));
            let _ = recv.stop(quinn::VarInt::from_u32(ErrorCode::Overloaded as u32));
            return false;
        }
    }
    // A stream keeps the buffer for its next answers, but not one grown past what checks
    // need by a rare large answer (a policy carries the rules text).
    answers.written(KEPT_ANSWER_CAPACITY);
    true
}

/// Most answer buffer a stream keeps between reads: what a busy stream's check answers take
/// (up to [`ANSWER_BYTES`] plus the room reserved for the next frame's, twice its size),
/// rounded up as the buffer grows, so a busy stream does not allocate it again (while the
/// budget is under half used: see [`BudgetedAnswers::written`]).
const KEPT_ANSWER_CAPACITY: usize = 8 * ANSWER_BYTES;

/// Most answer bytes a stream holds before writing them (plus the one answer that passed it):
/// a small frame can draw a large answer (a slot table, about 16 KiB, for a 16-byte request),
/// so answering a whole read at once let 64 KiB of requests hold tens of megabytes.
pub(super) const ANSWER_BYTES: usize = crate::budget::READ_BYTES;

/// How often a caller speaking another protocol version is logged at ERROR.
const COMPLAINT_INTERVAL_NS: u64 = 10_000_000_000;
/// When the next such caller may be logged (per process: one node per process in production).
static NEXT_COMPLAINT_NS: AtomicU64 = AtomicU64::new(0);

/// True at most once per `COMPLAINT_INTERVAL_NS`.
fn time_to_complain(now_ns: u64) -> bool {
    let due = NEXT_COMPLAINT_NS.load(Ordering::Relaxed);
    now_ns >= due
        && NEXT_COMPLAINT_NS
            .compare_exchange(
                due,
                now_ns.saturating_add(COMPLAINT_INTERVAL_NS),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// What a pass over a stream's complete frames left: the code of an error that ends the stream,
/// and whether frames are left to answer once the answers held are written.
#[derive(Debug, Default)]
pub(super) struct Pass {
    fatal: Option<ErrorCode>,
    more: bool,
}

impl Pass {
    /// Frames are left to answer once the answers held are written.
    fn more() -> Self {
        Pass {
            fatal: None,
            more: true,
        }
    }

    fn fatal(code: ErrorCode) -> Self {
        Pass {
            fatal: Some(code),
            more: false,
        }
    }
}

/// Answers the complete frames in `reader` until [`ANSWER_BYTES`] of answers are held, or the
/// budget could not take a frame's answer: that frame is refused as `overloaded`, unanswered
/// (its answer's room is reserved before it decides anything; a table or the rules are taken
/// back once encoded), and the answers held are written before more.
pub(super) async fn answer_available(
    answering: &Answering,
    remote: &Remote,
    reader: &mut BudgetedReader<'_>,
    answers: &mut BudgetedAnswers<'_>,
) -> Pass {
    let metrics = &answering.checks.metrics;
    // One clock read for all frames of this read: checks that arrive together decide at one instant.
    let now_ns = answering.checks.clock.now_ns();
    let started = Instant::now();
    let mut frames = 0;
    let pass = loop {
        if answers.len() >= ANSWER_BYTES {
            // The rest stays in the reader, answered once these answers are written.
            break Pass::more();
        }
        match reader.next_frame() {
            Ok(Some(frame)) if frame.kind.peer_only() && !remote.is_peer() => {
                remote.forbid(metrics, frame.kind);
                break Pass::fatal(ErrorCode::Forbidden);
            }
            Ok(Some(frame)) => {
                frames += 1;
                // An answer that decides something cannot be taken back once encoded: its room
                // is reserved first, and the frame refused unanswered when the budget cannot
                // take it. A table or the rules are counted once encoded (and taken back).
                let copy = matches!(
                    frame.kind,
                    FrameKind::TableRequest | FrameKind::PolicyRequest
                );
                if !copy && !answers.make_room(answer_bound(&frame)) {
                    refuse_over_budget(answering, answers, &frame);
                    break Pass::more();
                }
                let before = answers.len();
                let out = answers.out();
                let refused = match frame.kind {
                    FrameKind::RlqsReports | FrameKind::RlqsRegionClaims => {
                        answer_rlqs(answering, remote, &frame, out)
                    }
                    FrameKind::RegionUnconfirmed => super::unconfirmed::answer_unconfirmed(
                        &answering.checks,
                        remote,
                        &frame,
                        out,
                    ),
                    _ => {
                        let caller = remote.caller();
                        answer(answering, remote.version(), caller, &frame, now_ns, out).await
                    }
                };
                if let Some(code) = refused {
                    metrics.frame_error(code);
                }
                match answers.count(before, copy) {
                    Counted::Fits => {}
                    // Past its reserved room (the bound did not hold): written before more.
                    Counted::Kept => {
                        break Pass::more();
                    }
                    Counted::Undone => {
                        refuse_over_budget(answering, answers, &frame);
                        break Pass::more();
                    }
                }
            }
            Ok(None) => break Pass::default(),
            Err(e) => {
                metrics.frame_error(e.code);
                if e.code == ErrorCode::UnsupportedVersion && time_to_complain(now_ns) {
                    complain_of_version(remote, &e.message);
                }
                encode_error(answers.out(), e.request_id, e.code, e.message);
                if e.code.closes_stream() {
                    break Pass::fatal(e.code);
                }
            }
        }
    };
    if frames > 0 {
        metrics
            .frame_seconds
            .record(started.elapsed().as_secs_f64() / f64::from(frames));
    }
    pass
}

/// Most bytes the answer to `frame` may take, from its size: a check takes at least 17 bytes
/// on the wire (16 packed and a byte of key) and its decision at most 25, a lease or token
/// lease request more than its answer, and a refusal a few hundred bytes of message.
fn answer_bound(frame: &Frame) -> usize {
    frame.payload.len().saturating_mul(2).saturating_add(1024)
}

/// Answers `frame` `overloaded`, unanswered otherwise: the node holds too many answers and
/// partial frames for its budget (`--max-buffered-bytes`); the caller asks again later.
fn refuse_over_budget(answering: &Answering, answers: &mut BudgetedAnswers<'_>, frame: &Frame) {
    let metrics = &answering.checks.metrics;
    metrics.over_buffer_budget.increment(1);
    metrics.frame_error(ErrorCode::Overloaded);
    let message = format!(
        "the node is buffering too much for all its clients (limit {} bytes) to answer a \
         {:?} now: ask again later",
        answering.checks.limits.max_buffered_bytes, frame.kind
    );
    encode_error(
        answers.out(),
        frame.request_id,
        ErrorCode::Overloaded,
        message,
    );
}

/// Answers an RLQS frame between nodes: relayed reports (kind 21) or a region's claims (kind
/// 23), each sender checked against the certificate the connection presented.
fn answer_rlqs(
    answering: &Answering,
    remote: &Remote,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let certified = |id: &str| remote.certified_as(id);
    let members = &answering.checks.members;
    let me = members.me().id.as_str();
    if frame.kind == FrameKind::RlqsRegionClaims {
        let region_of = |id: &str| members.region_of(id);
        crate::rlqs::answer_region_claims(&answering.rlqs, me, certified, region_of, frame, out)
    } else {
        crate::rlqs::answer_reports(&answering.rlqs, me, certified, frame, out)
    }
}

/// Says where operators look that a caller of another build was refused, not only to it
/// (callers logged at most once per [`COMPLAINT_INTERVAL_NS`], so a hostile caller cannot
/// flood the log; every frame is counted in `floodgate_frame_errors_total`).
fn complain_of_version(remote: &Remote, message: &str) {
    tracing::error!(
        from = %remote.connection.remote_address(),
        "closed a stream: {} (more such streams are counted in \
         floodgate_frame_errors_total{{code=\"unsupported_version\"}}, \
         logged once per {}s)",
        message,
        COMPLAINT_INTERVAL_NS / 1_000_000_000
    );
}

/// Answers one frame received on a bidirectional stream of a connection speaking `version`.
pub(super) async fn answer(
    answering: &Answering,
    version: u8,
    caller: Caller<'_>,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let checks = &answering.checks;
    match frame.kind {
        FrameKind::CheckBatch | FrameKind::ForwardedCheckBatch => {
            answer_checks(checks, caller, frame, now_ns, out).await
        }
        FrameKind::ScopedCheckBatch | FrameKind::ForwardedScopedCheckBatch => {
            checks.slots.wait_until_joined().await;
            match crate::scoped::answer_scoped_batch(checks, caller, frame, now_ns, out).await {
                Ok(refused) => refused,
                Err(plain) => answer_checks(checks, caller, &plain, now_ns, out).await,
            }
        }
        FrameKind::LeaseRequest => crate::lease::answer_lease_requests(checks, frame, out).await,
        FrameKind::TokenLeaseBatch => {
            crate::token_leases::answer_token_leases(checks, caller, frame, now_ns, out).await
        }
        FrameKind::PolicyRequest => {
            crate::rules::answer_policy_request(answering.rules.as_deref(), frame, out)
        }
        FrameKind::TableRequest => {
            answering
                .tables
                .encode_table(out, version, frame.request_id);
            None
        }
        other => {
            encode_error(
                out,
                frame.request_id,
                ErrorCode::UnknownKind,
                format!("a node does not accept {other:?} frames on this stream"),
            );
            Some(ErrorCode::UnknownKind)
        }
    }
}

/// Answers a check batch (kind 1, or 10 from a peer) from `caller`: decided here, or
/// forwarded by group.
async fn answer_checks(
    checks: &CheckPath,
    caller: Caller<'_>,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let slots = &checks.slots;
    slots.wait_until_joined().await;
    let deciding = slots.deciding();
    let table = slots.table();
    // Alone in its table with nothing awaited: the whole frame is decided here.
    let alone = slots.ownership().decides_every_slot();
    if !alone {
        drop(deciding);
        // Groups may belong to other nodes, and gained slots may wait for a hand-off.
        forward::answer_check_batch(checks, caller, frame, now_ns, out).await
    } else {
        // A node alone decides everything here, synchronously, with the table held: a
        // node that joins meanwhile receives these decisions in its hand-off.
        let limits = checks.limits.wire();
        answer_frame(
            caller,
            &checks.store,
            &limits,
            &checks.metrics,
            now_ns,
            table.version(),
            frame,
            out,
        )
    }
}
