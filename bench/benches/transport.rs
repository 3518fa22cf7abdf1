//! quinn-proto's own CPU for one request and its answer: both ends of a connection in one
//! thread, datagrams handed over in memory (no sockets, no runtime, no system calls), with the
//! node's acknowledgement settings. That is the floor under what floodgate's transport costs a
//! request. Between round trips it can touch other memory, as the other processes of a host do
//! between requests at low load, to show what cold caches add. Run with
//! `cargo bench -p floodgate-bench --bench transport`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use floodgate::wire::{ACK_ELICITING_THRESHOLD, MAX_ACK_DELAY};
use quinn_proto::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::{
    AckFrequencyConfig, ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint,
    EndpointConfig, ServerConfig, StreamId, TransportConfig,
};

/// A check frame of one check and its answer are about this size.
const REQUEST: [u8; 48] = [7; 48];
const ANSWER: [u8; 40] = [9; 40];

/// Other memory touched between round trips, and how many round trips to time with it.
const RUNS: [(usize, usize); 4] = [(0, 100_000), (4, 20_000), (16, 5_000), (64, 1_000)];

/// One end: its endpoint and, once there is one, its connection.
struct End {
    endpoint: Endpoint,
    connection: Option<(ConnectionHandle, Connection)>,
    address: SocketAddr,
}

impl End {
    fn connection(&mut self) -> &mut Connection {
        &mut self.connection.as_mut().expect("connected").1
    }
}

/// Both ends of one connection, a clock moved by hand, and their buffers.
struct Pair {
    client: End,
    server: End,
    now: Instant,
    datagram: Vec<u8>,
    response: Vec<u8>,
    read: Vec<u8>,
    datagrams: usize,
}

fn transport() -> Arc<TransportConfig> {
    let mut acks = AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into())
        .max_ack_delay(Some(MAX_ACK_DELAY));
    let mut transport = TransportConfig::default();
    transport.ack_frequency_config(Some(acks));
    Arc::new(transport)
}

impl Pair {
    fn connect() -> Self {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()])
            .expect("a self-signed certificate");
        let cert = certified.cert.der().clone();
        let key =
            rustls::pki_types::PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_tls = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key.into())
            .expect("the certificate and its key");
        let mut server_config = ServerConfig::with_crypto(Arc::new(
            QuicServerConfig::try_from(server_tls).expect("a QUIC cipher suite"),
        ));
        server_config.transport_config(transport());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).expect("a valid certificate");
        let client_tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut client_config = ClientConfig::new(Arc::new(
            QuicClientConfig::try_from(client_tls).expect("a QUIC cipher suite"),
        ));
        client_config.transport_config(transport());
        let end = |server: Option<ServerConfig>, address: &str| End {
            endpoint: Endpoint::new(
                Arc::new(EndpointConfig::default()),
                server.map(Arc::new),
                false,
                None,
            ),
            connection: None,
            address: address.parse().expect("an address"),
        };
        let mut pair = Pair {
            client: end(None, "127.0.0.1:40001"),
            server: end(Some(server_config), "127.0.0.1:40002"),
            now: Instant::now(),
            datagram: Vec::with_capacity(2048),
            response: Vec::with_capacity(2048),
            read: Vec::new(),
            datagrams: 0,
        };
        let connection = pair
            .client
            .endpoint
            .connect(pair.now, client_config, pair.server.address, "localhost")
            .expect("a connection attempt");
        pair.client.connection = Some(connection);
        for _ in 0..100 {
            pair.exchange();
            pair.now += Duration::from_micros(100);
        }
        assert!(!pair.client.connection().is_handshaking(), "handshake done");
        pair
    }

    /// Delivers whatever either end has to send, both ways.
    fn exchange(&mut self) {
        self.flush(true);
        self.flush(false);
        for end in [&mut self.client, &mut self.server] {
            if let Some((_, connection)) = end.connection.as_mut() {
                while connection.poll().is_some() {}
            }
        }
    }

    /// Moves every datagram one end has to send into the other end.
    fn flush(&mut self, from_client: bool) {
        let (from, to) = if from_client {
            (&mut self.client, &mut self.server)
        } else {
            (&mut self.server, &mut self.client)
        };
        while let Some((_, connection)) = from.connection.as_mut() {
            self.datagram.clear();
            let Some(transmit) = connection.poll_transmit(self.now, 1, &mut self.datagram) else {
                break;
            };
            self.datagrams += 1;
            let data = BytesMut::from(&self.datagram[..transmit.size]);
            self.response.clear();
            let event =
                to.endpoint
                    .handle(self.now, from.address, None, None, data, &mut self.response);
            match event {
                Some(DatagramEvent::NewConnection(incoming)) => {
                    let accepted = to
                        .endpoint
                        .accept(incoming, self.now, &mut self.response, None)
                        .expect("the connection accepted");
                    to.connection = Some(accepted);
                }
                Some(DatagramEvent::ConnectionEvent(_, event)) => {
                    to.connection().handle_event(event)
                }
                Some(DatagramEvent::Response(_)) | None => {}
            }
        }
        for end in [from, to] {
            if let Some((handle, connection)) = end.connection.as_mut() {
                while let Some(event) = connection.poll_endpoint_events() {
                    if let Some(event) = end.endpoint.handle_event(*handle, event) {
                        connection.handle_event(event);
                    }
                }
            }
        }
    }

    /// Reads what has arrived on stream `id` of `connection` into `read`.
    fn read(read: &mut Vec<u8>, connection: &mut Connection, id: StreamId) {
        read.clear();
        let mut stream = connection.recv_stream(id);
        let Ok(mut chunks) = stream.read(true) else {
            return;
        };
        while let Ok(Some(chunk)) = chunks.next(usize::MAX) {
            read.extend_from_slice(&chunk.bytes);
        }
        let _ = chunks.finalize();
    }

    /// One request on `stream` and its answer, then the timers due 100 µs later.
    fn round_trip(&mut self, stream: StreamId, served: &mut Option<StreamId>) {
        let client = self.client.connection();
        client
            .send_stream(stream)
            .write(&REQUEST)
            .expect("room on the stream");
        self.flush(true);
        let server = self.server.connection();
        while server.poll().is_some() {}
        let id = *served.get_or_insert_with(|| {
            server
                .streams()
                .accept(Dir::Bi)
                .expect("the client's stream")
        });
        Self::read(&mut self.read, server, id);
        assert_eq!(self.read.len(), REQUEST.len());
        server
            .send_stream(id)
            .write(&ANSWER)
            .expect("room on the stream");
        self.flush(false);
        let client = self.client.connection();
        while client.poll().is_some() {}
        Self::read(&mut self.read, client, stream);
        assert_eq!(self.read.len(), ANSWER.len());
        self.now += Duration::from_micros(100);
        for end in [&mut self.client, &mut self.server] {
            let connection = end.connection();
            if connection.poll_timeout().is_some_and(|at| at <= self.now) {
                connection.handle_timeout(self.now);
            }
        }
        self.exchange();
    }
}

/// Touches one word per cache line of `memory`, evicting what the round trip left in cache.
fn touch(memory: &mut [u64]) {
    let mut sum = 0u64;
    for word in memory.iter_mut().step_by(8) {
        *word = word.wrapping_add(sum);
        sum = sum.wrapping_add(*word);
    }
    std::hint::black_box(sum);
}

fn main() {
    let mut pair = Pair::connect();
    let stream = pair
        .client
        .connection()
        .streams()
        .open(Dir::Bi)
        .expect("stream credit");
    let mut served = None;
    for _ in 0..10_000 {
        pair.round_trip(stream, &mut served);
    }
    println!(
        "quinn-proto, one request of {} bytes and its answer of {}, both ends in one thread:",
        REQUEST.len(),
        ANSWER.len()
    );
    println!();
    println!(
        "| other memory touched between round trips | round trips | µs each | datagrams each |"
    );
    println!("|---|---|---|---|");
    for (megabytes, count) in RUNS {
        let mut memory = vec![1u64; megabytes * 1024 * 1024 / 8];
        touch(&mut memory);
        pair.datagrams = 0;
        let mut spent = Duration::ZERO;
        for _ in 0..count {
            touch(&mut memory);
            let started = Instant::now();
            pair.round_trip(stream, &mut served);
            spent += started.elapsed();
        }
        println!(
            "| {megabytes} MiB | {count} | {:.2} | {:.2} |",
            spent.as_secs_f64() * 1e6 / count as f64,
            pair.datagrams as f64 / count as f64
        );
    }
}
