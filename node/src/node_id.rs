//! What a node id may be: a DNS name, which peers dial the node by and its certificate carries.

use rustls::pki_types::ServerName;

/// A node id given with `--node-id` must be a DNS name: peers dial the node by it and verify
/// its certificate carries it as a DNS subject alternative name.
pub fn validate_node_id(id: &str) -> anyhow::Result<()> {
    let is_dns = matches!(ServerName::try_from(id), Ok(ServerName::DnsName(_)));
    let plain = id.len() <= 253
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    anyhow::ensure!(
        is_dns && plain,
        "node id `{id}` is not a DNS name (letters, digits, `-` and `.`, e.g. fg-a.internal): \
         peers verify a node by its id, which its certificate must carry as a DNS name"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_must_be_dns_names() {
        assert!(validate_node_id("fg-a.internal").is_ok());
        assert!(validate_node_id("node-0").is_ok());
        for bad in ["", "a b", "../etc", "fg_a", "x:1", "é.example"] {
            let e = validate_node_id(bad).unwrap_err().to_string();
            assert!(e.contains("not a DNS name"), "{bad}: {e}");
        }
    }
}
