//! Which requests a rule applies to: method lists and path globs, and the request path's
//! normalization.
//!
//! A glob is an absolute path of `/`-separated segments. A segment is literal text, `*` (exactly
//! one non-empty segment) or, as the last segment only, `**` (any number of segments, including
//! none: `/v1/**` matches `/v1`, `/v1/` and `/v1/a/b`). Matching is case-sensitive.
//!
//! Request paths are normalized before matching (RFC 3986 §6.2.2), so a client cannot step around
//! a rule by spelling the same path differently: the query and fragment are dropped, empty
//! segments (`//`) are skipped, percent-encoded unreserved characters are decoded (`%6C` → `l`),
//! and `.` and `..` segments are resolved.

use std::borrow::Cow;
use std::fmt;

/// A validated path glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    any_suffix: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

impl PathPattern {
    /// Parses a glob; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text
            .strip_prefix('/')
            .ok_or_else(|| format!("path `{text}` must start with `/`"))?;
        if text.contains(['?', '#']) {
            return Err(format!(
                "path `{text}` contains `?` or `#`: rules match the path only, not the query"
            ));
        }
        let mut segments = Vec::new();
        let mut any_suffix = false;
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            match *part {
                "" if last => {} // a trailing `/` is the same path
                "" => return Err(format!("path `{text}` has an empty segment (`//`)")),
                "**" if last => any_suffix = true,
                "**" => {
                    return Err(format!(
                        "path `{text}`: `**` is only allowed as the last segment"
                    ));
                }
                "*" => segments.push(Segment::Any),
                "." | ".." => return Err(format!("path `{text}` has a `.` or `..` segment")),
                p if p.contains('*') => {
                    return Err(format!(
                        "path `{text}`: `*` must be a whole segment (`/a/*/b`), not part of `{p}`"
                    ));
                }
                p => segments.push(Segment::Literal(p.to_owned())),
            }
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
            any_suffix,
        })
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether a normalized path (its segments, see [`normalize_path`]) matches.
    pub fn matches<S: AsRef<str>>(&self, path: &[S]) -> bool {
        let fixed = self.segments.len();
        let length_ok = if self.any_suffix {
            path.len() >= fixed
        } else {
            path.len() == fixed
        };
        length_ok
            && self
                .segments
                .iter()
                .zip(path)
                .all(|(pattern, segment)| match pattern {
                    Segment::Any => true,
                    Segment::Literal(literal) => literal == segment.as_ref(),
                })
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The segments of a request path after normalization (see the module documentation).
pub fn normalize_path(path: &str) -> Vec<Cow<'_, str>> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut segments: Vec<Cow<'_, str>> = Vec::new();
    for raw in path.split('/') {
        let segment = decode_unreserved(raw);
        match segment.as_ref() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    segments
}

/// Decodes `%XX` escapes of unreserved characters (ALPHA DIGIT `-` `.` `_` `~`), which RFC 3986
/// says are equivalent to the characters themselves; other escapes (e.g. `%2F`) stay as written.
fn decode_unreserved(segment: &str) -> Cow<'_, str> {
    if !segment.contains('%') {
        return Cow::Borrowed(segment);
    }
    let bytes = segment.as_bytes();
    let mut out = String::with_capacity(segment.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| segment.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .filter(|b| b.is_ascii_alphanumeric() || b"-._~".contains(b));
        match decoded {
            Some(b) => {
                out.push(char::from(b));
                i += 3;
            }
            None => {
                // Copy one whole character (the input is valid UTF-8).
                let ch = segment[i..].chars().next().unwrap_or_default();
                out.push(ch);
                i += ch.len_utf8().max(1);
            }
        }
    }
    Cow::Owned(out)
}

/// The normalized path as one string (`/a/b`), for keys that include the path.
pub fn joined_path<S: AsRef<str>>(segments: &[S]) -> String {
    if segments.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::new();
    for segment in segments {
        out.push('/');
        out.push_str(segment.as_ref());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(glob: &str, path: &str) -> bool {
        PathPattern::parse(glob)
            .unwrap()
            .matches(&normalize_path(path))
    }

    #[test]
    fn star_is_one_segment_and_double_star_any_suffix() {
        assert!(matches("/v1/events/*/holds", "/v1/events/42/holds"));
        assert!(!matches("/v1/events/*/holds", "/v1/events/holds"));
        assert!(!matches("/v1/events/*/holds", "/v1/events/1/2/holds"));
        assert!(matches("/v1/**", "/v1"));
        assert!(matches("/v1/**", "/v1/a/b/c"));
        assert!(!matches("/v1/**", "/v2/a"));
        assert!(matches("/**", "/"));
        assert!(matches("/", "/"));
        assert!(!matches("/", "/a"));
    }

    #[test]
    fn spellings_of_the_same_path_match_alike() {
        for path in [
            "/v1/auth/login",
            "//v1//auth/login/",
            "/v1/./auth/login?x=1",
            "/v1/x/../auth/login",
            "/v1/auth/%6Cogin",
            "/v1/auth/%6cogin#frag",
        ] {
            assert!(matches("/v1/auth/login", path), "{path}");
        }
        assert!(!matches("/v1/auth/login", "/v1/auth/%2Flogin"));
        assert!(!matches("/v1/auth/login", "/v1/auth/Login"));
        assert_eq!(joined_path(&normalize_path("/a/%zz/%")), "/a/%zz/%");
        assert_eq!(joined_path(&normalize_path("/../..")), "/");
    }

    #[test]
    fn bad_globs_are_refused() {
        for glob in ["v1/*", "/v1//x", "/v1/**/x", "/v1/a*", "/v1/?", "/v1/../x"] {
            assert!(PathPattern::parse(glob).is_err(), "{glob}");
        }
    }
}
