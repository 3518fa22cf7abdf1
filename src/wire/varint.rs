//! Unsigned LEB128 integers: 7 bits a byte, low bits first, the high bit set on every byte but
//! the last. For values that are nearly always small (a region delta's units, and how long
//! before its message's newest admission it was admitted): a `u64` in 1 to 10 bytes, most in 1
//! to 4. Each value has one encoding: a longer one (a trailing zero byte) is refused.

/// Most bytes one value takes.
pub(crate) const MAX_BYTES: usize = 10;

/// Appends `value`.
pub(crate) fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // Truncation intended: the low 7 bits, the high bit says more follow.
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The value at the front of `bytes` and what follows it; `None` when `bytes` ends inside it,
/// it is longer than its shortest encoding, or it does not fit a `u64`.
pub(crate) fn take(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(MAX_BYTES) {
        let last = byte & 0x80 == 0;
        // The tenth byte holds bit 63 alone; a zero last byte after others adds nothing.
        if (i == MAX_BYTES - 1 && byte > 1) || (last && byte == 0 && i > 0) {
            return None;
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if last {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put(&mut out, value);
        out
    }

    #[test]
    fn values_read_back_at_every_length() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut values = vec![0, 1, 127, 128, 16_383, 16_384, u64::MAX - 1, u64::MAX];
        values.extend((0..64).map(|bit| 1u64 << bit));
        values.extend((0..64).map(|bit| (1u64 << bit) - 1));
        for _ in 0..2_000 {
            // xorshift: spread over every length.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            values.push(state >> (state % 64));
        }
        for value in values {
            let mut bytes = encoded(value);
            let length = bytes.len();
            assert_eq!(
                length,
                (64 - value.leading_zeros() as usize).div_ceil(7).max(1)
            );
            bytes.push(0xAB);
            assert_eq!(take(&bytes), Some((value, &[0xAB][..])), "{value}");
            // Cut anywhere inside, it is incomplete.
            for cut in 0..length {
                assert_eq!(take(&bytes[..cut]), None, "{value} cut at {cut}");
            }
        }
    }

    #[test]
    fn longer_encodings_and_values_past_64_bits_are_refused() {
        // 0 and 1 padded with a zero byte.
        assert_eq!(take(&[0x80, 0x00]), None);
        assert_eq!(take(&[0x81, 0x80, 0x00]), None);
        // u64::MAX is nine 0xff and a 1; a 2 there would be bit 64.
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(take(&max), Some((u64::MAX, &[][..])));
        max[9] = 0x02;
        assert_eq!(take(&max), None);
        // Eleven bytes never end a value.
        assert_eq!(take(&[0xff; 11]), None);
        assert_eq!(take(&[]), None);
    }
}
