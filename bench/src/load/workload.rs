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

    /// The keys of one request, written into `out` (cleared first).
    pub fn request(&self, rng: &mut SmallRng, out: &mut Vec<String>) {
        // Keep the strings' buffers: only their text is rewritten.
        out.truncate(0);
        let index = match self.workload.spread {
            KeySpread::Uniform => rng.random_range(0..self.keys),
            KeySpread::Zipf => self.zipf.sample(rng) as u64 - 1,
            KeySpread::Hot => 0,
            KeySpread::HotLeased => {
                // A key of its own, so every admission on it is counted by this workload.
                push_key(out, LEASED_KEY_PREFIX, 0);
                return;
            }
        };
        push_key(out, "user:", index);
        if self.workload.checks_per_request == 3 {
            // The IP and API key of a request follow its user, spread over the same key space.
            push_key(out, "ip:", index.wrapping_mul(7_919) % self.keys);
            push_key(out, "key:", index.wrapping_mul(104_729) % self.keys);
        }
    }
}

/// Writes `prefix` and `index` as a key without a formatting allocation per request.
fn push_key(out: &mut Vec<String>, prefix: &str, index: u64) {
    use std::fmt::Write as _;
    let mut key = String::with_capacity(prefix.len() + 20);
    key.push_str(prefix);
    let _ = write!(key, "{index}");
    out.push(key);
}
