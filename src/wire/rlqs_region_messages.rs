//! RLQS region messages (protocol version 8): for a `scope: global` bucket, each region's owner
//! tells the bucket's owner in the deciding region its demand and claim (kind 23), and is
//! answered with its region's part of the limit (kind 24, same request id). Validated like the
//! relay messages, then held to the same bounds.

use rkyv::rancor;
use rkyv::{Archive, Deserialize, Serialize};

use super::messages::{Refusal, access_validated};
use super::rlqs_messages::{
    MAX_WIRE_RLQS_ITEMS, WireRlqsBucket, check_bucket, check_from, check_period, malformed,
    too_many,
};
use crate::region::RegionName;

/// One region's word about one global bucket.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireRegionClaim {
    pub bucket: WireRlqsBucket,
    /// The whole limit, as the sender's configuration gives it: `requests` per `period_s`.
    pub requests: u64,
    pub period_s: u64,
    /// The region's Envoys' smoothed demand, requests per period.
    pub demand: u64,
    /// The most the region's Envoys may admit in a period now.
    pub claim: u64,
}

/// Kind 23, node → node: a region owner's claims for global buckets the receiver decides.
/// Answered with a kind 24.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RlqsRegionClaims {
    pub from: String,
    /// The sender's region (the receiver checks the membership knows the sender there).
    pub region: String,
    pub claims: Vec<WireRegionClaim>,
}

/// One bucket's part for the asking region.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireRegionPart {
    pub bucket: WireRlqsBucket,
    /// Requests per period the region's Envoys may share.
    pub part: u64,
}

/// Kind 24, node → node: the parts of the claimed buckets (a bucket left out keeps its floor).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RlqsRegionParts {
    pub from: String,
    pub parts: Vec<WireRegionPart>,
}

fn check_requests(i: usize, what: &str, n: u64) -> Result<(), Refusal> {
    if n > u64::from(u32::MAX) {
        return Err(malformed(format!(
            "RLQS region item {i}: {what} of {n} (at most {})",
            u32::MAX
        )));
    }
    Ok(())
}

/// Validates a kind 23 payload: the sender's id and region name, at most
/// [`MAX_WIRE_RLQS_ITEMS`] claims, each bucket id bounded and sorted, each period within a
/// year, each limit at most `u32::MAX` requests.
pub fn decode_rlqs_region_claims(payload: &[u8]) -> Result<RlqsRegionClaims, Refusal> {
    let archived = access_validated::<ArchivedRlqsRegionClaims>(payload, "RLQS region claims")?;
    if archived.claims.len() > MAX_WIRE_RLQS_ITEMS {
        return Err(too_many("region claims", archived.claims.len()));
    }
    let message: RlqsRegionClaims = rkyv::deserialize::<_, rancor::Error>(archived)
        .map_err(|e| malformed(format!("RLQS region claims: {e}")))?;
    check_from(&message.from)?;
    RegionName::new(&message.region).map_err(|e| malformed(format!("RLQS region claims: {e}")))?;
    for (i, claim) in message.claims.iter().enumerate() {
        check_bucket(i, &claim.bucket)?;
        check_period(i, claim.period_s)?;
        check_requests(i, "a limit", claim.requests)?;
    }
    Ok(message)
}

/// Validates a kind 24 payload: the sender's id, at most [`MAX_WIRE_RLQS_ITEMS`] parts, each
/// bucket id bounded and sorted, each part at most `u32::MAX` requests.
pub fn decode_rlqs_region_parts(payload: &[u8]) -> Result<RlqsRegionParts, Refusal> {
    let archived = access_validated::<ArchivedRlqsRegionParts>(payload, "RLQS region parts")?;
    if archived.parts.len() > MAX_WIRE_RLQS_ITEMS {
        return Err(too_many("region parts", archived.parts.len()));
    }
    let message: RlqsRegionParts = rkyv::deserialize::<_, rancor::Error>(archived)
        .map_err(|e| malformed(format!("RLQS region parts: {e}")))?;
    check_from(&message.from)?;
    for (i, part) in message.parts.iter().enumerate() {
        check_bucket(i, &part.bucket)?;
        check_requests(i, "a part", part.part)?;
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::framed_payload;
    use crate::wire::{ErrorCode, FrameKind, WireRlqsEntry};

    fn bucket() -> WireRlqsBucket {
        WireRlqsBucket {
            domain: "edge".into(),
            entries: vec![WireRlqsEntry {
                key: "name".into(),
                value: "shared".into(),
            }],
        }
    }

    fn claims(region: &str, claims: Vec<WireRegionClaim>) -> Result<RlqsRegionClaims, Refusal> {
        let message = RlqsRegionClaims {
            from: "node-1".into(),
            region: region.into(),
            claims,
        };
        decode_rlqs_region_claims(&framed_payload(FrameKind::RlqsRegionClaims, &message))
    }

    fn claim() -> WireRegionClaim {
        WireRegionClaim {
            bucket: bucket(),
            requests: 600,
            period_s: 60,
            demand: 420,
            claim: 300,
        }
    }

    #[test]
    fn claims_and_parts_decode_as_sent() {
        assert_eq!(claims("eu", vec![claim()]).unwrap().claims, vec![claim()]);
        let parts = RlqsRegionParts {
            from: "node-0".into(),
            parts: vec![WireRegionPart {
                bucket: bucket(),
                part: 450,
            }],
        };
        let payload = framed_payload(FrameKind::RlqsRegionParts, &parts);
        assert_eq!(decode_rlqs_region_parts(&payload).unwrap(), parts);
    }

    #[test]
    fn junk_is_refused_in_words() {
        let cases = [
            (claims("", vec![claim()]), "region"),
            (claims("eu west", vec![claim()]), "region"),
            (
                claims(
                    "eu",
                    vec![WireRegionClaim {
                        period_s: 0,
                        ..claim()
                    }],
                ),
                "period of 0",
            ),
            (
                claims(
                    "eu",
                    vec![WireRegionClaim {
                        requests: u64::MAX,
                        ..claim()
                    }],
                ),
                "a limit of",
            ),
            (
                claims(
                    "eu",
                    vec![WireRegionClaim {
                        bucket: WireRlqsBucket::default(),
                        ..claim()
                    }],
                ),
                "domain",
            ),
        ];
        for (refused, words) in cases {
            let (code, message) = refused.unwrap_err();
            assert_eq!(code, ErrorCode::MalformedPayload);
            assert!(message.contains(words), "{message}");
        }
        let (code, _) = claims("eu", vec![claim(); MAX_WIRE_RLQS_ITEMS + 1]).unwrap_err();
        assert_eq!(code, ErrorCode::BatchTooLarge);
        let parts = RlqsRegionParts {
            from: "node-0".into(),
            parts: vec![WireRegionPart {
                bucket: bucket(),
                part: u64::MAX,
            }],
        };
        let payload = framed_payload(FrameKind::RlqsRegionParts, &parts);
        let (code, message) = decode_rlqs_region_parts(&payload).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
        assert!(message.contains("a part of"), "{message}");
        let (code, _) = decode_rlqs_region_parts(&[9, 9, 9]).unwrap_err();
        assert_eq!(code, ErrorCode::MalformedPayload);
    }
}
