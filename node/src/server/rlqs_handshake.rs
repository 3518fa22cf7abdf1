//! The RLQS listener's connections, made ready before tonic serves them: the TLS handshake (with
//! `--rlqs-tls`) done here within [`HANDSHAKE_TIMEOUT`], the HTTP/2 connection preface required
//! within as long again, and after it a read at least every [`READ_IDLE`]. tonic runs TLS
//! handshakes, and hyper reads the preface, without a deadline: a caller that sent nothing, or
//! sent them a byte at a time, held a place of `--max-connections` for as long as it liked.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::config::{HANDSHAKE_TIMEOUT, HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT};
use crate::rls::HeldConnection;

/// Bytes of the HTTP/2 client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`), which
/// a caller sends first.
const PREFACE_BYTES: usize = 24;

/// The longest a connection reads nothing once its preface is in: hyper's keepalive PINGs
/// draw an answer at least every interval plus its timeout, so twice that is never reached by
/// a live caller.
const READ_IDLE: Duration = Duration::from_secs(
    2 * (HTTP2_KEEPALIVE_INTERVAL.as_secs() + HTTP2_KEEPALIVE_TIMEOUT.as_secs()),
);

/// A connection for tonic: its TLS handshake done when the listener has TLS, its preface due.
#[derive(Debug)]
pub(super) struct ReadyConnection {
    io: Transport,
    /// Bytes of the preface still to come (none once it is in).
    preface_left: usize,
    /// When a read that brought nothing fails the connection: the preface's deadline, then
    /// [`READ_IDLE`] after the last byte read.
    read_by: Pin<Box<Sleep>>,
}

/// The connection as accepted, or inside its TLS session.
type Transport = Either<HeldConnection, Box<TlsStream<HeldConnection>>>;

/// Hands tonic each connection `accepted` yields once it is ready (TLS handshakes run side by
/// side, each bounded by [`HANDSHAKE_TIMEOUT`]); a handshake that fails or runs late closes
/// its connection, which gives its place back. Ends on shutdown.
pub(super) fn ready_connections(
    accepted: ReceiverStream<io::Result<HeldConnection>>,
    tls: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<ReadyConnection>> {
    let (ready, receiver) = mpsc::channel(1);
    let mut accepted = accepted.into_inner();
    tokio::spawn(async move {
        let mut handshakes = JoinSet::new();
        loop {
            let connection = tokio::select! {
                _ = shutdown.wait_for(|stopping| *stopping) => return,
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
                connection = accepted.recv() => match connection {
                    Some(Ok(connection)) => connection,
                    // An accept that failed: the next one may not.
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "RLQS accept failed");
                        continue;
                    }
                    None => return,
                },
            };
            let Some(tls) = tls.clone() else {
                if ready
                    .send(Ok(ReadyConnection::new(Either::Left(connection))))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            };
            let ready = ready.clone();
            handshakes.spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(connection)).await {
                    Ok(Ok(stream)) => {
                        let connection = ReadyConnection::new(Either::Right(Box::new(stream)));
                        let _ = ready.send(Ok(connection)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "an RLQS TLS handshake failed"),
                    Err(_) => tracing::debug!("an RLQS TLS handshake did not finish in time"),
                }
            });
        }
    });
    ReceiverStream::new(receiver)
}

impl ReadyConnection {
    fn new(io: Transport) -> Self {
        ReadyConnection {
            io,
            preface_left: PREFACE_BYTES,
            read_by: Box::pin(tokio::time::sleep(HANDSHAKE_TIMEOUT)),
        }
    }

    fn held(&self) -> &HeldConnection {
        match &self.io {
            Either::Left(held) => held,
            Either::Right(stream) => stream.get_ref().0,
        }
    }
}

impl Connected for ReadyConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.held().connect_info()
    }
}

impl AsyncRead for ReadyConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                let got = buf.filled().len() - before;
                self.preface_left = self.preface_left.saturating_sub(got);
                if self.preface_left == 0 {
                    let next = tokio::time::Instant::now() + READ_IDLE;
                    self.read_by.as_mut().reset(next);
                }
                read
            }
            Poll::Pending if self.read_by.as_mut().poll(cx).is_ready() => {
                let why = if self.preface_left > 0 {
                    "the HTTP/2 connection preface did not arrive in time"
                } else {
                    "nothing read for the connection's read-idle bound"
                };
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
            }
            read => read,
        }
    }
}

impl AsyncWrite for ReadyConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::Instant;

    use super::*;

    const PREFACE: &[u8; PREFACE_BYTES] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A listener handing its connections over as the RLQS listener does; stops when the
    /// returned sender is dropped.
    async fn listen(
        tls: Option<TlsAcceptor>,
    ) -> (
        SocketAddr,
        mpsc::Receiver<io::Result<ReadyConnection>>,
        watch::Sender<bool>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let accepted = crate::rls::bounded_incoming(listener, 4, stopped.clone());
        (
            addr,
            ready_connections(accepted, tls, stopped).into_inner(),
            stop,
        )
    }

    fn acceptor(certs: &crate::DevCerts) -> TlsAcceptor {
        let tls = crate::TlsConfig {
            cert: certs.node_cert.clone(),
            key: certs.node_key.clone(),
            client_ca: None,
            peer_ca: None,
        };
        let config = crate::tls::http2_server_config(&tls, false, "--rlqs-client-auth").unwrap();
        TlsAcceptor::from(Arc::new(config))
    }

    /// Reads until the connection fails; returns how many bytes came first, and the error.
    async fn read_until_failed(connection: &mut ReadyConnection) -> (usize, io::Error) {
        let mut buf = [0u8; 64];
        let mut read = 0;
        loop {
            match connection.read(&mut buf).await {
                Ok(0) => panic!("the connection ended instead of failing"),
                Ok(n) => read += n,
                Err(e) => return (read, e),
            }
        }
    }

    /// A caller that sends all of the preface but its last byte loses its connection once
    /// the deadline passes, however long it has been sending.
    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_preface_is_late_fails_at_the_deadline() {
        let (addr, mut ready, _stop) = listen(None).await;
        let mut caller = TcpStream::connect(addr).await.unwrap();
        let mut connection = ready.recv().await.unwrap().unwrap();
        let handed_over = Instant::now();
        for byte in &PREFACE[..PREFACE_BYTES - 1] {
            caller.write_all(&[*byte]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let (read, failed) =
            tokio::time::timeout(10 * HANDSHAKE_TIMEOUT, read_until_failed(&mut connection))
                .await
                .expect("the connection failed");
        assert_eq!(read, PREFACE_BYTES - 1);
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut, "{failed}");
        assert_eq!(handed_over.elapsed(), HANDSHAKE_TIMEOUT);
    }

    /// Once the preface is in, a connection fails only when it has read nothing for
    /// [`READ_IDLE`]; each byte read restarts it.
    #[tokio::test(start_paused = true)]
    async fn after_its_preface_a_connection_fails_once_quiet_for_the_idle_bound() {
        let (addr, mut ready, _stop) = listen(None).await;
        let mut caller = TcpStream::connect(addr).await.unwrap();
        let mut connection = ready.recv().await.unwrap().unwrap();
        caller.write_all(PREFACE).await.unwrap();
        let mut preface = [0u8; PREFACE_BYTES];
        connection.read_exact(&mut preface).await.unwrap();
        assert_eq!(&preface, PREFACE);
        tokio::time::sleep(READ_IDLE - Duration::from_secs(1)).await;
        caller.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(connection.read(&mut buf).await.unwrap(), 1);
        let last_read = Instant::now();
        let (read, failed) =
            tokio::time::timeout(10 * READ_IDLE, read_until_failed(&mut connection))
                .await
                .expect("the connection failed");
        assert_eq!(read, 0);
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut, "{failed}");
        assert_eq!(last_read.elapsed(), READ_IDLE);
    }

    /// A caller that never finishes its TLS handshake is closed at the deadline and never
    /// handed to the server.
    #[tokio::test(start_paused = true)]
    async fn a_tls_handshake_not_done_in_time_closes_the_connection_unserved() {
        let dir = tempfile::tempdir().unwrap();
        let certs = crate::ensure_dev_certs(dir.path()).unwrap();
        let (addr, mut ready, _stop) = listen(Some(acceptor(&certs))).await;
        let mut caller = TcpStream::connect(addr).await.unwrap();
        let connected = Instant::now();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(10 * HANDSHAKE_TIMEOUT, caller.read(&mut buf))
            .await
            .expect("the connection closed");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        assert_eq!(connected.elapsed(), HANDSHAKE_TIMEOUT);
        assert!(ready.try_recv().is_err(), "a connection was handed over");
    }

    /// A TLS caller is handed over once its handshake is done (ALPN `h2`), at TLS 1.3 or 1.2
    /// (a stock Envoy's most toward an upstream), and what it sends arrives decrypted.
    #[tokio::test]
    async fn a_tls_caller_is_handed_over_after_its_handshake() {
        let dir = tempfile::tempdir().unwrap();
        let certs = crate::ensure_dev_certs(dir.path()).unwrap();
        let (addr, mut ready, _stop) = listen(Some(acceptor(&certs))).await;
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            tls_caller_is_handed_over(addr, &mut ready, &certs, version).await;
        }
    }

    async fn tls_caller_is_handed_over(
        addr: SocketAddr,
        ready: &mut mpsc::Receiver<io::Result<ReadyConnection>>,
        certs: &crate::DevCerts,
        version: &'static rustls::SupportedProtocolVersion,
    ) {
        let mut roots = rustls::RootCertStore::empty();
        for cert in crate::certs::load_certs(&certs.ca).unwrap() {
            roots.add(cert).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut caller = connector.connect(name, tcp).await.unwrap();
        let session = caller.get_ref().1;
        assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(session.protocol_version(), Some(version.version));
        caller.write_all(PREFACE).await.unwrap();
        caller.flush().await.unwrap();
        let mut connection = ready.recv().await.unwrap().unwrap();
        let mut preface = [0u8; PREFACE_BYTES];
        connection.read_exact(&mut preface).await.unwrap();
        assert_eq!(&preface, PREFACE);
    }
}
