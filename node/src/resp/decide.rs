//! A run of pipelined `CL.THROTTLE`s decided as check batches through the cluster (`front_batch`: here or by each key's owner), in chunks that fit one frame.

use floodgate::Decision;
use floodgate::wire::WireCheck;

use super::throttle::Throttle;
use crate::front_batch::FrontContext;
use crate::front_batch::{Undecided, run_batch};

/// What one check of a batch costs in a frame beyond its key (limit, cost, flags, framing).
const CHECK_OVERHEAD_BYTES: usize = 96;

/// One decision per throttle, in order, or why it was not decided. Checks of one key stay in
/// order: a batch's groups for one owner are decided in the order sent.
pub(crate) async fn decide(
    shared: &FrontContext,
    throttles: &[&Throttle],
) -> Vec<Result<Decision, String>> {
    let limits = shared.config.limits;
    let mut answers = Vec::with_capacity(throttles.len());
    let mut rest = throttles;
    while !rest.is_empty() {
        // Half a frame of checks at most, so the encoded batch always fits.
        let mut bytes = 0;
        let take = rest
            .iter()
            .take(limits.max_batch.max(1))
            .take_while(|t| {
                bytes += t.key.len() + CHECK_OVERHEAD_BYTES;
                bytes <= limits.max_frame_bytes / 2
            })
            .count()
            .max(1);
        let (chunk, later) = rest.split_at(take);
        rest = later;
        let groups = chunk
            .iter()
            .map(|t| vec![WireCheck::new(t.key.clone(), &t.limit, t.cost)])
            .collect();
        match run_batch(shared, groups).await {
            Ok(decisions) => answers.extend(
                decisions
                    .iter()
                    .map(|d| d.to_decision().map_err(|code| code.to_string())),
            ),
            Err(Undecided(why)) => answers.extend(chunk.iter().map(|_| Err(why.clone()))),
        }
    }
    answers
}
