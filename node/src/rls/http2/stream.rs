//! One stream's state as the connection keeps it, and the checks a request's header fields
//! must pass (RFC 9113 §8.2 and §8.3).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::AbortHandle;
use tokio::time::Instant;

use super::grpc::{Refusal, Route};

/// What RFC 9113 §8.2 and §8.3 ask of a header block's fields, checked as they are decoded.
#[derive(Debug, Default)]
pub(super) struct FieldCheck {
    /// As HTTP/2 counts a header list: each field's bytes and 32 more (counted by the caller
    /// of `note`).
    pub(super) list_bytes: usize,
    regular_seen: bool,
    pseudo_seen: bool,
    methods: u8,
    schemes: u8,
    paths: u8,
    malformed: bool,
    pub(super) content_length: Option<u64>,
}

impl FieldCheck {
    pub(super) fn note(&mut self, name: &[u8], value: &[u8]) {
        if let Some(pseudo) = name.strip_prefix(b":") {
            // Pseudo-fields come first, and a request has only these.
            self.pseudo_seen = true;
            self.malformed |= self.regular_seen;
            match pseudo {
                b"method" => self.methods = self.methods.saturating_add(1),
                b"scheme" => self.schemes = self.schemes.saturating_add(1),
                b"path" => {
                    self.paths = self.paths.saturating_add(1);
                    self.malformed |= value.is_empty();
                }
                b"authority" => {}
                _ => self.malformed = true,
            }
            return;
        }
        self.regular_seen = true;
        self.malformed |= name.iter().any(u8::is_ascii_uppercase)
            || matches!(
                name,
                b"connection"
                    | b"keep-alive"
                    | b"proxy-connection"
                    | b"transfer-encoding"
                    | b"upgrade"
            )
            || (name == b"te" && value != b"trailers");
        if name == b"content-length" {
            let length = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            self.malformed |= length.is_none() || self.content_length.is_some();
            self.content_length = length;
        }
    }

    /// A request's fields: `:method`, `:scheme` and `:path` once each.
    pub(super) fn request_ok(&self) -> bool {
        !self.malformed && self.methods == 1 && self.schemes == 1 && self.paths == 1
    }

    /// Trailers: no pseudo-field.
    pub(super) fn trailers_ok(&self) -> bool {
        !self.malformed && !self.pseudo_seen
    }
}

#[derive(Debug)]
pub(super) enum Phase {
    /// The request's message is arriving.
    Receiving { route: Route, body: Body },
    /// The request is whole; its answer is being decided.
    Deciding,
    /// A Watch answered with its first status; `not_serving` when that was NOT_SERVING.
    Watching { not_serving: bool },
    /// Refused: the refusal is sent once every frame of this read is read, so that a frame of
    /// the same read that breaks the stream is answered as HTTP/2 says.
    Refusing(Refusal),
    /// Answered in full before the caller ended its side: what it still sends is let go, and
    /// the stream closes with the caller's END_STREAM (or at its deadline). Keeping it open
    /// rather than resetting it checks the caller's frames on it as on any open stream.
    Draining,
}

/// A request's body as it arrives, in a buffer of its own: a call may outlive the read that
/// brought it (its decision waits on a bucket's owner), and a slice of the read buffer would
/// keep that whole buffer from being reused meanwhile.
#[derive(Debug, Default)]
pub(super) struct Body(BytesMut);

impl Body {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn push(&mut self, data: &[u8]) {
        if self.0.is_empty() {
            // At its size: a message in one DATA frame (Envoy's usual) is frozen without a
            // second allocation.
            self.0 = BytesMut::from(data);
        } else {
            self.0.extend_from_slice(data);
        }
    }

    pub(super) fn whole(self) -> Bytes {
        self.0.freeze()
    }
}

#[derive(Debug)]
pub(super) struct Stream {
    pub(super) phase: Phase,
    /// Bytes the caller may still send on it.
    pub(super) receive_window: i64,
    /// Bytes the node may still send on it.
    pub(super) send_window: i64,
    /// Bytes of the connection's window its unfinished message holds.
    pub(super) held: usize,
    /// The caller ended its side (END_STREAM).
    pub(super) remote_ended: bool,
    /// The request's `content-length`, and the DATA bytes that came (padding aside).
    pub(super) content_length: Option<u64>,
    pub(super) received: u64,
    /// When it is refused (or a Watch ended); what it was allowed, for the refusal.
    pub(super) deadline: Option<(Instant, Duration)>,
    /// When a Watch ends, as its caller asked (None: when the node stops).
    pub(super) watch_until: Option<Instant>,
    /// An answer's bytes waiting for the caller's window, and the trailers after them.
    pub(super) queued: Bytes,
    pub(super) trailers: Option<Bytes>,
    /// In `blocked`: its bytes wait for the connection's window (not its own).
    pub(super) waiting_for_connection: bool,
    /// Stops its decision when the stream closes first (reset, or past its deadline).
    pub(super) decision: Option<AbortHandle>,
}
