//! Just enough JSON writing for problem details: strings escaped per RFC 8259 §7.

/// Appends `value` as a JSON string, quotes included. Escapes `"`, `\` and every control
/// character (U+0000 to U+001F); U+2028 and U+2029 too, so the text is also safe inside
/// JavaScript. Everything else is written as is (the output is UTF-8).
pub fn push_string(out: &mut String, value: &str) {
    out.push('"');
    for ch in value.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `value` as a JSON string, quotes included.
pub fn string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    push_string(&mut out, value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_quotes_backslashes_and_control_characters() {
        assert_eq!(string("plain"), r#""plain""#);
        assert_eq!(string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(string("l1\nl2\r\t"), r#""l1\nl2\r\t""#);
        assert_eq!(string("\u{0}\u{1f}\u{8}\u{c}"), r#""\u0000\u001f\b\f""#);
        assert_eq!(string("é ✓ \u{2028}"), "\"é ✓ \\u2028\"");
        assert_eq!(string("\u{7f}"), "\"\u{7f}\"");
    }
}
