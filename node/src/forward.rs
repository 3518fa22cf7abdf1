//! Answers a check batch whose groups may belong to other nodes: decides this node's groups,
//! forwards the others once (one frame per owner, all at once, marked so they are never
//! forwarded again), and decides a group here when its owner does not answer in time.

use std::collections::BTreeMap;

use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, ErrorCode, Frame, FrameKind, FrameReader, WireCheck,
    WireDecision, decode_decisions, encode_message,
};
use rkyv::rancor;

use crate::metrics::DecisionTally;
use crate::server::Shared;
use crate::service::{decide_group, decode_frame, finish_batch};

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
    let table = cluster.table();
    let me = cluster.me.id.as_str();
    // Owner of each group: where its first key lives (a client groups keys of one owner).
    let mut remote: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    if frame.kind == FrameKind::CheckBatch {
        for (i, group) in groups.iter().enumerate() {
            if let Some(owner) = table.owner(group[0].key.slot())
                && owner != me
            {
                remote.entry(owner).or_default().push(i);
            }
        }
    }
    let mut answers: Vec<Option<Vec<WireDecision>>> = vec![None; groups.len()];
    if !remote.is_empty() {
        // Already validated by decode_frame, so this access succeeds; the groups re-encode as sent.
        let archived = rkyv::access::<ArchivedCheckBatch, rancor::Error>(&frame.payload).ok();
        let mut forwards = tokio::task::JoinSet::new();
        for (&owner, indices) in &remote {
            let (Some(archived), Some(addr)) = (archived, cluster.addr_of(owner)) else {
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
            let (indices, max) = (indices.clone(), limits.max_frame_bytes);
            forwards.spawn(async move { (indices, peers.request(&addr, &bytes, max + 64).await) });
        }
        while let Some(Ok((indices, answer))) = forwards.join_next().await {
            if let Ok(decisions) = answer
                .map_err(|e| e.to_string())
                .and_then(|bytes| decisions_of(&bytes))
            {
                let sizes: Vec<usize> = indices.iter().map(|&i| groups[i].len()).collect();
                if decisions.len() == sizes.iter().sum::<usize>() {
                    let mut rest = decisions.as_slice();
                    for (&i, size) in indices.iter().zip(sizes) {
                        answers[i] = Some(rest[..size].to_vec());
                        rest = &rest[size..];
                    }
                }
            }
        }
    }
    // Ours, and any group whose owner did not answer (availability over exactness: counted).
    let mut tally = DecisionTally::default();
    let mut decisions = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    for (group, answer) in groups.iter().zip(answers) {
        match answer {
            Some(forwarded) => decisions.extend(forwarded),
            None => decide_group(&shared.store, &mut tally, now_ns, group, &mut decisions),
        }
    }
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
