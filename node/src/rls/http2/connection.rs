//! One HTTP/2 connection's state, without I/O: the caller's bytes go in (`receive`), whole calls
//! come out (`take_calls`), answers go in (`answer`, `refuse`, ...), and the bytes to write
//! collect in `out`, each turn's in one buffer so that they leave in one write.
//!
//! Only what a gRPC server of unary calls and one server-streaming method needs is kept:
//! streams the caller opens, flow control both ways, SETTINGS, PING, GOAWAY and RST_STREAM. The
//! node never pushes and never opens a stream. Whatever a caller sends is checked against RFC
//! 9113; what breaks the connection's state (HPACK, flow control, framing) ends it with GOAWAY,
//! what breaks one stream resets that stream only.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::AbortHandle;
use prost::Message;
use rustc_hash::FxHasher;
use tokio::time::Instant;
use tonic::Status;

use super::frame::{self, Head, Reason};
use super::grpc::{self, Refusal, RequestHead, Route};
use super::hpack;
use super::stream::{Body, FieldCheck, Phase, Stream};

/// Most bytes of one header block as it arrives, its CONTINUATIONs joined: a block must be
/// decoded whole to keep HPACK's table in step, so this bounds what one block can hold.
const MAX_HEADER_BLOCK_BYTES: usize = 64 * 1024;
/// The node reads no more of a caller's frames while this much it was sent is still
/// unwritten (the caller does not read): a frame adds at most a refusal's few KiB past it.
pub(super) const MAX_UNWRITTEN_BYTES: usize = 256 * 1024;
/// How many closed streams are remembered, to tell frames still in flight on a stream the node
/// reset (let go) from frames a caller sends on a stream it knows is closed (its error).
const RECENT_STREAMS: usize = 64;

/// What the node allows a connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// The window of each stream the caller opens, at least one message of the largest size.
    pub(super) stream_window: u32,
    /// The connection's window, at least HTTP/2's initial 65,535.
    pub(super) connection_window: u32,
    pub(super) max_message: usize,
    pub(super) max_streams: u32,
    /// Most bytes of one call's headers, decoded (as HTTP/2 counts them: 32 more a field).
    pub(super) max_header_list: usize,
}

/// A call whose request is whole.
#[derive(Debug)]
pub(super) struct Call {
    pub(super) stream: u32,
    pub(super) route: Route,
    /// The message, without its prefix.
    pub(super) message: Bytes,
}

/// Why the connection ends: sent to the caller as GOAWAY.
#[derive(Debug)]
pub(super) struct Broken {
    pub(super) reason: Reason,
    pub(super) why: String,
}

fn broken(reason: Reason, why: impl Into<String>) -> Broken {
    Broken {
        reason,
        why: why.into(),
    }
}

/// The flags HEADERS defines; the rest are ignored on receipt (RFC 9113 §4.1).
const HEADERS_FLAGS: u8 = frame::END_STREAM | frame::END_HEADERS | frame::PADDED | frame::PRIORITY;
/// A flag bit HEADERS does not define, kept with a header block's flags (unknown ones cleared)
/// to say that its stream depends on itself.
const SELF_DEPENDENT: u8 = 0x80;

pub(super) struct Connection {
    limits: Limits,
    hpack: hpack::Decoder,
    streams: HashMap<u32, Stream, BuildHasherDefault<FxHasher>>,
    /// The highest stream the caller opened.
    last_opened: u32,
    preface_read: bool,
    settings_read: bool,
    /// The caller acknowledged the node's SETTINGS (until then it may use HTTP/2's defaults).
    settings_acknowledged: bool,
    /// Streams refused in this read (`Phase::Refusing`).
    refusing: Vec<u32>,
    /// Streams recently closed, newest last, and whether frames of the caller's may still be
    /// in flight on them (the node reset them while the caller was sending).
    recent: VecDeque<(u32, bool)>,
    /// A header block whose CONTINUATIONs are still to come: stream, HEADERS flags, fragments.
    continuing: Option<(u32, u8, BytesMut)>,
    /// Bytes the caller may still send on the connection.
    receive_window: i64,
    /// Bytes read and done with, to give back in a WINDOW_UPDATE.
    released: usize,
    send_window: i64,
    peer_initial_window: i64,
    peer_max_payload: usize,
    /// Streams whose answer bytes wait for the connection's window, in the order they began
    /// waiting. A stream waiting for its own window waits for its own WINDOW_UPDATE instead.
    blocked: VecDeque<u32>,
    /// The node said its first GOAWAY (`go_away`).
    draining_connection: bool,
    /// The node said its last GOAWAY: new streams are refused.
    going_away: bool,
    /// The caller said GOAWAY: it opens no more streams.
    caller_going_away: bool,
    /// A PING the node sent was answered.
    pong: bool,
    calls: Vec<Call>,
    /// A stream opened since the last `take_opened`.
    opened: bool,
    /// What to write, in order.
    pub(super) out: BytesMut,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("streams", &self.streams.len())
            .field("last_opened", &self.last_opened)
            .field("out", &self.out.len())
            .finish_non_exhaustive()
    }
}

/// The PING payload of the node's keepalive.
pub(super) const KEEPALIVE_PING: [u8; 8] = *b"fg-alive";
/// The PING payload that follows the first GOAWAY: its answer says the caller has seen it.
const GOAWAY_PING: [u8; 8] = *b"fg-going";

impl Connection {
    /// A connection whose first bytes to write are the node's SETTINGS and its connection
    /// window.
    pub(super) fn new(limits: Limits) -> Connection {
        // The node never sends SETTINGS_HEADER_TABLE_SIZE: the caller's table is the default.
        let hpack = hpack::Decoder::new(4_096);
        let mut out = BytesMut::with_capacity(16 * 1024);
        frame::put_settings(
            &mut out,
            &[
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (frame::SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_streams),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (
                    frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                    u32::try_from(limits.max_header_list).unwrap_or(u32::MAX),
                ),
            ],
        );
        let connection_window = limits.connection_window.max(frame::DEFAULT_WINDOW);
        if connection_window > frame::DEFAULT_WINDOW {
            frame::put_window_update(&mut out, 0, connection_window - frame::DEFAULT_WINDOW);
        }
        Connection {
            limits,
            hpack,
            streams: HashMap::default(),
            last_opened: 0,
            preface_read: false,
            settings_read: false,
            settings_acknowledged: false,
            refusing: Vec::new(),
            recent: VecDeque::with_capacity(RECENT_STREAMS),
            continuing: None,
            receive_window: i64::from(connection_window),
            released: 0,
            send_window: i64::from(frame::DEFAULT_WINDOW),
            peer_initial_window: i64::from(frame::DEFAULT_WINDOW),
            peer_max_payload: frame::MAX_PAYLOAD,
            blocked: VecDeque::new(),
            draining_connection: false,
            going_away: false,
            caller_going_away: false,
            pong: false,
            calls: Vec::new(),
            opened: false,
            out,
        }
    }

    /// The preface and the caller's first SETTINGS have been read.
    pub(super) fn established(&self) -> bool {
        self.settings_read
    }

    /// Calls open (read, deciding, answering or watching).
    pub(super) fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Nothing more will happen here: the caller or the node said GOAWAY, and no call is open.
    pub(super) fn finished(&self) -> bool {
        (self.going_away || self.caller_going_away) && self.streams.is_empty()
    }

    /// Moves the calls read whole since the last look to `into`.
    pub(super) fn take_calls(&mut self, into: &mut Vec<Call>) {
        into.append(&mut self.calls);
    }

    /// A stream was opened since the last look.
    pub(super) fn take_opened(&mut self) -> bool {
        std::mem::take(&mut self.opened)
    }

    /// The caller answered the node's keepalive PING since the last look.
    pub(super) fn take_pong(&mut self) -> bool {
        std::mem::take(&mut self.pong)
    }

    pub(super) fn ping(&mut self) {
        frame::put_ping(&mut self.out, 0, &KEEPALIVE_PING);
    }

    /// GOAWAY in two steps, as RFC 9113 §6.8 suggests: first one naming the highest stream
    /// id, with a PING, so that calls the caller sent meanwhile are still served; once the PING
    /// comes back, the one naming the last stream opened, after which new streams are refused.
    pub(super) fn go_away(&mut self) {
        if !self.draining_connection {
            self.draining_connection = true;
            frame::put_go_away(&mut self.out, frame::MAX_WINDOW, Reason::NO_ERROR, "");
            frame::put_ping(&mut self.out, 0, &GOAWAY_PING);
        }
    }

    fn go_away_final(&mut self) {
        if !self.going_away {
            self.going_away = true;
            frame::put_go_away(&mut self.out, self.last_opened, Reason::NO_ERROR, "");
        }
    }

    /// The GOAWAY that ends a connection the caller broke.
    pub(super) fn go_away_broken(&mut self, broken: &Broken) {
        self.going_away = true;
        frame::put_go_away(&mut self.out, self.last_opened, broken.reason, &broken.why);
    }

    /// Reads the whole frames in `input`, leaving a partial one there, and the rest too once
    /// `out` holds `MAX_UNWRITTEN_BYTES` (what the caller has not read bounds what it may ask).
    /// True when whole frames were left for later.
    pub(super) fn receive(&mut self, input: &mut BytesMut, now: Instant) -> Result<bool, Broken> {
        if !self.preface_read {
            let seen = input.len().min(frame::PREFACE.len());
            if input[..seen] != frame::PREFACE[..seen] {
                return Err(broken(
                    Reason::PROTOCOL_ERROR,
                    "not HTTP/2: the connection preface is missing",
                ));
            }
            if seen < frame::PREFACE.len() {
                return Ok(false);
            }
            input.advance(frame::PREFACE.len());
            self.preface_read = true;
        }
        let mut left = false;
        while let Some(head) = input.first_chunk::<{ frame::HEAD_BYTES }>().map(Head::read) {
            if self.out.len() >= MAX_UNWRITTEN_BYTES {
                left = input.len() >= frame::HEAD_BYTES + head.length;
                break;
            }
            if head.length > frame::MAX_PAYLOAD {
                return Err(broken(
                    Reason::FRAME_SIZE_ERROR,
                    format!(
                        "a frame of {} bytes, over the {} allowed",
                        head.length,
                        frame::MAX_PAYLOAD
                    ),
                ));
            }
            if input.len() < frame::HEAD_BYTES + head.length {
                // Room for the rest of it, so the next read completes it.
                input.reserve(frame::HEAD_BYTES + head.length - input.len());
                break;
            }
            // Read in place: only a message's bytes are copied out, into a buffer of its own,
            // so a call never holds the read buffer (nor counts references to it).
            let end = frame::HEAD_BYTES + head.length;
            self.frame(head, &input[frame::HEAD_BYTES..end], now)?;
            input.advance(end);
        }
        for id in std::mem::take(&mut self.refusing) {
            let refused = match self.streams.get_mut(&id) {
                Some(stream) => match std::mem::replace(&mut stream.phase, Phase::Deciding) {
                    Phase::Refusing(refusal) => refusal,
                    other => {
                        stream.phase = other;
                        continue;
                    }
                },
                None => continue,
            };
            self.refuse(id, &refused);
        }
        self.give_back_window();
        Ok(left)
    }

    fn frame(&mut self, head: Head, payload: &[u8], now: Instant) -> Result<(), Broken> {
        if !self.settings_read && head.kind != frame::SETTINGS {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "the caller's first frame must be SETTINGS",
            ));
        }
        if self.continuing.is_some() && head.kind != frame::CONTINUATION {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "a header block was interrupted before its END_HEADERS",
            ));
        }
        match head.kind {
            frame::DATA => self.data(head, payload),
            frame::HEADERS => self.headers(head, payload, now),
            frame::CONTINUATION => self.continuation(head, payload, now),
            frame::PRIORITY_FRAME => {
                if head.stream == 0 {
                    return Err(broken(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                // Priorities are not followed, only checked.
                if payload.len() != 5 {
                    self.stream_error(
                        head.stream,
                        Reason::FRAME_SIZE_ERROR,
                        "PRIORITY not 5 bytes long",
                    )
                } else if frame::read_u31(payload) == head.stream {
                    self.stream_error(
                        head.stream,
                        Reason::PROTOCOL_ERROR,
                        "a stream depending on itself",
                    )
                } else {
                    Ok(())
                }
            }
            frame::RST_STREAM => self.caller_reset(head, payload),
            frame::SETTINGS => self.settings(head, payload),
            frame::PING => self.ping_frame(head, payload),
            frame::GOAWAY => {
                if head.stream != 0 {
                    return Err(broken(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                self.caller_going_away = true;
                Ok(())
            }
            frame::WINDOW_UPDATE => self.window_update(head, payload),
            frame::PUSH_PROMISE => Err(broken(
                Reason::PROTOCOL_ERROR,
                "a client may not send PUSH_PROMISE",
            )),
            // Frames of extensions the node does not know are ignored.
            _ => Ok(()),
        }
    }

    fn data(&mut self, head: Head, payload: &[u8]) -> Result<(), Broken> {
        if head.stream == 0 || head.stream.is_multiple_of(2) {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "DATA on a stream a client may not open",
            ));
        }
        // The whole payload counts against the windows, padding too.
        let length = payload.len();
        self.receive_window -= length as i64;
        if self.receive_window < 0 {
            return Err(broken(
                Reason::FLOW_CONTROL_ERROR,
                "DATA past the connection's window",
            ));
        }
        let Some(data) = frame::unpadded(head.flags, payload) else {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "DATA padded past its length",
            ));
        };
        let Some(stream) = self.streams.get_mut(&head.stream) else {
            if head.stream > self.last_opened {
                return Err(broken(
                    Reason::PROTOCOL_ERROR,
                    "DATA on a stream never opened",
                ));
            }
            self.released += length;
            // In flight on a stream the node reset: let go. Otherwise the caller sends on a
            // stream it closed.
            if self.recently_closed(head.stream) != Some(true) {
                frame::put_reset(&mut self.out, head.stream, Reason::STREAM_CLOSED);
            }
            return Ok(());
        };
        stream.held += length;
        stream.receive_window -= length as i64;
        stream.received += data.len() as u64;
        if stream.remote_ended {
            self.reset(head.stream, Reason::STREAM_CLOSED);
            return Ok(());
        }
        if stream.receive_window < 0 {
            self.reset(head.stream, Reason::FLOW_CONTROL_ERROR);
            return Ok(());
        }
        if stream.content_length.is_some_and(|n| stream.received > n) {
            self.reset(head.stream, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        match &mut stream.phase {
            Phase::Receiving { body, .. } => {
                if body.len() + data.len() > self.limits.max_message + grpc::PREFIX_BYTES {
                    let refusal = Refusal::Grpc(grpc::over_limit(self.limits.max_message));
                    self.refuse_later(head.stream, refusal);
                } else if !data.is_empty() {
                    body.push(data);
                }
            }
            // What a refused call still sends is let go.
            Phase::Refusing(_) => {}
            Phase::Draining => {
                stream.held -= length;
                self.released += length;
            }
            Phase::Deciding | Phase::Watching { .. } => {
                // Only a stream still receiving is not ended by its caller.
                self.reset(head.stream, Reason::STREAM_CLOSED);
                return Ok(());
            }
        }
        if head.flags & frame::END_STREAM != 0 {
            self.request_whole(head.stream);
        }
        Ok(())
    }

    fn headers(&mut self, head: Head, payload: &[u8], now: Instant) -> Result<(), Broken> {
        if head.stream == 0 || head.stream.is_multiple_of(2) {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "HEADERS on a stream a client may not open",
            ));
        }
        let Some(mut block) = frame::unpadded(head.flags, payload) else {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "HEADERS padded past its length",
            ));
        };
        let mut flags = head.flags & HEADERS_FLAGS;
        if flags & frame::PRIORITY != 0 {
            if block.len() < 5 {
                return Err(broken(
                    Reason::FRAME_SIZE_ERROR,
                    "HEADERS too short for its priority",
                ));
            }
            if frame::read_u31(block) == head.stream {
                // Kept in the flags (the bit is spent) for the block's end: a stream error.
                flags |= SELF_DEPENDENT;
            }
            block = &block[5..];
        }
        if head.flags & frame::END_HEADERS == 0 {
            self.continuing = Some((head.stream, flags, BytesMut::from(block)));
            return Ok(());
        }
        self.header_block(head.stream, flags, block, now)
    }

    fn continuation(&mut self, head: Head, payload: &[u8], now: Instant) -> Result<(), Broken> {
        let Some((stream, flags, mut block)) = self.continuing.take() else {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION without a header block before it",
            ));
        };
        if head.stream != stream {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "CONTINUATION on another stream than its header block's",
            ));
        }
        if block.len() + payload.len() > MAX_HEADER_BLOCK_BYTES {
            return Err(broken(
                Reason::ENHANCE_YOUR_CALM,
                format!("a header block over {MAX_HEADER_BLOCK_BYTES} bytes"),
            ));
        }
        block.extend_from_slice(payload);
        if head.flags & frame::END_HEADERS == 0 {
            self.continuing = Some((stream, flags, block));
            return Ok(());
        }
        self.header_block(stream, flags, &block, now)
    }

    /// A whole header block: a new call, or trailers ending one.
    fn header_block(
        &mut self,
        id: u32,
        flags: u8,
        block: &[u8],
        now: Instant,
    ) -> Result<(), Broken> {
        // Decoded in every case, to keep the table in step with the caller's.
        let mut head = RequestHead::default();
        let mut check = FieldCheck::default();
        let max_list = self.limits.max_header_list;
        self.hpack
            .decode(block, |name, value| {
                // Past the limit the block is refused: its fields are only counted.
                check.list_bytes += name.len() + value.len() + 32;
                if check.list_bytes <= max_list {
                    check.note(name, value);
                    head.note(name, value);
                }
            })
            .map_err(|e| {
                broken(
                    Reason::COMPRESSION_ERROR,
                    format!("a header block HPACK cannot decode: {e}"),
                )
            })?;
        let end_stream = flags & frame::END_STREAM != 0;
        if let Some(stream) = self.streams.get_mut(&id) {
            // Trailers: they end the stream, and carry no pseudo-header.
            if stream.remote_ended {
                self.reset(id, Reason::STREAM_CLOSED);
            } else if !end_stream || !check.trailers_ok() {
                self.reset(id, Reason::PROTOCOL_ERROR);
            } else {
                self.request_whole(id);
            }
            return Ok(());
        }
        if id <= self.last_opened {
            return match self.recently_closed(id) {
                // Trailers in flight on a stream the node reset.
                Some(true) => Ok(()),
                Some(false) => Err(broken(
                    Reason::STREAM_CLOSED,
                    "HEADERS on a stream already closed",
                )),
                None => Err(broken(
                    Reason::PROTOCOL_ERROR,
                    "HEADERS opening a stream below one already opened",
                )),
            };
        }
        self.last_opened = id;
        self.opened = true;
        if self.going_away || self.streams.len() >= self.limits.max_streams as usize {
            self.reset_unopened(id, Reason::REFUSED_STREAM, end_stream);
            return Ok(());
        }
        if !check.request_ok() || flags & SELF_DEPENDENT != 0 {
            self.reset_unopened(id, Reason::PROTOCOL_ERROR, end_stream);
            return Ok(());
        }
        let routed = if check.list_bytes > self.limits.max_header_list {
            Err(Refusal::Http(431))
        } else {
            grpc::route(&head)
        };
        let (phase, route, asked) = match routed {
            Ok((route, asked)) => (
                Phase::Receiving {
                    route,
                    body: Body::default(),
                },
                route,
                asked,
            ),
            Err(refusal) => (Phase::Refusing(refusal), Route::ShouldRateLimit, None),
        };
        let watch_until = if route == Route::HealthWatch {
            asked.map(|asked| now + asked)
        } else {
            None
        };
        // A unary call's deadline is its own; a Watch's request must arrive within the call
        // timeout, and the Watch ends when its caller asked.
        let allowed = grpc::call_deadline(asked);
        let receive_window = if self.settings_acknowledged {
            i64::from(self.limits.stream_window)
        } else {
            i64::from(self.limits.stream_window.max(frame::DEFAULT_WINDOW))
        };
        if matches!(phase, Phase::Refusing(_)) {
            self.refusing.push(id);
        }
        self.streams.insert(
            id,
            Stream {
                phase,
                receive_window,
                send_window: self.peer_initial_window,
                held: 0,
                remote_ended: false,
                content_length: check.content_length,
                received: 0,
                deadline: Some((now + allowed, allowed)),
                watch_until,
                queued: Bytes::new(),
                trailers: None,
                waiting_for_connection: false,
                decision: None,
            },
        );
        if end_stream {
            self.request_whole(id);
        }
        Ok(())
    }

    /// Refuses stream `id` once every frame of this read is read.
    fn refuse_later(&mut self, id: u32, refusal: Refusal) {
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.phase = Phase::Refusing(refusal);
            self.refusing.push(id);
        }
    }

    /// The caller ended its side of a stream still receiving: its message is whole, and the
    /// window it held is given back.
    fn request_whole(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.remote_ended = true;
        self.released += std::mem::take(&mut stream.held);
        if stream
            .content_length
            .is_some_and(|length| length != stream.received)
        {
            self.reset(id, Reason::PROTOCOL_ERROR);
            return;
        }
        match stream.phase {
            Phase::Receiving { .. } => {}
            Phase::Draining => return self.close(id, false),
            _ => return,
        }
        let Phase::Receiving { route, body } =
            std::mem::replace(&mut stream.phase, Phase::Deciding)
        else {
            return;
        };
        match grpc::unframe(body.whole(), self.limits.max_message) {
            Ok(message) => self.calls.push(Call {
                stream: id,
                route,
                message,
            }),
            Err(status) => self.refuse_later(id, Refusal::Grpc(status)),
        }
    }

    fn caller_reset(&mut self, head: Head, payload: &[u8]) -> Result<(), Broken> {
        if payload.len() != 4 {
            return Err(broken(
                Reason::FRAME_SIZE_ERROR,
                "RST_STREAM not 4 bytes long",
            ));
        }
        if head.stream == 0 || head.stream > self.last_opened || head.stream.is_multiple_of(2) {
            return Err(broken(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on a stream never opened",
            ));
        }
        self.close(head.stream, false);
        Ok(())
    }

    fn settings(&mut self, head: Head, payload: &[u8]) -> Result<(), Broken> {
        if head.stream != 0 {
            return Err(broken(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.flags & frame::ACK != 0 {
            if !payload.is_empty() {
                return Err(broken(
                    Reason::FRAME_SIZE_ERROR,
                    "a SETTINGS acknowledgement with a payload",
                ));
            }
            self.settings_acknowledged = true;
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(broken(
                Reason::FRAME_SIZE_ERROR,
                "SETTINGS not a multiple of 6 bytes",
            ));
        }
        let mut initial_window = None;
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return Err(broken(Reason::PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1"));
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if value > frame::MAX_WINDOW {
                        return Err(broken(
                            Reason::FLOW_CONTROL_ERROR,
                            "INITIAL_WINDOW_SIZE over 2^31-1",
                        ));
                    }
                    // Applied once, below: the last value a frame carries is the one in force.
                    initial_window = Some(i64::from(value));
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(frame::MAX_PAYLOAD as u32..=frame::MAX_ALLOWED_PAYLOAD).contains(&value) {
                        return Err(broken(
                            Reason::PROTOCOL_ERROR,
                            "MAX_FRAME_SIZE outside 16,384 to 16,777,215",
                        ));
                    }
                    self.peer_max_payload = value as usize;
                }
                // The header table's size is the caller's decoder's: the node indexes nothing.
                // Limits on streams the node opens, and on header lists (the node's are small),
                // do not apply.
                _ => {}
            }
        }
        if let Some(window) = initial_window.filter(|w| *w != self.peer_initial_window) {
            let change = window - self.peer_initial_window;
            self.peer_initial_window = window;
            let mut waiting = Vec::new();
            for (&id, stream) in &mut self.streams {
                stream.send_window += change;
                if stream.send_window > i64::from(frame::MAX_WINDOW) {
                    return Err(broken(
                        Reason::FLOW_CONTROL_ERROR,
                        "INITIAL_WINDOW_SIZE took a stream's window over 2^31-1",
                    ));
                }
                if change > 0 && !stream.queued.is_empty() && !stream.waiting_for_connection {
                    waiting.push(id);
                }
            }
            for id in waiting {
                self.send_queued(id);
            }
        }
        self.settings_read = true;
        frame::put_settings_ack(&mut self.out);
        Ok(())
    }

    fn ping_frame(&mut self, head: Head, payload: &[u8]) -> Result<(), Broken> {
        if head.stream != 0 {
            return Err(broken(Reason::PROTOCOL_ERROR, "PING on a stream"));
        }
        let Ok(payload) = <&[u8; 8]>::try_from(payload) else {
            return Err(broken(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes long"));
        };
        if head.flags & frame::ACK != 0 {
            self.pong |= *payload == KEEPALIVE_PING;
            if *payload == GOAWAY_PING && self.draining_connection {
                self.go_away_final();
            }
        } else {
            frame::put_ping(&mut self.out, frame::ACK, payload);
        }
        Ok(())
    }

    fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), Broken> {
        if payload.len() != 4 {
            return Err(broken(
                Reason::FRAME_SIZE_ERROR,
                "WINDOW_UPDATE not 4 bytes long",
            ));
        }
        let increment = i64::from(frame::read_u31(payload));
        if head.stream == 0 {
            if increment == 0 {
                return Err(broken(
                    Reason::PROTOCOL_ERROR,
                    "a WINDOW_UPDATE of 0 on the connection",
                ));
            }
            self.send_window += increment;
            if self.send_window > i64::from(frame::MAX_WINDOW) {
                return Err(broken(
                    Reason::FLOW_CONTROL_ERROR,
                    "the connection's window over 2^31-1",
                ));
            }
        } else {
            if increment == 0 {
                return self.stream_error(
                    head.stream,
                    Reason::PROTOCOL_ERROR,
                    "a WINDOW_UPDATE of 0",
                );
            }
            let Some(stream) = self.streams.get_mut(&head.stream) else {
                if head.stream > self.last_opened || head.stream.is_multiple_of(2) {
                    return Err(broken(
                        Reason::PROTOCOL_ERROR,
                        "WINDOW_UPDATE on a stream never opened",
                    ));
                }
                return Ok(());
            };
            stream.send_window += increment;
            if stream.send_window > i64::from(frame::MAX_WINDOW) {
                self.reset(head.stream, Reason::FLOW_CONTROL_ERROR);
                return Ok(());
            }
            if !stream.queued.is_empty() && !stream.waiting_for_connection {
                self.send_queued(head.stream);
            }
            return Ok(());
        }
        self.send_blocked();
        Ok(())
    }

    /// Answers a unary call with `message` and OK. Nothing when the call is no longer open
    /// (reset by its caller, or past its deadline).
    pub(super) fn answer(&mut self, id: u32, message: &impl Message) {
        if !self.deciding(id) {
            return;
        }
        let length = match grpc::framed_length(message, self.limits.max_message) {
            Ok(length) => length,
            Err(status) => return self.refuse(id, &Refusal::Grpc(status)),
        };
        frame::put_headers(&mut self.out, id, frame::GRPC_HEAD, false);
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let room = self.send_window.min(stream.send_window);
        if room >= length as i64 && length <= self.peer_max_payload {
            // The usual case, encoded where it is sent.
            frame::put_head(&mut self.out, length, frame::DATA, 0, id);
            grpc::put_framed(&mut self.out, message);
            frame::put_headers(&mut self.out, id, frame::OK_TRAILERS, true);
            self.send_window -= length as i64;
            self.finish(id);
            return;
        }
        let mut framed = BytesMut::with_capacity(length);
        grpc::put_framed(&mut framed, message);
        stream.queued = framed.freeze();
        stream.trailers = Some(Bytes::from_static(frame::OK_TRAILERS));
        self.send_queued(id);
    }

    /// Opens a Watch's answer with its first status; it stays open until `end_watches` or its
    /// deadline.
    pub(super) fn watch(&mut self, id: u32, first: Bytes, not_serving: bool) {
        if !self.deciding(id) {
            return;
        }
        frame::put_headers(&mut self.out, id, frame::GRPC_HEAD, false);
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.phase = Phase::Watching { not_serving };
        stream.deadline = stream.watch_until.map(|until| (until, Duration::ZERO));
        stream.queued = first;
        self.send_queued(id);
    }

    /// Ends every Watch with `last` (unless NOT_SERVING was its status already) and OK: the
    /// node is stopping.
    pub(super) fn end_watches(&mut self, last: &Bytes) {
        let watching: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Watching { .. }) && s.trailers.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in watching {
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            if let Phase::Watching { not_serving: false } = stream.phase {
                let mut queued = BytesMut::from(&stream.queued[..]);
                queued.extend_from_slice(last);
                stream.queued = queued.freeze();
            }
            stream.trailers = Some(Bytes::from_static(frame::OK_TRAILERS));
            self.send_queued(id);
        }
    }

    /// Ties a call's decision to its stream: it is stopped if the stream closes first.
    pub(super) fn decide_with(&mut self, id: u32, decision: AbortHandle) {
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.decision = Some(decision);
        }
    }

    /// The call is still waiting for its answer.
    pub(super) fn deciding(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .is_some_and(|s| matches!(s.phase, Phase::Deciding))
    }

    /// Refuses a call: trailers-only (or an HTTP status) and the stream ended.
    pub(super) fn refuse(&mut self, id: u32, refusal: &Refusal) {
        if !self.streams.contains_key(&id) {
            return;
        }
        frame::put_headers(&mut self.out, id, &grpc::refusal_block(refusal), true);
        self.finish(id);
    }

    /// Sends what waits on stream `id` as the windows allow; its trailers and the stream's end
    /// once it is all sent.
    fn send_queued(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        while !stream.queued.is_empty() {
            if stream.send_window <= 0 {
                return;
            }
            if self.send_window <= 0 {
                if !stream.waiting_for_connection {
                    stream.waiting_for_connection = true;
                    self.blocked.push_back(id);
                }
                return;
            }
            let room = self.send_window.min(stream.send_window) as usize;
            let piece = room.min(self.peer_max_payload).min(stream.queued.len());
            let data = stream.queued.split_to(piece);
            frame::put_data(&mut self.out, id, &data, false);
            self.send_window -= piece as i64;
            stream.send_window -= piece as i64;
        }
        if let Some(trailers) = stream.trailers.take() {
            frame::put_headers(&mut self.out, id, &trailers, true);
            self.finish(id);
        }
    }

    /// Sends what the streams waiting for the connection's window can now, in turn, until the
    /// window is spent again.
    fn send_blocked(&mut self) {
        while self.send_window > 0 {
            let Some(id) = self.blocked.pop_front() else {
                return;
            };
            if let Some(stream) = self.streams.get_mut(&id) {
                stream.waiting_for_connection = false;
                self.send_queued(id);
            }
        }
    }

    /// Resets stream `id` (the node's error on it, or its deadline).
    pub(super) fn reset(&mut self, id: u32, reason: Reason) {
        if self.streams.contains_key(&id) {
            frame::put_reset(&mut self.out, id, reason);
            self.close(id, true);
        }
    }

    /// A stream error on `id` whether or not it is open; a connection error on a stream never
    /// opened, which may not be reset (RFC 9113 §6.4).
    fn stream_error(&mut self, id: u32, reason: Reason, why: &str) -> Result<(), Broken> {
        if id > self.last_opened {
            return Err(broken(reason, format!("{why}, on a stream never opened")));
        }
        frame::put_reset(&mut self.out, id, reason);
        self.close(id, true);
        Ok(())
    }

    /// Resets a stream refused as it opened.
    fn reset_unopened(&mut self, id: u32, reason: Reason, end_stream: bool) {
        frame::put_reset(&mut self.out, id, reason);
        self.remember(id, !end_stream);
    }

    /// Forgets stream `id`, its held window given back; `by_node` when the node closed it.
    fn close(&mut self, id: u32, by_node: bool) {
        let Some(stream) = self.streams.remove(&id) else {
            return;
        };
        self.released += stream.held;
        if stream.waiting_for_connection {
            self.blocked.retain(|&b| b != id);
        }
        if let Some(decision) = stream.decision {
            decision.abort();
        }
        self.remember(id, by_node && !stream.remote_ended);
    }

    fn remember(&mut self, id: u32, in_flight: bool) {
        if self.recent.len() == RECENT_STREAMS {
            self.recent.pop_front();
        }
        self.recent.push_back((id, in_flight));
    }

    /// Whether frames of the caller's may still be in flight on a recently closed stream;
    /// `None` when it is not one of the last closed.
    fn recently_closed(&self, id: u32) -> Option<bool> {
        self.recent
            .iter()
            .rev()
            .find(|(closed, _)| *closed == id)
            .map(|&(_, in_flight)| in_flight)
    }

    /// The node ended its side of stream `id`: it is forgotten, or drained while its caller
    /// still sends.
    fn finish(&mut self, id: u32) {
        match self.streams.get_mut(&id) {
            Some(stream) if !stream.remote_ended => {
                stream.phase = Phase::Draining;
                stream.queued = Bytes::new();
                self.released += std::mem::take(&mut stream.held);
            }
            _ => self.close(id, true),
        }
    }

    /// Gives the connection's window back (WINDOW_UPDATE) once half of it is read and done
    /// with, or the caller has less than half left: the caller is never held back by bytes the
    /// node is done with, and the node does not write an update per frame.
    pub(super) fn give_back_window(&mut self) {
        let half = i64::from(self.limits.connection_window.max(frame::DEFAULT_WINDOW) / 2);
        let released = self.released as i64;
        if released > 0 && (released >= half || self.receive_window < half) {
            self.released = 0;
            self.receive_window += released;
            frame::put_window_update(&mut self.out, 0, released as u32);
        }
    }

    /// Calls past their deadline: a call not yet answered is refused with DEADLINE_EXCEEDED;
    /// one whose answer waits for the caller's window is reset (CANCEL); a Watch ends with
    /// DEADLINE_EXCEEDED.
    pub(super) fn expire(&mut self, now: Instant) {
        let due: Vec<(u32, Duration)> = self
            .streams
            .iter()
            .filter_map(|(&id, s)| {
                s.deadline
                    .filter(|(at, _)| *at <= now)
                    .map(|(_, d)| (id, d))
            })
            .collect();
        for (id, allowed) in due {
            let Some(stream) = self.streams.get(&id) else {
                continue;
            };
            if !stream.queued.is_empty() {
                self.reset(id, Reason::CANCEL);
                continue;
            }
            match stream.phase {
                // Its caller never finished sending: asked to stop (RFC 9113 §8.1).
                Phase::Draining => self.reset(id, Reason::NO_ERROR),
                Phase::Watching { .. } => {
                    let status =
                        Status::deadline_exceeded("the Watch reached the caller's grpc-timeout");
                    frame::put_headers(&mut self.out, id, &grpc::trailers_block(&status), true);
                    self.finish(id);
                }
                Phase::Receiving { .. } | Phase::Deciding | Phase::Refusing(_) => {
                    let status =
                        Status::deadline_exceeded(format!("not answered within {allowed:?}"));
                    self.refuse(id, &Refusal::Grpc(status));
                }
            }
        }
        self.give_back_window();
    }

    /// The earliest deadline of the calls open.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter_map(|s| s.deadline.map(|(at, _)| at))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    const LIMITS: Limits = Limits {
        stream_window: 65_535,
        connection_window: 1 << 20,
        max_message: 4_096,
        max_streams: 4,
        max_header_list: 1_024,
    };

    /// A connection past its preface and SETTINGS, its own first bytes taken.
    fn established() -> Connection {
        let mut connection = Connection::new(LIMITS);
        let mut input = BytesMut::from(&frame::PREFACE[..]);
        frame::put_settings(&mut input, &[]);
        connection.receive(&mut input, Instant::now()).unwrap();
        assert!(connection.established());
        connection.out.clear();
        connection
    }

    /// The frames in `out`, with their payloads.
    fn frames(out: &[u8]) -> Vec<(Head, Bytes)> {
        let mut out = Bytes::copy_from_slice(out);
        let mut frames = Vec::new();
        while let Some(head) = out.first_chunk::<{ frame::HEAD_BYTES }>().map(Head::read) {
            out.advance(frame::HEAD_BYTES);
            frames.push((head, out.split_to(head.length)));
        }
        frames
    }

    fn call_block(encoder: &mut loona_hpack::Encoder<'_>, extra: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut fields: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", grpc::SHOULD_RATE_LIMIT.as_bytes()),
            (b"content-type", b"application/grpc"),
        ];
        fields.extend_from_slice(extra);
        encoder.encode(fields)
    }

    fn feed(connection: &mut Connection, bytes: &BytesMut) -> Result<(), Broken> {
        let mut input = bytes.clone();
        connection.receive(&mut input, Instant::now()).map(|_| ())
    }

    fn goaways(out: &[u8]) -> Vec<u32> {
        frames(out)
            .into_iter()
            .filter(|(head, _)| head.kind == frame::GOAWAY)
            .map(|(_, payload)| frame::read_u31(&payload))
            .collect()
    }

    #[test]
    fn a_call_reset_before_it_is_decided_is_not_decided_and_a_reset_stops_its_decision() {
        let mut connection = established();
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = BytesMut::new();
        // Opened, whole and reset in one read (a "rapid reset"): read whole, not to decide.
        frame::put_headers(&mut input, 1, &call_block(&mut encoder, &[]), false);
        frame::put_data(&mut input, 1, b"\0\0\0\0\0", true);
        frame::put_reset(&mut input, 1, Reason::CANCEL);
        frame::put_headers(&mut input, 3, &call_block(&mut encoder, &[]), false);
        frame::put_data(&mut input, 3, b"\0\0\0\0\0", true);
        feed(&mut connection, &input).unwrap();
        let mut calls = Vec::new();
        connection.take_calls(&mut calls);
        assert_eq!(calls.len(), 2);
        assert!(!connection.deciding(1) && connection.deciding(3));
        // Stream 3's decision stops when its caller resets it.
        let (stop, _stopped) = AbortHandle::new_pair();
        connection.decide_with(3, stop.clone());
        let mut input = BytesMut::new();
        frame::put_reset(&mut input, 3, Reason::CANCEL);
        feed(&mut connection, &input).unwrap();
        assert!(stop.is_aborted());
        assert_eq!(connection.open_streams(), 0);
    }

    #[test]
    fn a_caller_that_reads_nothing_is_read_no_further() {
        let mut connection = established();
        connection.out.resize(MAX_UNWRITTEN_BYTES, 0);
        let mut input = BytesMut::new();
        for _ in 0..3 {
            frame::put_ping(&mut input, 0, b"12345678");
        }
        assert!(connection.receive(&mut input, Instant::now()).unwrap());
        assert_eq!(input.len(), 3 * 17, "left until the caller reads");
        connection.out.clear();
        assert!(!connection.receive(&mut input, Instant::now()).unwrap());
        assert!(input.is_empty());
        assert_eq!(frames(&connection.out).len(), 3, "three PING answers");
    }

    #[test]
    fn going_away_serves_the_calls_sent_meanwhile_then_refuses_new_ones() {
        let mut connection = established();
        let mut encoder = loona_hpack::Encoder::new();
        connection.go_away();
        assert_eq!(goaways(&connection.out), [frame::MAX_WINDOW]);
        connection.out.clear();
        // A call already on its way is served.
        let mut input = BytesMut::new();
        frame::put_headers(&mut input, 1, &call_block(&mut encoder, &[]), false);
        frame::put_data(&mut input, 1, b"\0\0\0\0\0", true);
        feed(&mut connection, &input).unwrap();
        assert!(connection.deciding(1));
        // The PING comes back: the last GOAWAY names stream 1, and stream 3 is refused.
        let mut input = BytesMut::new();
        frame::put_ping(&mut input, frame::ACK, &GOAWAY_PING);
        frame::put_headers(&mut input, 3, &call_block(&mut encoder, &[]), true);
        feed(&mut connection, &input).unwrap();
        assert_eq!(goaways(&connection.out), [1]);
        assert_eq!(resets(&connection.out), [(3, Reason::REFUSED_STREAM)]);
        assert!(!connection.finished(), "stream 1 is still to answer");
        connection.answer(1, &tonic_health::pb::HealthCheckResponse { status: 1 });
        assert!(connection.finished());
    }

    fn resets(out: &[u8]) -> Vec<(u32, Reason)> {
        frames(out)
            .into_iter()
            .filter(|(head, _)| head.kind == frame::RST_STREAM)
            .map(|(head, payload)| {
                (
                    head.stream,
                    Reason(u32::from_be_bytes(payload[..].try_into().unwrap())),
                )
            })
            .collect()
    }

    #[test]
    fn a_call_is_read_whole_and_answered_with_its_trailers_in_one_buffer() {
        let mut connection = established();
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = BytesMut::new();
        frame::put_headers(&mut input, 1, &call_block(&mut encoder, &[]), false);
        frame::put_data(&mut input, 1, b"\0\0\0\0\x02ab", true);
        feed(&mut connection, &input).unwrap();
        let mut calls = Vec::new();
        connection.take_calls(&mut calls);
        assert_eq!(calls.len(), 1);
        assert_eq!(
            (calls[0].stream, calls[0].route),
            (1, Route::ShouldRateLimit)
        );
        assert_eq!(calls[0].message, &b"ab"[..]);
        let answer = tonic_health::pb::HealthCheckResponse { status: 1 };
        connection.answer(1, &answer);
        let sent = frames(&connection.out);
        let kinds: Vec<(u8, u8)> = sent.iter().map(|(h, _)| (h.kind, h.flags)).collect();
        assert_eq!(
            kinds,
            [
                (frame::HEADERS, frame::END_HEADERS),
                (frame::DATA, 0),
                (frame::HEADERS, frame::END_HEADERS | frame::END_STREAM)
            ]
        );
        assert_eq!(sent[1].1, &b"\0\0\0\0\x02\x08\x01"[..]);
        assert_eq!(connection.open_streams(), 0);
    }

    #[test]
    fn what_breaks_the_connection_ends_it_with_the_reason_http2_names() {
        let cases: Vec<(&str, BytesMut, Reason)> = {
            let mut cases = Vec::new();
            let mut input = BytesMut::new();
            frame::put_head(&mut input, frame::MAX_PAYLOAD + 1, frame::DATA, 0, 1);
            cases.push(("an oversized frame", input, Reason::FRAME_SIZE_ERROR));
            let mut input = BytesMut::new();
            frame::put_data(&mut input, 3, b"x", false);
            cases.push((
                "DATA on a stream never opened",
                input,
                Reason::PROTOCOL_ERROR,
            ));
            let mut input = BytesMut::new();
            frame::put_headers(&mut input, 2, b"\x88", true);
            cases.push(("a stream a server opens", input, Reason::PROTOCOL_ERROR));
            let mut input = BytesMut::new();
            frame::put_headers(&mut input, 1, b"\xff\xff\xff\xff\xff\xff", true);
            cases.push(("HPACK garbage", input, Reason::COMPRESSION_ERROR));
            let mut input = BytesMut::new();
            frame::put_window_update(&mut input, 0, frame::MAX_WINDOW);
            cases.push(("a window past 2^31-1", input, Reason::FLOW_CONTROL_ERROR));
            let mut input = BytesMut::new();
            frame::put_head(&mut input, 0, frame::PUSH_PROMISE, 0, 1);
            cases.push(("PUSH_PROMISE", input, Reason::PROTOCOL_ERROR));
            let mut input = BytesMut::new();
            frame::put_head(&mut input, 8, frame::HEADERS, 0, 1);
            input.extend_from_slice(&[0x82; 8]);
            frame::put_ping(&mut input, 0, b"12345678");
            cases.push(("a header block interrupted", input, Reason::PROTOCOL_ERROR));
            let mut input = BytesMut::new();
            frame::put_head(&mut input, 1, frame::HEADERS, 0, 1);
            input.extend_from_slice(&[0x82]);
            for _ in 0..5 {
                frame::put_head(&mut input, frame::MAX_PAYLOAD, frame::CONTINUATION, 0, 1);
                input.extend_from_slice(&[0x82; frame::MAX_PAYLOAD]);
            }
            cases.push(("an endless header block", input, Reason::ENHANCE_YOUR_CALM));
            cases
        };
        for (case, input, reason) in cases {
            let broke = feed(&mut established(), &input).expect_err(case);
            assert_eq!(broke.reason, reason, "{case}: {}", broke.why);
        }
        // Not HTTP/2 at all, and HTTP/2 that skips SETTINGS.
        let mut fresh = Connection::new(LIMITS);
        let broke = feed(&mut fresh, &BytesMut::from(&b"GET / HTTP/1.1\r\n"[..])).unwrap_err();
        assert_eq!(broke.reason, Reason::PROTOCOL_ERROR);
        let mut input = BytesMut::from(&frame::PREFACE[..]);
        frame::put_ping(&mut input, 0, b"12345678");
        let broke = feed(&mut Connection::new(LIMITS), &input).unwrap_err();
        assert_eq!(broke.reason, Reason::PROTOCOL_ERROR);
    }

    #[test]
    fn what_breaks_one_stream_resets_that_stream_and_the_connection_serves_on() {
        let mut connection = established();
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = BytesMut::new();
        // Stream 1's message is past the limit: refused once the read is read; it then drains,
        // its frames let go.
        frame::put_headers(&mut input, 1, &call_block(&mut encoder, &[]), false);
        for _ in 0..3 {
            frame::put_data(&mut input, 1, &[0; 16_384], false);
        }
        // Stream 3 names a header in capitals: malformed.
        frame::put_headers(
            &mut input,
            3,
            &call_block(&mut encoder, &[(b"X-Caps", b"1")]),
            true,
        );
        // Stream 5's headers are over the list limit: HTTP 431.
        let big = vec![b'v'; 1_100];
        frame::put_headers(
            &mut input,
            5,
            &call_block(&mut encoder, &[(b"x-big", &big)]),
            true,
        );
        // Stream 7 is fine.
        frame::put_headers(&mut input, 7, &call_block(&mut encoder, &[]), false);
        frame::put_data(&mut input, 7, b"\0\0\0\0\0", true);
        feed(&mut connection, &input).unwrap();
        assert_eq!(
            resets(&connection.out),
            [(3, Reason::PROTOCOL_ERROR)],
            "stream 1 is refused, not reset: it drains until its caller ends it"
        );
        assert_eq!(
            connection.released,
            3 * 16_384 + 5,
            "stream 1's bytes, and 7's once whole"
        );
        let statuses: Vec<(u32, Fields)> = frames(&connection.out)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::HEADERS)
            .map(|(h, block)| {
                let mut fields = Vec::new();
                loona_hpack::Decoder::new()
                    .decode_with_cb(&block, |n, v| fields.push((n.into_owned(), v.into_owned())))
                    .unwrap();
                (h.stream, fields)
            })
            .collect();
        assert_eq!(statuses.len(), 2);
        let exhausted = (tonic::Code::ResourceExhausted as i32).to_string();
        assert_eq!(statuses[0].0, 1);
        assert_eq!(
            statuses[0].1[2],
            (b"grpc-status".to_vec(), exhausted.into_bytes())
        );
        assert_eq!((statuses[1].0, &statuses[1].1[0].1[..]), (5, &b"431"[..]));
        let mut calls = Vec::new();
        connection.take_calls(&mut calls);
        assert_eq!(calls.iter().map(|c| c.stream).collect::<Vec<_>>(), [7]);
        // Stream 1 drains: what it still sends is let go, its end closes it.
        assert_eq!(connection.open_streams(), 2);
        let mut input = BytesMut::new();
        frame::put_data(&mut input, 1, &[0; 100], true);
        feed(&mut connection, &input).unwrap();
        assert_eq!(connection.open_streams(), 1);
        assert_eq!(connection.released, 3 * 16_384 + 105);
    }

    #[test]
    fn streams_past_the_limit_are_refused_and_their_window_comes_back() {
        let mut connection = established();
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = BytesMut::new();
        for stream in [1, 3, 5, 7, 9] {
            frame::put_headers(&mut input, stream, &call_block(&mut encoder, &[]), false);
            frame::put_data(&mut input, stream, &[0; 1_000], false);
        }
        feed(&mut connection, &input).unwrap();
        assert_eq!(resets(&connection.out), [(9, Reason::REFUSED_STREAM)]);
        assert_eq!(connection.open_streams(), 4);
        // The caller resets the four: all 5,000 bytes are the connection's again.
        let mut input = BytesMut::new();
        for stream in [1, 3, 5, 7] {
            frame::put_reset(&mut input, stream, Reason::CANCEL);
        }
        connection.out.clear();
        feed(&mut connection, &input).unwrap();
        assert_eq!(connection.open_streams(), 0);
        assert_eq!(
            connection.released, 5_000,
            "not yet half the window: held back"
        );
        connection.receive_window = 100;
        connection.give_back_window();
        let updates: Vec<_> = frames(&connection.out)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::WINDOW_UPDATE)
            .map(|(_, p)| frame::read_u31(&p))
            .collect();
        assert_eq!(
            updates,
            [5_000],
            "a caller short of window gets it back at once"
        );
    }

    #[test]
    fn an_answer_waits_for_the_window_and_leaves_as_it_opens() {
        let mut connection = established();
        let mut input = BytesMut::new();
        frame::put_settings(&mut input, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 3)]);
        let mut encoder = loona_hpack::Encoder::new();
        frame::put_headers(&mut input, 1, &call_block(&mut encoder, &[]), false);
        frame::put_data(&mut input, 1, b"\0\0\0\0\0", true);
        feed(&mut connection, &input).unwrap();
        connection.take_calls(&mut Vec::new());
        connection.out.clear();
        connection.answer(1, &tonic_health::pb::HealthCheckResponse { status: 1 });
        let data: Vec<Bytes> = frames(&connection.out)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::DATA)
            .map(|(_, p)| p)
            .collect();
        assert_eq!(data, [Bytes::from_static(b"\0\0\0")]);
        assert_eq!(connection.open_streams(), 1);
        connection.out.clear();
        let mut input = BytesMut::new();
        frame::put_window_update(&mut input, 1, 100);
        feed(&mut connection, &input).unwrap();
        let sent: Vec<(u8, Bytes)> = frames(&connection.out)
            .into_iter()
            .map(|(h, p)| (h.kind, p))
            .collect();
        assert_eq!(
            sent[0],
            (frame::DATA, Bytes::from_static(b"\0\x02\x08\x01"))
        );
        assert_eq!(
            sent[1],
            (frame::HEADERS, Bytes::from_static(frame::OK_TRAILERS))
        );
        assert_eq!(connection.open_streams(), 0);
    }

    proptest! {
        /// Whatever follows the preface and SETTINGS, the connection reads it or says why it
        /// ends; it never panics, and what it holds stays within its limits.
        #[test]
        fn any_bytes_are_read_or_refused_without_a_panic(
            frames in proptest::collection::vec(
                (0u8..12, any::<u8>(), 0u32..12, proptest::collection::vec(any::<u8>(), 0..64)),
                0..40,
            )
        ) {
            let mut connection = established();
            let mut input = BytesMut::new();
            for (kind, flags, stream, payload) in &frames {
                frame::put_head(&mut input, payload.len(), *kind, *flags, *stream);
                input.extend_from_slice(payload);
            }
            if feed(&mut connection, &input).is_ok() {
                prop_assert!(connection.open_streams() <= LIMITS.max_streams as usize);
                connection.expire(Instant::now() + grpc::CALL_TIMEOUT);
                prop_assert_eq!(connection.open_streams(), 0);
            }
        }
    }
}
