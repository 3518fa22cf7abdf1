//! Policy distribution messages: a client asks a node for its rules (`PolicyRequest`, kind 8)
//! and the node answers with the rules in force (`Policy`, kind 9).
//!
//! The rules travel as the rules file's text, not as a parsed model: the client re-parses it with
//! `Policy::from_yaml`, so there is one schema and one validation, and the version (the text's
//! content hash) means the same thing on both sides.

use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::messages::Refusal;

/// Largest rules text a node sends or a client accepts, and so the largest rules file.
pub const MAX_POLICY_TEXT_BYTES: usize = 1 << 20;

/// Client → node: "send the rules if they are not `version`" (empty: the client has none).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyRequest {
    pub version: String,
}

/// Node → client: the rules in force. `version` empty: the node has no rules. `text` empty with a
/// non-empty version: unchanged, the client already has that version.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyMessage {
    pub version: String,
    pub text: String,
}

impl PolicyMessage {
    /// The node has no rules.
    pub fn none() -> Self {
        PolicyMessage::default()
    }

    /// True when the message carries no new text: no rules, or the version the client has.
    pub fn is_unchanged(&self) -> bool {
        self.text.is_empty()
    }
}

/// Validates a `PolicyRequest` payload.
pub fn decode_policy_request(payload: &[u8]) -> Result<PolicyRequest, Refusal> {
    let request =
        super::messages::access_validated::<ArchivedPolicyRequest>(payload, "policy request")?;
    if request.version.len() > 128 {
        return Err((
            ErrorCode::MalformedPayload,
            "policy version longer than 128 bytes".to_owned(),
        ));
    }
    Ok(PolicyRequest {
        version: request.version.as_str().to_owned(),
    })
}

/// Validates a `Policy` payload (client side: a node's answer is checked like any input).
pub fn decode_policy_message(payload: &[u8]) -> Result<PolicyMessage, Refusal> {
    let message =
        super::messages::access_validated::<ArchivedPolicyMessage>(payload, "policy message")?;
    if message.text.len() > MAX_POLICY_TEXT_BYTES || message.version.len() > 128 {
        return Err((
            ErrorCode::MalformedPayload,
            format!(
                "policy message too large ({} bytes of text)",
                message.text.len()
            ),
        ));
    }
    Ok(PolicyMessage {
        version: message.version.as_str().to_owned(),
        text: message.text.as_str().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameKind, FrameReader, encode_message};

    #[test]
    fn policy_messages_round_trip_through_frames() {
        let message = PolicyMessage {
            version: "0123456789abcdef".to_owned(),
            text: "rules: []\n".to_owned(),
        };
        let mut bytes = Vec::new();
        encode_message(&mut bytes, FrameKind::Policy, 7, &message);
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(&bytes);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!((frame.kind, frame.request_id), (FrameKind::Policy, 7));
        assert_eq!(decode_policy_message(&frame.payload).unwrap(), message);

        let request = PolicyRequest {
            version: "abc".to_owned(),
        };
        let mut bytes = Vec::new();
        encode_message(&mut bytes, FrameKind::PolicyRequest, 8, &request);
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(&bytes);
        let frame = reader.next_frame().unwrap().unwrap();
        assert_eq!(decode_policy_request(&frame.payload).unwrap(), request);
    }

    #[test]
    fn garbage_is_refused_not_read() {
        let mut junk = rkyv::util::AlignedVec::<16>::new();
        junk.extend_from_slice(&[0xff; 3]);
        assert_eq!(
            decode_policy_message(&junk).unwrap_err().0,
            ErrorCode::MalformedPayload
        );
        assert_eq!(
            decode_policy_request(&junk).unwrap_err().0,
            ErrorCode::MalformedPayload
        );
        assert!(PolicyMessage::none().is_unchanged());
    }
}
