//! A census of this process's own UDP ports (Linux `/proc`), so the harness learns which ports a
//! gateway's client sends from: the client binds its sockets itself, one per node, on connect.

use std::collections::{HashMap, HashSet};

/// Local ports of the UDP sockets this process holds now (IPv4 and IPv6).
pub fn own_udp_ports() -> HashSet<u16> {
    let inodes = own_socket_inodes();
    let mut ports = HashSet::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for (inode, port) in parse_udp_table(&text) {
            if inodes.contains(&inode) {
                ports.insert(port);
            }
        }
    }
    ports
}

fn own_socket_inodes() -> HashSet<u64> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return HashSet::new();
    };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|target| {
            let text = target.to_string_lossy().into_owned();
            text.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// (inode, local port) of each row of `/proc/net/udp` or `udp6`.
fn parse_udp_table(text: &str) -> HashMap<u64, u16> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            let inode = fields.get(9)?.parse().ok()?;
            Some((inode, port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_bound_here_is_in_the_census() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        assert!(own_udp_ports().contains(&port));
        drop(socket);
        assert!(!own_udp_ports().contains(&port));
    }

    #[test]
    fn rows_give_their_inode_and_port() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                    1: 0100007F:1F90 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 4242 2 0\n";
        assert_eq!(parse_udp_table(text), HashMap::from([(4242, 8080)]));
    }
}
