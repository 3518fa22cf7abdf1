//! The decision batch (kind 2) and its packed layout on the wire.
//!
//! In memory a batch is one [`WireDecision`] per check. On the wire it is packed as columns, each
//! field only for the decisions that have it: an allowed decision takes 17 bytes (its outcome,
//! what remains, when the bucket resets), where a whole `WireDecision` took 32. Most decisions
//! are allowed, so an answer takes about half the bytes it did. The packing is
//! [`DecisionBatch`]'s own rkyv `Archive` impl.

use rkyv::rancor::{Fallible, Source};
use rkyv::ser::{Allocator, Writer};
use rkyv::{Archive, Deserialize, Place, Serialize};

use super::ErrorCode;
use super::messages::{Refusal, access_validated};
use super::packing::{Packed, unpack_error};
use crate::Decision;

/// One decision as the client reads it. `outcome`: 0 allowed, 1 denied, 2 cost exceeds burst
/// (`remaining` then holds the burst), 3 error (`error_code` says which). A field the outcome does
/// not use is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireDecision {
    pub outcome: u8,
    pub error_code: u16,
    pub remaining: u64,
    pub retry_after_ns: u64,
    pub reset_after_ns: u64,
}

/// Node → client: one decision per check of the batch, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecisionBatch {
    pub decisions: Vec<WireDecision>,
    /// The version of the answering node's slot table (0: not in a cluster). A client whose
    /// table has another version asks for the new one (`FrameKind::TableRequest`).
    pub table_version: u64,
}

const ALLOWED: u8 = 0;
const DENIED: u8 = 1;
const COST_EXCEEDS_BURST: u8 = 2;
const ERROR: u8 = 3;

/// A decision batch as archived: columns, each holding its field for the decisions that have it,
/// in order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PackedDecisions {
    /// One per decision: 0 allowed, 1 denied, 2 cost exceeds burst, 3 error.
    pub outcomes: Vec<u8>,
    /// One per decision but errors (for outcome 2, the burst).
    pub remaining: Vec<u64>,
    /// One per allowed or denied decision.
    pub reset_after_ns: Vec<u64>,
    /// One per denied decision.
    pub retry_after_ns: Vec<u64>,
    /// One per error.
    pub error_codes: Vec<u16>,
    pub table_version: u64,
}

/// The archived form of a [`DecisionBatch`].
pub type ArchivedDecisionBatch = ArchivedPackedDecisions;

impl PackedDecisions {
    /// Packs `batch`; a field its decision's outcome does not use is left out (an outcome over 3
    /// is sent as an error).
    pub fn pack(batch: &DecisionBatch) -> Self {
        let n = batch.decisions.len();
        let mut packed = PackedDecisions {
            outcomes: Vec::with_capacity(n),
            remaining: Vec::with_capacity(n),
            reset_after_ns: Vec::with_capacity(n),
            retry_after_ns: Vec::new(),
            error_codes: Vec::new(),
            table_version: batch.table_version,
        };
        for d in &batch.decisions {
            let outcome = d.outcome.min(ERROR);
            packed.outcomes.push(outcome);
            if outcome == ERROR {
                packed.error_codes.push(d.error_code);
                continue;
            }
            packed.remaining.push(d.remaining);
            if outcome == COST_EXCEEDS_BURST {
                continue;
            }
            packed.reset_after_ns.push(d.reset_after_ns);
            if outcome == DENIED {
                packed.retry_after_ns.push(d.retry_after_ns);
            }
        }
        packed
    }
}

fn malformed(message: String) -> Refusal {
    (ErrorCode::MalformedPayload, message)
}

impl ArchivedPackedDecisions {
    /// Appends every decision to `out`, after checking that each column holds as many values as
    /// the outcomes call for; returns the node's slot-table version.
    fn unpack_into(&self, out: &mut Vec<WireDecision>) -> Result<u64, Refusal> {
        let mut counts = [0usize; 4];
        for &outcome in self.outcomes.iter() {
            let Some(count) = counts.get_mut(usize::from(outcome)) else {
                return Err(malformed(format!("unknown outcome {outcome}")));
            };
            *count += 1;
        }
        let [allowed, denied, over_burst, errors] = counts;
        let expected = [
            (
                "remaining",
                self.remaining.len(),
                allowed + denied + over_burst,
            ),
            (
                "reset_after_ns",
                self.reset_after_ns.len(),
                allowed + denied,
            ),
            ("retry_after_ns", self.retry_after_ns.len(), denied),
            ("error_codes", self.error_codes.len(), errors),
        ];
        for (column, got, want) in expected {
            if got != want {
                return Err(malformed(format!(
                    "{got} values of {column} for {want} decisions that have one"
                )));
            }
        }
        out.reserve(self.outcomes.len());
        let mut remaining = self.remaining.iter().map(|v| v.to_native());
        let mut reset = self.reset_after_ns.iter().map(|v| v.to_native());
        let mut retry = self.retry_after_ns.iter().map(|v| v.to_native());
        let mut errors = self.error_codes.iter().map(|v| v.to_native());
        for &outcome in self.outcomes.iter() {
            let mut d = WireDecision {
                outcome,
                ..WireDecision::default()
            };
            // The counts above match the columns, so none of these runs dry.
            if outcome == ERROR {
                d.error_code = errors.next().unwrap_or_default();
            } else {
                d.remaining = remaining.next().unwrap_or_default();
                if outcome != COST_EXCEEDS_BURST {
                    d.reset_after_ns = reset.next().unwrap_or_default();
                }
                if outcome == DENIED {
                    d.retry_after_ns = retry.next().unwrap_or_default();
                }
            }
            out.push(d);
        }
        Ok(self.table_version.to_native())
    }
}

impl Archive for DecisionBatch {
    type Archived = ArchivedPackedDecisions;
    type Resolver = Packed<PackedDecisions>;

    fn resolve(&self, resolver: Self::Resolver, out: Place<Self::Archived>) {
        resolver.resolve(out);
    }
}

impl<S> Serialize<S> for DecisionBatch
where
    S: Fallible + Allocator + Writer + ?Sized,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        let packed = PackedDecisions::pack(self);
        Packed::serialize(packed, serializer)
    }
}

impl<D> Deserialize<DecisionBatch, D> for ArchivedPackedDecisions
where
    D: Fallible + ?Sized,
    D::Error: Source,
{
    fn deserialize(&self, _: &mut D) -> Result<DecisionBatch, D::Error> {
        let mut decisions = Vec::new();
        let table_version = self.unpack_into(&mut decisions).map_err(unpack_error)?;
        Ok(DecisionBatch {
            decisions,
            table_version,
        })
    }
}

impl From<Decision> for WireDecision {
    fn from(decision: Decision) -> Self {
        match decision {
            Decision::Allowed {
                remaining,
                reset_after_ns,
            } => WireDecision {
                outcome: ALLOWED,
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
                outcome: DENIED,
                error_code: 0,
                remaining,
                retry_after_ns,
                reset_after_ns,
            },
            Decision::CostExceedsBurst { burst } => WireDecision {
                outcome: COST_EXCEEDS_BURST,
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
            outcome: ERROR,
            error_code: code as u16,
            ..WireDecision::default()
        }
    }

    /// The decision, or the error code the node gave for this check.
    pub fn to_decision(&self) -> Result<Decision, ErrorCode> {
        match self.outcome {
            ALLOWED => Ok(Decision::Allowed {
                remaining: self.remaining,
                reset_after_ns: self.reset_after_ns,
            }),
            DENIED => Ok(Decision::Denied {
                remaining: self.remaining,
                retry_after_ns: self.retry_after_ns,
                reset_after_ns: self.reset_after_ns,
            }),
            COST_EXCEEDS_BURST => Ok(Decision::CostExceedsBurst {
                burst: self.remaining,
            }),
            ERROR => {
                Err(ErrorCode::from_u16(self.error_code).unwrap_or(ErrorCode::MalformedPayload))
            }
            _ => Err(ErrorCode::MalformedPayload),
        }
    }
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
/// slot-table version. On a refusal `decisions` is empty.
pub fn decode_decisions_into(
    payload: &[u8],
    decisions: &mut Vec<WireDecision>,
) -> Result<u64, Refusal> {
    decisions.clear();
    let batch = access_validated::<ArchivedDecisionBatch>(payload, "decision batch")?;
    batch
        .unpack_into(decisions)
        .inspect_err(|_| decisions.clear())
}

#[cfg(test)]
mod tests {
    use rkyv::rancor;

    use super::*;

    fn every_outcome() -> Vec<WireDecision> {
        vec![
            WireDecision::from(Decision::Allowed {
                remaining: 3,
                reset_after_ns: 5,
            }),
            WireDecision::error(ErrorCode::StoreFull),
            WireDecision::from(Decision::Denied {
                remaining: 0,
                retry_after_ns: 7,
                reset_after_ns: 11,
            }),
            WireDecision::from(Decision::CostExceedsBurst { burst: 13 }),
            WireDecision::from(Decision::Allowed {
                remaining: 2,
                reset_after_ns: 17,
            }),
        ]
    }

    #[test]
    fn decisions_decode_into_a_reused_buffer_as_they_decode_fresh() {
        let decisions = every_outcome();
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

    #[test]
    fn an_allowed_decision_takes_17_bytes() {
        let allowed = WireDecision::from(Decision::Allowed {
            remaining: 1,
            reset_after_ns: 2,
        });
        let size = |n: usize| {
            rkyv::to_bytes::<rancor::Error>(&DecisionBatch {
                decisions: vec![allowed; n],
                table_version: 1,
            })
            .unwrap()
            .len()
        };
        assert_eq!((size(264) - size(8)) / 256, 17);
    }

    #[test]
    fn columns_that_do_not_match_the_outcomes_are_refused() {
        let good = PackedDecisions::pack(&DecisionBatch {
            decisions: every_outcome(),
            table_version: 1,
        });
        let mut cases = Vec::new();
        let mut p = good.clone();
        p.outcomes[0] = 4;
        cases.push((p, "unknown outcome 4"));
        let mut p = good.clone();
        p.remaining.pop();
        cases.push((p, "3 values of remaining for 4"));
        let mut p = good.clone();
        p.reset_after_ns.push(1);
        cases.push((p, "4 values of reset_after_ns for 3"));
        let mut p = good.clone();
        p.retry_after_ns.clear();
        cases.push((p, "0 values of retry_after_ns for 1"));
        let mut p = good;
        p.error_codes.push(1);
        cases.push((p, "2 values of error_codes for 1"));
        for (packed, says) in cases {
            let payload = rkyv::to_bytes::<rancor::Error>(&packed).unwrap();
            let (code, message) = decode_decisions(&payload).unwrap_err();
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains(says), "{message}");
            assert!(rkyv::from_bytes::<DecisionBatch, rancor::Error>(&payload).is_err());
        }
    }
}
