//! Envoy's `RateLimitRequest` read in place: the domain and each entry's key and value are
//! borrowed from the message, where the generated type allocates a string for each of them
//! and a vector for each list (five allocations for a descriptor of one entry).
//!
//! It reads what prost reads and refuses what prost refuses (a test in the node, where Envoy's generated types are, holds the two together):
//! the fields below, unknown fields skipped by their wire type (groups too, nested at most
//! 100 deep, as prost's recursion limit), the last value of a scalar field sent twice,
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

use super::plan::DescriptorRequest;

/// Most entries in one descriptor; Envoy's actions make a handful.
pub const MAX_ENTRIES: usize = 64;

/// How deep messages and groups may nest, as prost's default recursion limit.
const DEPTH: u32 = 100;

/// A request as read: the domain and the descriptors borrow from the message.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestView<'a> {
    pub domain: &'a str,
    pub descriptors: Vec<DescriptorRequest<'a>>,
    pub hits_addend: u32,
}

/// Why a request was not read: the message is not a `RateLimitRequest` (`Malformed`, as prost
/// would have said), or asks for what the node does not serve (`Refused`).
#[derive(Debug, PartialEq, Eq)]
pub enum Unread {
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
pub fn read_request(message: &[u8], max_descriptors: usize) -> Result<RequestView<'_>, Unread> {
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
