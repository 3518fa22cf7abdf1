//! Kind 25 requests: a member of this node's region, handing it slots, sends the units of global
//! keys in them that other regions have not confirmed. They are counted against each key's
//! share here before the answer goes back, and the sender sends the hand-off's buckets only
//! after the answer: by the time this node decides those slots, it counts the units.

use floodgate::wire::{
    ErrorCode, Frame, FrameKind, RegionUnconfirmedMessage, decode_region_unconfirmed,
    encode_message,
};

use crate::check_path::CheckPath;
use crate::service::encode_error;

use super::remote::Remote;

/// Answers one kind 25: an empty kind 25 (same request id) once the units count, or an error
/// frame saying why they were refused.
pub(super) fn answer_unconfirmed(
    checks: &CheckPath,
    remote: &Remote,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let message = match decode_region_unconfirmed(&frame.payload) {
        Ok(message) => message,
        Err((code, why)) => {
            encode_error(out, frame.request_id, code, why);
            return Some(code);
        }
    };
    // A node speaks only as itself, and hands slots only to members of its own region.
    let members = &checks.members;
    let same_region = members
        .region_of(&message.from)
        .is_some_and(|region| region == members.me().region);
    if !remote.certified_as(&message.from) || !same_region {
        let why = format!(
            "unconfirmed region units from `{}`: its certificate names another node, or it is \
             not a member of this region",
            message.from
        );
        tracing::warn!(remote = %remote.connection.remote_address(), "dropped {why}");
        encode_error(out, frame.request_id, ErrorCode::Forbidden, why);
        return Some(ErrorCode::Forbidden);
    }
    checks.region_sync.inherit(&message.units);
    let answer = RegionUnconfirmedMessage {
        from: members.me().id.clone(),
        units: Vec::new(),
    };
    encode_message(out, FrameKind::RegionUnconfirmed, frame.request_id, &answer);
    None
}
