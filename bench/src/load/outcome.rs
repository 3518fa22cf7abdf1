//! What one request to a system under test came to, whichever system answered it.

/// Outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    /// Decided by the client's failure mode, not the server: counted, never hidden.
    Degraded,
}
