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
use std::task::{Poll, ready};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use tonic::body::Body;

/// The same generous timeout as the QUIC client's: a slow answer counts as slow.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// One HTTP/2 connection, as the service tonic's clients call: each call opens its stream,
/// sends its message and reads its answer in the caller's task. Clones share the connection.
#[derive(Clone)]
pub struct Connection {
    send: h2::client::SendRequest<Bytes>,
    origin: http::Uri,
}

impl Connection {
    /// Connects to `addr` (cleartext HTTP/2, as every gRPC system here listens). The connection's
    /// frames are read and written by a task of its own, which ends when the last clone is
    /// dropped or the server closes it; a call on a closed connection fails in words.
    pub async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Connection> {
        let socket = tokio::net::TcpStream::connect(addr).await?;
        socket.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(socket).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Connection {
            send,
            origin: format!("http://{addr}").parse()?,
        })
    }

    /// The scheme and authority every call's URI carries (`with_origin` of tonic's clients).
    pub fn origin(&self) -> &http::Uri {
        &self.origin
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
        self.send.poll_ready(cx).map_err(anyhow::Error::from)
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
