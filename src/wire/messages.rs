//! The messages frames carry, as rkyv types, and their validated decoding into core types.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use crate::{Algorithm, BucketKey, Decision, Limit};

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
}

/// One decision as sent. `outcome`: 0 allowed, 1 denied, 2 cost exceeds burst (`remaining` then
/// holds the burst), 3 error (`error_code` says which).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireDecision {
    pub outcome: u8,
    pub error_code: u16,
    pub remaining: u64,
    pub retry_after_ns: u64,
    pub reset_after_ns: u64,
}

/// Node → client: one decision per check of the batch, in order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct DecisionBatch {
    pub decisions: Vec<WireDecision>,
    /// The version of the answering node's slot table (0: not in a cluster). A client whose
    /// table has another version asks for the new one (`FrameKind::TableRequest`).
    pub table_version: u64,
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
}

impl Default for WireLimits {
    fn default() -> Self {
        WireLimits {
            max_batch: 4_096,
            max_key_bytes: 256,
        }
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
        }
    }

    /// A check that gives `cost` back to the bucket of `key`.
    pub fn refund(key: impl Into<Vec<u8>>, limit: &Limit, cost: u64) -> Self {
        WireCheck {
            refund: true,
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

impl From<Decision> for WireDecision {
    fn from(decision: Decision) -> Self {
        match decision {
            Decision::Allowed {
                remaining,
                reset_after_ns,
            } => WireDecision {
                outcome: 0,
                error_code: 0,
                remaining,
                retry_after_ns: 0,
                reset_after_ns,
            },
            Decision::Denied {
                remaining,
                retry_after_ns,
                reset_after_ns,
            } => WireDecision {
                outcome: 1,
                error_code: 0,
                remaining,
                retry_after_ns,
                reset_after_ns,
            },
            Decision::CostExceedsBurst { burst } => WireDecision {
                outcome: 2,
                error_code: 0,
                remaining: burst,
                retry_after_ns: 0,
                reset_after_ns: 0,
            },
        }
    }
}

impl WireDecision {
    /// A check the node could not decide (e.g. its store was full).
    pub fn error(code: ErrorCode) -> Self {
        WireDecision {
            outcome: 3,
            error_code: code as u16,
            ..WireDecision::default()
        }
    }

    /// The decision, or the error code the node gave for this check.
    pub fn to_decision(&self) -> Result<Decision, ErrorCode> {
        match self.outcome {
            0 => Ok(Decision::Allowed {
                remaining: self.remaining,
                reset_after_ns: self.reset_after_ns,
            }),
            1 => Ok(Decision::Denied {
                remaining: self.remaining,
                retry_after_ns: self.retry_after_ns,
                reset_after_ns: self.reset_after_ns,
            }),
            2 => Ok(Decision::CostExceedsBurst {
                burst: self.remaining,
            }),
            3 => Err(ErrorCode::from_u16(self.error_code).unwrap_or(ErrorCode::MalformedPayload)),
            _ => Err(ErrorCode::MalformedPayload),
        }
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
    Ok(ValidCheck {
        key: BucketKey::for_key(check.key.as_slice()),
        limit,
        cost: check.cost.to_native(),
        refund: check.refund,
        takeover: check.takeover,
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

/// Validates a decision batch payload (client side; nodes are not trusted blindly either).
pub fn decode_decision_batch(payload: &[u8]) -> Result<Vec<WireDecision>, Refusal> {
    decode_decisions(payload).map(|(decisions, _)| decisions)
}

/// Validates a decision batch payload; returns the decisions and the node's slot-table version.
pub fn decode_decisions(payload: &[u8]) -> Result<(Vec<WireDecision>, u64), Refusal> {
    let mut decisions = Vec::new();
    let version = decode_decisions_into(payload, &mut decisions)?;
    Ok((decisions, version))
}

/// [`decode_decisions`] into `decisions` (cleared first, its buffer reused); returns the node's
/// slot-table version.
pub fn decode_decisions_into(
    payload: &[u8],
    decisions: &mut Vec<WireDecision>,
) -> Result<u64, Refusal> {
    decisions.clear();
    let batch = access_validated::<ArchivedDecisionBatch>(payload, "decision batch")?;
    decisions.extend(batch.decisions.iter().map(|d| WireDecision {
        outcome: d.outcome,
        error_code: d.error_code.to_native(),
        remaining: d.remaining.to_native(),
        retry_after_ns: d.retry_after_ns.to_native(),
        reset_after_ns: d.reset_after_ns.to_native(),
    }));
    Ok(batch.table_version.to_native())
}

/// Validates an error frame payload.
pub fn decode_error_frame(payload: &[u8]) -> Result<ErrorFrame, Refusal> {
    let frame = access_validated::<ArchivedErrorFrame>(payload, "error frame")?;
    Ok(ErrorFrame {
        code: frame.code.to_native(),
        message: frame.message.as_str().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_decode_into_a_reused_buffer_as_they_decode_fresh() {
        let decisions = vec![
            WireDecision::from(Decision::Allowed {
                remaining: 3,
                reset_after_ns: 5,
            }),
            WireDecision::error(ErrorCode::StoreFull),
        ];
        let payload = rkyv::to_bytes::<rancor::Error>(&DecisionBatch {
            decisions: decisions.clone(),
            table_version: 9,
        })
        .unwrap();
        let mut buffer = vec![WireDecision::default(); 5];
        assert_eq!(decode_decisions_into(&payload, &mut buffer), Ok(9));
        assert_eq!(buffer, decisions);
        assert_eq!(decode_decisions(&payload), Ok((decisions, 9)));
        assert!(decode_decisions_into(b"not an archive", &mut buffer).is_err());
        assert!(buffer.is_empty());
    }
}
