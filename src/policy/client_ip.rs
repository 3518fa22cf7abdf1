//! The client's IP address: the peer's, or the one trusted proxies vouch for in `X-Forwarded-For`.
//!
//! Each proxy appends the address it received the request from, so `X-Forwarded-For` reads
//! `client, proxy1, proxy2` and the peer is the last proxy. Only entries appended by proxies we
//! trust are believed: walking from the right, every trusted hop vouches for the entry to its
//! left, and the first untrusted address is the client. The leftmost entry is whatever the
//! client chose to send, so it is never taken blindly.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(u32::from(ip)), self.prefix, 32) == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(ip), self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }
}

/// `bits` (a `width`-bit number) with only the first `prefix` bits kept.
fn masked(bits: u128, prefix: u8, width: u32) -> u128 {
    let host_bits = width - u32::from(prefix);
    if host_bits >= 128 {
        0
    } else {
        bits >> host_bits << host_bits
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let err = || format!("`{text}` is not an IP network (e.g. `10.0.0.0/8`, `2001:db8::/32`)");
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text.trim(), None),
        };
        let addr = IpAddr::from_str(addr).map_err(|_| err())?.to_canonical();
        let width: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= width)
                .ok_or_else(err)?,
            None => width,
        };
        let network = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        if masked(network, prefix, u32::from(width)) != network {
            return Err(format!(
                "`{text}` has bits set after the /{prefix} prefix; write the network address"
            ));
        }
        Ok(Cidr {
            network: addr,
            prefix,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The proxies in front of the gateway whose `X-Forwarded-For` entries are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    networks: Vec<Cidr>,
}

impl TrustedProxies {
    /// No trusted proxies: the client is always the peer.
    pub fn none() -> Self {
        TrustedProxies::default()
    }

    /// From CIDR strings; the error names the first bad one.
    pub fn parse<S: AsRef<str>>(cidrs: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let networks = cidrs
            .into_iter()
            .map(|c| c.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { networks })
    }

    pub fn from_networks(networks: Vec<Cidr>) -> Self {
        TrustedProxies { networks }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.networks.iter().any(|n| n.contains(ip))
    }

    pub fn networks(&self) -> &[Cidr] {
        &self.networks
    }

    pub fn len(&self) -> usize {
        self.networks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.networks.is_empty()
    }
}

/// The client's address for a request that arrived from `peer` with these `X-Forwarded-For`
/// header values (every field line, in order).
///
/// If the peer is not a trusted proxy, its address is the client's and the header is ignored (a
/// client can write anything in it). Otherwise the entries are read from the right, skipping
/// trusted proxies; the first untrusted address is the client. A malformed entry (`unknown`,
/// garbage) ends the walk at the last trusted hop before it, whose address is returned: nobody
/// trusted vouched for anything further left. IPv4-mapped IPv6 addresses count as IPv4; entries
/// may carry a port (`1.2.3.4:5678`, `[2001:db8::1]:443`).
pub fn client_ip(peer: IpAddr, x_forwarded_for: &[&str], trusted: &TrustedProxies) -> IpAddr {
    let mut hop = peer.to_canonical();
    if !trusted.contains(hop) {
        return hop;
    }
    let entries = x_forwarded_for
        .iter()
        .rev()
        .flat_map(|value| value.rsplit(','));
    for entry in entries {
        let Some(ip) = parse_entry(entry) else {
            return hop;
        };
        hop = ip;
        if !trusted.contains(hop) {
            return hop;
        }
    }
    // Every hop was a trusted proxy: the leftmost one is as far as anyone vouched.
    hop
}

/// One `X-Forwarded-For` entry as an address, with or without a port.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    let ip = IpAddr::from_str(entry)
        .ok()
        .or_else(|| SocketAddr::from_str(entry).ok().map(|s| s.ip()))?;
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains(ip("10.255.0.1")));
        assert!(net.contains(ip("::ffff:10.1.2.3")));
        assert!(!net.contains(ip("11.0.0.1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        assert!(!all.contains(ip("2001:db8::1")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        let host: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(host.to_string(), "192.0.2.7/32");
        for bad in ["10.0.0.0/33", "10.0.0.1/8", "nope", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
