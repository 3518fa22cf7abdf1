//! HTTP methods in a rules file: the standard methods, or an extension method spelled out as
//! `ext:NAME`, so a typo such as `PSOT` is an error rather than a rule that never matches.
//!
//! Case: a standard method may be written in any case (`post` is `POST`). Rules match request
//! methods ignoring case too, so a client cannot slip past a `POST` rule by sending `post`
//! (servers behind the gateway often treat methods case-insensitively).

/// The methods of RFC 9110 §9 and RFC 5789 (`PATCH`).
pub const STANDARD_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// The prefix that marks an extension method (`ext:PURGE`).
pub const EXTENSION_PREFIX: &str = "ext:";

/// Longest extension method name accepted.
pub const MAX_EXTENSION_METHOD_LEN: usize = 32;

/// Validates a method from a rules file and returns it upper-cased.
pub fn parse_method(text: &str) -> Result<String, String> {
    if let Some(name) = text.strip_prefix(EXTENSION_PREFIX) {
        return parse_extension(name);
    }
    let upper = text.to_ascii_uppercase();
    if STANDARD_METHODS.contains(&upper.as_str()) {
        return Ok(upper);
    }
    let hint = match closest_standard(&upper) {
        Some(near) => format!("did you mean `{near}`? "),
        None => String::new(),
    };
    Err(format!(
        "`{text}` is not a standard HTTP method; {hint}expected one of {}, or `{EXTENSION_PREFIX}NAME` for an extension method",
        STANDARD_METHODS.join(", ")
    ))
}

fn parse_extension(name: &str) -> Result<String, String> {
    // RFC 9110 §5.6.2 token characters: what a method may be made of.
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > MAX_EXTENSION_METHOD_LEN || !name.bytes().all(is_tchar) {
        return Err(format!(
            "extension method `{name}` must be 1 to {MAX_EXTENSION_METHOD_LEN} token characters (letters, digits, `!#$%&'*+-.^_`|~`)"
        ));
    }
    let upper = name.to_ascii_uppercase();
    if STANDARD_METHODS.contains(&upper.as_str()) {
        return Err(format!(
            "`{upper}` is a standard method: write `{upper}` without `{EXTENSION_PREFIX}`"
        ));
    }
    Ok(upper)
}

/// The standard method one typo away (one letter changed, added, removed, or two swapped).
fn closest_standard(upper: &str) -> Option<&'static str> {
    STANDARD_METHODS
        .into_iter()
        .find(|m| edit_distance(upper.as_bytes(), m.as_bytes()) <= 1 || swapped(upper, m))
}

fn swapped(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    matches!(diff.as_slice(), [i, j] if j == &(i + 1) && a[*i] == b[*j] && a[*j] == b[*i])
}

/// Levenshtein distance; both sides are short method names.
fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_methods_in_any_case_are_upper_cased() {
        assert_eq!(parse_method("post").unwrap(), "POST");
        assert_eq!(parse_method("Patch").unwrap(), "PATCH");
        assert_eq!(parse_method("OPTIONS").unwrap(), "OPTIONS");
    }

    #[test]
    fn typos_are_refused_with_the_nearest_method() {
        let e = parse_method("PSOT").unwrap_err();
        assert!(e.contains("did you mean `POST`"), "{e}");
        let e = parse_method("GETT").unwrap_err();
        assert!(e.contains("did you mean `GET`"), "{e}");
        let e = parse_method("PURGE").unwrap_err();
        assert!(!e.contains("did you mean"), "{e}");
        assert!(e.contains("ext:NAME"), "{e}");
        assert!(parse_method("").is_err());
    }

    #[test]
    fn extension_methods_need_the_prefix_and_a_token() {
        assert_eq!(parse_method("ext:purge").unwrap(), "PURGE");
        assert_eq!(parse_method("ext:M-SEARCH").unwrap(), "M-SEARCH");
        assert!(parse_method("ext:").is_err());
        assert!(parse_method("ext:a b").is_err());
        assert!(parse_method(&format!("ext:{}", "A".repeat(33))).is_err());
        assert!(parse_method("ext:post").unwrap_err().contains("standard"));
    }
}
