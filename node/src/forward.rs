//! Answers a check batch in a cluster: decides this node's groups, forwards the others once (one
//! frame per owner, all at once, marked so they are never forwarded again), and decides a group
//! here when its owner does not answer in time.
//!
//! Order matters for exactness when slots move: first wait (bounded) for the hand-off of any
//! slot this node just gained, then read the table and decide the local groups without awaiting
//! anything in between, so a decision never uses ownership older than a few microseconds.

use std::collections::BTreeMap;

use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, ErrorCode, Frame, FrameKind, FrameReader, ValidCheck,
    WireCheck, WireDecision, decode_decisions, encode_message,
};
use rkyv::rancor;

use crate::metrics::DecisionTally;
use crate::server::Shared;
use crate::service::{decide_group, decode_frame, finish_batch};

/// Longest a node waits for its slot table to catch up with a peer that forwarded it checks.
const TABLE_CATCH_UP: std::time::Duration = std::time::Duration::from_millis(300);

pub(crate) async fn answer_check_batch(
    shared: &Shared,
    frame: &Frame,
    now_ns: u64,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let limits = shared.config.limits;
    let groups = match decode_frame(frame, &limits.wire(), out) {
        Ok(groups) => groups,
        Err(code) => return Some(code),
    };
    let cluster = &shared.cluster;
    if frame.kind == FrameKind::ForwardedCheckBatch {
        // The sender's table already names this node as owner; if ours does not yet, ours is
        // the older one: wait (bounded) for it, so the hand-off wait below sees the change.
        let mut tables = cluster.watch_table();
        let me = cluster.me.id.clone();
        let not_mine = |table: &floodgate::cluster::SlotTable| {
            groups
                .iter()
                .any(|g| table.owner(g[0].key.slot()) != Some(me.as_str()))
        };
        let behind = not_mine(&tables.borrow_and_update());
        if behind {
            let _ = tokio::time::timeout(TABLE_CATCH_UP, tables.changed()).await;
        }
    }
    // Gained slots wait for their previous owner's hand-off (a no-op almost always).
    cluster
        .wait_for_handoffs(groups.iter().map(|g| g[0].key.slot()), now_ns)
        .await;
    let table = cluster.table();
    let me = cluster.me.id.as_str();
    // Owner of each group: where its first key lives (a client groups keys of one owner). A
    // forwarded batch is decided here whatever the table says: it is never forwarded twice.
    let mut remote: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut local = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    let mut placed = Vec::with_capacity(groups.len());
    let mut tally = DecisionTally::default();
    for (i, group) in groups.iter().enumerate() {
        match table.owner(group[0].key.slot()) {
            Some(owner) if owner != me && frame.kind == FrameKind::CheckBatch => {
                remote.entry(owner.to_owned()).or_default().push(i);
                placed.push(Placed::Forwarded(None));
            }
            _ => {
                let start = local.len();
                decide_group(&shared.store, &mut tally, now_ns, group, &mut local);
                placed.push(Placed::Here(start..local.len()));
            }
        }
    }
    let decisions = if remote.is_empty() {
        local
    } else {
        forward(shared, frame, &groups, &remote, &mut placed).await;
        // A node that has left (it is not in its own table) must not decide: its buckets are
        // gone to their new owners, so a decision here would be fresh. The client's failure mode
        // decides instead.
        let leaving = !table.nodes().iter().any(|n| n == me);
        let mut decisions = Vec::with_capacity(local.capacity());
        for (group, place) in groups.iter().zip(placed) {
            match place {
                Placed::Here(range) => decisions.extend_from_slice(&local[range]),
                Placed::Forwarded(Some(answer)) => decisions.extend(answer),
                Placed::Forwarded(None) if leaving => {
                    decisions.extend(std::iter::repeat_n(
                        WireDecision::error(ErrorCode::ShuttingDown),
                        group.len(),
                    ));
                }
                // An owner that did not answer: decide here (availability over exactness;
                // these buckets replicate to the owner like any other).
                Placed::Forwarded(None) => {
                    decide_group(&shared.store, &mut tally, now_ns, group, &mut decisions)
                }
            }
        }
        decisions
    };
    finish_batch(
        &shared.metrics,
        &tally,
        frame.request_id,
        decisions,
        table.version(),
        out,
    );
    None
}

/// Where a group's decisions are: decided here (a range of the local decisions), or expected
/// from its owner (`None` until an answer arrives in time).
enum Placed {
    Here(std::ops::Range<usize>),
    Forwarded(Option<Vec<WireDecision>>),
}

/// Sends each owner its groups (re-encoded from the validated archive) and fills `placed`
/// with what comes back in time.
async fn forward(
    shared: &Shared,
    frame: &Frame,
    groups: &[Vec<ValidCheck>],
    remote: &BTreeMap<String, Vec<usize>>,
    placed: &mut [Placed],
) {
    // Already validated by decode_frame, so this access succeeds.
    let Ok(archived) = rkyv::access::<ArchivedCheckBatch, rancor::Error>(&frame.payload) else {
        return;
    };
    let cluster = &shared.cluster;
    let max = shared.config.limits.max_frame_bytes;
    let mut forwards = tokio::task::JoinSet::new();
    for (owner, indices) in remote {
        let Some(addr) = cluster.addr_of(owner) else {
            continue;
        };
        let batch = CheckBatch {
            groups: indices
                .iter()
                .filter_map(|&i| {
                    rkyv::deserialize::<Vec<WireCheck>, rancor::Error>(&archived.groups[i]).ok()
                })
                .collect(),
        };
        let mut bytes = Vec::new();
        encode_message(&mut bytes, FrameKind::ForwardedCheckBatch, 1, &batch);
        shared
            .metrics
            .forwarded
            .increment(indices.iter().map(|&i| groups[i].len() as u64).sum());
        let peers = cluster.peers.clone();
        let indices = indices.clone();
        forwards.spawn(async move { (indices, peers.request(&addr, &bytes, max + 64).await) });
    }
    while let Some(Ok((indices, answer))) = forwards.join_next().await {
        let Ok(decisions) = answer
            .map_err(|e| e.to_string())
            .and_then(|bytes| decisions_of(&bytes))
        else {
            continue;
        };
        let sizes: Vec<usize> = indices.iter().map(|&i| groups[i].len()).collect();
        if decisions.len() != sizes.iter().sum::<usize>() {
            continue;
        }
        let mut rest = decisions.as_slice();
        for (&i, size) in indices.iter().zip(sizes) {
            placed[i] = Placed::Forwarded(Some(rest[..size].to_vec()));
            rest = &rest[size..];
        }
    }
}

fn decisions_of(bytes: &[u8]) -> Result<Vec<WireDecision>, String> {
    let mut reader = FrameReader::new(bytes.len().max(16));
    reader.extend(bytes);
    match reader.next_frame() {
        Ok(Some(frame)) if frame.kind == FrameKind::DecisionBatch => {
            decode_decisions(&frame.payload)
                .map(|(d, _)| d)
                .map_err(|(_, m)| m)
        }
        other => Err(format!("unexpected answer to a forwarded batch: {other:?}")),
    }
}
