//! A minimal Redis client for the RESP front's tests: commands written as multibulk arrays,
//! replies read back as values (RESP2 and RESP3), every read bounded in time.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

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
    stream: BufReader<TcpStream>,
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
            stream: BufReader::new(stream),
        }
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
