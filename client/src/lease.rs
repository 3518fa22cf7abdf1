//! Concurrency leases from a gateway: [`Client::acquire`], [`Client::release`] and
//! [`Client::renew`]. Each is one kind 15 frame on its own stream to the owner of the key's slot
//! (to its successor, marked as a takeover, while the owner's link is down), apart from the
//! check path: no queue, no batching, no failure mode: an error says the limiter could not
//! answer, and the caller decides (the tower layer answers 503 for a fail-closed rule).

use std::sync::Arc;
use std::time::Duration;

use floodgate::lease::{LeaseId, LeaseLimit};
use floodgate::wire::{
    ErrorCode, FrameKind, LeaseAnswer, LeaseRequestBatch, WireLeaseRequest, decode_lease_answers,
    encode_lease_requests,
};

use crate::client::Client;
use crate::config::MAX_KEY_BYTES;
use crate::error::ClientError;
use crate::link::NodeLink;
use crate::request::{AnswerError, request_encoded};

/// Shortest time a lease call waits for its answer: it opens a stream of its own (one round
/// trip more than a check), so the check timeout (5 ms by default) would be too tight.
const MIN_LEASE_TIMEOUT: Duration = Duration::from_millis(500);
/// Most times a call is sent again after `not_owner` (the table moved under it).
const NOT_OWNER_RETRIES: usize = 2;
/// Longest a call waits for a new slot table after `not_owner` before it is sent again.
const TABLE_WAIT: Duration = Duration::from_millis(500);
/// Largest answer accepted (one answer of a few dozen bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A lease held: give it back with [`Client::release`] (or let it expire after its TTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: Vec<u8>,
    id: LeaseId,
    in_use: u64,
    expires_in: Duration,
}

impl Lease {
    /// The lease's id, unique among its key's leases: 128 random bits (64 from a node, or a
    /// cluster, that speaks protocol version 9 or older).
    pub fn id(&self) -> LeaseId {
        self.id
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Leases of the key held when this one was granted, itself included.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Time from the grant until the node reclaims it, unless renewed.
    pub fn expires_in(&self) -> Duration {
        self.expires_in
    }
}

/// The answer to [`Client::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    Granted(Lease),
    /// All `max` are held: `retry_after` is when the earliest of them expires (a release may
    /// free one sooner).
    Refused {
        in_use: u64,
        retry_after: Duration,
    },
}

/// The answer to [`Client::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Renewed {
        expires_in: Duration,
    },
    /// The lease is not held any more (it expired, and its place may be someone else's):
    /// acquire again.
    NotHeld,
}

impl Client {
    /// Takes one of at most `max` concurrent leases on `key`, held for `ttl` unless released
    /// or renewed. `max` is 1..=100,000 and `ttl` 1 ms..=1 day. An error means the limiter did
    /// not answer (or refused the call): an acquire that timed out may have been granted, and
    /// then holds its place until its TTL.
    pub async fn acquire(
        &self,
        key: impl Into<Vec<u8>>,
        max: u64,
        ttl: Duration,
    ) -> Result<Acquire, ClientError> {
        let key = key.into();
        let limit = LeaseLimit::new(max, nanos(ttl))
            .map_err(|e| ClientError::BadRequest(format!("lease limit: {e}")))?;
        check_key(&key)?;
        let answer = self
            .lease_call(WireLeaseRequest::acquire(key.clone(), &limit))
            .await?;
        match answer {
            LeaseAnswer::Granted {
                lease_id,
                in_use,
                expires_in_ns,
            } => Ok(Acquire::Granted(Lease {
                key,
                id: lease_id,
                in_use,
                expires_in: Duration::from_nanos(expires_in_ns),
            })),
            LeaseAnswer::Refused {
                in_use,
                retry_after_ns,
            } => Ok(Acquire::Refused {
                in_use,
                retry_after: Duration::from_nanos(retry_after_ns),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Gives a lease back. Idempotent: returns false when it was not held any more (released
    /// before, or expired), which is not an error.
    pub async fn release(&self, lease: &Lease) -> Result<bool, ClientError> {
        let answer = self
            .lease_call(WireLeaseRequest::release(lease.key.clone(), lease.id))
            .await?;
        match answer {
            LeaseAnswer::Released { was_held, .. } => Ok(was_held),
            other => Err(unexpected(other)),
        }
    }

    /// Extends a held lease to expire `ttl` from now.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renewal, ClientError> {
        let ttl_ns = LeaseLimit::check_ttl(nanos(ttl))
            .map_err(|e| ClientError::BadRequest(format!("lease renewal: {e}")))?;
        let answer = self
            .lease_call(WireLeaseRequest::renew(lease.key.clone(), lease.id, ttl_ns))
            .await?;
        match answer {
            LeaseAnswer::Renewed { expires_in_ns, .. } => Ok(Renewal::Renewed {
                expires_in: Duration::from_nanos(expires_in_ns),
            }),
            LeaseAnswer::NotHeld { .. } => Ok(Renewal::NotHeld),
            other => Err(unexpected(other)),
        }
    }

    /// Sends one lease request to the node that decides its key and returns its answer; sent
    /// again (at most twice) after `not_owner`, once the table has moved.
    async fn lease_call(&self, request: WireLeaseRequest) -> Result<LeaseAnswer, ClientError> {
        let timeout = self.timeout().max(MIN_LEASE_TIMEOUT);
        let routing = self.routing();
        let mut attempt = 0;
        loop {
            let mut changes = routing.changes();
            let routes = routing.routes();
            let owner = routes.links[routes.route(&request.key)].clone();
            let successor = routes
                .successor(&request.key)
                .map(|i| routes.links[i].clone())
                .filter(|s| !Arc::ptr_eq(s, &owner) && s.is_connected());
            // As for checks: while the owner's link is down, its successor decides from the
            // owner's replicas.
            let (link, takeover) = match successor {
                Some(successor) if owner.is_down() && !owner.is_rejoined() => (successor, true),
                _ => (owner, false),
            };
            let answer = send(&link, &request, takeover, timeout).await?;
            let (answer, version) = answer;
            routing.hint.saw(version, link.addr);
            match answer {
                LeaseAnswer::Error(ErrorCode::NotOwner) if attempt < NOT_OWNER_RETRIES => {
                    attempt += 1;
                    routing.hint.poke();
                    let _ = tokio::time::timeout(TABLE_WAIT, changes.changed()).await;
                }
                LeaseAnswer::Error(code) => {
                    return Err(ClientError::Rejected {
                        node: link.addr,
                        code,
                        message: format!("the node could not decide the lease ({code})"),
                    });
                }
                answer => return Ok(answer),
            }
        }
    }
}

/// One request on its own stream of `link`'s connection.
async fn send(
    link: &NodeLink,
    request: &WireLeaseRequest,
    takeover: bool,
    timeout: Duration,
) -> Result<(LeaseAnswer, u64), ClientError> {
    let connection = match link.connection() {
        Some(connection) => connection,
        None => {
            // A link to a member just discovered is still connecting: wait for it (bounded),
            // as a check waits in its queue.
            let mut state = link.subscribe();
            let _ = tokio::time::timeout(
                timeout,
                state.wait_for(|s| *s != crate::status::LinkState::Connecting),
            )
            .await;
            link.connection().ok_or_else(|| {
                ClientError::Unavailable(format!(
                    "no connection to the node deciding this key ({})",
                    link.addr
                ))
            })?
        }
    };
    let batch = LeaseRequestBatch {
        requests: vec![WireLeaseRequest {
            takeover,
            ..request.clone()
        }],
    };
    // In the layout of the version the connection agreed on.
    let mut frame = Vec::new();
    encode_lease_requests(&mut frame, agreed_version(&connection), 1, &batch);
    let answered = tokio::time::timeout(timeout, request_on(&connection, &frame))
        .await
        .map_err(|_| {
            ClientError::Unavailable(format!(
                "no lease answer from {} within {timeout:?}",
                link.addr
            ))
        })?;
    let payload = answered.map_err(|e| match e {
        AnswerError::Refused { code, message } => ClientError::Rejected {
            node: link.addr,
            code,
            message,
        },
        AnswerError::Failed(why) => ClientError::Unavailable(format!("{}: {why}", link.addr)),
    })?;
    let (answers, version) =
        decode_lease_answers(payload.version, &payload.payload).map_err(|(_, why)| {
            ClientError::Unavailable(format!("bad lease answer from {}: {why}", link.addr))
        })?;
    match answers.as_slice() {
        [answer] => Ok((*answer, version)),
        other => Err(ClientError::Unavailable(format!(
            "{} answered {} lease answers to one request",
            link.addr,
            other.len()
        ))),
    }
}

/// Sends one encoded kind 15 `frame` on its own stream; the answer frame (its version says its
/// layout).
async fn request_on(
    connection: &quinn::Connection,
    frame: &[u8],
) -> Result<floodgate::wire::Frame, AnswerError> {
    request_encoded(connection, frame, FrameKind::LeaseAnswer, MAX_ANSWER_BYTES).await
}

/// The protocol version a connection agreed on in its handshake (its ALPN id).
fn agreed_version(connection: &quinn::Connection) -> u8 {
    connection
        .handshake_data()
        .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol)
        .and_then(|id| floodgate::protocol::version_of_alpn(&id))
        .unwrap_or(floodgate::protocol::OLDEST)
}

fn check_key(key: &[u8]) -> Result<(), ClientError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(ClientError::BadRequest(format!(
            "lease key of {} bytes exceeds the maximum of {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn unexpected(answer: LeaseAnswer) -> ClientError {
    ClientError::Unavailable(format!(
        "the node answered a lease request with {answer:?}, which does not answer it"
    ))
}
