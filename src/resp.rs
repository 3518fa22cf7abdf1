//! RESP, the Redis protocol: commands parsed from bytes under caps on every length, replies
//! written as RESP2 or RESP3. Pure: no sockets, no runtime.
//!
//! A command is an array of bulk strings (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`), or an inline
//! line (`PING hi\r\n`) as typed into telnet. Anything malformed is a [`ProtocolError`], after
//! which the stream cannot be resynchronised and the server closes the connection, as Redis does.

use std::fmt;

/// Caps on what one command may hold; a command over any of them is a protocol error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespLimits {
    /// Most arguments, the command name included.
    pub max_args: usize,
    /// Longest single argument, in bytes.
    pub max_arg_bytes: usize,
    /// Longest whole command as sent (headers and arguments), and longest inline line.
    pub max_command_bytes: usize,
}

impl Default for RespLimits {
    fn default() -> Self {
        RespLimits {
            max_args: 256,
            max_arg_bytes: 16 * 1024,
            max_command_bytes: 64 * 1024,
        }
    }
}

/// Why the bytes are not RESP; the text is the reply after `-ERR `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

/// What the start of a buffer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A whole command (never empty), and how many bytes it took.
    Command(Vec<Vec<u8>>, usize),
    /// Bytes that carry no command (an empty line, `*0`), to be skipped.
    Skip(usize),
    /// Not all there yet: nothing can be said before the buffer holds at least this many bytes.
    Incomplete(usize),
}

/// Parses the command at the start of `buf`.
pub fn parse_command(buf: &[u8], limits: &RespLimits) -> Result<Parsed, ProtocolError> {
    match buf.first() {
        None => Ok(Parsed::Incomplete(1)),
        Some(b'*') => parse_multibulk(buf, limits),
        Some(_) => parse_inline(buf, limits),
    }
}

fn error(message: impl Into<String>) -> ProtocolError {
    ProtocolError(message.into())
}

/// The line starting at `from` (without its `\r\n`) and where the next one starts, or `None`
/// when its end is not there yet. A line longer than `max` is an error.
fn line(buf: &[u8], from: usize, max: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let rest = &buf[from.min(buf.len())..];
    match rest.iter().position(|&b| b == b'\n') {
        Some(end) if end > max => Err(error("too big line")),
        Some(end) => {
            let text = &rest[..end];
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            Ok(Some((text, from + end + 1)))
        }
        None if rest.len() > max => Err(error("too big line")),
        None => Ok(None),
    }
}

/// A length header's number: ASCII digits with an optional leading `-`, at most 18 of them.
fn number(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    Some(if negative { -value } else { value })
}

/// Longest header line (`*` or `$`, sign and 18 digits): a longer one is hostile.
const MAX_HEADER: usize = 24;

fn parse_multibulk(buf: &[u8], limits: &RespLimits) -> Result<Parsed, ProtocolError> {
    let Some((header, mut at)) = line(buf, 0, MAX_HEADER)? else {
        return Ok(Parsed::Incomplete(buf.len() + 1));
    };
    let count = number(&header[1..]).ok_or_else(|| error("invalid multibulk length"))?;
    if count <= 0 {
        return Ok(Parsed::Skip(at));
    }
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count > limits.max_args {
        return Err(error(format!(
            "invalid multibulk length (at most {} arguments)",
            limits.max_args
        )));
    }
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let Some((header, body)) = line(buf, at, MAX_HEADER)? else {
            return Ok(Parsed::Incomplete(buf.len() + 1));
        };
        match header.first() {
            Some(b'$') => {}
            Some(&other) => {
                return Err(error(format!(
                    "expected '$', got '{}'",
                    char::from(other).escape_default()
                )));
            }
            None => return Err(error("expected '$', got an empty line")),
        }
        let len = number(&header[1..])
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= limits.max_arg_bytes)
            .ok_or_else(|| error("invalid bulk length"))?;
        let end = body + len + 2;
        if end > limits.max_command_bytes {
            return Err(error(format!(
                "command longer than {} bytes",
                limits.max_command_bytes
            )));
        }
        if buf.len() < end {
            return Ok(Parsed::Incomplete(end));
        }
        if &buf[body + len..end] != b"\r\n" {
            return Err(error("expected CRLF after a bulk string"));
        }
        args.push(buf[body..body + len].to_vec());
        at = end;
    }
    Ok(Parsed::Command(args, at))
}

fn parse_inline(buf: &[u8], limits: &RespLimits) -> Result<Parsed, ProtocolError> {
    let Some((text, next)) =
        line(buf, 0, limits.max_command_bytes).map_err(|_| error("too big inline request"))?
    else {
        return Ok(Parsed::Incomplete(buf.len() + 1));
    };
    let args: Vec<Vec<u8>> = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|word| !word.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if args.is_empty() {
        return Ok(Parsed::Skip(next));
    }
    if args.len() > limits.max_args || args.iter().any(|a| a.len() > limits.max_arg_bytes) {
        return Err(error("too big inline request"));
    }
    Ok(Parsed::Command(args, next))
}

/// The protocol a connection's replies are written in (`HELLO 3` switches to RESP3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

/// A reply, written by [`Reply::write`] in either protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`: a status line (no `\r` or `\n` inside).
    Simple(String),
    /// `-ERR ...`: the text starts with the error code.
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    /// RESP2 `$-1`, RESP3 `_`.
    Null,
    Array(Vec<Reply>),
    /// RESP3 `%`; in RESP2 a flat array of keys and values.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK".to_owned())
    }

    pub fn error(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    pub fn bulk(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(bytes.into())
    }

    /// Appends the reply's bytes to `out`.
    pub fn write(&self, protocol: Protocol, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(text) => line_reply(out, b'+', text),
            Reply::Error(text) => line_reply(out, b'-', text),
            Reply::Integer(n) => {
                out.push(b':');
                decimal(out, *n);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Bulk(bytes) => {
                header(out, b'$', bytes.len());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Null => match protocol {
                Protocol::Resp2 => out.extend_from_slice(b"$-1\r\n"),
                Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
            },
            Reply::Array(items) => {
                header(out, b'*', items.len());
                for item in items {
                    item.write(protocol, out);
                }
            }
            Reply::Map(pairs) => {
                match protocol {
                    Protocol::Resp2 => header(out, b'*', pairs.len() * 2),
                    Protocol::Resp3 => header(out, b'%', pairs.len()),
                }
                for (key, value) in pairs {
                    key.write(protocol, out);
                    value.write(protocol, out);
                }
            }
        }
    }
}

fn header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.push(kind);
    decimal(out, i64::try_from(len).unwrap_or(i64::MAX));
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written in place: a reply's numbers cost no allocation.
fn decimal(out: &mut Vec<u8>, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// A status or error line: a line break inside would start a bogus reply, so it becomes a space.
fn line_reply(out: &mut Vec<u8>, kind: u8, text: &str) {
    out.push(kind);
    out.extend(
        text.bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Parsed, ProtocolError> {
        parse_command(bytes, &RespLimits::default())
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn integers_are_written_as_decimal_text() {
        for n in [0, 7, -1, 10, -10, 1_000_000_007, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            Reply::Integer(n).write(Protocol::Resp2, &mut out);
            assert_eq!(out, format!(":{n}\r\n").into_bytes());
        }
        let mut out = Vec::new();
        Reply::Array(vec![Reply::Integer(1); 12]).write(Protocol::Resp3, &mut out);
        assert!(out.starts_with(b"*12\r\n:1\r\n"));
    }

    #[test]
    fn a_multibulk_command_and_its_length() {
        let bytes = b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*1\r\n";
        assert_eq!(parse(bytes), Ok(Parsed::Command(args(&["ECHO", "hi"]), 22)));
        // Binary arguments pass as they are, CRLF inside included.
        assert_eq!(
            parse(b"*1\r\n$4\r\na\r\nb\r\n"),
            Ok(Parsed::Command(vec![b"a\r\nb".to_vec()], 14))
        );
    }

    #[test]
    fn every_prefix_of_a_command_is_incomplete_and_says_how_much_is_needed() {
        let bytes = b"*3\r\n$11\r\nCL.THROTTLE\r\n$3\r\nkey\r\n";
        for cut in 0..bytes.len() {
            match parse(&bytes[..cut]) {
                Ok(Parsed::Incomplete(needed)) => assert!(needed > cut, "cut {cut}"),
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        // Inside a bulk, the whole bulk's end is known.
        assert_eq!(parse(b"*1\r\n$10\r\nab"), Ok(Parsed::Incomplete(21)));
    }

    #[test]
    fn inline_commands_and_empty_lines() {
        assert_eq!(
            parse(b"PING  hello\r\n"),
            Ok(Parsed::Command(args(&["PING", "hello"]), 13))
        );
        assert_eq!(parse(b"ping\n"), Ok(Parsed::Command(args(&["ping"]), 5)));
        assert_eq!(parse(b"\r\n"), Ok(Parsed::Skip(2)));
        assert_eq!(parse(b"*0\r\n"), Ok(Parsed::Skip(4)));
        assert_eq!(parse(b"*-1\r\n"), Ok(Parsed::Skip(5)));
    }

    #[test]
    fn malformed_and_oversized_input_is_a_protocol_error() {
        let limits = RespLimits {
            max_args: 3,
            max_arg_bytes: 8,
            max_command_bytes: 40,
        };
        let bad: [&[u8]; 9] = [
            b"*x\r\n",
            b"*4\r\n",
            b"*1\r\n:1\r\n",
            b"*1\r\n$9\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$2\r\nabXY",
            b"*99999999999999999999\r\n",
            b"*3\r\n$8\r\n12345678\r\n$8\r\n12345678\r\n$8\r\n",
            b"*1\r\n$123456789012345678901234567890\r\n",
        ];
        for bytes in bad {
            assert!(
                parse_command(bytes, &limits).is_err(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        // A header line with no end in sight is refused once it is too long to be one.
        assert!(parse_command(&[b'*'; 100], &limits).is_err());
        // So is an inline line longer than a command.
        assert!(parse_command(&[b'a'; 41], &limits).is_err());
        assert_eq!(
            parse_command(&[b'a'; 40], &limits),
            Ok(Parsed::Incomplete(41))
        );
    }

    fn written(reply: &Reply, protocol: Protocol) -> String {
        let mut out = Vec::new();
        reply.write(protocol, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn replies_in_both_protocols() {
        let throttle = Reply::Array([0, 16, 15, -1, 2].map(Reply::Integer).to_vec());
        assert_eq!(
            written(&throttle, Protocol::Resp2),
            "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n"
        );
        assert_eq!(written(&Reply::Null, Protocol::Resp2), "$-1\r\n");
        assert_eq!(written(&Reply::Null, Protocol::Resp3), "_\r\n");
        let map = Reply::Map(vec![(Reply::bulk("proto"), Reply::Integer(3))]);
        assert_eq!(
            written(&map, Protocol::Resp2),
            "*2\r\n$5\r\nproto\r\n:3\r\n"
        );
        assert_eq!(
            written(&map, Protocol::Resp3),
            "%1\r\n$5\r\nproto\r\n:3\r\n"
        );
        assert_eq!(
            written(&Reply::error("ERR a\r\nb"), Protocol::Resp2),
            "-ERR a  b\r\n"
        );
    }
}
