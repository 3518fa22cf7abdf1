//! The priority classes a request can carry, lowest first.

use std::fmt;

/// A request's class. Ordered: `Sheddable < Default < Critical`; shedding takes the lowest
/// first, and a share of a limit kept for a class is open to every class above it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Traffic that can be dropped first (prefetches, analytics, retries).
    Sheddable,
    /// What a request is when nothing says otherwise.
    #[default]
    Default,
    /// Traffic kept to the last (checkout, logins, health checks).
    Critical,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Sheddable, Priority::Default, Priority::Critical];

    /// The name in rules files, headers and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Sheddable => "sheddable",
            Priority::Default => "default",
            Priority::Critical => "critical",
        }
    }

    /// The class named `name`, ignoring ASCII case and surrounding spaces.
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim();
        Priority::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// 0 for the lowest class, 2 for the highest.
    pub fn rank(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Classes order lowest first and read back from their names in any case.
    #[test]
    fn classes_are_ordered_and_named() {
        assert!(Priority::Sheddable < Priority::Default && Priority::Default < Priority::Critical);
        for class in Priority::ALL {
            assert_eq!(Priority::from_name(class.name()), Some(class));
            assert_eq!(Priority::ALL[class.rank()], class);
        }
        assert_eq!(Priority::from_name(" CRITICAL "), Some(Priority::Critical));
        assert_eq!(Priority::from_name("urgent"), None);
        assert_eq!(Priority::default(), Priority::Default);
    }
}
