//! The RLS listener's connections, bounded: a connection is accepted only while fewer than the
//! allowance are open, so a flood of callers waits in the kernel's backlog instead of growing
//! the node's memory.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

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
}

/// Accepts while a place is free and hands the connections to the server; ends on shutdown.
/// Each server bounds how long a connection may hold its place quiet (the RLS front's own
/// HTTP/2, the RLQS listener's `rlqs_handshake`).
pub(crate) fn bounded(
    listener: TcpListener,
    max_connections: usize,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<HeldConnection>> {
    let (sender, receiver) = mpsc::channel(1);
    let places = Arc::new(Semaphore::new(max_connections.max(1)));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.wait_for(|stopping| *stopping) => return,
                accepted = accept(&listener, &places) => accepted,
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

async fn accept(listener: &TcpListener, places: &Arc<Semaphore>) -> io::Result<HeldConnection> {
    let place = places
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| io::Error::other("the RLS listener is closed"))?;
    let (stream, _) = listener.accept().await?;
    Ok(HeldConnection {
        stream,
        _place: place,
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
        Pin::new(&mut self.stream).poll_read(cx, buf)
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
