//! Sends groups of a received batch on to the nodes that decide them, one forwarded frame per
//! node, all at once, and splits each node's answer back into its groups. Used for a group's
//! owner in this region (`forward.rs`) and in a home region (`reach.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, CheckGroups, FrameKind, WireDecision, decode_decisions,
};

use crate::check_path::CheckPath;

/// What one node is sent: the indices of its groups and the encoded frame that carries them.
pub(crate) struct OwnerBatch {
    pub(crate) owner: String,
    pub(crate) indices: Vec<usize>,
    pub(crate) frame: Vec<u8>,
    /// How long to wait for its answer.
    pub(crate) within: Duration,
}

/// One group's answer from the node it was sent to.
pub(crate) struct GroupAnswer {
    pub(crate) owner: String,
    pub(crate) group: usize,
    pub(crate) decisions: Vec<WireDecision>,
}

/// Builds one batch per node of `by_owner` from the received frame: `encode` turns a node's
/// indices and its groups into the frame and the time to wait for it. Nothing when the frame
/// does not unpack (it was validated when read, so it does).
pub(crate) fn batches(
    archived: Option<&ArchivedCheckBatch>,
    by_owner: BTreeMap<String, Vec<usize>>,
    mut encode: impl FnMut(&[usize], CheckBatch) -> (Vec<u8>, Duration),
) -> Vec<OwnerBatch> {
    let Some(Ok(mut sent)) = archived.map(ArchivedCheckBatch::unpack) else {
        return Vec::new();
    };
    by_owner
        .into_iter()
        .map(|(owner, indices)| {
            // Each group goes to one node, so it is moved, not copied.
            let batch = CheckBatch {
                groups: indices
                    .iter()
                    .filter_map(|&i| sent.groups.get_mut(i).map(std::mem::take))
                    .collect(),
            };
            let (frame, within) = encode(&indices, batch);
            OwnerBatch {
                owner,
                indices,
                frame,
                within,
            }
        })
        .collect()
}

/// Sends every batch at once and returns the answers of the groups whose node answered in
/// full (a node whose address is unknown, that did not answer in time, or whose answer does
/// not match what was sent leaves its groups out). `groups` gives each group's size.
pub(crate) async fn send(
    checks: &CheckPath,
    batches: Vec<OwnerBatch>,
    groups: &CheckGroups,
) -> Vec<GroupAnswer> {
    let max = checks.limits.max_frame_bytes;
    let mut forwards = tokio::task::JoinSet::new();
    for batch in batches {
        let Some(addr) = checks.members.addr_of(&batch.owner) else {
            continue;
        };
        let peers = checks.peers.clone();
        forwards.spawn(async move {
            let answer = peers
                .request_within(
                    batch.within,
                    &addr,
                    &batch.frame,
                    max + 64,
                    FrameKind::DecisionBatch,
                )
                .await;
            (batch.owner, batch.indices, answer)
        });
    }
    let mut answers = Vec::new();
    while let Some(Ok((owner, indices, answer))) = forwards.join_next().await {
        let Ok(Ok((decisions, _))) = answer.map(|f| decode_decisions(&f.payload)) else {
            continue;
        };
        let sizes: Vec<usize> = indices.iter().map(|&i| groups[i].len()).collect();
        if decisions.len() != sizes.iter().sum::<usize>() {
            continue;
        }
        let mut rest = decisions.as_slice();
        for (&group, size) in indices.iter().zip(sizes) {
            answers.push(GroupAnswer {
                owner: owner.clone(),
                group,
                decisions: rest[..size].to_vec(),
            });
            rest = &rest[size..];
        }
    }
    answers
}
