//! The gRPC systems' transport: tonic's generated clients and codec, each call put straight onto
//! one of h2's HTTP/2 client connections from the caller's own task.
//!
//! Not tonic's `Channel`: a `Channel` puts a buffer task and hyper's dispatch between the caller
//! and the connection (a queue, a reply channel and a task spawned per call). On these two cores,
//! shared with the system measured, that cost more than twice the floodgate node's CPU per RLS
//! call, so the gRPC rows measured the bench's client as much as the system. Envoy, the client
//! the RLS front serves in production, drives its HTTP/2 connections from its own event loop
//! too. Every gRPC system here (floodgate's RLS front, envoyproxy/ratelimit, Gubernator) is
//! called through this, so their rows compare alike.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Poll, ready};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use tonic::body::Body;

/// The same generous timeout as the QUIC client's: a slow answer counts as slow.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The windows hyper's HTTP/2 client (so tonic's `Channel`, the client before this one)
/// advertises: 2 MiB a stream, 5 MiB the connection. They also size h2's budget of small DATA
/// frames buffered unread (half the connection window): at h2's own 64 KiB default, a burst of
/// a few dozen answers not yet read by their callers ends the connection with
/// `ENHANCE_YOUR_CALM`, as an overloaded open-loop step makes happen.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;

/// One HTTP/2 connection, as the service tonic's clients call: each call opens its stream,
/// sends its message and reads its answer in the caller's task. Clones share the connection.
#[derive(Clone)]
pub struct Connection {
    send: h2::client::SendRequest<Bytes>,
    origin: http::Uri,
    /// Set once the connection is found closed: the set it belongs to opens another.
    closed: Arc<AtomicBool>,
}

impl Connection {
    /// Connects to `addr` (cleartext HTTP/2, as every gRPC system here listens). The connection's
    /// frames are read and written by a task of its own, which ends when the last clone is
    /// dropped or the connection closes; a call on a closed connection fails in words.
    pub async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Connection> {
        let socket = tokio::net::TcpStream::connect(addr).await?;
        socket.set_nodelay(true)?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(socket)
            .await?;
        let closed = Arc::new(AtomicBool::new(false));
        let flag = closed.clone();
        tokio::spawn(async move {
            let _ = connection.await;
            flag.store(true, Ordering::Relaxed);
        });
        Ok(Connection {
            send,
            origin: format!("http://{addr}").parse()?,
            closed,
        })
    }

    /// The scheme and authority every call's URI carries (`with_origin` of tonic's clients).
    pub fn origin(&self) -> &http::Uri {
        &self.origin
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// Connections to a few servers that calls take turns over, each opened again once found closed
/// (the server's GOAWAY, a reset socket), as tonic's `Channel` reconnects: without that, one
/// lost connection would fail every later call of the run on it.
pub struct Connections {
    slots: Vec<Slot>,
    next: AtomicUsize,
}

struct Slot {
    addr: std::net::SocketAddr,
    /// The connection and how many times it was opened.
    current: parking_lot::RwLock<(u64, Connection)>,
    /// Held while one caller opens the slot's next connection; the others wait for it.
    reopening: tokio::sync::Mutex<()>,
}

/// A connection taken for a call, and where to report it closed.
pub struct Turn {
    pub connection: Connection,
    slot: usize,
    generation: u64,
}

impl Connections {
    /// One connection to each of `addrs`, in that order.
    pub async fn open(addrs: &[std::net::SocketAddr]) -> anyhow::Result<Connections> {
        let mut slots = Vec::with_capacity(addrs.len());
        for &addr in addrs {
            let connection = Connection::open(addr)
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            slots.push(Slot {
                addr,
                current: parking_lot::RwLock::new((0, connection)),
                reopening: tokio::sync::Mutex::new(()),
            });
        }
        anyhow::ensure!(!slots.is_empty(), "no server to connect to");
        Ok(Connections {
            slots,
            next: AtomicUsize::new(0),
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The next connection in turn.
    pub fn turn(&self) -> Turn {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let (generation, connection) = self.slots[slot].current.read().clone();
        Turn {
            connection,
            slot,
            generation,
        }
    }

    /// After a failed call: opens the turn's connection again if it is closed and no other
    /// caller has done so since. A failure to connect leaves the closed one (the next failed
    /// call tries again).
    pub async fn recover(&self, turn: &Turn) {
        if !turn.connection.is_closed() {
            return;
        }
        let slot = &self.slots[turn.slot];
        let _reopening = slot.reopening.lock().await;
        if slot.current.read().0 != turn.generation {
            return;
        }
        if let Ok(fresh) = Connection::open(slot.addr).await {
            *slot.current.write() = (turn.generation + 1, fresh);
        }
    }
}

type Answer = http::Response<AnswerBody>;
type CallFuture = Pin<Box<dyn Future<Output = anyhow::Result<Answer>> + Send>>;

impl tonic::codegen::Service<http::Request<Body>> for Connection {
    type Response = Answer;
    type Error = anyhow::Error;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<anyhow::Result<()>> {
        // Pending while the server's limit of concurrent streams is reached.
        self.send.poll_ready(cx).map_err(|error| {
            self.closed.store(true, Ordering::Relaxed);
            anyhow::Error::from(error)
        })
    }

    fn call(&mut self, request: http::Request<Body>) -> CallFuture {
        // The handle made ready goes with this call; the service keeps a fresh clone.
        let fresh = self.send.clone();
        let mut send = std::mem::replace(&mut self.send, fresh);
        let call = async move {
            let (head, body) = request.into_parts();
            // A unary call's message is whole at once: one DATA frame ends the stream.
            let message = body.collect().await?.to_bytes();
            let (answer, mut stream) =
                send.send_request(http::Request::from_parts(head, ()), false)?;
            stream.send_data(message, true)?;
            Ok(answer.await?.map(AnswerBody::new))
        };
        Box::pin(async move {
            tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .context("no answer within the call's timeout")?
        })
    }
}

/// An answer's body as tonic reads it: the message, then the trailers holding `grpc-status`.
pub struct AnswerBody {
    stream: h2::RecvStream,
    data_done: bool,
}

impl AnswerBody {
    fn new(stream: h2::RecvStream) -> AnswerBody {
        AnswerBody {
            stream,
            data_done: false,
        }
    }
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match ready!(this.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Read is read: the window goes back to the server at once.
                    let _ = this.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => this.data_done = true,
            }
        }
        match ready!(this.stream.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(error) => Poll::Ready(Some(Err(error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::Service;

    /// Whether `connection` takes a call now (`false`: it is closed).
    async fn ready(connection: &mut Connection) -> bool {
        std::future::poll_fn(|cx| connection.poll_ready(cx))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_closed_connection_is_opened_again_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let server = tokio::spawn(async move {
            // The first connection is closed right after its handshake; the next ones stay open.
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let n = count.fetch_add(1, Ordering::SeqCst);
                let mut connection = h2::server::handshake(socket).await.unwrap();
                if n == 0 {
                    drop(connection);
                    continue;
                }
                tokio::spawn(async move { while connection.accept().await.is_some() {} });
            }
        });
        let connections = Connections::open(&[addr]).await.unwrap();
        let mut first = connections.turn();
        assert_eq!(first.generation, 0);
        // Bounded: the client sees the server's close as soon as it reads it.
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            while ready(&mut first.connection).await {
                tokio::task::yield_now().await;
            }
        });
        seen.await.expect("the closed connection is noticed");
        assert!(first.connection.is_closed());

        connections.recover(&first).await;
        let mut second = connections.turn();
        assert_eq!(second.generation, 1);
        assert!(ready(&mut second.connection).await);
        // A second report of the same closed connection opens nothing more.
        connections.recover(&first).await;
        assert_eq!(connections.turn().generation, 1);
        // Nor does a failed call on an open one.
        connections.recover(&second).await;
        assert_eq!(connections.turn().generation, 1);
        server.abort();
    }
}
