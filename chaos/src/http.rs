//! The little HTTP/1.1 the harness speaks to example-gateway processes: a `GET` carrying a user
//! header over keep-alive loopback connections, and the response parser it needs (status line,
//! headers, a body sized by `Content-Length`, chunked, or running to the close). Hand-written
//! rather than hyper: the gateways answer short bodies on loopback, and the crate keeps its
//! dependencies (and the workspace's lock file) as they are.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest response head accepted (status line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Longest body accepted (a gateway's answers are a few hundred bytes).
pub const MAX_BODY: usize = 1 << 20;

/// Why a response could not be read.
#[derive(Debug)]
pub enum HttpError {
    /// Not HTTP/1.x as this parser reads it.
    Malformed(&'static str),
    /// A head over [`MAX_HEAD`] or a body over [`MAX_BODY`].
    TooLarge,
    /// The connection closed before the response was complete.
    Truncated,
    /// The connection closed before any byte of the response: on a reused connection, the
    /// gateway had closed it while idle, and the request may go again on a new one.
    Closed,
    Io(std::io::Error),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Malformed(why) => write!(f, "malformed response: {why}"),
            HttpError::TooLarge => write!(f, "response too large"),
            HttpError::Truncated => write!(f, "connection closed mid-response"),
            HttpError::Closed => write!(f, "connection closed before an answer"),
            HttpError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl From<std::io::Error> for HttpError {
    fn from(e: std::io::Error) -> Self {
        HttpError::Io(e)
    }
}

/// One complete response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Whether the connection may carry the next request.
    pub keep_alive: bool,
    /// Bytes of the buffer the response took.
    pub consumed: usize,
}

/// What [`parse_response`] found in the bytes read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// More bytes are needed.
    Incomplete,
    Done(Response),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Fixed(usize),
    Chunked,
    UntilClose,
}

/// Reads one response from the start of `buf`. `closed`: the peer has closed, so nothing more
/// will come (a body without a length ends there; anything else incomplete is truncated).
pub fn parse_response(buf: &[u8], closed: bool) -> Result<Parse, HttpError> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(HttpError::TooLarge);
        }
        return if closed {
            Err(HttpError::Truncated)
        } else {
            Ok(Parse::Incomplete)
        };
    };
    if head_end > MAX_HEAD {
        return Err(HttpError::TooLarge);
    }
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| HttpError::Malformed("head is not UTF-8"))?;
    let Head {
        status,
        mut keep_alive,
        length,
        chunked,
    } = parse_head(head)?;
    let body = if status == 204 || status == 304 {
        Body::Fixed(0)
    } else if chunked {
        // Transfer-Encoding wins over Content-Length (RFC 9112, 6.3).
        Body::Chunked
    } else {
        match length {
            Some(n) => Body::Fixed(n),
            None => Body::UntilClose,
        }
    };
    let start = head_end + 4;
    let end = match body {
        Body::Fixed(n) => {
            if n > MAX_BODY {
                return Err(HttpError::TooLarge);
            }
            (buf.len() >= start + n).then_some(start + n)
        }
        Body::Chunked => chunked_end(buf, start)?,
        Body::UntilClose => {
            keep_alive = false;
            if buf.len() - start > MAX_BODY {
                return Err(HttpError::TooLarge);
            }
            closed.then_some(buf.len())
        }
    };
    match end {
        Some(consumed) => Ok(Parse::Done(Response {
            status,
            keep_alive,
            consumed,
        })),
        None if closed => Err(HttpError::Truncated),
        None => Ok(Parse::Incomplete),
    }
}

/// What a response's head says about its body and its connection.
struct Head {
    status: u16,
    keep_alive: bool,
    length: Option<usize>,
    chunked: bool,
}

/// The status line and the headers that matter here (without the blank line ending them).
fn parse_head(head: &str) -> Result<Head, HttpError> {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let keep_alive = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(HttpError::Malformed("not an HTTP/1.x status line")),
    };
    let code = parts.next().unwrap_or_default();
    let status: u16 = match code.parse() {
        Ok(s) if code.len() == 3 && (200..600).contains(&s) => s,
        Ok(s) if (100..200).contains(&s) => {
            return Err(HttpError::Malformed(
                "interim (1xx) responses are not expected",
            ));
        }
        _ => return Err(HttpError::Malformed("bad status code")),
    };
    let mut head = Head {
        status,
        keep_alive,
        length: None,
        chunked: false,
    };
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or(HttpError::Malformed("header line without a colon"))?;
        read_header(&mut head, version, name, value.trim())?;
    }
    Ok(head)
}

/// One header line's part in `head`: the body's length or encoding, or the connection's fate.
fn read_header(head: &mut Head, version: &str, name: &str, value: &str) -> Result<(), HttpError> {
    if name.eq_ignore_ascii_case("content-length") {
        let n: usize = value
            .parse()
            .map_err(|_| HttpError::Malformed("bad content-length"))?;
        if head.length.is_some_and(|l| l != n) {
            return Err(HttpError::Malformed("conflicting content-length"));
        }
        head.length = Some(n);
    } else if name.eq_ignore_ascii_case("transfer-encoding") {
        head.chunked = value
            .rsplit(',')
            .next()
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        if !head.chunked {
            return Err(HttpError::Malformed("unsupported transfer-encoding"));
        }
    } else if name.eq_ignore_ascii_case("connection") {
        for token in value.split(',').map(str::trim) {
            if token.eq_ignore_ascii_case("close") {
                head.keep_alive = false;
            } else if token.eq_ignore_ascii_case("keep-alive") && version == "HTTP/1.0" {
                head.keep_alive = true;
            }
        }
    }
    Ok(())
}

/// Where a chunked body starting at `start` ends (after its last chunk and trailers), or
/// `None` when it has not all arrived.
fn chunked_end(buf: &[u8], start: usize) -> Result<Option<usize>, HttpError> {
    let mut at = start;
    loop {
        let Some(line_len) = find(&buf[at..], b"\r\n") else {
            if buf.len() - at > 64 {
                return Err(HttpError::Malformed("chunk size line too long"));
            }
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + line_len])
            .map_err(|_| HttpError::Malformed("chunk size is not UTF-8"))?;
        let digits = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(digits, 16)
            .map_err(|_| HttpError::Malformed("bad chunk size"))?;
        at += line_len + 2;
        if size == 0 {
            // Trailer lines, then the empty line that ends the message.
            loop {
                let Some(len) = find(&buf[at..], b"\r\n") else {
                    return Ok(None);
                };
                at += len + 2;
                if len == 0 {
                    return Ok(Some(at));
                }
            }
        }
        if at - start + size > MAX_BODY {
            return Err(HttpError::TooLarge);
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(HttpError::Malformed("chunk not followed by CRLF"));
        }
        at += size + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The request the harness sends: `GET path` as `user` (the `X-User-Id` an auth step in front
/// of a gateway would set).
pub fn get_request(path: &str, user: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: chaos\r\nX-User-Id: {user}\r\n\r\n").into_bytes()
}

/// A keep-alive connection to a gateway.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Connection {
    pub async fn connect(addr: SocketAddr) -> Result<Connection, HttpError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buf: Vec::with_capacity(1024),
        })
    }

    /// Sends `request` and reads its response. The caller bounds it in time; the connection
    /// may be reused only when the answer says `keep_alive`.
    pub async fn exchange(&mut self, request: &[u8]) -> Result<Response, HttpError> {
        self.buf.clear();
        if self.stream.write_all(request).await.is_err() {
            return Err(HttpError::Closed);
        }
        let mut chunk = [0u8; 4096];
        loop {
            let read = match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) if self.buf.is_empty() => return Err(HttpError::Closed),
                read => read?,
            };
            self.buf.extend_from_slice(&chunk[..read]);
            match parse_response(&self.buf, read == 0)? {
                Parse::Done(mut response) => {
                    // Bytes past the response (none are expected) would be misread as the
                    // next answer: such a connection is not reused.
                    response.keep_alive &= response.consumed == self.buf.len() && read > 0;
                    return Ok(response);
                }
                Parse::Incomplete if self.buf.len() > MAX_HEAD + MAX_BODY => {
                    return Err(HttpError::TooLarge);
                }
                Parse::Incomplete => {}
            }
        }
    }
}

/// How long one request to a gateway may take, connecting included, before it counts as
/// unanswered (the gateway's own limiter timeout is 50 ms).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What a gateway's status says about the check behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 200: a node admitted it (the rule fails closed, so nothing else admits).
    Admitted,
    /// 429: denied.
    Denied,
    /// 503: the limiter could not decide and the rule fails closed.
    Unavailable,
    /// Any other status: not an answer the limiter gives.
    Unexpected(u16),
}

pub fn outcome(status: u16) -> Outcome {
    match status {
        200 => Outcome::Admitted,
        429 => Outcome::Denied,
        503 => Outcome::Unavailable,
        other => Outcome::Unexpected(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(buf: &[u8], closed: bool) -> Response {
        match parse_response(buf, closed) {
            Ok(Parse::Done(r)) => r,
            other => panic!("{other:?} for {:?}", String::from_utf8_lossy(buf)),
        }
    }

    #[test]
    fn a_sized_response_is_done_only_once_its_body_arrived_at_any_split() {
        let text = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"ok\":true}\n";
        for split in 0..text.len() {
            assert_eq!(
                parse_response(&text[..split], false).unwrap(),
                Parse::Incomplete,
                "at {split}"
            );
        }
        assert_eq!(
            done(text, false),
            Response {
                status: 200,
                keep_alive: true,
                consumed: text.len()
            }
        );
        // Closed before the body ended: truncated, not an answer.
        assert!(matches!(
            parse_response(&text[..text.len() - 1], true),
            Err(HttpError::Truncated)
        ));
    }

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_and_trailers() {
        let text = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..text.len() {
            assert_eq!(
                parse_response(&text[..split], false).unwrap(),
                Parse::Incomplete,
                "at {split}"
            );
        }
        let response = done(text, false);
        assert_eq!((response.status, response.consumed), (429, text.len()));
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n";
        assert!(matches!(
            parse_response(bad, false),
            Err(HttpError::Malformed(_))
        ));
        let size = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(matches!(
            parse_response(size, false),
            Err(HttpError::Malformed("bad chunk size"))
        ));
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        let status = |head: &str| {
            done(
                format!("{head}\r\ncontent-length: 0\r\n\r\n").as_bytes(),
                false,
            )
        };
        assert!(status("HTTP/1.1 200 OK").keep_alive);
        assert!(!status("HTTP/1.1 200 OK\r\nConnection: close").keep_alive);
        assert!(!status("HTTP/1.0 200 OK").keep_alive);
        assert!(status("HTTP/1.0 200 OK\r\nconnection: Keep-Alive").keep_alive);
        // No length: the body runs to the close, which ends the connection.
        let open = b"HTTP/1.1 503 Service Unavailable\r\n\r\nbody";
        assert_eq!(parse_response(open, false).unwrap(), Parse::Incomplete);
        let response = done(open, true);
        assert_eq!((response.status, response.keep_alive), (503, false));
        assert_eq!(response.consumed, open.len());
        // 204 has no body whatever else is said.
        assert_eq!(done(b"HTTP/1.1 204 No Content\r\n\r\n", false).consumed, 27);
    }

    #[test]
    fn what_is_not_a_response_is_refused() {
        for (text, why) in [
            (&b"SSH-2.0-x\r\n\r\n"[..], "not an HTTP/1.x status line"),
            (b"HTTP/1.1 20 OK\r\n\r\n", "bad status code"),
            (b"HTTP/1.1 700 Odd\r\n\r\n", "bad status code"),
            (
                b"HTTP/1.1 100 Continue\r\n\r\n",
                "interim (1xx) responses are not expected",
            ),
            (
                b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
                "header line without a colon",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                "conflicting content-length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
                "bad content-length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                "unsupported transfer-encoding",
            ),
        ] {
            match parse_response(text, false) {
                Err(HttpError::Malformed(found)) => assert_eq!(found, why),
                other => panic!("{other:?} for {:?}", String::from_utf8_lossy(text)),
            }
        }
        let long = vec![b'a'; MAX_HEAD + 1];
        assert!(matches!(
            parse_response(&long, false),
            Err(HttpError::TooLarge)
        ));
        let huge = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert!(matches!(
            parse_response(huge.as_bytes(), false),
            Err(HttpError::TooLarge)
        ));
        assert!(matches!(
            parse_response(b"HTTP/1.1 200", true),
            Err(HttpError::Truncated)
        ));
    }

    #[test]
    fn statuses_map_to_what_the_limiter_decided() {
        assert_eq!(outcome(200), Outcome::Admitted);
        assert_eq!(outcome(429), Outcome::Denied);
        assert_eq!(outcome(503), Outcome::Unavailable);
        assert_eq!(outcome(502), Outcome::Unexpected(502));
    }

    #[test]
    fn the_request_names_the_path_and_the_user() {
        assert_eq!(
            get_request("/chaos/requests", "user-3"),
            b"GET /chaos/requests HTTP/1.1\r\nHost: chaos\r\nX-User-Id: user-3\r\n\r\n"
        );
    }
}
