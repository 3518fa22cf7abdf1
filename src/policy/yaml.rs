//! Reading YAML with positions: a guarded loader and typed accessors that fail at a line and column.
//!
//! The loader first walks the parser's events to refuse what a rules file never needs but an
//! accident or an attacker could use to exhaust memory: aliases (each is copied when the tree is
//! built, so nested ones grow exponentially), deep nesting and huge files. Only then is the tree
//! built, with a [`Span`](saphyr_parser::Span) on every node.

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use saphyr_parser::{Event, Marker, Parser, ScanError};

use super::error::PolicyError;

/// A YAML node with its position.
pub(crate) type Node<'a> = MarkedYaml<'a>;

/// Largest rules file accepted: a policy is a few hundred rules, not megabytes, and nodes hand
/// the file to clients whole, in one policy message.
pub const MAX_RULES_FILE_BYTES: usize = crate::wire::MAX_POLICY_TEXT_BYTES;
/// Deepest nesting of mappings and sequences; the schema needs 4.
const MAX_DEPTH: usize = 16;

/// An error at a parser marker (line from 1, column from 0 in saphyr).
pub(crate) fn error_at_marker(marker: &Marker, message: impl Into<String>) -> PolicyError {
    PolicyError::new(marker.line().max(1), marker.col() + 1, message)
}

/// An error pointing at the start of `node`.
pub(crate) fn error_at(node: &Node<'_>, message: impl Into<String>) -> PolicyError {
    error_at_marker(&node.span.start, message)
}

fn scan_error(e: &ScanError) -> PolicyError {
    error_at_marker(e.marker(), format!("YAML syntax: {}", e.info()))
}

/// Parses `text` into its single document, refusing aliases, deep nesting and oversized input.
pub(crate) fn load(text: &str) -> Result<Node<'_>, PolicyError> {
    if text.len() > MAX_RULES_FILE_BYTES {
        return Err(PolicyError::new(
            1,
            1,
            format!(
                "rules file is {} bytes; the maximum is {MAX_RULES_FILE_BYTES}",
                text.len()
            ),
        ));
    }
    let mut depth = 0usize;
    let mut documents = 0usize;
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| scan_error(&e))?;
        match event {
            Event::Alias(_) => {
                return Err(error_at_marker(
                    &span.start,
                    "YAML aliases (`*name`) are not supported in rules files; write the value out",
                ));
            }
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(error_at_marker(
                        &span.start,
                        "a rules file holds one YAML document; found a second one",
                    ));
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(error_at_marker(
                        &span.start,
                        format!("nesting deeper than {MAX_DEPTH} levels"),
                    ));
                }
            }
            Event::MappingEnd | Event::SequenceEnd => depth -= 1,
            _ => {}
        }
    }
    let mut docs = MarkedYaml::load_from_str(text).map_err(|e| scan_error(&e))?;
    match docs.pop() {
        Some(doc) if !matches!(doc.data, YamlData::Value(Scalar::Null)) => Ok(doc),
        _ => Err(PolicyError::new(
            1,
            1,
            "the rules file is empty: expected a mapping with at least `rules:`",
        )),
    }
}

/// A YAML mapping whose keys were checked against the fields a section allows.
pub(crate) struct Fields<'n, 'a> {
    node: &'n Node<'a>,
    entries: Vec<(&'n str, &'n Node<'a>, &'n Node<'a>)>,
    what: &'static str,
}

impl<'n, 'a> Fields<'n, 'a> {
    /// Reads `node` as a mapping of `what` (e.g. "rule") whose keys are all in `allowed`.
    pub(crate) fn new(
        node: &'n Node<'a>,
        what: &'static str,
        allowed: &[&str],
    ) -> Result<Self, PolicyError> {
        let entries = mapping(node, what)?;
        for &(name, key, _) in &entries {
            if !allowed.contains(&name) {
                return Err(error_at(
                    key,
                    format!(
                        "unknown field `{name}` in {what}; expected one of: {}",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(Fields {
            node,
            entries,
            what,
        })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'n Node<'a>> {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, _, value)| value)
    }

    pub(crate) fn require(&self, name: &str) -> Result<&'n Node<'a>, PolicyError> {
        self.get(name).ok_or_else(|| {
            error_at(
                self.node,
                format!("missing field `{name}` in {}", self.what),
            )
        })
    }

    /// The node the fields belong to, for errors about the whole section.
    pub(crate) fn node(&self) -> &'n Node<'a> {
        self.node
    }
}

/// The entries of a mapping with string keys: (key text, key node, value node), in file order.
pub(crate) fn mapping<'n, 'a>(
    node: &'n Node<'a>,
    what: &str,
) -> Result<Vec<(&'n str, &'n Node<'a>, &'n Node<'a>)>, PolicyError> {
    let YamlData::Mapping(map) = &node.data else {
        return Err(error_at(node, format!("expected a mapping for {what}")));
    };
    map.iter()
        .map(|(key, value)| Ok((string(key, "a key")?, key, value)))
        .collect()
}

/// The items of a sequence.
pub(crate) fn sequence<'n, 'a>(
    node: &'n Node<'a>,
    what: &str,
) -> Result<&'n [Node<'a>], PolicyError> {
    match &node.data {
        YamlData::Sequence(items) => Ok(items),
        _ => Err(error_at(node, format!("expected a list for {what}"))),
    }
}

/// A string scalar (quoted or plain; numbers and booleans are refused so a typo is not silently
/// read as a different type).
pub(crate) fn string<'n>(node: &'n Node<'_>, what: &str) -> Result<&'n str, PolicyError> {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Ok(s),
        _ => Err(error_at(
            node,
            format!("expected a string for {what}, found {}", describe(node)),
        )),
    }
}

/// A non-negative integer scalar.
pub(crate) fn unsigned(node: &Node<'_>, what: &str) -> Result<u64, PolicyError> {
    match &node.data {
        YamlData::Value(Scalar::Integer(i)) if *i >= 0 => Ok(*i as u64),
        _ => Err(error_at(
            node,
            format!(
                "expected a non-negative integer for {what}, found {}",
                describe(node)
            ),
        )),
    }
}

pub(crate) fn boolean(node: &Node<'_>, what: &str) -> Result<bool, PolicyError> {
    match &node.data {
        YamlData::Value(Scalar::Boolean(b)) => Ok(*b),
        _ => Err(error_at(
            node,
            format!(
                "expected true or false for {what}, found {}",
                describe(node)
            ),
        )),
    }
}

/// One string or a list of strings, each with its node (for positions).
pub(crate) fn strings<'n, 'a>(
    node: &'n Node<'a>,
    what: &str,
) -> Result<Vec<(&'n str, &'n Node<'a>)>, PolicyError> {
    match &node.data {
        YamlData::Sequence(items) => items.iter().map(|i| Ok((string(i, what)?, i))).collect(),
        _ => Ok(vec![(string(node, what)?, node)]),
    }
}

/// A short name for what a node holds, for error messages.
pub(crate) fn describe(node: &Node<'_>) -> String {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => format!("the string `{s}`"),
        YamlData::Value(Scalar::Integer(i)) => format!("the number {i}"),
        YamlData::Value(Scalar::FloatingPoint(f)) => format!("the number {f}"),
        YamlData::Value(Scalar::Boolean(b)) => format!("`{b}`"),
        YamlData::Value(Scalar::Null) => "nothing".to_owned(),
        YamlData::Sequence(_) => "a list".to_owned(),
        YamlData::Mapping(_) => "a mapping".to_owned(),
        YamlData::Tagged(tag, _) => format!("a value tagged `{tag}`"),
        _ => "an unreadable value".to_owned(),
    }
}
