//! Kind 25 (protocol version 11): with a hand-off, the units of global keys that other regions
//! had not confirmed when their slots left the sender, for the new decider to count against
//! each key's share (see `crate::region::UnconfirmedUnits`). Validated like every payload.

use rkyv::{Archive, Deserialize, Serialize};

use super::ErrorCode;
use super::messages::{Refusal, access_validated};
use super::region_messages::MAX_WIRE_NODE_ID_BYTES;
use crate::BucketKey;
use crate::region::{RegionName, UnconfirmedUnits};

/// Most entries one kind 25 message may carry (a hand-off with more sends several).
pub const MAX_WIRE_UNCONFIRMED: usize = 4_096;

/// One key's units that one other region had not confirmed.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WireUnconfirmed {
    pub key: u128,
    pub region: String,
    pub units: u64,
}

/// Kind 25, node → node of the same region: sent with a hand-off, before its buckets.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionUnconfirmedMessage {
    /// The sender's node id, which its certificate must carry.
    pub from: String,
    pub units: Vec<WireUnconfirmed>,
}

impl From<&UnconfirmedUnits> for WireUnconfirmed {
    fn from(units: &UnconfirmedUnits) -> Self {
        WireUnconfirmed {
            key: units.key.to_u128(),
            region: units.region.as_str().to_owned(),
            units: units.units,
        }
    }
}

impl From<&RegionUnconfirmed> for RegionUnconfirmedMessage {
    fn from(message: &RegionUnconfirmed) -> Self {
        RegionUnconfirmedMessage {
            from: message.from.clone(),
            units: message.units.iter().map(WireUnconfirmed::from).collect(),
        }
    }
}

/// A validated kind 25 message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionUnconfirmed {
    pub from: String,
    pub units: Vec<UnconfirmedUnits>,
}

fn malformed(message: String) -> Refusal {
    (ErrorCode::MalformedPayload, message)
}

/// Validates a kind 25 payload: a node id of 1 to [`MAX_WIRE_NODE_ID_BYTES`] bytes, at most
/// [`MAX_WIRE_UNCONFIRMED`] entries, each with a valid region name and at least one unit.
pub fn decode_region_unconfirmed(payload: &[u8]) -> Result<RegionUnconfirmed, Refusal> {
    let message =
        access_validated::<ArchivedRegionUnconfirmedMessage>(payload, "unconfirmed units")?;
    let from = message.from.as_str();
    if from.is_empty() || from.len() > MAX_WIRE_NODE_ID_BYTES {
        return Err(malformed(format!(
            "unconfirmed units from a node id of {} bytes; expected 1 to {MAX_WIRE_NODE_ID_BYTES}",
            from.len()
        )));
    }
    if message.units.len() > MAX_WIRE_UNCONFIRMED {
        return Err(malformed(format!(
            "{} unconfirmed entries in one message; the maximum is {MAX_WIRE_UNCONFIRMED}",
            message.units.len()
        )));
    }
    let mut units = Vec::with_capacity(message.units.len());
    for entry in message.units.iter() {
        let region =
            RegionName::new(entry.region.as_str()).map_err(|e| malformed(e.to_string()))?;
        let count = entry.units.to_native();
        if count == 0 {
            return Err(malformed("an unconfirmed entry of 0 units".to_owned()));
        }
        units.push(UnconfirmedUnits {
            key: BucketKey::from_u128(entry.key.to_native()),
            region,
            units: count,
        });
    }
    Ok(RegionUnconfirmed {
        from: from.to_owned(),
        units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameKind, FrameReader, encode_message};

    fn round_trip(message: &RegionUnconfirmedMessage) -> Result<RegionUnconfirmed, Refusal> {
        let mut frame = Vec::new();
        encode_message(&mut frame, FrameKind::RegionUnconfirmed, 0, message);
        let mut reader = FrameReader::new(1 << 20);
        reader.extend(&frame);
        let frame = reader.next_frame().unwrap().unwrap();
        decode_region_unconfirmed(&frame.payload)
    }

    #[test]
    fn units_go_and_come_back_and_bad_ones_are_refused() {
        let units = UnconfirmedUnits {
            key: BucketKey::for_key(b"k"),
            region: RegionName::new("us").unwrap(),
            units: 7,
        };
        let message = RegionUnconfirmedMessage {
            from: "node-1".into(),
            units: vec![WireUnconfirmed::from(&units)],
        };
        assert_eq!(
            round_trip(&message).unwrap(),
            RegionUnconfirmed {
                from: "node-1".into(),
                units: vec![units],
            }
        );
        let mut zero = message.clone();
        zero.units[0].units = 0;
        assert!(round_trip(&zero).unwrap_err().1.contains("0 units"));
        let mut bad_region = message.clone();
        bad_region.units[0].region = "no spaces here".into();
        assert!(round_trip(&bad_region).is_err());
        let mut nobody = message.clone();
        nobody.from = String::new();
        assert!(
            round_trip(&nobody)
                .unwrap_err()
                .1
                .contains("node id of 0 bytes")
        );
        let mut many = message;
        many.units = vec![many.units[0].clone(); MAX_WIRE_UNCONFIRMED + 1];
        assert!(round_trip(&many).unwrap_err().1.contains("maximum"));
    }
}
