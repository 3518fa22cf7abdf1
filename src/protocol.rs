//! Protocol versions: which ones a build speaks, how two ends agree on one, and which features a
//! version carries.
//!
//! Every node and client speaks a range of versions (`min..=max`). Two ends speak the highest
//! version both ranges hold: QUIC connections agree on it in the handshake (each version has its
//! own ALPN id, offered and accepted highest first), and gossip carries each member's range so
//! every node knows the **cluster version**, the highest version every member speaks. A frame
//! kind or field new in version `v` goes only over a connection that agreed on `v` or later;
//! behaviour that needs every member (a message that may be forwarded, replicated or relayed to
//! a third node) waits for the cluster version to reach `v`, or for the **region version** (the
//! same, over this region's members) when it never leaves the region: replicas, a join's
//! releases, lease syncs, deltas passed on and RLQS relays stay in one region's ring, so regions can be upgraded
//! one after the other without the last one holding every other back. Release N speaks N-1's
//! version too, so nodes and gateways can be upgraded one at a time in either order.

use std::fmt;

/// The first version this build speaks: what the build before protocol negotiation spoke (its
/// frames carry 2 and its ALPN id is `floodgate/1`).
pub const OLDEST: u8 = 2;
/// The newest version this build speaks: 3 adds each member's version range to gossip and to
/// the slot table clients read, and the cluster version to the slot table; 4 adds the settled
/// point and the receiver's session to the region exchange, and the `try_again` answer; 5
/// changes no layout: a node takes region deltas from a member of its own region (passed on to
/// the key's owner there); 6 adds two check flags, peek and charge (metered costs), and the
/// `outcome_unknown` answer, with no layout change either; 7 adds two peer kinds, RLQS usage
/// reports relayed to a bucket's owner and its assignments back (no layout change); 8 adds two
/// peer kinds, a region's claims for global RLQS buckets and its parts back (no layout change);
/// 9 adds to gossip whether a member is still joining, and a member tells each newcomer which
/// slots it does not decide; 10 makes lease ids 128 bits (kinds 15-17); 11 adds a peer kind, the
/// units of global keys other regions have not confirmed, sent with a hand-off (no layout
/// change); 12 sends replicated GCRA buckets as columns (kind 7); 13 sends region deltas as
/// columns (kind 13).
pub const NEWEST: u8 = 13;
/// What this build speaks.
pub const SUPPORTED: VersionRange = VersionRange {
    min: OLDEST,
    max: NEWEST,
};
/// What a member is taken to speak while nobody has said: a member gossiped only in version 2's
/// format (by a build that knows no ranges) speaks 2 alone, as far as anyone can tell.
pub const UNKNOWN_MEMBER: VersionRange = VersionRange { min: 2, max: 2 };

/// ALPN id of version 2, kept from before versions were negotiated so those builds still
/// connect.
const ALPN_V2: &[u8] = b"floodgate/1";
/// Prefix of the ALPN id of every later version: `floodgate/v3`, `floodgate/v4`, ...
const ALPN_PREFIX: &[u8] = b"floodgate/v";

/// The versions one end speaks, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionRange {
    pub min: u8,
    pub max: u8,
}

impl VersionRange {
    /// A range, or `None` when `min > max` (no such range: refuse whoever claims it).
    pub fn new(min: u8, max: u8) -> Option<Self> {
        (min <= max).then_some(VersionRange { min, max })
    }

    pub fn contains(self, version: u8) -> bool {
        (self.min..=self.max).contains(&version)
    }

    /// The highest version both ranges hold: what two ends speak. `None`: nothing in common.
    pub fn highest_shared(self, other: VersionRange) -> Option<u8> {
        let (min, max) = (self.min.max(other.min), self.max.min(other.max));
        (min <= max).then_some(max)
    }

    /// The versions both ranges hold, or `None`.
    pub fn intersect(self, other: VersionRange) -> Option<VersionRange> {
        VersionRange::new(self.min.max(other.min), self.max.min(other.max))
    }

    /// ALPN ids of every version in the range, highest first: the order a client offers them
    /// in and a server prefers them in, so the highest shared version wins.
    pub fn alpn_ids(self) -> Vec<Vec<u8>> {
        (self.min..=self.max).rev().map(alpn_id).collect()
    }

    /// The range of the versions named by a list of ALPN ids (as a client offered them): ids
    /// that are not floodgate's are skipped; `None` when none is.
    pub fn of_alpn_ids<'a>(ids: impl IntoIterator<Item = &'a [u8]>) -> Option<VersionRange> {
        let mut versions = ids.into_iter().filter_map(version_of_alpn);
        let first = versions.next()?;
        Some(
            versions.fold(VersionRange::exactly(first), |range, v| VersionRange {
                min: range.min.min(v),
                max: range.max.max(v),
            }),
        )
    }

    pub fn exactly(version: u8) -> Self {
        VersionRange {
            min: version,
            max: version,
        }
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// The ALPN id of `version`.
pub fn alpn_id(version: u8) -> Vec<u8> {
    if version == 2 {
        ALPN_V2.to_vec()
    } else {
        let mut id = ALPN_PREFIX.to_vec();
        id.extend_from_slice(version.to_string().as_bytes());
        id
    }
}

/// The version an ALPN id names, if it is one of floodgate's (of any version, spoken here or
/// not).
pub fn version_of_alpn(id: &[u8]) -> Option<u8> {
    if id == ALPN_V2 {
        return Some(2);
    }
    let digits = id.strip_prefix(ALPN_PREFIX)?;
    if digits.is_empty() || digits.len() > 3 || digits.starts_with(b"0") {
        return None;
    }
    let version: u8 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    (version > 2).then_some(version)
}

/// The highest version every member speaks, given each member's range (this node's own among
/// them). `None` when the ranges share no version (a member that shares none with this node
/// cannot connect; with a third one it can happen).
pub fn cluster_version(ranges: impl IntoIterator<Item = VersionRange>) -> Option<u8> {
    ranges
        .into_iter()
        .try_fold(VersionRange::new(0, u8::MAX)?, VersionRange::intersect)
        .map(|shared| shared.max)
}

/// What a version brings that an older reader cannot read. Every item names the version it
/// came with; sending it waits for that version (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Gossip digests carry each member's version range; the slot table carries each member's
    /// range and the cluster version.
    MemberVersions,
    /// Region deltas (kind 13) carry the sender's settled point (every sequence number below it
    /// was acknowledged by that destination), acknowledgements (kind 14) the receiver's
    /// session: a restarted receiver resumes where the sender's unacknowledged messages start,
    /// and a sender tells a receiver's restart at once.
    RegionResync,
    /// A check may be answered with the error code `try_again` (nothing decided, send it again
    /// shortly) where an older caller waits or is answered `shutting_down`.
    TryAgain,
    /// A node forwards a group with `global` checks to its owner as kind 20 (a scoped batch);
    /// to an owner that does not read it, such a group is answered `not_owner`.
    ForwardedScopes,
    /// A node passes region deltas for keys another member of its region decides on to that
    /// member (kind 13 from its own region), where an older member refuses them: only once the
    /// region version has it.
    RegionPassOn,
    /// A check may be a peek (decide its cost, take nothing) or a charge (take its cost after
    /// the fact, never refused), and a charge whose outcome a node cannot know is answered
    /// `outcome_unknown`. An older node refuses a frame with either flag as malformed, so a
    /// client sends them only once the cluster version has it, and a node forwards them to an
    /// owner that reads them (to a home region's owner, not known to it, once the cluster
    /// version has it).
    MeteredCosts,
    /// A node accepting an Envoy's RLQS stream relays the usage of each bucket to the bucket's
    /// owner (kind 21) and takes the assignments it sends back (kind 22), where an older
    /// cluster's nodes each split a bucket's limit among their own Envoys. The owner is the one
    /// in the node's region, and relays go no further, so it is used once the region version
    /// has it.
    RlqsRelay,
    /// A region's owner of a `scope: global` RLQS bucket asks the bucket's owner in the deciding
    /// region for its region's part of the limit (kinds 23 and 24), where an older cluster's
    /// regions each split the whole limit among their own Envoys.
    RlqsGlobal,
    /// Gossip says whether each member is still joining: a joining node takes its first table
    /// only once it knows a member that is not, and no table names a joining member. A member
    /// sends each newcomer in its table a release (a hand-off listing every slot it does not
    /// decide), and a newcomer decides a gained slot once every member's release or hand-off
    /// has listed it, not on a guess of who owned it before. An older member sends none, so a
    /// newcomer waits for them only once the region version has it (releases go only to the
    /// members of one region's table).
    SettledJoins,
    /// Lease ids are 128 bits in kinds 15-17 (64 before). A caller speaking an older version is
    /// granted 64-bit ids, and so is every caller while the region version is older (a lease
    /// is replicated to members of the region that must read its id).
    WideLeaseIds,
    /// A node handing off slots sends the new owner, before the buckets, the units of global
    /// keys in them that other regions have not confirmed (kind 25), which the new owner counts
    /// against each key's share; an older member refuses the kind, so it is sent only to a new
    /// owner whose link agreed on this version (the receiver alone reads it: a member that
    /// hands the slots on sends its own).
    UnconfirmedHandoff,
    /// Replicate frames (kind 7) carry GCRA buckets, nearly every bucket replicated, as four
    /// columns (24 bytes a bucket where a flat bucket takes 96),
    /// windows and logs flat as before. A round's replicas are written once the region version
    /// has it (they are made off the runtime's workers, where no link is at hand); a hand-off's
    /// buckets in the layout of the link to the new owner (a member that passes buckets on
    /// writes them again for its own link).
    CompactReplicas,
    /// Region deltas (kind 13) go as columns, each distinct limit once and each delta's units
    /// and age as LEB128 integers: about 19 bytes a delta where version 4's layout takes 64.
    /// Region messages go over one link and are sent in the layout that link agreed on (a
    /// member passing deltas on encodes them again for its own link).
    CompactDeltas,
}

impl Feature {
    /// The version that brought it.
    pub fn since(self) -> u8 {
        match self {
            Feature::MemberVersions => 3,
            Feature::RegionResync | Feature::TryAgain | Feature::ForwardedScopes => 4,
            Feature::RegionPassOn => 5,
            Feature::MeteredCosts => 6,
            Feature::RlqsRelay => 7,
            Feature::RlqsGlobal => 8,
            Feature::SettledJoins => 9,
            Feature::WideLeaseIds => 10,
            Feature::UnconfirmedHandoff => 11,
            Feature::CompactReplicas => 12,
            Feature::CompactDeltas => 13,
        }
    }

    /// True when a peer or client speaking `version` reads it.
    pub fn readable_at(self, version: u8) -> bool {
        version >= self.since()
    }

    /// True when it may go to an end speaking `connection` inside a cluster speaking
    /// `cluster`: for what the receiver may pass on to any member (forward, replicate, relay).
    pub fn usable(self, connection: u8, cluster: u8) -> bool {
        self.readable_at(connection.min(cluster))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min: u8, max: u8) -> VersionRange {
        VersionRange::new(min, max).unwrap()
    }

    #[test]
    fn two_ends_speak_the_highest_version_they_share() {
        assert_eq!(range(2, 3).highest_shared(range(2, 2)), Some(2));
        assert_eq!(range(2, 3).highest_shared(range(3, 4)), Some(3));
        assert_eq!(range(2, 4).highest_shared(range(3, 3)), Some(3));
        assert_eq!(range(2, 3).highest_shared(range(2, 3)), Some(3));
        assert_eq!(range(2, 3).highest_shared(range(4, 5)), None);
        assert_eq!(range(4, 5).highest_shared(range(2, 3)), None);
        assert_eq!(VersionRange::new(3, 2), None);
    }

    #[test]
    fn alpn_ids_go_highest_first_and_version_2_keeps_its_old_id() {
        assert_eq!(
            range(2, 5).alpn_ids(),
            vec![
                b"floodgate/v5".to_vec(),
                b"floodgate/v4".to_vec(),
                b"floodgate/v3".to_vec(),
                b"floodgate/1".to_vec()
            ]
        );
        for version in 2..=u8::MAX {
            assert_eq!(version_of_alpn(&alpn_id(version)), Some(version));
        }
        for foreign in [
            &b"h3"[..],
            b"floodgate/v",
            b"floodgate/v2",
            b"floodgate/v03",
            b"floodgate/v256",
            b"floodgate/vx",
            b"floodgate/2",
        ] {
            assert_eq!(version_of_alpn(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn an_offer_is_read_back_as_the_range_it_names() {
        let offer = range(3, 5).alpn_ids();
        assert_eq!(
            VersionRange::of_alpn_ids(offer.iter().map(Vec::as_slice)),
            Some(range(3, 5))
        );
        let foreign: [&[u8]; 2] = [b"h3", b"http/1.1"];
        assert_eq!(VersionRange::of_alpn_ids(foreign), None);
    }

    #[test]
    fn the_cluster_speaks_what_every_member_speaks() {
        assert_eq!(cluster_version([range(2, 3)]), Some(3));
        assert_eq!(cluster_version([range(2, 3), range(2, 3)]), Some(3));
        // One old member holds the whole cluster at its version.
        assert_eq!(
            cluster_version([range(2, 3), UNKNOWN_MEMBER, range(2, 3)]),
            Some(2)
        );
        assert_eq!(cluster_version([range(2, 3), range(3, 4)]), Some(3));
        assert_eq!(cluster_version([range(2, 2), range(3, 4)]), None);
    }

    #[test]
    fn a_feature_waits_for_its_version_on_the_connection_and_in_the_cluster() {
        let feature = Feature::MemberVersions;
        assert!(!feature.readable_at(2));
        assert!(feature.readable_at(3));
        assert!(feature.usable(3, 3));
        // A new end in a cluster that still has an old member.
        assert!(!feature.usable(3, 2));
        // An old end in a new cluster.
        assert!(!feature.usable(2, 3));
        for feature in [Feature::RegionResync, Feature::TryAgain] {
            assert_eq!(feature.since(), 4);
            assert!(!feature.readable_at(3));
            assert!(feature.readable_at(NEWEST));
        }
    }

    #[test]
    fn ranges_print_as_operators_read_them() {
        assert_eq!(range(2, 3).to_string(), "2-3");
        assert_eq!(SUPPORTED.to_string(), format!("{OLDEST}-{NEWEST}"));
        assert_eq!(range(2, 2).to_string(), "2");
    }

    #[test]
    fn the_docs_name_the_range_this_build_speaks() {
        // Operators read the range there before an upgrade; a new version must update both.
        let stated = [
            (
                include_str!("../docs/OPERATIONS.md"),
                "docs/OPERATIONS.md",
                format!("This build speaks **{OLDEST}–{NEWEST}**"),
            ),
            (
                include_str!("../docs/PROTOCOL.md"),
                "docs/PROTOCOL.md",
                format!("this build speaks {OLDEST} to {NEWEST}."),
            ),
        ];
        for (text, file, words) in stated {
            assert!(text.contains(&words), "{file} must say `{words}`");
        }
    }
}
