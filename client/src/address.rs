//! Resolving seeds ([`HostPort`], parsed in the core): IPv4 first, bounded in time, again on
//! every connection attempt, so a node whose address changes is followed.

use std::net::SocketAddr;
use std::time::Duration;

pub use floodgate::HostPort;

/// Every address `host` names, IPv4 first (a name like `localhost` often lists `::1` first
/// while nodes listen on IPv4 only), the lookup bounded by `timeout`.
pub(crate) async fn resolve(host: &HostPort, timeout: Duration) -> Result<Vec<SocketAddr>, String> {
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

/// The address to dial now: the first [`resolve`] gives of the same family as `like` (a client
/// endpoint's socket is bound for one family), else the first.
pub(crate) async fn resolve_like(
    host: &HostPort,
    like: SocketAddr,
    timeout: Duration,
) -> Result<SocketAddr, String> {
    let addrs = resolve(host, timeout).await?;
    Ok(addrs
        .iter()
        .find(|a| a.is_ipv4() == like.is_ipv4())
        .copied()
        .unwrap_or(addrs[0]))
}
