//! Errors the client returns, and the classification callers use to react to them.

use std::path::PathBuf;

use floodgate::check::DegradedReason;
use floodgate::wire::ErrorCode;

/// The class of a failure, the one thing a caller needs to pick a reaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The client's configuration is unusable (found by [`crate::Client::connect`]).
    Config,
    /// The request is invalid whatever the node's state (a caller bug): fix the call, do not
    /// retry it.
    BadRequest,
    /// A node answered with an error that is not the caller's fault (overloaded, shutting down,
    /// store full, ...).
    Rejected,
    /// No answer within the call's timeout.
    Timeout,
    /// No usable connection to the node (down, refused the handshake, circuit open).
    Unreachable,
}

/// Why a [`crate::ClientConfig`] cannot be used. Each message names the field or file at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no node addresses given")]
    NoNodes,
    #[error("node {0} is listed twice")]
    DuplicateNode(crate::address::HostPort),
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
    #[error("cannot load the {what} from {path}: {problem}")]
    File {
        what: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("TLS setup failed: {0}")]
    Tls(String),
    #[error("cannot open a UDP socket: {0}")]
    Socket(String),
}

/// What [`crate::Client::connect`] and [`crate::Client::check`] return instead of a result.
///
/// Transport failures (timeouts, unreachable nodes) are *not* errors of `check`: they are decided
/// by each check's failure mode and visible in [`crate::Verdict::source`]. An error here means the
/// caller must change something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("invalid client configuration: {0}")]
    Config(#[from] ConfigError),
    /// Caught before sending: an empty check list, a key over the protocol's maximum, too many
    /// checks for one frame.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The node refused the request with an error frame.
    #[error("node {node} refused the request: {code}: {message}")]
    Rejected {
        node: std::net::SocketAddr,
        code: ErrorCode,
        message: String,
    },
    /// No node could be asked (a tool's one-shot request such as fetching the slot table;
    /// `check` never returns this: failure modes decide instead).
    #[error("no node answered: {0}")]
    Unavailable(String),
}

impl ClientError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Config(_) => ErrorKind::Config,
            ClientError::BadRequest(_) => ErrorKind::BadRequest,
            ClientError::Rejected { code, .. } => classify_code(*code),
            ClientError::Unavailable(_) => ErrorKind::Unreachable,
        }
    }
}

impl From<DegradedReason> for ErrorKind {
    /// The class of why a node did not decide a check.
    fn from(reason: DegradedReason) -> Self {
        match reason {
            DegradedReason::Timeout | DegradedReason::Backlog => ErrorKind::Timeout,
            DegradedReason::Unreachable
            | DegradedReason::CircuitOpen
            | DegradedReason::Protocol => ErrorKind::Unreachable,
            DegradedReason::Refused(_) => ErrorKind::Rejected,
        }
    }
}

/// The class of a node's error code: codes that say the request itself was invalid are bad
/// requests, every other refusal is the node's state.
pub fn classify_code(code: ErrorCode) -> ErrorKind {
    if is_bad_request(code) {
        ErrorKind::BadRequest
    } else {
        ErrorKind::Rejected
    }
}

/// Codes a node sends only when the request would be refused by any node in any state.
pub(crate) fn is_bad_request(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::KeyTooLong | ErrorCode::InvalidLimit | ErrorCode::BatchTooLarge
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_codes_are_classified_as_bad_request_or_rejected() {
        let node = "127.0.0.1:1".parse().unwrap();
        let rejected = |code| ClientError::Rejected {
            node,
            code,
            message: String::new(),
        };
        assert_eq!(
            rejected(ErrorCode::KeyTooLong).kind(),
            ErrorKind::BadRequest
        );
        assert_eq!(
            rejected(ErrorCode::BatchTooLarge).kind(),
            ErrorKind::BadRequest
        );
        assert_eq!(
            rejected(ErrorCode::InvalidLimit).kind(),
            ErrorKind::BadRequest
        );
        assert_eq!(rejected(ErrorCode::Overloaded).kind(), ErrorKind::Rejected);
        assert_eq!(rejected(ErrorCode::StoreFull).kind(), ErrorKind::Rejected);
        assert_eq!(
            ClientError::BadRequest("x".into()).kind(),
            ErrorKind::BadRequest
        );
        assert_eq!(
            ClientError::from(ConfigError::NoNodes).kind(),
            ErrorKind::Config
        );
    }
}
