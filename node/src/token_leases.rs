//! Kind 18: token leases for hot keys, decided where checks are decided. The owner (or the
//! successor taking a lost owner over) first refunds what a gateway returns, then grants up to
//! what it asks from the bucket (`floodgate::token_lease::take_up_to`); a grant consumes the
//! bucket like a check, so it is replicated and handed off like any consumed bucket. A request
//! for a slot this node does not decide is answered `not_owner`: the gateway then checks that
//! key the ordinary way (which forwards) until its table leads it to the owner.

use floodgate::BucketStore;
use floodgate::cluster::ownership::{Arrival, Placement, Refusal};
use floodgate::token_lease::take_up_to;
use floodgate::wire::{
    ErrorCode, Frame, FrameKind, TokenLeaseAnswer, TokenLeaseAnswers, ValidTokenLease,
    decode_token_lease_batch, encode_message,
};

use crate::caller::Caller;
use crate::check_path::CheckPath;
use crate::service::encode_error;

/// Answers one kind 18 frame from `caller`: a kind 19 frame, or an error frame when it is
/// refused whole.
pub(crate) async fn answer_token_leases(
    checks: &CheckPath,
    caller: Caller<'_>,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let requests = match decode_token_lease_batch(&frame.payload, &checks.limits.wire()) {
        Ok(requests) => requests,
        Err((code, message)) => {
            encode_error(out, frame.request_id, code, message);
            return Some(code);
        }
    };
    checks.slots.wait_until_joined().await;
    let slots = || requests.iter().map(|r| r.key.slot());
    // Gained slots wait for their previous owner's hand-off, as checks do; then everything is
    // placed and decided under the deciding gate, so a table switch's hand-off holds it.
    let deciding = checks.slots.enter_deciding(slots(), now_ns).await;
    let (placements, table_version) = checks.slots.place_each(
        requests
            .iter()
            .map(|r| (r.key.slot(), Arrival::from_client(r.takeover))),
        now_ns,
    );
    let mut tally = Tally::default();
    let answers = requests
        .iter()
        .zip(placements)
        .map(|(request, placement)| match placement {
            Placement::Decide | Placement::Takeover => {
                decide(&checks.store, caller, request, now_ns, &mut tally)
            }
            // Forwarding a lease would make the forwarder hold nothing: the client asks its
            // owner, or checks the key as usual.
            Placement::Forward(_) | Placement::Refuse(Refusal::NotOwner) => {
                TokenLeaseAnswer::error(ErrorCode::NotOwner)
            }
            // Waited for the hand-off already; lease callers know no `try_again`.
            Placement::Refuse(Refusal::ShuttingDown | Refusal::TryAgain) => {
                TokenLeaseAnswer::error(ErrorCode::ShuttingDown)
            }
        })
        .collect();
    drop(deciding);
    tally.record();
    encode_message(
        out,
        FrameKind::TokenLeaseAnswers,
        frame.request_id,
        &TokenLeaseAnswers {
            answers,
            table_version,
        },
    );
    None
}

/// Refunds what is returned (at most what `caller` was granted on the key), then grants what
/// the bucket holds of what is wanted.
fn decide(
    store: &BucketStore,
    caller: Caller<'_>,
    request: &ValidTokenLease,
    now_ns: u64,
    tally: &mut Tally,
) -> TokenLeaseAnswer {
    if request.returning > 0 {
        let returned = caller.take_returned(request.key, request.returning);
        store.refund(request.key, &request.limit, returned, now_ns);
        tally.returned += returned;
        tally.refused += request.returning - returned;
    }
    match take_up_to(store, request.key, &request.limit, request.want, now_ns) {
        Ok(grant) => {
            caller.granted_tokens(request.key, grant.granted);
            tally.granted += grant.granted;
            tally.empty += u64::from(grant.granted == 0 && request.want > 0);
            TokenLeaseAnswer::from(grant)
        }
        Err(_) => TokenLeaseAnswer::error(ErrorCode::StoreFull),
    }
}

/// One frame's token counts, added to the metrics once.
#[derive(Default)]
struct Tally {
    granted: u64,
    returned: u64,
    /// Returned beyond what the gateway was granted: not given back.
    refused: u64,
    empty: u64,
}

impl Tally {
    fn record(&self) {
        let tokens = "floodgate_token_lease_tokens_total";
        metrics::counter!(tokens, "direction" => "granted").increment(self.granted);
        metrics::counter!(tokens, "direction" => "returned").increment(self.returned);
        metrics::counter!(tokens, "direction" => "refused").increment(self.refused);
        metrics::counter!("floodgate_token_lease_empty_total").increment(self.empty);
    }
}
