//! Sends groups of a received batch on to the nodes that decide them, one forwarded frame per
//! node, all at once, and splits each node's answer back into its groups. Used for a group's
//! owner in this region (`forward.rs`, its plain groups coalesced with other batches' by
//! `forward_queue`) and in a home region (`reach.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use floodgate::wire::{
    ArchivedCheckBatch, CheckBatch, CheckGroups, FrameKind, WireCheck, WireDecision,
    decode_decisions,
};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::check_path::CheckPath;
use crate::forward_queue::RoundLimits;

/// What one node is sent: the indices of its groups and what carries them.
pub(crate) struct OwnerBatch {
    pub(crate) owner: String,
    pub(crate) indices: Vec<usize>,
    pub(crate) outgoing: Outgoing,
    /// How long to wait for its answer.
    pub(crate) within: Duration,
}

/// How a node's groups travel.
pub(crate) enum Outgoing {
    /// A kind 10 frame of the table of this version, with what other batches forward to the
    /// same owner meanwhile (`forward_queue`).
    Coalesced {
        groups: Vec<Vec<WireCheck>>,
        table_version: u64,
    },
    /// An encoded frame of their own.
    Frame(Vec<u8>),
}

/// One group's answer from the node it was sent to.
pub(crate) struct GroupAnswer {
    pub(crate) owner: String,
    pub(crate) group: usize,
    pub(crate) decisions: Vec<WireDecision>,
}

/// The batch as it arrived, from which the groups sent on are taken.
#[derive(Clone, Copy)]
pub(crate) enum Received<'a> {
    /// A frame's validated archive (a QUIC client's or a peer's): unpacked once, when a group
    /// of it is sent on.
    Archived(&'a ArchivedCheckBatch),
    /// A front's own groups (the RLS and RESP fronts build them): those sent on are copied,
    /// with no archive made and unpacked again on the way.
    Groups(&'a [Vec<WireCheck>]),
}

/// The groups a batch's forwards are taken from.
enum SentGroups<'a> {
    Unpacked(Vec<Vec<WireCheck>>),
    Borrowed(&'a [Vec<WireCheck>]),
}

impl SentGroups<'_> {
    /// Group `i`: each goes to one node, so an unpacked one is moved, a borrowed one copied.
    fn take(&mut self, i: usize) -> Option<Vec<WireCheck>> {
        match self {
            SentGroups::Unpacked(groups) => groups.get_mut(i).map(std::mem::take),
            SentGroups::Borrowed(groups) => groups.get(i).cloned(),
        }
    }
}

/// Builds one batch per node of `by_owner` from the received batch: `encode` turns a node's
/// indices and its groups into what carries them and the time to wait for it. Nothing when the
/// archive does not unpack (it was validated when read, so it does).
pub(crate) fn batches(
    received: Option<Received<'_>>,
    by_owner: BTreeMap<String, Vec<usize>>,
    mut encode: impl FnMut(&[usize], CheckBatch) -> (Outgoing, Duration),
) -> Vec<OwnerBatch> {
    let mut sent = match received {
        Some(Received::Archived(archived)) => match archived.unpack() {
            Ok(batch) => SentGroups::Unpacked(batch.groups),
            Err(_) => return Vec::new(),
        },
        Some(Received::Groups(groups)) => SentGroups::Borrowed(groups),
        None => return Vec::new(),
    };
    by_owner
        .into_iter()
        .map(|(owner, indices)| {
            let batch = CheckBatch {
                groups: indices.iter().filter_map(|&i| sent.take(i)).collect(),
            };
            let (outgoing, within) = encode(&indices, batch);
            OwnerBatch {
                owner,
                indices,
                outgoing,
                within,
            }
        })
        .collect()
}

/// Sends every batch at once and returns the answers of the groups whose node answered in
/// full (a node whose address is unknown, that did not answer in time, or whose answer does
/// not match what was sent leaves its groups out). `groups` gives each group's size. The sends
/// wait side by side in the caller's task, given up if it is dropped. With a task each, every
/// forward cost a spawn, and each task, done, gave the caller's connection a turn of its own:
/// an RLS connection wrote the answers of calls that came back in one forwarded round one
/// TCP segment each (0.6 writes per call through a cluster's fronts, 0.2 since).
pub(crate) async fn send(
    checks: &CheckPath,
    batches: Vec<OwnerBatch>,
    groups: &CheckGroups,
) -> Vec<GroupAnswer> {
    let max_answer_bytes = checks.limits.max_frame_bytes + 64;
    let limits = RoundLimits::of(&checks.limits);
    let mut forwards = FuturesUnordered::new();
    for batch in batches {
        let Some(addr) = checks.members.addr_of(&batch.owner) else {
            continue;
        };
        let (peers, queues) = (&checks.peers, &checks.forwards);
        forwards.push(async move {
            let decisions = match batch.outgoing {
                Outgoing::Coalesced {
                    groups,
                    table_version,
                } => {
                    let within = batch.within;
                    queues
                        .forward(
                            peers,
                            &addr,
                            groups,
                            table_version,
                            within,
                            limits,
                            max_answer_bytes,
                        )
                        .await
                }
                Outgoing::Frame(frame) => {
                    let kind = FrameKind::DecisionBatch;
                    let answer = peers
                        .request_within(batch.within, &addr, &frame, max_answer_bytes, kind)
                        .await;
                    answer
                        .ok()
                        .and_then(|f| decode_decisions(&f.payload).ok())
                        .map(|(decisions, _)| decisions)
                }
            };
            (batch.owner, batch.indices, decisions)
        });
    }
    let mut answers = Vec::new();
    while let Some((owner, indices, decisions)) = forwards.next().await {
        let Some(decisions) = decisions else {
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
