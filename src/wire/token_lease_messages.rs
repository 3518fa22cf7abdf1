//! Token-lease messages: a gateway asks a key's owner for some of its tokens and returns those it
//! did not use (kind 18); the owner answers what it granted (kind 19). Validated like every
//! other payload before a field is read.

use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::messages::{Refusal, WireCheck, WireLimits, access_validated, validate_check};
use crate::BucketKey;
use crate::Limit;
use crate::token_lease::Grant;

/// One key's request: its check (key, limit; `cost` is the tokens wanted, 0 to only return;
/// `takeover` as for a check; `refund` must be false) and the unused tokens of an earlier grant
/// given back first.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TokenLeaseRequest {
    pub check: WireCheck,
    pub returning: u64,
}

/// Kind 18, client → node: token-lease requests, each decided on its own.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenLeaseBatch {
    pub requests: Vec<TokenLeaseRequest>,
}

/// One answer: `outcome` 0 decided (`granted` tokens, possibly 0; then `retry_after_ns` is when
/// the next one is due), 3 not decided (`error_code` says why: `not_owner`, `store_full`, ...).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenLeaseAnswer {
    pub outcome: u8,
    pub error_code: u16,
    pub granted: u64,
    pub remaining: u64,
    pub retry_after_ns: u64,
}

/// Kind 19, node → client: one answer per request, in order, and the node's table version.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenLeaseAnswers {
    pub answers: Vec<TokenLeaseAnswer>,
    pub table_version: u64,
}

/// A request that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidTokenLease {
    pub key: BucketKey,
    pub limit: Limit,
    /// Tokens wanted, at most the limit's burst (a larger want is clamped to it).
    pub want: u64,
    /// Unused tokens given back, at most the limit's burst.
    pub returning: u64,
    pub takeover: bool,
}

impl TokenLeaseRequest {
    pub fn new(key: impl Into<Vec<u8>>, limit: &Limit, want: u64, returning: u64) -> Self {
        TokenLeaseRequest {
            check: WireCheck::new(key, limit, want),
            returning,
        }
    }
}

impl From<Grant> for TokenLeaseAnswer {
    fn from(grant: Grant) -> Self {
        TokenLeaseAnswer {
            outcome: 0,
            error_code: 0,
            granted: grant.granted,
            remaining: grant.remaining,
            retry_after_ns: grant.retry_after_ns,
        }
    }
}

impl TokenLeaseAnswer {
    pub fn error(code: ErrorCode) -> Self {
        TokenLeaseAnswer {
            outcome: 3,
            error_code: code as u16,
            ..TokenLeaseAnswer::default()
        }
    }

    /// The grant, or the code the node gave instead.
    pub fn to_grant(&self) -> Result<Grant, ErrorCode> {
        match self.outcome {
            0 => Ok(Grant {
                granted: self.granted,
                remaining: self.remaining,
                retry_after_ns: self.retry_after_ns,
            }),
            3 => Err(ErrorCode::from_u16(self.error_code).unwrap_or(ErrorCode::MalformedPayload)),
            _ => Err(ErrorCode::MalformedPayload),
        }
    }
}

/// Validates a kind 18 payload: at most `max_batch` requests, each key and limit as a check's,
/// no refund flag, and nothing returned beyond the limit's burst (no lease is larger).
pub fn decode_token_lease_batch(
    payload: &[u8],
    limits: &WireLimits,
) -> Result<Vec<ValidTokenLease>, Refusal> {
    let batch = access_validated::<ArchivedTokenLeaseBatch>(payload, "token lease batch")?;
    if batch.requests.len() > limits.max_batch {
        return Err((
            ErrorCode::BatchTooLarge,
            format!(
                "{} token lease requests in one frame; the maximum is {}",
                batch.requests.len(),
                limits.max_batch
            ),
        ));
    }
    let mut requests = Vec::with_capacity(batch.requests.len());
    for (i, request) in batch.requests.iter().enumerate() {
        let check = validate_check(&request.check, limits)?;
        if check.refund {
            return Err((
                ErrorCode::MalformedPayload,
                format!(
                    "token lease request {i} is marked as a refund; return tokens with `returning`"
                ),
            ));
        }
        let returning = request.returning.to_native();
        if returning > check.limit.burst() {
            return Err((
                ErrorCode::MalformedPayload,
                format!(
                    "token lease request {i} returns {returning} tokens, more than its limit's burst of {} (no lease is larger)",
                    check.limit.burst()
                ),
            ));
        }
        requests.push(ValidTokenLease {
            key: check.key,
            limit: check.limit,
            want: check.cost.min(check.limit.burst()),
            returning,
            takeover: check.takeover,
        });
    }
    Ok(requests)
}

/// Validates a kind 19 payload (client side): the answers and the node's table version.
pub fn decode_token_lease_answers(payload: &[u8]) -> Result<(Vec<TokenLeaseAnswer>, u64), Refusal> {
    let message = access_validated::<ArchivedTokenLeaseAnswers>(payload, "token lease answers")?;
    let answers = message
        .answers
        .iter()
        .map(|a| TokenLeaseAnswer {
            outcome: a.outcome,
            error_code: a.error_code.to_native(),
            granted: a.granted.to_native(),
            remaining: a.remaining.to_native(),
            retry_after_ns: a.retry_after_ns.to_native(),
        })
        .collect();
    Ok((answers, message.table_version.to_native()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC;
    use crate::wire::FrameKind;
    use crate::wire::frame::framed_payload;

    fn limit() -> Limit {
        Limit::gcra(100, NANOS_PER_SEC, 10).unwrap()
    }

    #[test]
    fn a_valid_batch_decodes_with_want_clamped_to_the_burst() {
        let batch = TokenLeaseBatch {
            requests: vec![
                TokenLeaseRequest::new("hot", &limit(), 50, 3),
                TokenLeaseRequest::new("other", &limit(), 0, 10),
            ],
        };
        let decoded = decode_token_lease_batch(
            &framed_payload(FrameKind::TokenLeaseBatch, &batch),
            &WireLimits::default(),
        )
        .unwrap();
        assert_eq!(decoded.len(), 2);
        assert_eq!((decoded[0].want, decoded[0].returning), (10, 3));
        assert_eq!(decoded[0].key, BucketKey::for_key(b"hot"));
        assert_eq!((decoded[1].want, decoded[1].returning), (0, 10));
    }

    #[test]
    fn bad_requests_are_refused_in_words() {
        let limits = WireLimits {
            max_batch: 1,
            max_key_bytes: 4,
            ..WireLimits::default()
        };
        let refused = |batch: TokenLeaseBatch| {
            decode_token_lease_batch(&framed_payload(FrameKind::TokenLeaseBatch, &batch), &limits)
                .unwrap_err()
        };
        let two = TokenLeaseBatch {
            requests: vec![TokenLeaseRequest::new("a", &limit(), 1, 0); 2],
        };
        assert_eq!(refused(two).0, ErrorCode::BatchTooLarge);
        let long = TokenLeaseBatch {
            requests: vec![TokenLeaseRequest::new("abcde", &limit(), 1, 0)],
        };
        assert_eq!(refused(long).0, ErrorCode::KeyTooLong);
        let over = TokenLeaseBatch {
            requests: vec![TokenLeaseRequest::new("a", &limit(), 1, 11)],
        };
        let (code, message) = refused(over);
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("returns 11 tokens"), "{message}");
        let mut refund = TokenLeaseRequest::new("a", &limit(), 1, 0);
        refund.check.refund = true;
        let (code, _) = refused(TokenLeaseBatch {
            requests: vec![refund],
        });
        assert_eq!(code, ErrorCode::MalformedPayload);
        let mut zero_rate = TokenLeaseRequest::new("a", &limit(), 1, 0);
        zero_rate.check.rate = 0;
        let (code, _) = refused(TokenLeaseBatch {
            requests: vec![zero_rate],
        });
        assert_eq!(code, ErrorCode::InvalidLimit);
        let garbage = [0xffu8; 16];
        assert_eq!(
            decode_token_lease_batch(&garbage, &limits).unwrap_err().0,
            ErrorCode::MalformedPayload
        );
        assert!(decode_token_lease_answers(&garbage).is_err());
    }

    #[test]
    fn answers_round_trip() {
        let answers = TokenLeaseAnswers {
            answers: vec![
                TokenLeaseAnswer::from(Grant {
                    granted: 4,
                    remaining: 6,
                    retry_after_ns: 0,
                }),
                TokenLeaseAnswer::error(ErrorCode::NotOwner),
            ],
            table_version: 9,
        };
        let (decoded, version) =
            decode_token_lease_answers(&framed_payload(FrameKind::TokenLeaseBatch, &answers))
                .unwrap();
        assert_eq!(version, 9);
        assert_eq!(decoded, answers.answers);
        assert_eq!(decoded[0].to_grant().unwrap().granted, 4);
        assert_eq!(decoded[1].to_grant(), Err(ErrorCode::NotOwner));
    }
}
