//! HPACK decoding (RFC 7541) of the header blocks callers send: the static and dynamic tables,
//! integers, and string literals plain or Huffman-coded. The node only decodes: what it sends
//! is encoded without the dynamic table (`frame`).
//!
//! Decoding is cheap where it matters: fields the caller indexed (Envoy's and gRPC clients'
//! steady state: the same method and content type on every call) are read from the tables
//! without a copy, and a Huffman-coded literal is decoded bit by bit against the canonical
//! code's per-length ranges, with no table built per string. Encoders that follow nghttp2 (h2,
//! Envoy's) never index `:path`, so each call carries the same Huffman-coded path: the last such
//! literal's decoding is kept and reused while the coded bytes are the same.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::LazyLock;

/// Why a header block cannot be decoded: the connection's table is then out of step with the
/// caller's, and the connection must end (COMPRESSION_ERROR).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Error {
    #[error("the block ends inside a field")]
    Truncated,
    #[error("an integer past 2^28")]
    Overflow,
    #[error("index {0} is in neither table")]
    BadIndex(usize),
    #[error("a Huffman-coded string that is not the code's")]
    BadHuffman,
    #[error("a table size update to {0} bytes, over the {1} allowed")]
    TableTooLarge(usize, usize),
    #[error("a table size update after the block's first field")]
    LateSizeUpdate,
}

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// A field's bytes each way: how the dynamic table counts an entry (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// One connection's decoder: its dynamic table follows the caller's encoder.
#[derive(Debug)]
pub(super) struct Decoder {
    /// Newest first: index 62 is the front.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// What the node's SETTINGS allow the caller to make `max_size`.
    allowed: usize,
    last_huffman: LastHuffman,
}

/// The last Huffman-coded literal value decoded, coded and decoded, both within
/// [`LastHuffman::MOST`] bytes coded (so a connection holds at most about a kilobyte for it).
/// The same coded bytes always decode the same, so a hit is the decoding itself.
#[derive(Debug, Default)]
struct LastHuffman {
    coded: Vec<u8>,
    decoded: Vec<u8>,
}

impl LastHuffman {
    /// Longest coded literal kept: a gRPC path is under a hundred bytes.
    const MOST: usize = 256;

    /// The literal value at `block[*at]`, decoded: from the last one when its coded bytes are
    /// the same; a short Huffman-coded one decoded is kept in its place.
    fn value<'a>(&'a mut self, block: &'a [u8], at: &mut usize) -> Result<Cow<'a, [u8]>, Error> {
        let (huffman, coded) = literal(block, at)?;
        if !huffman {
            return Ok(Cow::Borrowed(coded));
        }
        if coded.len() > Self::MOST {
            return huffman_decode(coded).map(Cow::Owned);
        }
        if coded != self.coded.as_slice() {
            // Decoded into the kept buffer (its capacity reused): an error leaves it empty,
            // so no bad string is ever taken for a good one.
            self.coded.clear();
            huffman_decode_into(coded, &mut self.decoded)?;
            self.coded.extend_from_slice(coded);
        }
        Ok(Cow::Borrowed(&self.decoded))
    }
}

impl Decoder {
    pub(super) fn new(allowed: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: allowed,
            allowed,
            last_huffman: LastHuffman::default(),
        }
    }

    /// Decodes a whole block, handing each field to `field` in order.
    pub(super) fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), Error> {
        let mut at = 0;
        let mut fields = 0usize;
        while let Some(&first) = block.get(at) {
            if first & 0x80 != 0 {
                let index = integer(block, &mut at, 7)?;
                let (name, value) = entry(&self.table, index)?;
                field(name, value);
            } else if first & 0xe0 == 0x20 {
                if fields > 0 {
                    return Err(Error::LateSizeUpdate);
                }
                let size = integer(block, &mut at, 5)?;
                if size > self.allowed {
                    return Err(Error::TableTooLarge(size, self.allowed));
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // 01: indexed hereafter; 0000 and 0001: not indexed (never, for 0001).
                let indexing = first & 0xc0 == 0x40;
                let index = integer(block, &mut at, if indexing { 6 } else { 4 })?;
                let name = if index == 0 {
                    string(block, &mut at)?
                } else {
                    Cow::Borrowed(entry(&self.table, index)?.0)
                };
                let value = self.last_huffman.value(block, &mut at)?;
                field(&name, &value);
                if indexing {
                    let entry = (Box::from(&name[..]), Box::from(&value[..]));
                    self.insert(entry);
                }
            }
            fields += 1;
        }
        Ok(())
    }

    fn insert(&mut self, entry: Entry) {
        let size = entry.0.len() + entry.1.len() + ENTRY_OVERHEAD;
        // An entry larger than the table empties it and is not kept (RFC 7541 §4.4).
        if size > self.max_size {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.size += size;
        self.table.push_front(entry);
    }

    /// Drops the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some((name, value)) = self.table.pop_back() else {
                break;
            };
            self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
    }
}

/// The field at `index` of the static table or of `table`, the dynamic one (newest first).
fn entry(table: &VecDeque<Entry>, index: usize) -> Result<(&[u8], &[u8]), Error> {
    match index {
        0 => Err(Error::BadIndex(0)),
        1..=61 => Ok(STATIC_TABLE[index - 1]),
        _ => table
            .get(index - 62)
            .map(|(name, value)| (&name[..], &value[..]))
            .ok_or(Error::BadIndex(index)),
    }
}

/// An integer with a `prefix`-bit prefix at `block[*at]` (RFC 7541 §5.1).
fn integer(block: &[u8], at: &mut usize, prefix: u8) -> Result<usize, Error> {
    let most = (1usize << prefix) - 1;
    let mut value = usize::from(*block.get(*at).ok_or(Error::Truncated)?) & most;
    *at += 1;
    if value < most {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(*at).ok_or(Error::Truncated)?;
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        if shift > 21 {
            return Err(Error::Overflow);
        }
    }
}

/// A string literal at `block[*at]` (RFC 7541 §5.2): borrowed when plain, decoded when
/// Huffman-coded.
fn string<'a>(block: &'a [u8], at: &mut usize) -> Result<Cow<'a, [u8]>, Error> {
    let (huffman, raw) = literal(block, at)?;
    if huffman {
        Ok(Cow::Owned(huffman_decode(raw)?))
    } else {
        Ok(Cow::Borrowed(raw))
    }
}

/// A string literal's bytes as sent at `block[*at]`, and whether they are Huffman-coded.
fn literal<'a>(block: &'a [u8], at: &mut usize) -> Result<(bool, &'a [u8]), Error> {
    let huffman = block.get(*at).ok_or(Error::Truncated)? & 0x80 != 0;
    let length = integer(block, at, 7)?;
    let end = at
        .checked_add(length)
        .filter(|&end| end <= block.len())
        .ok_or(Error::Truncated)?;
    let raw = &block[*at..end];
    *at = end;
    Ok((huffman, raw))
}

/// The canonical Huffman code's ranges per length: codes of one length are consecutive, so a
/// code read so far is a symbol when it falls in its length's range.
struct Canonical {
    /// The first code of each length (bits 0 to 30).
    first: [u32; 31],
    count: [u32; 31],
    /// Where each length's symbols start in `symbols`.
    start: [u16; 31],
    /// Symbols by length, then code.
    symbols: [u16; 257],
}

static CANONICAL: LazyLock<Canonical> = LazyLock::new(|| {
    let mut by_code: Vec<(u8, u32, u16)> = HUFFMAN_CODE_TABLE
        .iter()
        .enumerate()
        .map(|(symbol, &(code, length))| (length, code, symbol as u16))
        .collect();
    by_code.sort_unstable();
    let mut canonical = Canonical {
        first: [0; 31],
        count: [0; 31],
        start: [0; 31],
        symbols: [0; 257],
    };
    for (i, &(length, code, symbol)) in by_code.iter().enumerate() {
        let length = usize::from(length);
        if canonical.count[length] == 0 {
            canonical.first[length] = code;
            canonical.start[length] = i as u16;
        }
        canonical.count[length] += 1;
        canonical.symbols[i] = symbol;
    }
    canonical
});

/// The end-of-string symbol: never valid inside a string.
const EOS: u16 = 256;

/// A Huffman-coded string decoded (RFC 7541 §5.2 and Appendix B).
fn huffman_decode(coded: &[u8]) -> Result<Vec<u8>, Error> {
    let mut decoded = Vec::new();
    huffman_decode_into(coded, &mut decoded)?;
    Ok(decoded)
}

/// [`huffman_decode`] into `decoded` (cleared first; left empty on an error).
fn huffman_decode_into(coded: &[u8], decoded: &mut Vec<u8>) -> Result<(), Error> {
    decoded.clear();
    // At least 5 bits a symbol.
    decoded.reserve(coded.len() * 8 / 5);
    let result = huffman_symbols(coded, decoded);
    if result.is_err() {
        decoded.clear();
    }
    result
}

/// The symbols of `coded` pushed onto `decoded`, then its padding checked.
fn huffman_symbols(coded: &[u8], decoded: &mut Vec<u8>) -> Result<(), Error> {
    let canonical = &*CANONICAL;
    let (mut code, mut length) = (0u32, 0usize);
    for &byte in coded {
        for bit in (0..8).rev() {
            code = code << 1 | u32::from(byte >> bit & 1);
            length += 1;
            if length > 30 {
                return Err(Error::BadHuffman);
            }
            let offset = code.wrapping_sub(canonical.first[length]);
            if offset < canonical.count[length] {
                let symbol =
                    canonical.symbols[usize::from(canonical.start[length]) + offset as usize];
                if symbol == EOS {
                    return Err(Error::BadHuffman);
                }
                decoded.push(symbol as u8);
                (code, length) = (0, 0);
            }
        }
    }
    // What is left must be padding: fewer than 8 bits, all ones (the EOS code's start).
    if length > 7 || code != (1 << length) - 1 {
        return Err(Error::BadHuffman);
    }
    Ok(())
}

/// RFC 7541 Appendix A.
static STATIC_TABLE: &[(&[u8], &[u8])] = &[
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// RFC 7541 Appendix B: each symbol's code and its length in bits (256 is EOS).
static HUFFMAN_CODE_TABLE: &[(u32, u8)] = &[
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Huffman-codes `text` as RFC 7541 §5.2 says, padded with ones.
    fn huffman_encode(text: &[u8]) -> Vec<u8> {
        let (mut bits, mut held, mut out) = (0u64, 0u32, Vec::new());
        for &byte in text {
            let (code, length) = HUFFMAN_CODE_TABLE[usize::from(byte)];
            bits = bits << length | u64::from(code);
            held += u32::from(length);
            while held >= 8 {
                held -= 8;
                out.push((bits >> held) as u8);
            }
        }
        if held > 0 {
            out.push((bits << (8 - held)) as u8 | (0xff >> held));
        }
        out
    }

    #[test]
    fn every_symbol_decodes_alone_and_in_a_string() {
        for byte in 0..=255u8 {
            assert_eq!(huffman_decode(&huffman_encode(&[byte])).unwrap(), [byte]);
        }
        let all: Vec<u8> = (0..=255u8).rev().chain(0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        // RFC 7541 C.4.1's "www.example.com".
        let coded = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        assert_eq!(huffman_decode(&coded).unwrap(), b"www.example.com");
    }

    #[test]
    fn bad_huffman_padding_and_eos_are_refused() {
        // Padding of zeros, padding of 8 bits, and the EOS code itself.
        assert_eq!(huffman_decode(&[0x00]), Err(Error::BadHuffman));
        let mut long_pad = huffman_encode(b"a");
        long_pad.push(0xff);
        assert_eq!(huffman_decode(&long_pad), Err(Error::BadHuffman));
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xff]),
            Err(Error::BadHuffman)
        );
    }

    #[test]
    fn the_rfcs_request_examples_decode_with_their_table() {
        // RFC 7541 C.4.1 to C.4.3: three requests, Huffman-coded, sharing a dynamic table.
        let blocks: [&[u8]; 3] = [
            &[
                0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
                0x90, 0xf4, 0xff,
            ],
            &[
                0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
            ],
            &[
                0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
                0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
            ],
        ];
        let mut decoder = Decoder::new(4_096);
        let mut fields = Vec::new();
        for block in blocks {
            let mut these = Vec::new();
            decoder
                .decode(block, |n, v| {
                    these.push(format!(
                        "{}: {}",
                        String::from_utf8_lossy(n),
                        String::from_utf8_lossy(v)
                    ))
                })
                .unwrap();
            fields.push(these.join(", "));
        }
        assert_eq!(
            fields,
            [
                ":method: GET, :scheme: http, :path: /, :authority: www.example.com",
                ":method: GET, :scheme: http, :path: /, :authority: www.example.com, cache-control: no-cache",
                ":method: GET, :scheme: https, :path: /index.html, :authority: www.example.com, custom-key: custom-value",
            ]
        );
        assert_eq!(decoder.size, 164, "the RFC's table size after C.4.3");
    }

    /// A literal field with an indexed name (`:path`, static index 4), never indexed, its value
    /// Huffman-coded, as h2 and Envoy send each call's path.
    fn path_block(coded: &[u8]) -> Vec<u8> {
        let mut block = vec![0x04, 0x80 | coded.len() as u8];
        block.extend_from_slice(coded);
        block
    }

    fn path_of(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<u8>, Error> {
        let mut path = Vec::new();
        decoder.decode(block, |_, value| path = value.to_vec())?;
        Ok(path)
    }

    #[test]
    fn a_repeated_huffman_literal_decodes_the_same_and_a_bad_one_is_still_refused() {
        let mut decoder = Decoder::new(4_096);
        let rls = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
        let other = b"/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit";
        let (rls_block, other_block) = (
            path_block(&huffman_encode(rls)),
            path_block(&huffman_encode(other)),
        );
        for block in [&rls_block, &rls_block, &other_block, &rls_block] {
            let expected: &[u8] = if block == &other_block { other } else { rls };
            assert_eq!(path_of(&mut decoder, block).unwrap(), expected);
        }
        // A bad string after a good one, then the same bad string again: refused both times, and
        // the good one still decodes after.
        let mut bad = huffman_encode(rls);
        bad.push(0x00);
        for _ in 0..2 {
            assert_eq!(
                path_of(&mut decoder, &path_block(&bad)),
                Err(Error::BadHuffman)
            );
        }
        assert_eq!(path_of(&mut decoder, &rls_block).unwrap(), rls);
        // An empty Huffman-coded string after a refused one is the empty string.
        assert_eq!(
            path_of(&mut decoder, &path_block(&bad)),
            Err(Error::BadHuffman)
        );
        assert_eq!(path_of(&mut decoder, &path_block(&[])).unwrap(), b"");
        // One longer than what is kept (500 symbols of 5 bits: 313 bytes coded) decodes all the
        // same, and is not kept: the empty string before it still is.
        let long = vec![b'a'; 500];
        let mut block = vec![0x04, 0x80 | 0x7f];
        let coded = huffman_encode(&long);
        block.push((coded.len() - 0x7f) as u8 & 0x7f | 0x80);
        block.push(((coded.len() - 0x7f) >> 7) as u8);
        block.extend_from_slice(&coded);
        assert!(coded.len() > LastHuffman::MOST);
        assert_eq!(path_of(&mut decoder, &block).unwrap(), long);
        assert!(decoder.last_huffman.coded.is_empty() && decoder.last_huffman.decoded.is_empty());
    }

    #[test]
    fn bad_blocks_are_refused_and_the_table_stays_bounded() {
        let mut decoder = Decoder::new(100);
        assert_eq!(decoder.decode(&[0x80], |_, _| {}), Err(Error::BadIndex(0)));
        assert_eq!(decoder.decode(&[0xbe], |_, _| {}), Err(Error::BadIndex(62)));
        assert_eq!(
            decoder.decode(&[0x40, 0x05, b'a'], |_, _| {}),
            Err(Error::Truncated)
        );
        assert_eq!(
            decoder.decode(&[0xff, 0xff, 0xff, 0xff, 0xff], |_, _| {}),
            Err(Error::Overflow)
        );
        assert_eq!(
            decoder.decode(&[0x3f, 0xe1, 0x1f], |_, _| {}),
            Err(Error::TableTooLarge(4_096, 100))
        );
        assert_eq!(
            decoder.decode(&[0x82, 0x20], |_, _| {}),
            Err(Error::LateSizeUpdate)
        );
        // Entries past the table's size push the oldest out; one larger than it empties it.
        for value in [&b"0123456789"[..], b"abcdefghij", b"ABCDEFGHIJ"] {
            let mut block = vec![0x40, 0x01, b'k', value.len() as u8];
            block.extend_from_slice(value);
            decoder.decode(&block, |_, _| {}).unwrap();
            assert!(decoder.size <= 100);
        }
        assert_eq!(decoder.table.len(), 2);
        let mut block = vec![0x40, 0x01, b'k', 80];
        block.extend_from_slice(&[b'x'; 80]);
        decoder.decode(&block, |_, _| {}).unwrap();
        assert_eq!((decoder.table.len(), decoder.size), (0, 0));
    }
}
