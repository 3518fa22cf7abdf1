//! Envoy's `RateLimitRequest` read in place: the domain and each entry's key and value are
//! borrowed from the message, where the generated type allocates a string for each of them
//! and a vector for each list (five allocations for a descriptor of one entry).
//!
//! It reads what prost reads and refuses what prost refuses (a test holds the two together):
//! the fields below, unknown fields skipped by their wire type (groups too, nested at most
//! [`DEPTH`] deep, as prost's recursion limit), the last value of a scalar field sent twice,
//! a message field sent twice merged, strings checked to be UTF-8. On top of that, what no Envoy sends is refused
//! here with the words the caller sees: an empty domain, no descriptors or more than the node
//! decides in one batch, a descriptor without entries or with more than [`MAX_ENTRIES`]. Past
//! those bounds descriptors and entries are only counted, so what a request makes the node
//! hold stays in proportion to what it may ask.
//!
//! The fields read (envoy.service.ratelimit.v3 and envoy.extensions.common.ratelimit.v3):
//! `RateLimitRequest { domain = 1; repeated RateLimitDescriptor descriptors = 2;
//! uint32 hits_addend = 3 }`, `RateLimitDescriptor { repeated Entry entries = 1;
//! RateLimitOverride limit = 2; google.protobuf.UInt64Value hits_addend = 3;
//! bool is_negative_hits = 4 }`, `Entry { key = 1; value = 2 }`,
//! `RateLimitOverride { uint32 requests_per_unit = 1; RateLimitUnit unit = 2 }`,
//! `UInt64Value { uint64 value = 1 }`.

use floodgate::rls::DescriptorRequest;

/// Most entries in one descriptor; Envoy's actions make a handful.
pub(crate) const MAX_ENTRIES: usize = 64;

/// How deep messages and groups may nest, as prost's default recursion limit.
const DEPTH: u32 = 100;

/// A request as read: the domain and the descriptors borrow from the message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestView<'a> {
    pub(crate) domain: &'a str,
    pub(crate) descriptors: Vec<DescriptorRequest<'a>>,
    pub(crate) hits_addend: u32,
}

/// Why a request was not read: the message is not a `RateLimitRequest` (`Malformed`, as prost
/// would have said), or asks for what the node does not serve (`Refused`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unread {
    Malformed(&'static str),
    Refused(String),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::Malformed(why) => write!(f, "not a RateLimitRequest: {why}"),
            Unread::Refused(why) => f.write_str(why),
        }
    }
}

/// Reads `message` (one `RateLimitRequest`, without its gRPC prefix); at most
/// `max_descriptors` descriptors are accepted.
pub(crate) fn read_request(
    message: &[u8],
    max_descriptors: usize,
) -> Result<RequestView<'_>, Unread> {
    let mut request = RequestView {
        domain: "",
        descriptors: Vec::new(),
        hits_addend: 0,
    };
    // Descriptors seen, and the entries of the first with too few or too many.
    let mut seen = 0usize;
    let mut bad_entries: Option<usize> = None;
    let mut input = Input(message);
    while let Some((field, wire)) = input.key()? {
        match (field, wire) {
            (1, LEN) => request.domain = utf8(input.bytes()?)?,
            (2, LEN) => {
                let body = input.bytes()?;
                let mut descriptor = DescriptorRequest::default();
                let keep = seen < max_descriptors;
                let entries = read_descriptor(body, &mut descriptor, keep)?;
                if !(1..=MAX_ENTRIES).contains(&entries) && bad_entries.is_none() {
                    bad_entries = Some(entries);
                }
                if keep {
                    request.descriptors.push(descriptor);
                }
                seen += 1;
            }
            (3, VARINT) => request.hits_addend = input.varint()? as u32,
            (1..=3, _) => return Err(Unread::Malformed(WRONG_WIRE_TYPE)),
            _ => input.skip(field, wire, DEPTH)?,
        }
    }
    if request.domain.is_empty() {
        return Err(Unread::Refused(
            "rate limit domain must not be empty".to_owned(),
        ));
    }
    if seen == 0 {
        return Err(Unread::Refused(
            "rate limit descriptor list must not be empty".to_owned(),
        ));
    }
    if seen > max_descriptors {
        return Err(Unread::Refused(format!(
            "{seen} descriptors; the most in one request is {max_descriptors}"
        )));
    }
    if let Some(entries) = bad_entries {
        return Err(Unread::Refused(format!(
            "a descriptor has {entries} entries; expected 1 to {MAX_ENTRIES}"
        )));
    }
    Ok(request)
}

/// Reads one `RateLimitDescriptor` into `descriptor` (its entries only while `keep` and at
/// most [`MAX_ENTRIES`]); returns how many entries it has.
fn read_descriptor<'a>(
    body: &'a [u8],
    descriptor: &mut DescriptorRequest<'a>,
    keep: bool,
) -> Result<usize, Unread> {
    let depth = DEPTH - 1;
    let mut entries = 0;
    let mut input = Input(body);
    while let Some((field, wire)) = input.key()? {
        match (field, wire) {
            (1, LEN) => {
                let entry = read_entry(input.bytes()?, depth - 1)?;
                if keep && entries < MAX_ENTRIES {
                    descriptor.entries.push(entry);
                }
                entries += 1;
            }
            (2, LEN) => {
                // A message field seen twice is merged: each of its fields, the last seen.
                let (mut requests, mut unit) = descriptor.limit_override.unwrap_or((0, 0));
                let mut limit = Input(input.bytes()?);
                while let Some((field, wire)) = limit.key()? {
                    match (field, wire) {
                        (1, VARINT) => requests = limit.varint()? as u32,
                        (2, VARINT) => unit = limit.varint()? as i32,
                        (1..=2, _) => return Err(Unread::Malformed(WRONG_WIRE_TYPE)),
                        _ => limit.skip(field, wire, depth - 1)?,
                    }
                }
                descriptor.limit_override = Some((requests, unit));
            }
            (3, LEN) => {
                let mut value = descriptor.hits_addend.unwrap_or(0);
                let mut wrapper = Input(input.bytes()?);
                while let Some((field, wire)) = wrapper.key()? {
                    match (field, wire) {
                        (1, VARINT) => value = wrapper.varint()?,
                        (1, _) => return Err(Unread::Malformed(WRONG_WIRE_TYPE)),
                        _ => wrapper.skip(field, wire, depth - 1)?,
                    }
                }
                descriptor.hits_addend = Some(value);
            }
            (4, VARINT) => descriptor.negative_hits = input.varint()? != 0,
            (1..=4, _) => return Err(Unread::Malformed(WRONG_WIRE_TYPE)),
            _ => input.skip(field, wire, depth)?,
        }
    }
    Ok(entries)
}

/// One `Entry`: its key and value.
fn read_entry(body: &[u8], depth: u32) -> Result<(&str, &str), Unread> {
    let (mut key, mut value) = ("", "");
    let mut input = Input(body);
    while let Some((field, wire)) = input.key()? {
        match (field, wire) {
            (1, LEN) => key = utf8(input.bytes()?)?,
            (2, LEN) => value = utf8(input.bytes()?)?,
            (1..=2, _) => return Err(Unread::Malformed(WRONG_WIRE_TYPE)),
            _ => input.skip(field, wire, depth)?,
        }
    }
    Ok((key, value))
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

const WRONG_WIRE_TYPE: &str = "a field of the wrong wire type";
const CUT_SHORT: &str = "the message ends inside a field";

fn utf8(bytes: &[u8]) -> Result<&str, Unread> {
    std::str::from_utf8(bytes).map_err(|_| Unread::Malformed("a string that is not UTF-8"))
}

/// What is left of a message to read.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    /// The next field's number and wire type; `None` at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>, Unread> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| Unread::Malformed("a field key over 32 bits"))?;
        let wire = (key & 7) as u8;
        if wire > FIXED32 {
            return Err(Unread::Malformed("an unknown wire type"));
        }
        let field = key >> 3;
        if field == 0 {
            return Err(Unread::Malformed("a field numbered 0"));
        }
        Ok(Some((field, wire)))
    }

    /// A base-128 varint of at most 10 bytes, the tenth holding only the top bit.
    fn varint(&mut self) -> Result<u64, Unread> {
        let mut value = 0u64;
        for (i, &byte) in self.0.iter().enumerate().take(10) {
            if i == 9 && byte > 1 {
                break;
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                self.0 = &self.0[i + 1..];
                return Ok(value);
            }
        }
        if self.0.len() < 10 && self.0.iter().all(|b| b & 0x80 != 0) {
            return Err(Unread::Malformed(CUT_SHORT));
        }
        Err(Unread::Malformed("a varint over 64 bits"))
    }

    /// A length-delimited field's bytes.
    fn bytes(&mut self) -> Result<&'a [u8], Unread> {
        let length = self.varint()?;
        let length = usize::try_from(length)
            .ok()
            .filter(|&n| n <= self.0.len())
            .ok_or(Unread::Malformed(CUT_SHORT))?;
        let (bytes, rest) = self.0.split_at(length);
        self.0 = rest;
        Ok(bytes)
    }

    fn take(&mut self, n: usize) -> Result<(), Unread> {
        self.0 = self.0.get(n..).ok_or(Unread::Malformed(CUT_SHORT))?;
        Ok(())
    }

    /// Skips a field the reader does not know, a group down to its end. `depth` is how much
    /// deeper fields may still be: at 0 none is read, as prost counts.
    fn skip(&mut self, field: u32, wire: u8, depth: u32) -> Result<(), Unread> {
        if depth == 0 {
            return Err(Unread::Malformed("fields nested too deep"));
        }
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8),
            LEN => self.bytes().map(drop),
            FIXED32 => self.take(4),
            START_GROUP => loop {
                let Some((inner, inner_wire)) = self.key()? else {
                    return Err(Unread::Malformed(CUT_SHORT));
                };
                if inner_wire == END_GROUP {
                    return if inner == field {
                        Ok(())
                    } else {
                        Err(Unread::Malformed("a group ended under another number"))
                    };
                }
                self.skip(inner, inner_wire, depth - 1)?;
            },
            _ => Err(Unread::Malformed("a group's end without its start")),
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use prost::Message;

    use super::*;
    use crate::alloc_counter::allocations_during;
    use crate::seeded::Seeded;

    /// What prost makes of `message`, put as the reader puts it: the request's descriptors in
    /// the core's terms, or `Malformed` (its words aside) where prost refuses the bytes, or
    /// the refusal the node made of prost's request before it read requests itself.
    fn as_prost_reads(message: &[u8], max_descriptors: usize) -> Result<Owned, Unread> {
        let request = RateLimitRequest::decode(message).map_err(|_| Unread::Malformed("prost"))?;
        if request.domain.is_empty() {
            return Err(Unread::Refused(
                "rate limit domain must not be empty".to_owned(),
            ));
        }
        if request.descriptors.is_empty() {
            return Err(Unread::Refused(
                "rate limit descriptor list must not be empty".to_owned(),
            ));
        }
        if request.descriptors.len() > max_descriptors {
            return Err(Unread::Refused(format!(
                "{} descriptors; the most in one request is {max_descriptors}",
                request.descriptors.len()
            )));
        }
        if let Some(d) = request
            .descriptors
            .iter()
            .find(|d| !(1..=MAX_ENTRIES).contains(&d.entries.len()))
        {
            return Err(Unread::Refused(format!(
                "a descriptor has {} entries; expected 1 to {MAX_ENTRIES}",
                d.entries.len()
            )));
        }
        Ok(Owned {
            domain: request.domain,
            hits_addend: request.hits_addend,
            descriptors: request
                .descriptors
                .into_iter()
                .map(|d| OwnedDescriptor {
                    entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                    limit_override: d.limit.map(|l| (l.requests_per_unit, l.unit)),
                    hits_addend: d.hits_addend.map(|h| h.value),
                    negative_hits: d.is_negative_hits,
                })
                .collect(),
        })
    }

    #[derive(Debug, PartialEq)]
    struct Owned {
        domain: String,
        hits_addend: u32,
        descriptors: Vec<OwnedDescriptor>,
    }

    #[derive(Debug, PartialEq)]
    struct OwnedDescriptor {
        entries: Vec<(String, String)>,
        limit_override: Option<(u32, i32)>,
        hits_addend: Option<u64>,
        negative_hits: bool,
    }

    fn as_read(message: &[u8], max_descriptors: usize) -> Result<Owned, Unread> {
        let request = read_request(message, max_descriptors).map_err(|unread| match unread {
            Unread::Malformed(_) => Unread::Malformed("prost"),
            refused => refused,
        })?;
        Ok(Owned {
            domain: request.domain.to_owned(),
            hits_addend: request.hits_addend,
            descriptors: request
                .descriptors
                .into_iter()
                .map(|d| OwnedDescriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    limit_override: d.limit_override,
                    hits_addend: d.hits_addend,
                    negative_hits: d.negative_hits,
                })
                .collect(),
        })
    }

    fn envoy_request(descriptors: usize) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: (0..descriptors)
                .map(|i| RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "api_key".to_owned(),
                            value: format!("key-{i}"),
                        },
                        Entry {
                            key: "path".to_owned(),
                            value: "/v1/items".to_owned(),
                        },
                    ],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    #[test]
    fn a_request_as_envoy_sends_it_is_read_in_place() {
        let mut request = envoy_request(2);
        request.hits_addend = 3;
        request.descriptors[1].limit = Some(RateLimitOverride {
            requests_per_unit: 42,
            unit: 2,
        });
        request.descriptors[1].hits_addend = Some(pbuf_u64(7));
        request.descriptors[1].is_negative_hits = true;
        let message = request.encode_to_vec();
        let read = read_request(&message, 10).unwrap();
        assert_eq!(read.domain, "edge");
        assert_eq!(read.hits_addend, 3);
        assert_eq!(
            read.descriptors,
            vec![
                DescriptorRequest {
                    entries: vec![("api_key", "key-0"), ("path", "/v1/items")],
                    ..Default::default()
                },
                DescriptorRequest {
                    entries: vec![("api_key", "key-1"), ("path", "/v1/items")],
                    limit_override: Some((42, 2)),
                    hits_addend: Some(7),
                    negative_hits: true,
                },
            ]
        );
        // Borrowed, not copied.
        let range = message.as_ptr_range();
        assert!(range.contains(&read.domain.as_ptr()));
        assert!(range.contains(&read.descriptors[1].entries[0].1.as_ptr()));
    }

    fn pbuf_u64(value: u64) -> envoy_types::pb::google::protobuf::UInt64Value {
        envoy_types::pb::google::protobuf::UInt64Value { value }
    }

    #[test]
    fn reading_allocates_the_descriptor_list_and_one_entry_list_a_descriptor() {
        for count in [1, 3] {
            let message = envoy_request(count).encode_to_vec();
            let (read, allocations) = allocations_during(|| read_request(&message, 10).map(drop));
            assert!(read.is_ok());
            assert_eq!(allocations, 1 + count as u64, "{count} descriptors");
        }
    }

    #[test]
    fn what_no_envoy_sends_is_refused_in_words_and_counted_past_the_bounds() {
        let refused =
            |request: &RateLimitRequest, max| match read_request(&request.encode_to_vec(), max)
                .unwrap_err()
            {
                Unread::Refused(why) => why,
                other => panic!("{other:?}"),
            };
        let mut request = envoy_request(1);
        request.domain.clear();
        assert_eq!(refused(&request, 10), "rate limit domain must not be empty");
        assert_eq!(
            refused(&envoy_request(0), 10),
            "rate limit descriptor list must not be empty"
        );
        assert_eq!(
            refused(&envoy_request(25), 10),
            "25 descriptors; the most in one request is 10"
        );
        let mut request = envoy_request(3);
        request.descriptors[1].entries.clear();
        assert_eq!(
            refused(&request, 10),
            "a descriptor has 0 entries; expected 1 to 64"
        );
        request.descriptors[1].entries = (0..100)
            .map(|i| Entry {
                key: format!("k{i}"),
                value: String::new(),
            })
            .collect();
        assert_eq!(
            refused(&request, 10),
            "a descriptor has 100 entries; expected 1 to 64"
        );
    }

    #[test]
    fn malformed_messages_are_refused_as_prost_refuses_them() {
        let good = envoy_request(1).encode_to_vec();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("cut inside a field", good[..good.len() - 1].to_vec()),
            ("domain as a varint", [&[0x08, 0x01][..], &good].concat()),
            (
                "a string that is not UTF-8",
                [&good[..], &[0x0a, 0x01, 0xff]].concat(),
            ),
            ("wire type 6", [&good[..], &[0x0e]].concat()),
            ("field 0", [&good[..], &[0x02, 0x00]].concat()),
            ("an end group alone", [&good[..], &[0x2c]].concat()),
            (
                "a group ended under another number",
                [&good[..], &[0x2b, 0x34]].concat(),
            ),
            (
                "a group not ended",
                [&good[..], &[0x2b, 0x28, 0x01]].concat(),
            ),
            (
                "an 11-byte varint",
                [&good[..], &[0x28], &[0xff; 10], &[0x01]].concat(),
            ),
            (
                "a tenth byte over 1",
                [&good[..], &[0x28], &[0xff; 9], &[0x02]].concat(),
            ),
        ];
        for (what, message) in cases {
            assert!(
                matches!(read_request(&message, 10), Err(Unread::Malformed(_))),
                "{what}"
            );
            assert!(
                RateLimitRequest::decode(&message[..]).is_err(),
                "prost: {what}"
            );
        }
        // What prost skips, the reader skips: unknown fields of every wire type, a group with
        // fields in it, a ten-byte varint.
        let skipped = [
            &good[..],
            &[0x28],
            &[0xff; 9],
            &[0x01],
            &[0x31, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0x3a, 0x02, 0xff, 0xfe],
            &[0x45, 1, 2, 3, 4],
            &[0x4b, 0x08, 0x05, 0x12, 0x00, 0x4c],
        ]
        .concat();
        assert_eq!(as_read(&skipped, 10), as_prost_reads(&skipped, 10));
        assert!(as_read(&skipped, 10).is_ok());
    }

    /// Groups nested just within and just past the depth prost allows, at the top of the
    /// request and inside an entry.
    #[test]
    fn groups_nest_as_deep_as_prost_allows() {
        fn nested(depth: usize) -> Vec<u8> {
            // Field 9 as groups, `depth` deep, a varint at the bottom.
            [vec![0x4b; depth], vec![0x50, 0x01], vec![0x4c; depth]].concat()
        }
        let good = envoy_request(1).encode_to_vec();
        for depth in [97, 98, 99, 100, 101] {
            let top = [&good[..], &nested(depth)].concat();
            assert_eq!(
                as_read(&top, 10),
                as_prost_reads(&top, 10),
                "{depth} at the top"
            );
            let entry = [&[0x0a, 0x01, b'k'][..], &nested(depth)].concat();
            let descriptor = [&[0x0a, entry.len() as u8][..], &entry].concat();
            let inside = [
                &[0x0a, 0x01, b'd'][..],
                &[0x12, descriptor.len() as u8],
                &descriptor,
            ]
            .concat();
            assert_eq!(
                as_read(&inside, 10),
                as_prost_reads(&inside, 10),
                "{depth} in an entry"
            );
        }
    }

    fn put_varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push(value as u8 | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    /// Messages for the comparison with prost, from a seed.
    struct Messages(Seeded);

    impl Messages {
        fn below(&mut self, n: u64) -> u64 {
            self.0.below(n)
        }

        fn next(&mut self) -> u64 {
            self.0.next()
        }

        /// A message of `fields` fields: mostly what the reader knows at this `level` (0 the
        /// request, 1 a descriptor, 2 an entry, 4 a limit or a wrapper; 3 a group's), sometimes
        /// of another wire type, unknown, or not UTF-8.
        fn message(&mut self, level: u32, fields: u64) -> Vec<u8> {
            let mut out = Vec::new();
            // Most requests carry a domain and a descriptor, most descriptors an entry, so
            // that many are read through.
            if self.below(4) != 0 {
                match level {
                    0 => {
                        out.extend_from_slice(b"\x0a\x01d");
                        let fields = self.below(3);
                        let descriptor = self.message(1, fields);
                        put_varint(&mut out, 2 << 3 | 2);
                        put_varint(&mut out, descriptor.len() as u64);
                        out.extend_from_slice(&descriptor);
                    }
                    1 => out.extend_from_slice(b"\x0a\x06\x0a\x01k\x12\x01v"),
                    _ => {}
                }
            }
            for _ in 0..fields {
                let field = self.below(6) + 1;
                // Level 2 is an entry, 4 a limit or a wrapper (varints inside).
                let nested = match (level, field) {
                    (0, 2) => Some(1),
                    (1, 1) => Some(2),
                    (1, 2..=3) => Some(4),
                    _ => None,
                };
                let expected = match (level, field) {
                    (0, 3) | (1, 4) | (4, 1..=2) => 0,
                    (0, 1..=2) | (1, 1..=3) | (2, 1..=2) => 2,
                    _ => [0, 1, 2, 5][self.below(4) as usize],
                };
                let wire = match self.below(40) {
                    0 => self.below(6),
                    _ => expected,
                };
                put_varint(&mut out, (field << 3) | wire);
                match wire {
                    0 => {
                        let value = match self.below(4) {
                            0 => u64::MAX - self.below(3),
                            1 => self.below(1 << 40),
                            _ => self.below(200),
                        };
                        put_varint(&mut out, value);
                    }
                    1 => out.extend_from_slice(&self.next().to_le_bytes()),
                    2 => {
                        let body = match nested {
                            Some(inner) => {
                                let fields = self.below(5);
                                self.message(inner, fields)
                            }
                            _ => {
                                let length = self.below(12) as usize;
                                let mut text: Vec<u8> =
                                    (0..length).map(|_| b'a' + self.below(26) as u8).collect();
                                if self.below(20) == 0 && !text.is_empty() {
                                    text[0] = 0xc0;
                                }
                                text
                            }
                        };
                        put_varint(&mut out, body.len() as u64);
                        out.extend_from_slice(&body);
                    }
                    3 => {
                        let inner = self.below(3);
                        out.extend_from_slice(&self.message(3, inner));
                        put_varint(&mut out, (field << 3) | 4);
                    }
                    5 => out.extend_from_slice(&(self.next() as u32).to_le_bytes()),
                    _ => {}
                }
            }
            out
        }
    }

    /// Seeded messages, whole and then cut, with a byte changed, or with bytes put in: the
    /// reader and prost agree on every one (the same request, or both refuse it).
    #[test]
    fn the_reader_reads_what_prost_reads_and_refuses_what_it_refuses() {
        let mut seeded = Messages(Seeded(0x5eed));
        let (mut read, mut refused, mut malformed) = (0, 0, 0);
        for case in 0..20_000 {
            let fields = seeded.below(8);
            let mut message = seeded.message(0, fields);
            match seeded.below(4) {
                1 if !message.is_empty() => {
                    let cut = seeded.below(message.len() as u64) as usize;
                    message.truncate(cut);
                }
                2 if !message.is_empty() => {
                    let at = seeded.below(message.len() as u64) as usize;
                    message[at] = seeded.next() as u8;
                }
                3 => {
                    let at = seeded.below(message.len() as u64 + 1) as usize;
                    let put: Vec<u8> = (0..seeded.below(4)).map(|_| seeded.next() as u8).collect();
                    message.splice(at..at, put);
                }
                _ => {}
            }
            let max = seeded.below(4) as usize + 1;
            let ours = as_read(&message, max);
            assert_eq!(
                ours,
                as_prost_reads(&message, max),
                "case {case}: {message:02x?}"
            );
            match ours {
                Ok(_) => read += 1,
                Err(Unread::Refused(_)) => refused += 1,
                Err(Unread::Malformed(_)) => malformed += 1,
            }
        }
        // Every outcome was exercised, many times each.
        assert!(
            read > 2_000 && refused > 2_000 && malformed > 2_000,
            "{read} read, {refused} refused, {malformed} malformed"
        );
    }
}
