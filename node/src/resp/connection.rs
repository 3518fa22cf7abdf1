//! One RESP connection's loop: read into a buffer held against the node's budget, parse up to
//! a pipeline's worth of commands, serve them, write the replies.

use std::time::Duration;

use floodgate::resp::{Parsed, ProtocolError, Reply, RespLimits, parse_command};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::Front;
use super::commands::Session;

/// Most bytes read at once.
const READ_BYTES: usize = 16 * 1024;
/// Most commands served per round; the rest wait in the buffer, which is not read further until
/// they are served, so a client that never reads its replies stops being read.
pub(crate) const MAX_PIPELINE: usize = 1_024;
/// A client that takes replies slower than this is dropped, so it cannot hold a task forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Past the connection allowance: Redis's answer past `maxclients`, then closed.
pub(crate) fn refuse(stream: TcpStream) {
    let _ = stream.try_write(b"-ERR max number of clients reached\r\n");
}

/// Serves one connection (plain TCP or TLS) until the client closes it, `QUIT`, a protocol
/// error, the budget refusing its bytes, or the node shutting down.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    front: &Front,
    mut stream: S,
    id: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let limits = front.settings.limits;
    let mut session = Session::new(id, front);
    let mut reservation = front.shared.budget.reservation();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BYTES);
    // Read into a fixed chunk, then appended: no zeroing per read, never more than it holds.
    let mut chunk = vec![0u8; READ_BYTES].into_boxed_slice();
    let mut out: Vec<u8> = Vec::new();
    // Bytes the buffer must hold before parsing can say more.
    let mut needed = 1;
    // Made once and polled beside every read: a new one per read cost a registration each.
    let stopping = shutdown.wait_for(|stopping| *stopping);
    tokio::pin!(stopping);
    loop {
        let Pipeline {
            commands,
            used,
            failure,
        } = parse_pipeline(&buf, &mut needed, &limits);
        buf.drain(..used);
        if !commands.is_empty() {
            session.run(front, commands, &mut out).await;
        }
        if let Some(error) = &failure {
            Reply::Error(format!("ERR {error}")).write(session.protocol(), &mut out);
        }
        let mut over_budget = false;
        if !out.is_empty() {
            // While replies are written the read chunk is idle: the unparsed bytes and the
            // replies are what the connection holds.
            if reservation.resize(buf.len() + out.len(), false).is_err() {
                out.clear();
                overloaded(front, &mut out);
                over_budget = true;
            }
            let written = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&out)).await;
            out.clear();
            if !matches!(written, Ok(Ok(()))) {
                return;
            }
        }
        if failure.is_some() || session.closing || over_budget {
            let _ = stream.shutdown().await;
            return;
        }
        if used > 0 {
            // Commands may remain whole in the buffer: serve them before reading more.
            continue;
        }
        // The unparsed bytes and the read chunk, held against the node-wide budget.
        if reservation.resize(buf.len() + READ_BYTES, false).is_err() {
            overloaded(front, &mut out);
            let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&out)).await;
            return;
        }
        let read = tokio::select! {
            read = stream.read(&mut chunk[..]) => read,
            _ = &mut stopping => return,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// What one round parses from the front of the buffer.
struct Pipeline {
    /// Whole commands, at most [`MAX_PIPELINE`].
    commands: Vec<Vec<Vec<u8>>>,
    /// Bytes the commands and the skipped input took.
    used: usize,
    /// The protocol error parsing stopped at, if any.
    failure: Option<ProtocolError>,
}

/// Parses commands from the front of `buf` until [`MAX_PIPELINE`] of them, an incomplete
/// command or a protocol error. `needed` is the bytes the buffer must hold before parsing can
/// say more: nothing is parsed until it holds them, and parsing sets it anew.
fn parse_pipeline(buf: &[u8], needed: &mut usize, limits: &RespLimits) -> Pipeline {
    let mut commands = Vec::new();
    let mut used = 0;
    let mut failure = None;
    while commands.len() < MAX_PIPELINE && buf.len() - used >= *needed {
        match parse_command(&buf[used..], limits) {
            Ok(Parsed::Command(args, n)) => {
                commands.push(args);
                used += n;
                *needed = 1;
            }
            Ok(Parsed::Skip(n)) => {
                used += n;
                *needed = 1;
            }
            Ok(Parsed::Incomplete(n)) => {
                *needed = n;
                break;
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    Pipeline {
        commands,
        used,
        failure,
    }
}

/// The error written when the node-wide buffer budget refuses the connection's bytes (in
/// RESP2: a simple error reads the same in RESP3).
fn overloaded(front: &Front, out: &mut Vec<u8>) {
    Reply::Error(format!(
        "ERR floodgate is buffering too much for all its clients (limit {} bytes): retry later",
        front.shared.budget.limit()
    ))
    .write(floodgate::resp::Protocol::Resp2, out);
}
