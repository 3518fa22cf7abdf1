//! The client's IP: the peer, or the rightmost address trusted proxies vouch for in
//! `X-Forwarded-For`, never the leftmost blindly : a spoofed `X-Forwarded-For`
//! from an untrusted peer does not change the client IP.

use std::net::{IpAddr, Ipv4Addr};

use floodgate::policy::{TrustedProxies, client_ip};
use proptest::prelude::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn trusted() -> TrustedProxies {
    TrustedProxies::parse(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap()
}

#[test]
fn an_untrusted_peer_is_the_client_whatever_the_header_says() {
    let peer = ip("203.0.113.50");
    assert_eq!(client_ip(peer, &["1.2.3.4"], &trusted()), peer);
    assert_eq!(client_ip(peer, &["10.0.0.1, 1.2.3.4"], &trusted()), peer);
    assert_eq!(client_ip(peer, &[], &trusted()), peer);
    assert_eq!(client_ip(peer, &["1.2.3.4"], &TrustedProxies::none()), peer);
}

#[test]
fn behind_trusted_proxies_the_rightmost_untrusted_address_is_the_client() {
    let lb = ip("10.0.0.2");
    assert_eq!(
        client_ip(lb, &["198.51.100.7"], &trusted()),
        ip("198.51.100.7")
    );
    // The client wrote a fake first entry; our proxies appended the real address after it.
    assert_eq!(
        client_ip(lb, &["6.6.6.6, 198.51.100.7, 10.0.0.9"], &trusted()),
        ip("198.51.100.7")
    );
    // Several field lines count as one list, in order.
    assert_eq!(
        client_ip(lb, &["6.6.6.6", "198.51.100.7", "10.0.0.9"], &trusted()),
        ip("198.51.100.7")
    );
    // Ports and brackets, IPv6, and IPv4-mapped peers.
    assert_eq!(
        client_ip(lb, &["198.51.100.7:4711"], &trusted()),
        ip("198.51.100.7")
    );
    assert_eq!(
        client_ip(lb, &["[2001:db8::1]:443"], &trusted()),
        ip("2001:db8::1")
    );
    assert_eq!(
        client_ip(ip("2001:db8:ffff::1"), &["2001:db8::7"], &trusted()),
        ip("2001:db8::7")
    );
    assert_eq!(
        client_ip(ip("::ffff:10.0.0.2"), &["::ffff:198.51.100.7"], &trusted()),
        ip("198.51.100.7")
    );
}

#[test]
fn a_malformed_entry_stops_at_the_last_trusted_hop() {
    let lb = ip("10.0.0.2");
    assert_eq!(client_ip(lb, &["198.51.100.7, unknown"], &trusted()), lb);
    assert_eq!(
        client_ip(lb, &["198.51.100.7, garbage, 10.0.0.3"], &trusted()),
        ip("10.0.0.3")
    );
    assert_eq!(
        client_ip(lb, &["198.51.100.7,,10.0.0.3"], &trusted()),
        ip("10.0.0.3")
    );
    assert_eq!(client_ip(lb, &[""], &trusted()), lb);
    // No header, or only trusted hops: the leftmost trusted hop is as far as anyone vouched.
    assert_eq!(client_ip(lb, &[], &trusted()), lb);
    assert_eq!(
        client_ip(lb, &["10.1.1.1, 10.2.2.2"], &trusted()),
        ip("10.1.1.1")
    );
}

/// One X-Forwarded-For entry: a trusted proxy, an outside address, or garbage.
fn entry() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<[u8; 3]>().prop_map(|[a, b, c]| format!("10.{a}.{b}.{c}")),
        any::<u32>()
            .prop_filter("outside 10/8", |x| x >> 24 != 10)
            .prop_map(|x| Ipv4Addr::from(x).to_string()),
        Just("unknown".to_owned()),
        Just(String::new()),
        Just("2001:db8:ffff::9".to_owned()),
        Just("[2001:db8::5]:80".to_owned()),
    ]
}

proptest! {
    /// Whatever the header holds, the answer is the peer, or an entry such that the peer and
    /// every entry to its right are well-formed trusted proxies: someone we trust vouched for it.
    #[test]
    fn the_client_ip_is_always_vouched_for(
        peer_trusted in any::<bool>(),
        peer_low in any::<u16>(),
        lines in prop::collection::vec(prop::collection::vec(entry(), 0..4), 0..4),
    ) {
        let trusted = trusted();
        let peer = if peer_trusted {
            IpAddr::V4(Ipv4Addr::new(10, 9, (peer_low >> 8) as u8, peer_low as u8))
        } else {
            IpAddr::V4(Ipv4Addr::new(192, 0, (peer_low >> 8) as u8, peer_low as u8))
        };
        let values: Vec<String> = lines.iter().map(|l| l.join(", ")).collect();
        let value_refs: Vec<&str> = values.iter().map(String::as_str).collect();
        let got = client_ip(peer, &value_refs, &trusted);

        // The flattened entries, right to left, as the walk sees them.
        let entries: Vec<&str> = value_refs.iter().flat_map(|v| v.split(',')).collect();
        if !trusted.contains(peer) {
            prop_assert_eq!(got, peer);
            return Ok(());
        }
        // Trusted peer: the answer is the peer, or entry i with every entry right of it a
        // parseable trusted proxy.
        let parse = |e: &str| -> Option<IpAddr> {
            let e = e.trim();
            e.parse::<IpAddr>().ok()
                .or_else(|| e.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
                .map(|ip| ip.to_canonical())
        };
        let vouched = got == peer
            || (0..entries.len()).any(|i| {
                parse(entries[i]) == Some(got)
                    && entries[i + 1..]
                        .iter()
                        .all(|e| parse(e).is_some_and(|ip| trusted.contains(ip)))
            });
        prop_assert!(vouched, "peer {} header {:?} gave {}", peer, values, got);
        // And it is never an untrusted address left of an untrusted one.
        if !trusted.contains(got) {
            let position = entries.iter().rposition(|e| parse(e) == Some(got)).unwrap();
            prop_assert!(entries[position + 1..].iter().all(|e| parse(e).is_some_and(|ip| trusted.contains(ip))));
        }
    }
}
