//! A request's descriptors into what to check: per descriptor, no limit, or one bucket (key,
//! limit, cost) with the rule that names it. `replaces` is applied across the request here.

use std::collections::HashSet;
use std::sync::Arc;

use crate::limit::Algorithm;

use super::config::{Counted, RateRule, RlsConfig, Unit};

/// Longest bucket key built from a descriptor; longer ones are refused (hostile input).
pub const MAX_RLS_KEY_BYTES: usize = 4096;

/// One descriptor as Envoy sent it, its entries borrowed from the request's message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescriptorRequest<'a> {
    pub entries: Vec<(&'a str, &'a str)>,
    /// The per-descriptor `limit` override: (requests_per_unit, proto unit number).
    pub limit_override: Option<(u32, i32)>,
    /// The per-descriptor `hits_addend`; `Some(0)` peeks.
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`: give the hits back instead of taking them (never denied). Honoured
    /// only where [`PlanOptions::allow_negative_hits`] is set.
    pub negative_hits: bool,
}

/// What the listener lets a descriptor ask for beyond taking its hits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Honour `is_negative_hits` (give units back to the descriptor's bucket). Off by default:
    /// whoever can reach the listener could otherwise refill any key, so a descriptor asking
    /// for negative hits is planned `Invalid` and touches nothing.
    pub allow_negative_hits: bool,
}

/// What one descriptor needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Planned {
    /// No rule matched (or it was replaced): OK, no `current_limit`.
    NoLimit,
    /// `unlimited: true`: OK, nothing counted.
    Unlimited(Arc<RateRule>),
    /// One bucket to check.
    Check {
        rule: Arc<RateRule>,
        /// The bucket's identity: domain, entries and (for an override) the override's limit.
        key: Vec<u8>,
        counted: Counted,
        cost: u64,
        /// Give `cost` back (`is_negative_hits`) instead of taking it.
        refund: bool,
        /// A metered rule's descriptor without hits: ask that `cost` (the estimate) is left,
        /// taking nothing.
        peek: bool,
        /// A metered rule's descriptor with hits: charge `cost` after the fact, never refused.
        charge: bool,
    },
    /// The descriptor cannot be decided (a bad override, an oversized key, negative hits where
    /// they are off): the words say why.
    Invalid(String),
}

/// Why a descriptor asking for negative hits is refused where they are off.
pub const NEGATIVE_HITS_OFF: &str = "negative hits (is_negative_hits) are off on this listener; \
     the operator enables them with --rls-allow-negative-hits";

/// Plans every descriptor of a request. `hits_addend` is the request's (0 means 1).
pub fn plan_request(
    config: &RlsConfig,
    domain: &str,
    descriptors: &[DescriptorRequest],
    hits_addend: u64,
    options: PlanOptions,
) -> Vec<Planned> {
    let request_hits = hits_addend.max(1);
    // The request's hits when it says any (0 means unset).
    let explicit_hits = (hits_addend > 0).then_some(hits_addend);
    let rules: Vec<Result<Option<Arc<RateRule>>, String>> = descriptors
        .iter()
        .map(|d| rule_for(config, domain, d))
        .collect();
    // `replaces`: a matched rule drops the matched rules it names.
    let replaced: HashSet<&str> = rules
        .iter()
        .filter_map(|r| r.as_ref().ok().and_then(Option::as_ref))
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    descriptors
        .iter()
        .zip(&rules)
        .map(|(descriptor, rule)| {
            // Refused whether or not a rule matches: the request asks for something this
            // listener does not do, and its sender should hear so.
            if descriptor.negative_hits && !options.allow_negative_hits {
                return Planned::Invalid(NEGATIVE_HITS_OFF.to_owned());
            }
            let rule = match rule {
                Err(message) => return Planned::Invalid(message.clone()),
                Ok(None) => return Planned::NoLimit,
                Ok(Some(rule)) => rule,
            };
            if rule.name.as_deref().is_some_and(|n| replaced.contains(n)) {
                return Planned::NoLimit;
            }
            let Some(counted) = rule.counted.clone() else {
                return Planned::Unlimited(rule.clone());
            };
            let key = match bucket_key(domain, descriptor) {
                Ok(key) => key,
                Err(TooLong(length)) => {
                    return Planned::Invalid(format!(
                        "descriptor is {length} bytes; the most is {MAX_RLS_KEY_BYTES}"
                    ));
                }
            };
            let hits = descriptor.hits_addend.unwrap_or(request_hits);
            let (cost, peek, charge) = match counted.metered_estimate {
                // A metered rule: no hits of its own (or 0) asks; hits are a cost spent.
                Some(_) if descriptor.negative_hits => (hits, false, false),
                Some(estimate) => match descriptor.hits_addend.or(explicit_hits) {
                    None | Some(0) => (estimate, true, false),
                    Some(spent) => (spent, false, true),
                },
                None => (hits, false, false),
            };
            Planned::Check {
                rule: rule.clone(),
                key,
                counted,
                cost,
                refund: descriptor.negative_hits,
                peek,
                charge,
            }
        })
        .collect()
}

fn rule_for(
    config: &RlsConfig,
    domain: &str,
    descriptor: &DescriptorRequest,
) -> Result<Option<Arc<RateRule>>, String> {
    if !config.has_domain(domain) {
        return Ok(None);
    }
    if let Some((requests_per_unit, unit)) = descriptor.limit_override {
        // As envoyproxy/ratelimit: an override applies in a known domain, matched or not, and
        // is never in shadow mode.
        let unit = Unit::from_proto(unit)
            .ok_or_else(|| format!("limit override has an unknown unit ({unit})"))?;
        let counted = Counted::new(requests_per_unit, unit, Algorithm::FixedWindow, None)?;
        return Ok(Some(Arc::new(RateRule {
            // Not the entries: metric labels must stay bounded by the configuration.
            full_key: format!("{domain}.limit_override"),
            name: None,
            replaces: Vec::new(),
            shadow_mode: false,
            detailed_metric: false,
            counted: Some(counted),
        })));
    }
    Ok(config.find_in(domain, descriptor.entries.iter().copied()))
}

/// A descriptor's identity over [`MAX_RLS_KEY_BYTES`]: its length.
struct TooLong(usize);

/// Identities up to this length are put together on the stack: every descriptor Envoy sends
/// is keyed, and its identity is only hashed.
const IDENTITY_ON_STACK: usize = 512;

/// The key sent to the bucket store: `rls:` and a 128-bit digest of the descriptor's identity
/// (see [`identity_parts`]), so any descriptor fits the node's key length bound and every
/// bucket key has the same size. The key is part of the wire and of replicas: a node of
/// another version must key a descriptor the same.
fn bucket_key(domain: &str, descriptor: &DescriptorRequest) -> Result<Vec<u8>, TooLong> {
    let limit_override = descriptor
        .limit_override
        .map(|(requests_per_unit, unit)| format!("override {requests_per_unit}/{unit}"));
    let parts = || identity_parts(domain, descriptor, limit_override.as_deref());
    let length = IDENTITY_TAG.len() + parts().map(|p| 4 + p.len()).sum::<usize>();
    if length > MAX_RLS_KEY_BYTES {
        return Err(TooLong(length));
    }
    let mut on_stack = [0u8; IDENTITY_ON_STACK];
    let mut spilled = Vec::new();
    let identity: &mut [u8] = if length <= IDENTITY_ON_STACK {
        &mut on_stack[..length]
    } else {
        spilled.resize(length, 0);
        &mut spilled
    };
    identity[..IDENTITY_TAG.len()].copy_from_slice(IDENTITY_TAG);
    let mut at = IDENTITY_TAG.len();
    for part in parts() {
        identity[at..at + 4].copy_from_slice(&(part.len() as u32).to_le_bytes());
        identity[at + 4..at + 4 + part.len()].copy_from_slice(part);
        at += 4 + part.len();
    }
    let mut key = Vec::with_capacity(KEY_TAG.len() + 16);
    key.extend_from_slice(KEY_TAG);
    key.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(identity).to_le_bytes());
    Ok(key)
}

const IDENTITY_TAG: &[u8] = b"rls\0";
const KEY_TAG: &[u8] = b"rls:";

/// The identity's parts, each written length-prefixed after [`IDENTITY_TAG`] so no two
/// descriptors share a key by concatenation: the domain, each entry's key and value, and an
/// override's limit (a new override never inherits another's counter).
fn identity_parts<'a>(
    domain: &'a str,
    descriptor: &'a DescriptorRequest,
    limit_override: Option<&'a str>,
) -> impl Iterator<Item = &'a [u8]> {
    std::iter::once(domain.as_bytes())
        .chain(
            descriptor
                .entries
                .iter()
                .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()]),
        )
        .chain(limit_override.map(str::as_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RlsConfig {
        RlsConfig::from_files([(
            "c.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3, name: wide}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: narrow, replaces: [{name: wide}]}\n  - key: u\n    rate_limit: {unlimited: true}\n",
        )])
        .unwrap()
    }

    fn descriptor<'a>(entries: &[(&'a str, &'a str)]) -> DescriptorRequest<'a> {
        DescriptorRequest {
            entries: entries.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn costs_come_from_the_descriptor_then_the_request() {
        let mut peek = descriptor(&[("a", "1")]);
        peek.hits_addend = Some(0);
        let plans = plan_request(
            &config(),
            "d",
            &[descriptor(&[("a", "1")]), peek],
            5,
            PlanOptions::default(),
        );
        let costs: Vec<u64> = plans
            .iter()
            .map(|p| match p {
                Planned::Check { cost, .. } => *cost,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(costs, vec![5, 0]);
        let plans = plan_request(
            &config(),
            "d",
            &[descriptor(&[("a", "1")])],
            0,
            PlanOptions::default(),
        );
        assert!(matches!(plans[0], Planned::Check { cost: 1, .. }));
    }

    /// A metered rule: no hits (the request's or the descriptor's, or 0) peeks the estimate;
    /// hits are a charge; negative hits stay a refund.
    #[test]
    fn a_metered_rule_peeks_without_hits_and_charges_hits() {
        let metered = RlsConfig::from_files([(
            "m.yaml",
            "domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: minute, requests_per_unit: 50, metered: true, estimate: 4}\n",
        )])
        .unwrap();
        let plan = |hits: Option<u64>, request: u64, negative: bool| {
            let mut d = descriptor(&[("t", "k")]);
            d.hits_addend = hits;
            d.negative_hits = negative;
            let options = PlanOptions {
                allow_negative_hits: true,
            };
            match plan_request(&metered, "d", &[d], request, options).remove(0) {
                Planned::Check {
                    cost,
                    peek,
                    charge,
                    refund,
                    ..
                } => (cost, peek, charge, refund),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(plan(None, 0, false), (4, true, false, false));
        assert_eq!(plan(Some(0), 9, false), (4, true, false, false));
        assert_eq!(plan(None, 9, false), (9, false, true, false));
        assert_eq!(plan(Some(70), 9, false), (70, false, true, false));
        assert_eq!(plan(Some(2), 0, true), (2, false, false, true));
    }

    #[test]
    fn a_matched_rule_drops_the_rules_it_replaces() {
        let c = config();
        let both = plan_request(
            &c,
            "d",
            &[descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
            1,
            PlanOptions::default(),
        );
        assert_eq!(both[0], Planned::NoLimit);
        assert!(matches!(&both[1], Planned::Check { rule, .. } if rule.display_name() == "narrow"));
        let alone = plan_request(
            &c,
            "d",
            &[descriptor(&[("a", "1")])],
            1,
            PlanOptions::default(),
        );
        assert!(matches!(alone[0], Planned::Check { .. }));
    }

    #[test]
    fn an_override_is_part_of_the_bucket_identity() {
        let c = config();
        let key_of = |d: &DescriptorRequest| match &plan_request(
            &c,
            "d",
            std::slice::from_ref(d),
            1,
            PlanOptions::default(),
        )[0]
        {
            Planned::Check { key, counted, .. } => (key.clone(), counted.requests_per_unit),
            other => panic!("{other:?}"),
        };
        let plain = descriptor(&[("a", "1")]);
        let mut five = plain.clone();
        five.limit_override = Some((5, 2));
        let mut six = plain.clone();
        six.limit_override = Some((6, 2));
        let (k0, r0) = key_of(&plain);
        let (k5, r5) = key_of(&five);
        let (k6, r6) = key_of(&six);
        assert_eq!((r0, r5, r6), (3, 5, 6));
        assert_ne!(k0, k5);
        assert_ne!(k5, k6);
        // Even an unmatched descriptor is limited by its override in a known domain.
        let mut unmatched = descriptor(&[("zzz", "1")]);
        unmatched.limit_override = Some((2, 1));
        assert!(matches!(key_of(&unmatched), (_, 2)));
        unmatched.limit_override = Some((2, 99));
        assert!(matches!(
            plan_request(&c, "d", &[unmatched], 1, PlanOptions::default())[0],
            Planned::Invalid(_)
        ));
    }

    #[test]
    fn unknown_domains_unmatched_and_unlimited_descriptors_count_nothing() {
        let c = config();
        assert_eq!(
            plan_request(
                &c,
                "x",
                &[descriptor(&[("a", "1")])],
                1,
                PlanOptions::default()
            )[0],
            Planned::NoLimit
        );
        assert_eq!(
            plan_request(
                &c,
                "d",
                &[descriptor(&[("q", "1")])],
                1,
                PlanOptions::default()
            )[0],
            Planned::NoLimit
        );
        assert!(matches!(
            plan_request(
                &c,
                "d",
                &[descriptor(&[("u", "1")])],
                1,
                PlanOptions::default()
            )[0],
            Planned::Unlimited(_)
        ));
    }

    #[test]
    fn negative_hits_are_refused_unless_the_listener_allows_them() {
        let c = config();
        let mut give_back = descriptor(&[("a", "1")]);
        give_back.negative_hits = true;
        let mut unmatched = descriptor(&[("q", "1")]);
        unmatched.negative_hits = true;
        let request = [descriptor(&[("a", "1")]), give_back, unmatched];
        let off = plan_request(&c, "d", &request, 1, PlanOptions::default());
        assert!(matches!(off[0], Planned::Check { refund: false, .. }));
        // Matched or not, in a known domain or not: the descriptor is refused, nothing planned.
        assert_eq!(off[1], Planned::Invalid(NEGATIVE_HITS_OFF.to_owned()));
        assert_eq!(off[2], Planned::Invalid(NEGATIVE_HITS_OFF.to_owned()));
        let elsewhere = plan_request(&c, "x", &request[1..2], 1, PlanOptions::default());
        assert_eq!(elsewhere[0], Planned::Invalid(NEGATIVE_HITS_OFF.to_owned()));
        let on = PlanOptions {
            allow_negative_hits: true,
        };
        let allowed = plan_request(&c, "d", &request, 1, on);
        assert!(matches!(
            allowed[1],
            Planned::Check {
                refund: true,
                cost: 1,
                ..
            }
        ));
        assert_eq!(allowed[2], Planned::NoLimit);
    }

    fn key(domain: &str, descriptor: &DescriptorRequest) -> Vec<u8> {
        bucket_key(domain, descriptor).unwrap_or_else(|TooLong(n)| panic!("{n} bytes"))
    }

    #[test]
    fn keys_do_not_collide_by_concatenation() {
        assert_ne!(
            key("d", &descriptor(&[("ab", "c")])),
            key("d", &descriptor(&[("a", "bc")]))
        );
    }

    #[test]
    fn a_descriptor_keys_the_same_bucket_as_earlier_versions_did() {
        // Nodes of two versions share buckets through forwards and replicas during an
        // upgrade: these are the keys the versions before this one computed.
        assert_eq!(
            key("edge", &descriptor(&[("remote_address", "10.0.0.1")])),
            [
                0x72, 0x6c, 0x73, 0x3a, 0xc2, 0x1a, 0xc0, 0x3c, 0x74, 0xf0, 0x10, 0x5f, 0xd7, 0x76,
                0x64, 0xee, 0x34, 0xa0, 0x1f, 0x38
            ]
        );
        let mut with_override = descriptor(&[("api_key", "k1"), ("path", "/v1/x")]);
        with_override.limit_override = Some((10, 2));
        assert_eq!(
            key("edge", &with_override),
            [
                0x72, 0x6c, 0x73, 0x3a, 0xa6, 0x98, 0xd1, 0xf7, 0x42, 0x5f, 0x7f, 0xaf, 0xc6, 0xca,
                0xc1, 0x2a, 0xfd, 0xa3, 0x83, 0x6e
            ]
        );
    }

    #[test]
    fn identities_past_the_stack_are_keyed_and_past_the_bound_refused() {
        let long = "v".repeat(IDENTITY_ON_STACK);
        let spilled = key("d", &descriptor(&[("k", &long)]));
        assert_eq!(spilled.len(), KEY_TAG.len() + 16);
        assert_ne!(spilled, key("d", &descriptor(&[("k", &long[1..])])));
        // Tag, domain and key parts: 4 + 5 + 5 bytes; the value's part brings it to the bound.
        let at_bound = "v".repeat(MAX_RLS_KEY_BYTES - 14 - 4);
        assert!(bucket_key("d", &descriptor(&[("k", &at_bound)])).is_ok());
        let over = format!("{at_bound}v");
        assert!(matches!(
            bucket_key("d", &descriptor(&[("k", &over)])),
            Err(TooLong(n)) if n == MAX_RLS_KEY_BYTES + 1
        ));
    }
}
