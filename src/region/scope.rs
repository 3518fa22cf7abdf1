//! Where a check is decided across regions: [`Scope`], and [`RegionName`], a validated region.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Longest region name accepted (`--region`, rules files, the wire).
pub const MAX_REGION_NAME_BYTES: usize = 64;

/// A region's name: 1 to 64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit (the same
/// alphabet as rule names, so it needs no escaping in keys, logs or metrics labels).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionName(Arc<str>);

/// Why a text is not a region name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "region `{0}` must be 1 to {MAX_REGION_NAME_BYTES} letters, digits, `.`, `_` or `-`, starting with a letter or digit"
)]
pub struct RegionNameError(pub String);

impl RegionName {
    pub fn new(name: &str) -> Result<Self, RegionNameError> {
        let ok = (1..=MAX_REGION_NAME_BYTES).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            // Keep the error message bounded whatever was sent.
            let shown: String = name.chars().take(MAX_REGION_NAME_BYTES + 1).collect();
            return Err(RegionNameError(shown));
        }
        Ok(RegionName(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for RegionName {
    type Err = RegionNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RegionName::new(s)
    }
}

impl fmt::Display for RegionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which regions one limit spans, and who decides a check on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Scope {
    /// One limit per region, decided exactly by the key's owner in the gateway's region. A
    /// client using two regions can get up to twice the limit. The default.
    #[default]
    Region,
    /// One limit shared by every region: the owner in the gateway's region decides at once from
    /// its bucket, which also holds what the other regions consumed (exchanged as deltas every
    /// sync interval; over-admission bounded, see `crate::region`).
    Global,
    /// One limit decided by the key's owner in the named region (exact for every region, one
    /// cross-region round trip per check).
    Home(RegionName),
}

impl Scope {
    /// `region`, `global` or `home:REGION`: the form rules files, logs and the CLI use.
    pub fn name(&self) -> String {
        match self {
            Scope::Region => "region".to_owned(),
            Scope::Global => "global".to_owned(),
            Scope::Home(region) => format!("home:{region}"),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Why a text is not a scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("unknown scope `{0}`: expected region, global or home:REGION")]
    Unknown(String),
    #[error(transparent)]
    Region(#[from] RegionNameError),
}

impl FromStr for Scope {
    type Err = ScopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "region" => Ok(Scope::Region),
            "global" => Ok(Scope::Global),
            _ => match s.strip_prefix("home:") {
                Some(region) => Ok(Scope::Home(RegionName::new(region)?)),
                None => Err(ScopeError::Unknown(s.chars().take(80).collect())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_round_trip_through_their_names() {
        for text in ["region", "global", "home:eu-west-1"] {
            let scope: Scope = text.parse().unwrap();
            assert_eq!(scope.name(), text);
        }
        assert_eq!(Scope::default(), Scope::Region);
    }

    #[test]
    fn bad_scopes_and_regions_are_refused_with_their_reason() {
        let err = "planet".parse::<Scope>().unwrap_err();
        assert!(
            err.to_string()
                .contains("expected region, global or home:REGION")
        );
        let err = "home:".parse::<Scope>().unwrap_err();
        assert!(err.to_string().contains("must be 1 to 64"), "{err}");
        assert!(RegionName::new("eu west").is_err());
        assert!(RegionName::new("-eu").is_err());
        assert!(RegionName::new(&"x".repeat(65)).is_err());
        assert_eq!(
            RegionName::new("us-east_1.b").unwrap().as_str(),
            "us-east_1.b"
        );
    }
}
