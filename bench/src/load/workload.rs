//! The workloads both systems run: which keys each request checks.

use std::fmt;

use rand::{Rng, rngs::SmallRng};
use rand_distr::{Distribution, Zipf};

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeySpread {
    /// Uniform over all keys.
    Uniform,
    /// Zipf (s = 1.0) over all keys: a few hot keys, a long tail.
    Zipf,
    /// Every request on one key.
    Hot,
    /// Every request on one key (its own, used by no other workload), through a client with
    /// token leases on: the key is decided at the gateway against tokens leased from its owner.
    HotLeased,
}

impl KeySpread {
    /// True for the spreads whose client leases hot keys' tokens.
    pub fn leased(self) -> bool {
        self == KeySpread::HotLeased
    }
}

/// One workload: the key spread and how many checks each request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    pub spread: KeySpread,
    /// 1 (one rule) or 3 (user + IP + API key, decided all-or-nothing).
    pub checks_per_request: usize,
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spread = match self.spread {
            KeySpread::Uniform => "uniform",
            KeySpread::Zipf => "zipf",
            KeySpread::Hot => "hot-key",
            KeySpread::HotLeased => "hot-key-leased",
        };
        write!(f, "{spread}/{}-check", self.checks_per_request)
    }
}

/// The prefix of the leased workload's key: no other workload (nor the key loading) uses it.
pub const LEASED_KEY_PREFIX: &str = "leased:";

/// Draws request keys for one workload.
#[derive(Debug)]
pub struct KeyGen {
    workload: Workload,
    keys: u64,
    zipf: Zipf<f64>,
}

impl KeyGen {
    pub fn new(workload: Workload, keys: u64) -> Self {
        // keys >= 1 is checked by the caller; Zipf::new only fails for n < 1 or s < 0.
        let zipf =
            Zipf::new(keys.max(1) as f64, 1.0).unwrap_or_else(|_| unreachable!("n >= 1, s = 1"));
        KeyGen {
            workload,
            keys,
            zipf,
        }
    }

    /// True when this workload's requests go through the client with token leases on.
    pub fn leased(&self) -> bool {
        self.workload.spread.leased()
    }

    /// The keys of one request, written over `out`: its strings' buffers are kept and only
    /// their text rewritten, so a request allocates nothing once `out` has been used.
    pub fn request(&self, rng: &mut SmallRng, out: &mut Vec<String>) {
        let mut keys = KeyWriter { out, written: 0 };
        let index = match self.workload.spread {
            KeySpread::Uniform => rng.random_range(0..self.keys),
            KeySpread::Zipf => self.zipf.sample(rng) as u64 - 1,
            KeySpread::Hot => 0,
            KeySpread::HotLeased => {
                // A key of its own, so every admission on it is counted by this workload.
                keys.push(LEASED_KEY_PREFIX, 0);
                return;
            }
        };
        keys.push("user:", index);
        if self.workload.checks_per_request == 3 {
            // The IP and API key of a request follow its user, spread over the same key space.
            keys.push("ip:", index.wrapping_mul(7_919) % self.keys);
            keys.push("key:", index.wrapping_mul(104_729) % self.keys);
        }
    }
}

/// Writes one request's keys over a vector of strings; dropped, it cuts off the strings of a
/// longer request before.
struct KeyWriter<'a> {
    out: &'a mut Vec<String>,
    written: usize,
}

impl KeyWriter<'_> {
    /// Writes `prefix` and `index` as the next key, in the buffer of the string there if any.
    fn push(&mut self, prefix: &str, index: u64) {
        if self.written == self.out.len() {
            self.out.push(String::with_capacity(prefix.len() + 20));
        }
        let key = &mut self.out[self.written];
        key.clear();
        key.push_str(prefix);
        key.push_str(itoa::Buffer::new().format(index));
        self.written += 1;
    }
}

impl Drop for KeyWriter<'_> {
    fn drop(&mut self) {
        self.out.truncate(self.written);
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn keygen(spread: KeySpread, checks_per_request: usize) -> KeyGen {
        KeyGen::new(
            Workload {
                spread,
                checks_per_request,
            },
            1_000,
        )
    }

    #[test]
    fn a_reused_request_holds_only_its_own_keys() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut request = Vec::new();
        keygen(KeySpread::HotLeased, 1).request(&mut rng, &mut request);
        assert_eq!(request, [format!("{LEASED_KEY_PREFIX}0")]);
        // Sized for the longer prefix: a string allocated for a `user:` key would be smaller.
        let capacity = request[0].capacity();

        keygen(KeySpread::Uniform, 3).request(&mut rng, &mut request);
        assert_eq!(request.len(), 3);
        assert!(request[0].starts_with("user:") && request[1].starts_with("ip:"));

        // A shorter request written over a longer one: one key, its text only.
        keygen(KeySpread::Hot, 1).request(&mut rng, &mut request);
        assert_eq!(request, ["user:0"]);
        assert_eq!(
            request[0].capacity(),
            capacity,
            "the first key's buffer was kept"
        );
    }

    #[test]
    fn three_check_requests_derive_ip_and_api_key_from_the_user() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut request = Vec::new();
        let keys = keygen(KeySpread::Uniform, 3);
        for _ in 0..100 {
            keys.request(&mut rng, &mut request);
            let user: u64 = request[0]["user:".len()..].parse().unwrap();
            assert_eq!(request[1], format!("ip:{}", user * 7_919 % 1_000));
            assert_eq!(request[2], format!("key:{}", user * 104_729 % 1_000));
        }
    }
}
