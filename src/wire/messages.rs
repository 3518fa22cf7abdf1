//! The messages frames carry, as rkyv types, and their validated decoding into core types.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use crate::limit::format_period;
use crate::{Algorithm, BucketCheck, BucketKey, Limit, MAX_PERIOD_NS, SLIDING_LOG_MAX_LIMIT};

/// One check as sent: the key bytes and everything needed to enforce it, so a node needs no
/// configuration. The key bytes are the bucket's whole identity (clients prefix the rule name).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WireCheck {
    pub key: Vec<u8>,
    /// `Algorithm` in wire order: 0 gcra, 1 fixed-window, 2 sliding-window, 3 sliding-log.
    pub algorithm: u8,
    pub rate: u64,
    pub period_ns: u64,
    pub burst: u64,
    pub cost: u64,
    /// Give `cost` back instead of taking it (a request denied on another node). A group is
    /// either all refunds or none; refunds are never denied.
    pub refund: bool,
    /// Sent to the slot's successor because the client cannot reach the owner: the successor
    /// decides it from its replica of the owner's buckets instead of forwarding it. Read on a
    /// group's first check.
    pub takeover: bool,
    /// Decide `cost` but take nothing: a metered request's check, before it goes on, that its
    /// key has at least the estimate left. Mixes with taking checks in a group (protocol
    /// version 6).
    pub peek: bool,
    /// Take `cost` after the fact (a metered cost known once the response is done), never
    /// refused, even into debt. A group is either all charges or none (protocol version 6).
    pub charge: bool,
}

/// Either way: why a request (or, with request id 0, the stream) was refused.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    pub code: u16,
    pub message: String,
}

/// What a node accepts; everything else is refused with an error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLimits {
    pub max_batch: usize,
    pub max_key_bytes: usize,
    /// Longest period a caller's limit may have: how long its bucket may live.
    pub max_period_ns: u64,
    /// Largest sliding-log limit a caller may ask for: how many times its bucket may hold.
    pub max_log_limit: u64,
}

impl Default for WireLimits {
    fn default() -> Self {
        WireLimits {
            max_batch: 4_096,
            max_key_bytes: 256,
            max_period_ns: MAX_PERIOD_NS,
            max_log_limit: SLIDING_LOG_MAX_LIMIT,
        }
    }
}

impl WireLimits {
    /// Refuses a limit that costs more than this receiver lets a caller ask for.
    pub fn admit(&self, limit: &Limit) -> Result<(), Refusal> {
        if limit.period_ns() > self.max_period_ns {
            return Err((
                ErrorCode::InvalidLimit,
                format!(
                    "a period of {} is longer than this node allows ({}, its --max-limit-period)",
                    format_period(limit.period_ns()),
                    format_period(self.max_period_ns)
                ),
            ));
        }
        if limit.algorithm() == Algorithm::SlidingLog && limit.burst() > self.max_log_limit {
            return Err((
                ErrorCode::InvalidLimit,
                format!(
                    "a sliding-log limit of {} is more than this node allows ({}, its \
                     --max-log-limit); use sliding-window for large limits",
                    limit.burst(),
                    self.max_log_limit
                ),
            ));
        }
        Ok(())
    }
}

/// A check that passed validation, ready for the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidCheck {
    pub key: BucketKey,
    pub limit: Limit,
    pub cost: u64,
    pub refund: bool,
    pub takeover: bool,
    pub peek: bool,
    pub charge: bool,
}

impl ValidCheck {
    /// The store's check of this one: its key, limit and cost.
    pub fn check(&self) -> BucketCheck {
        BucketCheck {
            key: self.key,
            limit: self.limit,
            cost: self.cost,
            peek: self.peek,
        }
    }
}

impl WireCheck {
    pub fn new(key: impl Into<Vec<u8>>, limit: &Limit, cost: u64) -> Self {
        WireCheck {
            key: key.into(),
            algorithm: algorithm_to_wire(limit.algorithm()),
            rate: limit.rate(),
            period_ns: limit.period_ns(),
            burst: limit.burst(),
            cost,
            refund: false,
            takeover: false,
            peek: false,
            charge: false,
        }
    }

    /// A check that gives `cost` back to the bucket of `key`.
    pub fn refund(key: impl Into<Vec<u8>>, limit: &Limit, cost: u64) -> Self {
        WireCheck {
            refund: true,
            ..WireCheck::new(key, limit, cost)
        }
    }

    /// A check that `key`'s bucket has `cost` left, taking nothing.
    pub fn peek(key: impl Into<Vec<u8>>, limit: &Limit, cost: u64) -> Self {
        WireCheck {
            peek: true,
            ..WireCheck::new(key, limit, cost)
        }
    }

    /// A charge of `cost` spent already, taken from `key`'s bucket even into debt.
    pub fn charge(key: impl Into<Vec<u8>>, limit: &Limit, cost: u64) -> Self {
        WireCheck {
            charge: true,
            ..WireCheck::new(key, limit, cost)
        }
    }
}

pub fn algorithm_to_wire(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::Gcra => 0,
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::SlidingLog => 3,
    }
}

/// Why a payload was refused: the code to send back and a message for the operator.
pub type Refusal = (ErrorCode, String);

/// Validates a payload as an archived `T`. The first pass uses rancor's `Failure`, which costs
/// nothing on success but says nothing on failure (in release builds `rancor::Error` is the
/// same: "failed without error information"); only a payload that fails is validated again with
/// `BoxedError` to say what was wrong, so the check path stays as fast as it was.
pub(crate) fn access_validated<'a, T>(payload: &'a [u8], what: &str) -> Result<&'a T, Refusal>
where
    T: rkyv::Portable
        + for<'v> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'v, rancor::Failure>>
        + for<'v> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'v, rancor::BoxedError>>,
{
    rkyv::access::<T, rancor::Failure>(payload).map_err(|_| {
        let detail = match rkyv::access::<T, rancor::BoxedError>(payload) {
            // The kind of fault only ("unaligned pointer", "subtree pointer overran range"):
            // the rest names addresses in this process, which a peer has no business seeing.
            Err(e) => e
                .to_string()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned(),
            Ok(_) => "unknown reason".to_owned(),
        };
        (
            ErrorCode::MalformedPayload,
            format!(
                "payload of {} bytes is not a valid {what} (rkyv validation failed: {detail})",
                payload.len()
            ),
        )
    })
}

pub(crate) fn validate_check(
    check: &ArchivedWireCheck,
    limits: &WireLimits,
) -> Result<ValidCheck, Refusal> {
    check_key_len(check.key.len(), limits)?;
    let limit = limit_from_wire(
        check.algorithm,
        check.rate.to_native(),
        check.period_ns.to_native(),
        check.burst.to_native(),
    )?;
    limits.admit(&limit)?;
    Ok(ValidCheck {
        key: BucketKey::for_key(check.key.as_slice()),
        limit,
        cost: check.cost.to_native(),
        refund: check.refund,
        takeover: check.takeover,
        peek: check.peek,
        charge: check.charge,
    })
}

/// Refuses a key longer than `limits` allow.
pub(crate) fn check_key_len(len: usize, limits: &WireLimits) -> Result<(), Refusal> {
    if len > limits.max_key_bytes {
        let message = format!(
            "key of {len} bytes exceeds the maximum of {}",
            limits.max_key_bytes
        );
        return Err((ErrorCode::KeyTooLong, message));
    }
    Ok(())
}

/// A limit from its wire fields, or `invalid_limit` saying why not.
pub(crate) fn limit_from_wire(
    algorithm: u8,
    rate: u64,
    period_ns: u64,
    burst: u64,
) -> Result<Limit, Refusal> {
    let Some(&algorithm) = Algorithm::ALL.get(usize::from(algorithm)) else {
        return Err((
            ErrorCode::InvalidLimit,
            format!("unknown algorithm {algorithm}"),
        ));
    };
    Limit::new(algorithm, rate, period_ns, burst)
        .map_err(|e| (ErrorCode::InvalidLimit, e.to_string()))
}

/// Validates an error frame payload.
pub fn decode_error_frame(payload: &[u8]) -> Result<ErrorFrame, Refusal> {
    let frame = access_validated::<ArchivedErrorFrame>(payload, "error frame")?;
    Ok(ErrorFrame {
        code: frame.code.to_native(),
        message: frame.message.as_str().to_owned(),
    })
}
