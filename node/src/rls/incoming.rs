//! The RLS listener's connections, bounded: a connection is accepted only while fewer than the
//! allowance are open, so a flood of callers waits in the kernel's backlog instead of growing
//! the node's memory.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A TCP connection holding one of the listener's places until it is dropped.
#[derive(Debug)]
pub(crate) struct HeldConnection {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
    /// With a read-idle bound: when a read that brought nothing since fails the connection.
    quiet: Option<Quiet>,
}

/// A connection's read-idle bound: `after` without a byte read ends it (at `until`).
#[derive(Debug)]
struct Quiet {
    after: Duration,
    until: Pin<Box<tokio::time::Sleep>>,
}

/// Accepts while a place is free and hands the connections to the server; ends on shutdown.
/// With `read_idle`, a connection that reads nothing for that long fails (for a server whose
/// handshakes have no timeout of their own: a caller that never sends one gives its place back).
pub(crate) fn bounded(
    listener: TcpListener,
    max_connections: usize,
    read_idle: Option<Duration>,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<HeldConnection>> {
    let (sender, receiver) = mpsc::channel(1);
    let places = Arc::new(Semaphore::new(max_connections.max(1)));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.wait_for(|stopping| *stopping) => return,
                accepted = accept(&listener, &places, read_idle) => accepted,
            };
            if let Ok(counted) = &accepted {
                let _ = counted.stream.set_nodelay(true);
            }
            if sender.send(accepted).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(receiver)
}

async fn accept(
    listener: &TcpListener,
    places: &Arc<Semaphore>,
    read_idle: Option<Duration>,
) -> io::Result<HeldConnection> {
    let place = places
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| io::Error::other("the RLS listener is closed"))?;
    let (stream, _) = listener.accept().await?;
    Ok(HeldConnection {
        stream,
        _place: place,
        quiet: read_idle.map(|after| Quiet {
            after,
            until: Box::pin(tokio::time::sleep(after)),
        }),
    })
}

impl Connected for HeldConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for HeldConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        let Some(quiet) = &mut self.quiet else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                let next = tokio::time::Instant::now() + quiet.after;
                quiet.until.as_mut().reset(next);
                read
            }
            Poll::Pending if quiet.until.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing read for the connection's read-idle bound",
                )))
            }
            read => read,
        }
    }
}

impl AsyncWrite for HeldConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    use super::*;

    /// A caller that sends nothing (no TLS handshake, no HTTP/2 preface) loses its connection,
    /// and its place, once it has been quiet for the bound; each byte read restarts it.
    #[tokio::test(start_paused = true)]
    async fn a_connection_quiet_for_its_bound_fails() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_stop, stopped) = watch::channel(false);
        let bound = Duration::from_secs(160);
        let mut incoming = bounded(listener, 4, Some(bound), stopped).into_inner();
        let mut caller = TcpStream::connect(addr).await.unwrap();
        let mut held = incoming.recv().await.unwrap().unwrap();
        caller.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(held.read(&mut buf).await.unwrap(), 1);
        let read_at = Instant::now();
        let quiet = held.read(&mut buf).await.unwrap_err();
        assert_eq!(quiet.kind(), io::ErrorKind::TimedOut);
        assert_eq!(Instant::now() - read_at, bound);
    }

    /// Without a bound (the RLS front keeps its own), a quiet connection just waits.
    #[tokio::test(start_paused = true)]
    async fn without_a_bound_a_quiet_connection_waits() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_stop, stopped) = watch::channel(false);
        let mut incoming = bounded(listener, 4, None, stopped).into_inner();
        let _caller = TcpStream::connect(addr).await.unwrap();
        let mut held = incoming.recv().await.unwrap().unwrap();
        let mut buf = [0u8; 8];
        let waited = tokio::time::timeout(Duration::from_secs(3_600), held.read(&mut buf)).await;
        assert!(waited.is_err(), "{waited:?}");
    }
}
