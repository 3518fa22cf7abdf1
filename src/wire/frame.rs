//! Framing: encoding a frame, and `FrameReader`, which cuts a byte stream into validated frames.

use rkyv::util::AlignedVec;

use super::{BASE_LAYOUT, ErrorCode, FrameKind, HEADER_BYTES, MAGIC};
use crate::protocol;

/// One received frame: its header fields and its payload copied into an aligned buffer (rkyv
/// needs alignment; the bytes as received carry none).
#[derive(Debug)]
pub struct Frame {
    /// The protocol version of the payload's layout (see [`encode_frame_at`]).
    pub version: u8,
    pub kind: FrameKind,
    pub request_id: u64,
    pub payload: AlignedVec,
}

/// Why the byte stream could not be cut into frames. Every such error closes the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct FrameError {
    pub code: ErrorCode,
    /// The request id, when the header got far enough to have one.
    pub request_id: u64,
    pub message: String,
}

/// Appends one frame to `out`, of a kind whose payload has kept the layout of version 2.
pub fn encode_frame(out: &mut Vec<u8>, kind: FrameKind, request_id: u64, payload: &[u8]) {
    encode_frame_at(out, BASE_LAYOUT, kind, request_id, payload);
}

/// Appends one frame to `out` whose payload has the layout version `layout` brought. A frame
/// carries the version of its payload's layout, not the newest its sender speaks, so every
/// reader that knows that layout reads it: a kind unchanged since version 2 stays readable by
/// builds that speak only 2. A sender picks the layout from the version the connection agreed
/// on ([`crate::protocol`]).
pub fn encode_frame_at(
    out: &mut Vec<u8>,
    layout: u8,
    kind: FrameKind,
    request_id: u64,
    payload: &[u8],
) {
    // The caller's payloads are built by this crate and bounded well below 4 GiB.
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.reserve(HEADER_BYTES + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(layout);
    out.push(kind as u8);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(payload);
}

/// `message`'s payload as a receiver reads it back out of a frame: for decoder tests.
#[cfg(test)]
pub(crate) fn framed_payload<T>(kind: FrameKind, message: &T) -> AlignedVec
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    let mut bytes = Vec::new();
    encode_message(&mut bytes, kind, 1, message);
    let mut reader = FrameReader::new(1 << 20);
    reader.extend(&bytes);
    reader.next_frame().unwrap().unwrap().payload
}

/// Serializes `message` with rkyv and appends it as one frame to `out` (a kind unchanged since
/// version 2, as [`encode_frame`]).
pub fn encode_message<T>(out: &mut Vec<u8>, kind: FrameKind, request_id: u64, message: &T)
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    encode_message_at(out, BASE_LAYOUT, kind, request_id, message);
}

/// Serializes `message`, whose layout version `layout` brought, as one frame (see
/// [`encode_frame_at`]).
pub fn encode_message_at<T>(
    out: &mut Vec<u8>,
    layout: u8,
    kind: FrameKind,
    request_id: u64,
    message: &T,
) where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    // Serializing plain structs of vectors into memory cannot fail; an empty payload would be
    // refused by the receiver's validation, never misread.
    let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(message).unwrap_or_default();
    encode_frame_at(out, layout, kind, request_id, &bytes);
}

/// Cuts a byte stream into frames. Feed it whatever bytes arrive (`extend`), then take every
/// complete frame (`next_frame`). Memory is bounded by one frame plus one read (and one
/// payload given back with `recycle`).
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    max_frame_bytes: usize,
    /// A payload buffer given back by the reader's user ([`FrameReader::recycle`]), for the
    /// next frame: a reader that gets its payloads back allocates none per frame.
    spare: AlignedVec,
}

impl FrameReader {
    /// A reader refusing payloads over `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameReader {
            buf: Vec::new(),
            start: 0,
            max_frame_bytes,
            spare: AlignedVec::new(),
        }
    }

    /// Gives a frame's payload back once read, so the next frame is copied into its buffer.
    pub fn recycle(&mut self, payload: AlignedVec) {
        if payload.capacity() > self.spare.capacity() {
            self.spare = payload;
        }
    }

    /// Appends received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start * 2 > self.buf.len() {
            // Compact once the consumed prefix dominates, so the buffer never keeps old frames.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that makes the
    /// rest of the stream unreadable.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let bytes = &self.buf[self.start..];
        if bytes.len() < 4 {
            if !MAGIC.starts_with(&bytes[..bytes.len().min(2)]) {
                return Err(self.error(ErrorCode::BadMagic, 0, "frame does not start with \"FG\""));
            }
            return Ok(None);
        }
        if bytes[..2] != MAGIC {
            return Err(self.error(ErrorCode::BadMagic, 0, "frame does not start with \"FG\""));
        }
        let version = bytes[2];
        if !(BASE_LAYOUT..=protocol::NEWEST).contains(&version) {
            let message = format!(
                "frame of protocol version {version}: this build reads versions {}",
                protocol::SUPPORTED
            );
            return Err(self.error(ErrorCode::UnsupportedVersion, 0, &message));
        }
        if bytes.len() < HEADER_BYTES {
            return Ok(None);
        }
        let kind_byte = bytes[3];
        let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
        let request_id = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        if len > self.max_frame_bytes {
            let message = format!(
                "frame of {len} bytes exceeds the maximum of {}",
                self.max_frame_bytes
            );
            return Err(self.error(ErrorCode::FrameTooLarge, request_id, &message));
        }
        if bytes.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        let Some(kind) = FrameKind::from_u8(kind_byte) else {
            // Framing is intact, so the stream survives: skip the frame and report it.
            self.start += HEADER_BYTES + len;
            return Err(FrameError {
                code: ErrorCode::UnknownKind,
                request_id,
                message: format!("unknown frame kind {kind_byte}"),
            });
        };
        let mut payload = std::mem::take(&mut self.spare);
        payload.clear();
        payload.extend_from_slice(&bytes[HEADER_BYTES..HEADER_BYTES + len]);
        self.start += HEADER_BYTES + len;
        Ok(Some(Frame {
            version,
            kind,
            request_id,
            payload,
        }))
    }

    /// Call at the end of the stream: an error if it stopped in the middle of a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buffered() {
            0 => Ok(()),
            n => Err(FrameError {
                code: ErrorCode::Truncated,
                request_id: 0,
                message: format!("stream ended inside a frame ({n} bytes left over)"),
            }),
        }
    }

    fn error(&self, code: ErrorCode, request_id: u64, message: &str) -> FrameError {
        FrameError {
            code,
            request_id,
            message: message.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(request_id: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::DecisionBatch, request_id, payload);
        out
    }

    #[test]
    fn a_recycled_payload_buffer_carries_the_next_frame() {
        let mut reader = FrameReader::new(1 << 16);
        reader.extend(&frame_bytes(1, &[7; 64]));
        let first = reader.next_frame().unwrap().unwrap();
        let buffer = first.payload.as_ptr();
        reader.recycle(first.payload);
        reader.extend(&frame_bytes(2, &[9; 32]));
        let second = reader.next_frame().unwrap().unwrap();
        assert_eq!(second.request_id, 2);
        // The second frame's bytes alone, in the first frame's buffer.
        assert_eq!(second.payload.as_slice(), &[9; 32]);
        assert_eq!(second.payload.as_ptr(), buffer);
    }

    #[test]
    fn every_version_this_build_speaks_is_read_and_others_are_refused_naming_both() {
        for version in crate::protocol::OLDEST..=crate::protocol::NEWEST {
            let mut bytes = Vec::new();
            encode_frame_at(&mut bytes, version, FrameKind::Gossip, 3, &[1; 8]);
            let mut reader = FrameReader::new(1 << 16);
            reader.extend(&bytes);
            let frame = reader.next_frame().unwrap().unwrap();
            assert_eq!((frame.version, frame.kind), (version, FrameKind::Gossip));
        }
        for version in [0, 1, crate::protocol::NEWEST + 1, u8::MAX] {
            let mut bytes = Vec::new();
            encode_frame_at(&mut bytes, version, FrameKind::Gossip, 3, &[1; 8]);
            let mut reader = FrameReader::new(1 << 16);
            reader.extend(&bytes);
            let error = reader.next_frame().unwrap_err();
            assert_eq!(error.code, ErrorCode::UnsupportedVersion);
            assert!(
                error.message.contains(&format!("version {version}"))
                    && error
                        .message
                        .contains(&crate::protocol::SUPPORTED.to_string()),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn a_kind_unchanged_since_version_2_is_stamped_2() {
        let bytes = frame_bytes(1, &[0; 16]);
        assert_eq!(bytes[2], BASE_LAYOUT);
        assert_eq!(BASE_LAYOUT, 2);
    }
}
