//! The smallest HTTP/1.1 client the shed demo needs: one GET per connection (`Connection:
//! close`), the status read from the answer, everything bounded (time and bytes).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most bytes read of one answer (the demo's answers are a few hundred).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// GETs `path` from `addr` with `headers`; returns the status and the body, or `None` on any
/// failure or after `timeout`.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Option<(u16, String)> {
    tokio::time::timeout(timeout, get_unbounded(addr, path, headers))
        .await
        .ok()
        .flatten()
}

async fn get_unbounded(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || answer.len() + n > MAX_ANSWER_BYTES {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&answer);
    // "HTTP/1.1 200 OK"
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Some((status, body))
}
