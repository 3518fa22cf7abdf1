//! The core's reader of `RateLimitRequest` (`floodgate::rls::read_request`) held to prost's
//! decoding of Envoy's own generated types, which only the node has: the same requests
//! read, the same messages refused, and what reading allocates.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

use crate::alloc_counter::allocations_during;
use crate::seeded::Seeded;
use floodgate::rls::{DescriptorRequest, MAX_ENTRIES, Unread, read_request};

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
