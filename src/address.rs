//! `HostPort`: a HOST:PORT whose host may be a DNS name, checked when parsed. Resolving it is
//! the shells' job (the node and the client look a name up again on every dial, so a name whose
//! address changes is followed); the core only parses and prints.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// HOST:PORT, where HOST is an IP address (`[::1]` for IPv6) or a DNS name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    host: String,
    port: u16,
}

/// Longest DNS name accepted (RFC 1035).
const MAX_NAME_BYTES: usize = 253;

impl HostPort {
    /// The host part: an IP address or a DNS name, without brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address itself when the host is an IP address (nothing to resolve).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.host
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, self.port))
    }
}

impl From<SocketAddr> for HostPort {
    fn from(addr: SocketAddr) -> Self {
        HostPort {
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for HostPort {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let expected = "expected HOST:PORT (an IP address or a DNS name, then a port), \
                        e.g. 10.0.0.1:7100, fg-0.fg.svc:7100 or [::1]:7100";
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(addr.into());
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(format!("`{text}` has no port: {expected}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{text}`: the port `{port}` is not a number in 0..=65535"))?;
        if host.contains(':') || host.starts_with('[') {
            return Err(format!("`{text}`: {expected} (IPv6 goes in brackets)"));
        }
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        let name = host.strip_suffix('.').unwrap_or(host);
        if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.split('.').all(label_ok) {
            return Err(format!(
                "`{text}`: `{host}` is not an IP address or a DNS name"
            ));
        }
        Ok(HostPort {
            host: host.to_owned(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_parse_and_print_back() {
        for text in [
            "127.0.0.1:7100",
            "[::1]:7100",
            "localhost:7100",
            "fg-0.fg.svc:7100",
        ] {
            let parsed: HostPort = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
        assert_eq!(
            "fg-0.fg.svc:7100".parse::<HostPort>().unwrap().host(),
            "fg-0.fg.svc"
        );
        assert!(
            "localhost:7100"
                .parse::<HostPort>()
                .unwrap()
                .socket_addr()
                .is_none()
        );
    }

    #[test]
    fn malformed_values_say_what_is_wrong() {
        let error = |text: &str| text.parse::<HostPort>().unwrap_err();
        assert!(
            error("localhost").contains("has no port"),
            "{}",
            error("localhost")
        );
        assert!(error("localhost:http").contains("port `http`"));
        assert!(error("localhost:70000").contains("not a number"));
        assert!(error("::1:7100").contains("brackets"));
        for bad in [":7100", "a_b:7100", "-x:7100", "a..b:7100", "bad name:1"] {
            assert!(
                error(bad).contains("not an IP address or a DNS name"),
                "{bad}"
            );
        }
    }
}
