//! HTTP/2's frames (RFC 9113 §4 and §6) as the RLS listener reads and writes them, and the few
//! header blocks it sends. Those are HPACK-encoded without the dynamic table (RFC 7541 §6.2.2,
//! "literal without indexing"), so the node keeps no encoder state for its callers.

use bytes::{BufMut, BytesMut};

/// What a caller sends before its first frame.
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's header: length (24 bits), type, flags, stream (31 bits).
pub(super) const HEAD_BYTES: usize = 9;
/// The largest frame payload the node reads: HTTP/2's default, which it never raises.
pub(super) const MAX_PAYLOAD: usize = 16_384;
/// Every window's size until a SETTINGS or WINDOW_UPDATE says otherwise.
pub(super) const DEFAULT_WINDOW: u32 = 65_535;
/// The most a flow-control window may hold.
pub(super) const MAX_WINDOW: u32 = (1 << 31) - 1;
/// The largest frame payload a caller may ask the node to accept from it is up to the caller; the
/// node's own writes never exceed what the caller allows, HTTP/2's default at least.
pub(super) const MAX_ALLOWED_PAYLOAD: u32 = (1 << 24) - 1;

pub(super) const END_STREAM: u8 = 0x1;
pub(super) const ACK: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

/// Frame types.
pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const PRIORITY_FRAME: u8 = 0x2;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PUSH_PROMISE: u8 = 0x5;
pub(super) const PING: u8 = 0x6;
pub(super) const GOAWAY: u8 = 0x7;
pub(super) const WINDOW_UPDATE: u8 = 0x8;
pub(super) const CONTINUATION: u8 = 0x9;

/// SETTINGS parameters.
pub(super) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(super) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(super) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(super) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113 §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reason(pub(super) u32);

impl Reason {
    pub(super) const NO_ERROR: Reason = Reason(0x0);
    pub(super) const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub(super) const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub(super) const STREAM_CLOSED: Reason = Reason(0x5);
    pub(super) const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub(super) const REFUSED_STREAM: Reason = Reason(0x7);
    pub(super) const CANCEL: Reason = Reason(0x8);
    pub(super) const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub(super) const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
}

/// A frame's header, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) length: usize,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
}

impl Head {
    pub(super) fn read(bytes: &[u8; HEAD_BYTES]) -> Head {
        Head {
            length: usize::from(bytes[0]) << 16
                | usize::from(bytes[1]) << 8
                | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            // The reserved bit is ignored on receipt.
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & MAX_WINDOW,
        }
    }
}

/// A 31-bit value from four bytes (the reserved bit ignored).
pub(super) fn read_u31(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & MAX_WINDOW
}

/// A DATA or HEADERS payload without its padding; `None` when the padding says it is longer
/// than the payload (a PROTOCOL_ERROR).
pub(super) fn unpadded(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    if flags & PADDED == 0 {
        return Some(payload);
    }
    let (&pad, rest) = payload.split_first()?;
    rest.get(..rest.len().checked_sub(usize::from(pad))?)
}

pub(super) fn put_head(out: &mut BytesMut, length: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(length <= MAX_ALLOWED_PAYLOAD as usize);
    let length = length as u32;
    out.put_slice(&[
        (length >> 16) as u8,
        (length >> 8) as u8,
        length as u8,
        kind,
        flags,
    ]);
    out.put_u32(stream);
}

pub(super) fn put_settings(out: &mut BytesMut, settings: &[(u16, u32)]) {
    put_head(out, settings.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in settings {
        out.put_u16(id);
        out.put_u32(value);
    }
}

pub(super) fn put_settings_ack(out: &mut BytesMut) {
    put_head(out, 0, SETTINGS, ACK, 0);
}

pub(super) fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.put_u32(increment);
}

pub(super) fn put_ping(out: &mut BytesMut, flags: u8, payload: &[u8; 8]) {
    put_head(out, 8, PING, flags, 0);
    out.put_slice(payload);
}

pub(super) fn put_reset(out: &mut BytesMut, stream: u32, reason: Reason) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.put_u32(reason.0);
}

/// GOAWAY, with a debug text cut to fit one frame.
pub(super) fn put_go_away(out: &mut BytesMut, last_stream: u32, reason: Reason, debug: &str) {
    let debug = &debug.as_bytes()[..debug.len().min(256)];
    put_head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.put_u32(last_stream);
    out.put_u32(reason.0);
    out.put_slice(debug);
}

/// A header block in one HEADERS frame: the node's blocks are small, far under any frame size a
/// caller may set.
pub(super) fn put_headers(out: &mut BytesMut, stream: u32, block: &[u8], end_stream: bool) {
    let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
    put_head(out, block.len(), HEADERS, flags, stream);
    out.put_slice(block);
}

pub(super) fn put_data(out: &mut BytesMut, stream: u32, data: &[u8], end_stream: bool) {
    put_head(
        out,
        data.len(),
        DATA,
        if end_stream { END_STREAM } else { 0 },
        stream,
    );
    out.put_slice(data);
}

/// HPACK: `:status: 200` (static table entry 8) and `content-type: application/grpc` (a literal
/// without indexing, its name static entry 31).
pub(super) const GRPC_HEAD: &[u8] = b"\x88\x0f\x10\x10application/grpc";
/// HPACK: `grpc-status: 0`, a literal without indexing.
pub(super) const OK_TRAILERS: &[u8] = b"\x00\x0bgrpc-status\x010";

/// HPACK's integer (RFC 7541 §5.1) with `prefix` bits in the first byte, whose other bits are
/// `first`'s.
pub(super) fn put_integer(out: &mut BytesMut, first: u8, prefix: u8, mut value: usize) {
    let most = (1usize << prefix) - 1;
    if value < most {
        out.put_u8(first | value as u8);
        return;
    }
    out.put_u8(first | most as u8);
    value -= most;
    while value >= 128 {
        out.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.put_u8(value as u8);
}

/// A string literal, not Huffman-coded.
fn put_string(out: &mut BytesMut, text: &[u8]) {
    put_integer(out, 0, 7, text.len());
    out.put_slice(text);
}

/// A header field as a literal without indexing, with a new name.
pub(super) fn put_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_u8(0);
    put_string(out, name);
    put_string(out, value);
}

/// `:status: code`, a literal without indexing whose name is static entry 8.
pub(super) fn put_status(out: &mut BytesMut, code: u16) {
    if code == 200 {
        out.put_u8(0x88);
        return;
    }
    out.put_u8(0x08);
    put_string(out, code.to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_round_trips_and_the_reserved_bit_is_ignored() {
        let mut out = BytesMut::new();
        put_head(&mut out, 70_000, HEADERS, END_HEADERS, 7);
        let mut bytes: [u8; HEAD_BYTES] = out[..].try_into().unwrap();
        bytes[5] |= 0x80;
        let head = Head::read(&bytes);
        assert_eq!(
            head,
            Head {
                length: 70_000,
                kind: HEADERS,
                flags: END_HEADERS,
                stream: 7
            }
        );
    }

    #[test]
    fn padding_is_taken_off_and_padding_past_the_payload_is_refused() {
        assert_eq!(unpadded(PADDED, b"\x02abc\0\0"), Some(&b"abc"[..]));
        assert_eq!(unpadded(0, b"abc"), Some(&b"abc"[..]));
        // Padding may take the whole payload after its length, but no more.
        assert_eq!(unpadded(PADDED, b"\x02ab"), Some(&b""[..]));
        assert!(unpadded(PADDED, b"\x03ab").is_none());
        assert!(unpadded(PADDED, b"").is_none());
    }

    #[test]
    fn the_blocks_sent_decode_as_hpack_says() {
        let mut block = BytesMut::from(GRPC_HEAD);
        block.extend_from_slice(OK_TRAILERS);
        put_status(&mut block, 415);
        put_field(&mut block, b"grpc-message", "x".repeat(300).as_bytes());
        let mut fields = Vec::new();
        loona_hpack::Decoder::new()
            .decode_with_cb(&block, |name, value| {
                fields.push((name.into_owned(), value.into_owned()));
            })
            .unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b":status".to_vec(), b"200".to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"grpc-status".to_vec(), b"0".to_vec()),
            (b":status".to_vec(), b"415".to_vec()),
            (b"grpc-message".to_vec(), "x".repeat(300).into_bytes()),
        ];
        assert_eq!(fields, expected);
    }
}
