//! quinn on tokio, with the UDP socket registered for reads only: the runtime the floodgate
//! client and node run their endpoints on.
//!
//! quinn's own tokio runtime registers its socket for reads and writes, edge-triggered. A UDP
//! socket signals "writable" again each time a datagram it sent leaves its send buffer (on
//! loopback, as it is sent), so every datagram sent gave the sending thread's next wait for
//! events one more event, and one more system call to collect it; and after each read, one
//! more read found the socket empty. Together that was a third of the node's system calls at
//! low load. Sends on UDP almost never block, so this runtime sends without asking and waits
//! for writability only after a send was refused (`WouldBlock`), through a second
//! registration of the same socket that lives until a send gets through; and a read that
//! did not fill its batch marks the socket drained.

use std::future::Future;
use std::io;
use std::net::UdpSocket;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncTimer, AsyncUdpSocket, Runtime, UdpPoller};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A quinn [`Runtime`] on the current tokio runtime whose sockets wake their runtime only to
/// read (see the module's documentation).
#[derive(Debug)]
pub struct ReadInterestRuntime;

impl Runtime for ReadInterestRuntime {
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        quinn::TokioRuntime.new_timer(at)
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        quinn::TokioRuntime.spawn(future);
    }

    fn wrap_udp_socket(&self, socket: UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        Ok(Arc::new(ReadInterestSocket::new(socket)?))
    }

    fn now(&self) -> Instant {
        quinn::TokioRuntime.now()
    }
}

/// Registers `socket` with the current runtime's I/O driver for `interest` alone.
// tokio deprecated this safe constructor because a wrapped type could close or replace its
// descriptor while registered; a std `UdpSocket` owns its descriptor and closes it only when
// dropped, with the `AsyncFd` that holds it, which is the case the replacement's safety
// contract asks for.
#[allow(deprecated)]
fn register(socket: UdpSocket, interest: Interest) -> io::Result<AsyncFd<UdpSocket>> {
    AsyncFd::with_interest(socket, interest)
}

#[derive(Debug)]
struct ReadInterestSocket {
    io: AsyncFd<UdpSocket>,
    state: UdpSocketState,
    /// The last send was refused for want of buffer space: senders wait until it is writable.
    refused: AtomicBool,
}

impl ReadInterestSocket {
    fn new(socket: UdpSocket) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let state = UdpSocketState::new((&socket).into())?;
        Ok(ReadInterestSocket {
            io: register(socket, Interest::READABLE)?,
            state,
            refused: AtomicBool::new(false),
        })
    }
}

impl AsyncUdpSocket for ReadInterestSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(WritablePoller {
            socket: self,
            waiting: None,
            said_writable: false,
        })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let sent = self.state.send(self.io.get_ref().into(), transmit);
        match &sent {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.refused.store(true, Ordering::Release);
            }
            Ok(()) if self.refused.load(Ordering::Relaxed) => {
                self.refused.store(false, Ordering::Release);
            }
            _ => {}
        }
        sent
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut ready = ready!(self.io.poll_read_ready(cx))?;
            match self.state.recv(self.io.get_ref().into(), bufs, meta) {
                Ok(count) => {
                    // Fewer datagrams than there was room for: the queue was empty, and a
                    // datagram that arrives from now on is reported afresh (edge-triggered).
                    // Clearing here saves the read that would only say "would block", one per
                    // wake-up at low load.
                    if count < bufs.len().min(meta.len()).min(quinn::udp::BATCH_SIZE) {
                        ready.clear_ready();
                    }
                    return Poll::Ready(Ok(count));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready.clear_ready(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.io.get_ref().local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

/// Says a send may be tried: at once, unless the last one was refused; then once the socket is
/// writable, seen through a registration of a duplicate of the socket for writes alone, kept
/// until a send gets through. epoll calls a socket writable once half its send buffer is
/// free, which a large batch of datagrams may still not fit in: a send refused after this
/// poller said "writable" clears that readiness, and the next wait is for the next time
/// space is freed, not a loop of sends that cannot fit.
#[derive(Debug)]
struct WritablePoller {
    socket: Arc<ReadInterestSocket>,
    waiting: Option<AsyncFd<UdpSocket>>,
    /// This poller said "writable" since the socket last refused a send.
    said_writable: bool,
}

impl UdpPoller for WritablePoller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.socket.refused.load(Ordering::Acquire) {
            this.waiting = None;
            this.said_writable = false;
            return Poll::Ready(Ok(()));
        }
        let waiting = match &mut this.waiting {
            Some(waiting) => waiting,
            waiting @ None => {
                let duplicate = this.socket.io.get_ref().try_clone()?;
                // Registering a socket that is already writable reports it at once (epoll
                // checks the current state when a descriptor is added).
                waiting.insert(register(duplicate, Interest::WRITABLE)?)
            }
        };
        loop {
            let mut ready = ready!(waiting.poll_write_ready(cx))?;
            if this.said_writable {
                // Refused again since: wait for more room.
                ready.clear_ready();
                this.said_writable = false;
                continue;
            }
            ready.retain_ready();
            this.said_writable = true;
            return Poll::Ready(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Duration;

    use super::*;

    /// Bounds a wait that must end (a lost wake-up would otherwise hang the test).
    const BOUND: Duration = Duration::from_secs(10);

    fn socket() -> Arc<ReadInterestSocket> {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        Arc::new(ReadInterestSocket::new(socket).unwrap())
    }

    async fn receive(socket: &ReadInterestSocket) -> usize {
        let mut storage = vec![[0u8; 1500]; quinn::udp::BATCH_SIZE];
        let mut bufs: Vec<io::IoSliceMut<'_>> =
            storage.iter_mut().map(|b| io::IoSliceMut::new(b)).collect();
        let mut meta = vec![RecvMeta::default(); bufs.len()];
        let received = poll_fn(|cx| socket.poll_recv(cx, &mut bufs, &mut meta));
        tokio::time::timeout(BOUND, received)
            .await
            .expect("a datagram sent is received")
            .unwrap()
    }

    #[tokio::test]
    async fn a_drained_socket_still_wakes_for_the_next_datagram() {
        let socket = socket();
        let to = socket.local_addr().unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            sender.send_to(b"ping", to).unwrap();
        }
        // Reads of fewer datagrams than the batch: the socket is marked drained after each...
        let mut received = 0;
        while received < 3 {
            received += receive(&socket).await;
        }
        assert_eq!(received, 3);
        let mut empty = [0u8; 16];
        let mut bufs = [io::IoSliceMut::new(&mut empty)];
        let mut meta = [RecvMeta::default()];
        let waker = std::task::Waker::noop();
        let polled = socket.poll_recv(&mut Context::from_waker(waker), &mut bufs, &mut meta);
        assert!(polled.is_pending());
        // ...and a datagram sent after that is still reported.
        sender.send_to(b"pong", to).unwrap();
        assert_eq!(receive(&socket).await, 1);
    }

    #[tokio::test]
    async fn a_refused_send_waits_for_room_once_and_then_for_more() {
        let socket = socket();
        let mut poller = WritablePoller {
            socket: socket.clone(),
            waiting: None,
            said_writable: false,
        };
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut poll = |poller: &mut WritablePoller| Pin::new(poller).poll_writable(&mut cx);
        // Nothing refused: writable at once, without registering anything.
        assert!(matches!(poll(&mut poller), Poll::Ready(Ok(()))));
        assert!(poller.waiting.is_none());
        // After a refusal the poller asks the runtime, which reports this idle socket writable
        // as soon as it is registered.
        socket.refused.store(true, Ordering::Release);
        let writable = poll_fn(|cx| Pin::new(&mut poller).poll_writable(cx));
        tokio::time::timeout(BOUND, writable)
            .await
            .expect("an idle socket is writable")
            .unwrap();
        assert!(poller.waiting.is_some());
        // Refused again after that "writable": no second "writable" until room is freed,
        // which on this idle socket never happens (a loop of refused sends would spin).
        assert!(poll(&mut poller).is_pending());
        assert!(poll(&mut poller).is_pending());
        // A send that gets through ends the wait and drops the registration.
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let transmit = Transmit {
            destination: peer.local_addr().unwrap(),
            ecn: None,
            contents: b"room again",
            segment_size: None,
            src_ip: None,
        };
        socket.try_send(&transmit).unwrap();
        assert!(!socket.refused.load(Ordering::Acquire));
        assert!(matches!(poll(&mut poller), Poll::Ready(Ok(()))));
        assert!(poller.waiting.is_none());
    }

    #[tokio::test]
    async fn a_datagram_sent_through_the_runtime_is_received() {
        let runtime: Arc<dyn Runtime> = Arc::new(ReadInterestRuntime);
        let bind = || UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, b) = (
            runtime.wrap_udp_socket(bind()).unwrap(),
            runtime.wrap_udp_socket(bind()).unwrap(),
        );
        let payload = b"one datagram through quinn's own send path";
        let transmit = Transmit {
            destination: b.local_addr().unwrap(),
            ecn: None,
            contents: payload,
            segment_size: None,
            src_ip: None,
        };
        a.try_send(&transmit).unwrap();
        let mut storage = [0u8; 1500];
        let mut bufs = [io::IoSliceMut::new(&mut storage)];
        let mut meta = [RecvMeta::default()];
        let received = poll_fn(|cx| b.poll_recv(cx, &mut bufs, &mut meta));
        let count = tokio::time::timeout(BOUND, received)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(count, 1);
        assert_eq!(&storage[..meta[0].len], payload);
    }
}
