//! Resolving HOST:PORT values ([`HostPort`], parsed in the core): IPv4 first, bounded in time.
//! Seeds are resolved on every dial, so a name whose address changes is followed; `--listen`,
//! `--admin` and `--advertise` once, at start.

use std::net::SocketAddr;
use std::time::Duration;

pub use floodgate::HostPort;

/// Every address `host` names, IPv4 first (a name like `localhost` often lists `::1` first
/// while nodes listen on IPv4 only), the lookup bounded by `timeout`.
pub async fn resolve(host: &HostPort, timeout: Duration) -> Result<Vec<SocketAddr>, String> {
    if let Some(addr) = host.socket_addr() {
        return Ok(vec![addr]);
    }
    let lookup = tokio::net::lookup_host((host.host(), host.port()));
    let mut addrs: Vec<SocketAddr> = match tokio::time::timeout(timeout, lookup).await {
        Ok(Ok(addrs)) => addrs.collect(),
        Ok(Err(e)) => return Err(format!("cannot resolve {host}: {e}")),
        Err(_) => return Err(format!("resolving {host} took over {timeout:?}")),
    };
    if addrs.is_empty() {
        return Err(format!("{host} resolves to no address"));
    }
    // Stable: the resolver's order is kept within each family.
    addrs.sort_by_key(|a| a.is_ipv6());
    Ok(addrs)
}

/// The first address [`resolve`] gives: for flags resolved once, at start.
pub async fn resolve_first(host: &HostPort, timeout: Duration) -> Result<SocketAddr, String> {
    Ok(resolve(host, timeout).await?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn localhost_resolves_ipv4_first() {
        let host = "localhost:7100".parse::<HostPort>().unwrap();
        let addrs = resolve(&host, Duration::from_secs(5)).await.unwrap();
        assert_eq!(addrs[0], SocketAddr::from(([127, 0, 0, 1], 7100)));
    }
}
