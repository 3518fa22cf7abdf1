//! `scope: global` buckets across regions: how one bucket's limit `N` is split among the regions
//! whose Envoys report it. Pure state: the time comes in as nanoseconds.
//!
//! Each region's owner of the bucket splits its region's part `N_r` among its own Envoys (the
//! allocator, `shares`), and tells the bucket's owner in the **deciding region** (the first
//! region name the membership knows) its demand and its claim: the most its Envoys may still
//! admit, `max(N_r, what they hold)`. The deciding owner answers with the region's new `N_r`:
//!
//! - targets: half of `N` evenly over the `R` regions (the floor, `N / 2R`, which a region may
//!   take without asking: a new owner starts there), half by demand;
//! - a **shrink** is given at once; the region counts as holding its old part until its next
//!   claim says its Envoys have shrunk (the shrink acknowledged);
//! - a **grow** only out of `N` minus what every other region holds or was given, so the parts
//!   never add up past `N`, whatever the order messages arrive in.
//!
//! One region decides because a grow must come out of room no other region can take at the
//! same time: two regions growing each into what the other just gave up, each before hearing
//! of the other's grow, would together pass `N`.
//!
//! A region that hears nothing from the deciding owner for its part's [`RegionShare`] hold time
//! falls back to its floor; the deciding owner hands out what it held beyond the floor once the
//! region has been silent for that time plus the assignments' time to live (by then its
//! Envoys hold at most the floor).

use std::collections::{BTreeMap, HashMap};

use super::shares::{BucketKey, EXPIRY_MARGIN_NS};

/// A region's floor: what it may take without asking, so the parts of `regions` regions, each
/// at least its floor, leave half of `limit` to be split by demand.
pub fn floor(limit: u64, regions: usize) -> u64 {
    limit / (2 * regions.max(1) as u64)
}

/// The deciding owner's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitConfig {
    /// The Envoys' assignments' time to live: a region silent for twice this (and the margin)
    /// holds at most its floor.
    pub ttl_ns: u64,
    /// Most buckets split here; past it a bucket is not split (its regions keep their floors).
    pub max_buckets: usize,
}

impl SplitConfig {
    /// How long a region's last claim and part are counted after it was last heard from: it
    /// keeps its part for `ttl` without news, then its Envoys' assignments run out.
    pub fn silent_after_ns(&self) -> u64 {
        self.ttl_ns
            .saturating_mul(2)
            .saturating_add(EXPIRY_MARGIN_NS)
    }
}

/// One region's word about a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionClaim {
    /// Its Envoys' smoothed demand, requests per period.
    pub demand: u64,
    /// The most its Envoys may admit in a period now: `max(N_r, sum of 1 + t_i)`.
    pub claim: u64,
}

#[derive(Debug, Clone, Copy)]
struct Region {
    demand: u64,
    claim: u64,
    /// The last part given.
    part: u64,
    heard_ns: u64,
}

impl Region {
    /// What it may hold: its last claim, or the part given since, whichever is more.
    fn held(&self) -> u64 {
        self.claim.max(self.part)
    }
}

#[derive(Debug)]
struct Split {
    limit: u64,
    regions: BTreeMap<String, Region>,
}

/// The deciding owner's splits, one per global bucket it decides.
#[derive(Debug)]
pub struct RegionSplits {
    config: SplitConfig,
    buckets: HashMap<BucketKey, Split>,
}

impl RegionSplits {
    pub fn new(config: SplitConfig) -> RegionSplits {
        RegionSplits {
            config,
            buckets: HashMap::new(),
        }
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Takes `region`'s claim on `bucket` (a limit of `limit`, shared by the `known` regions:
    /// every region the membership knows, `region` among them) and answers its new part;
    /// `None` when the bucket is new and the most buckets are split already.
    pub fn report(
        &mut self,
        now_ns: u64,
        bucket: &BucketKey,
        limit: u64,
        known: &[String],
        region: &str,
        word: RegionClaim,
    ) -> Option<u64> {
        let silent_after = self.config.silent_after_ns();
        if !self.buckets.contains_key(bucket) && self.buckets.len() >= self.config.max_buckets {
            return None;
        }
        let split = self.buckets.entry(bucket.clone()).or_insert(Split {
            limit,
            regions: BTreeMap::new(),
        });
        // A reloaded configuration may have changed the limit.
        split.limit = limit;
        let regions = known.len().max(1);
        let floor = floor(limit, regions);
        split
            .regions
            .retain(|_, r| now_ns < r.heard_ns.saturating_add(silent_after));
        let me = split.regions.entry(region.to_owned()).or_insert(Region {
            demand: 0,
            claim: 0,
            part: floor,
            heard_ns: now_ns,
        });
        me.demand = word.demand;
        me.claim = word.claim;
        me.heard_ns = now_ns;
        let current = me.part;
        let target = target(limit, floor, known, region, &split.regions);
        let part = if target <= current {
            target
        } else {
            // What every other region holds or was given; one not heard from (or silent long
            // enough) holds at most its floor.
            let others: u64 = known
                .iter()
                .filter(|r| r.as_str() != region)
                .map(|r| split.regions.get(r).map_or(floor, Region::held))
                .chain(
                    split
                        .regions
                        .iter()
                        .filter(|(r, _)| r.as_str() != region && !known.contains(r))
                        .map(|(_, r)| r.held()),
                )
                .fold(0u64, u64::saturating_add);
            current.max(target.min(limit.saturating_sub(others)))
        };
        if let Some(me) = split.regions.get_mut(region) {
            me.part = part;
        }
        Some(part)
    }

    /// Forgets the buckets no region has claimed for the silence time.
    pub fn expire(&mut self, now_ns: u64) {
        let silent_after = self.config.silent_after_ns();
        self.buckets.retain(|_, split| {
            split
                .regions
                .values()
                .any(|r| now_ns < r.heard_ns.saturating_add(silent_after))
        });
    }
}

/// `region`'s target part: its floor, and of the rest its share of the known regions' demand
/// (the rest split evenly while nobody has demand).
fn target(
    limit: u64,
    floor: u64,
    known: &[String],
    region: &str,
    regions: &BTreeMap<String, Region>,
) -> u64 {
    let count = known.len().max(1) as u128;
    let rest = u128::from(limit.saturating_sub(floor.saturating_mul(count as u64)));
    let demand_of = |r: &str| u128::from(regions.get(r).map_or(0, |r| r.demand));
    let total: u128 = known.iter().map(|r| demand_of(r)).sum();
    let extra = (rest * demand_of(region))
        .checked_div(total)
        .unwrap_or(rest / count);
    floor.saturating_add(u64::try_from(extra).unwrap_or(u64::MAX))
}

/// A region owner's part of one global bucket: what the deciding owner last gave, kept for
/// `hold_ns` without news, then the floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionShare {
    /// The whole limit, requests per period.
    pub limit: u64,
    pub period_s: u64,
    part: Option<u64>,
    given_ns: u64,
}

impl RegionShare {
    pub fn new(limit: u64, period_s: u64) -> RegionShare {
        RegionShare {
            limit,
            period_s,
            part: None,
            given_ns: 0,
        }
    }

    /// The part this region splits among its Envoys now, of `regions` regions.
    pub fn part(&self, now_ns: u64, hold_ns: u64, regions: usize) -> u64 {
        match self.part {
            Some(part) if now_ns < self.given_ns.saturating_add(hold_ns) => part,
            _ => floor(self.limit, regions),
        }
    }

    /// The deciding owner gave `part` in answer to a claim sent at `asked_ns` (the hold counts
    /// from the claim: the deciding owner counts the silence from when it heard it).
    pub fn give(&mut self, asked_ns: u64, part: u64) {
        self.part = Some(part);
        self.given_ns = asked_ns;
    }

    /// True when the part's hold has run out (or nothing was given): the floor applies.
    pub fn held_past(&self, now_ns: u64, hold_ns: u64) -> bool {
        self.part.is_none() || now_ns >= self.given_ns.saturating_add(hold_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded::Seeded;
    use floodgate::NANOS_PER_SEC;

    const S: u64 = NANOS_PER_SEC;
    const TTL: u64 = 15 * S;

    fn bucket() -> BucketKey {
        BucketKey {
            domain: "edge".into(),
            entries: vec![("name".into(), "shared".into())],
        }
    }

    fn known(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn splits() -> RegionSplits {
        RegionSplits::new(SplitConfig {
            ttl_ns: TTL,
            max_buckets: 10,
        })
    }

    fn word(demand: u64, claim: u64) -> RegionClaim {
        RegionClaim { demand, claim }
    }

    #[test]
    fn parts_follow_demand_and_a_grow_waits_for_the_shrink_to_be_claimed() {
        let mut s = splits();
        let k = known(&["eu", "us"]);
        let b = bucket();
        // Each starts at its floor (25 of 100); "eu" busy alone grows into what "us" does not
        // hold: us is counted at its floor until heard from.
        assert_eq!(s.report(0, &b, 100, &k, "eu", word(90, 25)), Some(75));
        assert_eq!(s.report(0, &b, 100, &k, "us", word(10, 25)), Some(25));
        // us's demand counts now: eu's target is 70, a shrink, given at once.
        assert_eq!(s.report(S, &b, 100, &k, "eu", word(90, 75)), Some(70));
        // Demand turns: us's target is 50 but eu still claims 75; us may take only 25.
        assert_eq!(s.report(2 * S, &b, 100, &k, "us", word(90, 25)), Some(25));
        // eu is told to shrink (its target 50)...
        assert_eq!(s.report(3 * S, &b, 100, &k, "eu", word(90, 75)), Some(50));
        // ...but until eu claims less, us still waits.
        assert_eq!(s.report(4 * S, &b, 100, &k, "us", word(90, 25)), Some(25));
        assert_eq!(s.report(5 * S, &b, 100, &k, "eu", word(90, 50)), Some(50));
        assert_eq!(s.report(6 * S, &b, 100, &k, "us", word(90, 25)), Some(50));
    }

    #[test]
    fn a_silent_region_keeps_its_part_until_its_envoys_assignments_run_out() {
        let mut s = splits();
        let k = known(&["eu", "us"]);
        let b = bucket();
        assert_eq!(s.report(0, &b, 100, &k, "us", word(100, 25)), Some(75));
        // us goes silent holding 75; eu wants everything.
        assert_eq!(s.report(S, &b, 100, &k, "eu", word(100, 25)), Some(25));
        let later = 2 * TTL + EXPIRY_MARGIN_NS - S;
        assert_eq!(s.report(later, &b, 100, &k, "eu", word(100, 25)), Some(25));
        // us has been silent long enough to be at its floor.
        let silent = 2 * TTL + EXPIRY_MARGIN_NS + S;
        assert_eq!(s.report(silent, &b, 100, &k, "eu", word(100, 25)), Some(75));
        // us, cut off, kept its part for the hold time, then fell to its floor.
        let mut share = RegionShare::new(100, 60);
        share.give(0, 75);
        assert_eq!(share.part(TTL - 1, TTL, 2), 75);
        assert_eq!(share.part(TTL, TTL, 2), 25);
    }

    #[test]
    fn buckets_past_the_bound_are_not_split_and_quiet_ones_are_forgotten() {
        let mut s = RegionSplits::new(SplitConfig {
            ttl_ns: TTL,
            max_buckets: 1,
        });
        let k = known(&["eu"]);
        let mut other = bucket();
        other.entries[0].1 = "other".into();
        assert_eq!(s.report(0, &bucket(), 10, &k, "eu", word(1, 0)), Some(10));
        assert_eq!(s.report(0, &other, 10, &k, "eu", word(1, 0)), None);
        s.expire(2 * TTL + EXPIRY_MARGIN_NS);
        assert_eq!(s.bucket_count(), 0);
        assert_eq!(s.report(0, &other, 10, &k, "eu", word(1, 0)), Some(10));
    }

    /// A region in the simulation: the part it was given and what its Envoys hold (they move
    /// to a new part only at a later step, as Envoys do at their next report; an assignment
    /// above the part runs out a time to live after the part fell).
    struct SimRegion {
        name: String,
        share: RegionShare,
        holding: u64,
        /// When the part fell below what the Envoys hold.
        fell_ns: Option<u64>,
        demand: u64,
        /// One report at a time: the round trip in flight, its answer and when it arrives.
        asked: Option<(u64, Option<u64>, u64)>,
    }

    /// Three regions, their demand jumping at random, each round trip to the deciding region
    /// delayed or its answer lost; after every step the Envoys of all regions together may
    /// admit at most `N`.
    #[test]
    fn seeded_runs_never_let_the_regions_together_hold_more_than_the_limit() {
        const N: u64 = 600;
        let step_ns = S / 4;
        for seed in 0..300u64 {
            let mut rng = Seeded(seed);
            let mut decider = splits();
            let names = known(&["ap", "eu", "us"]);
            let mut regions: Vec<SimRegion> = names
                .iter()
                .map(|n| SimRegion {
                    name: n.clone(),
                    share: RegionShare::new(N, 60),
                    holding: floor(N, 3),
                    fell_ns: None,
                    demand: 0,
                    asked: None,
                })
                .collect();
            for step in 0..600u64 {
                let now = step * step_ns;
                let i = rng.below(3) as usize;
                match rng.below(4) {
                    0 => regions[i].demand = rng.below(1_000),
                    1 if regions[i].asked.is_none() => {
                        let r = &regions[i];
                        let part = r.share.part(now, TTL, 3);
                        let word = word(r.demand, part.max(r.holding));
                        let given = decider.report(now, &bucket(), N, &names, &r.name, word);
                        // Lost one time in five, late by up to 20 steps (5 s).
                        let given = given.filter(|_| rng.below(5) != 0);
                        regions[i].asked = Some((now, given, step + rng.below(20)));
                    }
                    2 => {
                        regions[i].holding = regions[i].share.part(now, TTL, 3);
                        regions[i].fell_ns = None;
                    }
                    _ => {}
                }
                for r in &mut regions {
                    if let Some((sent, given, at)) = r.asked
                        && at <= step
                    {
                        if let Some(part) = given {
                            r.share.give(sent, part);
                        }
                        r.asked = None;
                    }
                    let part = r.share.part(now, TTL, 3);
                    if part >= r.holding {
                        r.fell_ns = None;
                        continue;
                    }
                    // Fell now, or when the part's hold ran out.
                    let fell = *r.fell_ns.get_or_insert(if r.share.held_past(now, TTL) {
                        r.share.given_ns + TTL
                    } else {
                        now
                    });
                    if now >= fell + TTL + EXPIRY_MARGIN_NS {
                        r.holding = part;
                        r.fell_ns = None;
                    }
                }
                // Each region's Envoys may admit what they hold, or the part where that is
                // more (they may move to it at any moment).
                let total: u64 = regions
                    .iter()
                    .map(|r| r.holding.max(r.share.part(now, TTL, 3)))
                    .sum();
                assert!(total <= N, "seed {seed} step {step}: {total} > {N}");
            }
        }
    }
}
