//! A minimal Redis client for the RESP front's tests: commands written as multibulk arrays,
//! replies read back as values (RESP2 and RESP3), every read bounded in time.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A connection to the front: plain TCP or TLS.
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Connection for T {}

/// Longest a test waits for one reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// The five integers of a `CL.THROTTLE` reply.
    pub fn throttle(&self) -> [i64; 5] {
        match self {
            Value::Array(items) if items.len() == 5 => {
                let mut out = [0; 5];
                for (slot, item) in out.iter_mut().zip(items) {
                    match item {
                        Value::Int(n) => *slot = *n,
                        other => panic!("not an integer: {other:?}"),
                    }
                }
                out
            }
            other => panic!("not a CL.THROTTLE reply: {other:?}"),
        }
    }
}

pub struct RespClient {
    stream: BufReader<Box<dyn Connection>>,
}

/// The bytes of one command as a multibulk array.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A command given as space-separated words.
pub fn words(text: &str) -> Vec<u8> {
    let args: Vec<&[u8]> = text.split(' ').map(str::as_bytes).collect();
    encode(&args)
}

impl RespClient {
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        RespClient {
            stream: BufReader::new(Box::new(stream)),
        }
    }

    /// Over TLS, trusting the PEM CA `ca` and presenting `identity` (certificate and key PEM
    /// files) if given; the handshake's error when it fails.
    pub async fn connect_tls(
        addr: SocketAddr,
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
    ) -> std::io::Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                let key = PrivateKeyDer::from_pem_file(key).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").unwrap();
        let stream = tokio::time::timeout(REPLY_TIMEOUT, connector.connect(name, tcp))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        Ok(RespClient {
            stream: BufReader::new(Box::new(stream)),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.get_mut().write_all(bytes).await.unwrap();
    }

    /// One command (space-separated words) and its reply.
    pub async fn call(&mut self, text: &str) -> Value {
        self.send(&words(text)).await;
        self.read().await
    }

    pub async fn read(&mut self) -> Value {
        tokio::time::timeout(REPLY_TIMEOUT, self.value())
            .await
            .expect("a reply within 10 s")
            .expect("a well-formed reply")
    }

    /// `None` once the server has closed the connection (bounded in time).
    pub async fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(REPLY_TIMEOUT, self.stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// Everything the server sends until it closes the connection (bounded in time: `None`
    /// when it is still open after the reply timeout).
    pub async fn rest(&mut self) -> Option<Vec<u8>> {
        let mut bytes = Vec::new();
        tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_to_end(&mut bytes))
            .await
            .ok()
            .map(|_| bytes)
    }

    async fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        let n = self.stream.read_line(&mut line).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end_matches("\r\n").to_owned())
    }

    fn value(&mut self) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Value>> + '_>> {
        Box::pin(async move {
            let line = self.line().await?;
            let (kind, rest) = line.split_at(1);
            let number = || rest.parse::<i64>().unwrap();
            Ok(match kind {
                "+" => Value::Simple(rest.to_owned()),
                "-" => Value::Error(rest.to_owned()),
                ":" => Value::Int(number()),
                "_" => Value::Null,
                "$" if number() < 0 => Value::Null,
                "$" => {
                    let mut bytes = vec![0; number() as usize + 2];
                    self.stream.read_exact(&mut bytes).await?;
                    bytes.truncate(bytes.len() - 2);
                    Value::Bulk(bytes)
                }
                "*" if number() < 0 => Value::Null,
                "*" => {
                    let mut items = Vec::new();
                    for _ in 0..number() {
                        items.push(self.value().await?);
                    }
                    Value::Array(items)
                }
                "%" => {
                    let mut pairs = Vec::new();
                    for _ in 0..number() {
                        let key = self.value().await?;
                        pairs.push((key, self.value().await?));
                    }
                    Value::Map(pairs)
                }
                other => panic!("unknown reply type {other:?} in {line:?}"),
            })
        })
    }
}
