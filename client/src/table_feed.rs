//! How the client learns slot tables: fetching one (`TableRequest` → `SlotTable`), following a
//! node's pushes, and the hints answers give that the table changed ([`TableHint`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate::wire::{FrameKind, FrameReader, decode_slot_table, encode_frame};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::address::{HostPort, resolve};
use crate::cluster_table::ClusterTable;
use crate::config::{ClientConfig, validate_nodes};
use crate::error::ClientError;
use crate::request::{AnswerError, request_frame};
use crate::{dial, tls};

/// Longest one fetch (connection included) may take before the next candidate node is tried.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest slot-table answer accepted (4,096 owners and up to 1,024 members fit easily).
const MAX_TABLE_BYTES: usize = 1 << 20;

/// What answers tell the refresher: a node has another table version than ours, or a link went
/// down. Cheap to consult on every answer (one atomic load while the versions agree).
#[derive(Debug, Default)]
pub(crate) struct TableHint {
    /// Version of the table calls are routed by (0: none yet).
    pub(crate) current: AtomicU64,
    /// The node that last reported another version: asked first.
    pub(crate) from: Mutex<Option<SocketAddr>>,
    /// The latest table a node pushed, not yet applied.
    pub(crate) pushed: Mutex<Option<ClusterTable>>,
    pub(crate) wake: Notify,
}

impl TableHint {
    /// A node answered with its table `version` (0: it is in no cluster).
    pub(crate) fn saw(&self, version: u64, node: SocketAddr) {
        if version == 0 || version == self.current.load(Ordering::Relaxed) {
            return;
        }
        *self.from.lock() = Some(node);
        self.wake.notify_one();
    }

    /// A node pushed its table: routed by at once when it is another version.
    pub(crate) fn pushed(&self, table: ClusterTable) {
        if table.version() == self.current.load(Ordering::Relaxed) {
            return;
        }
        *self.pushed.lock() = Some(table);
        self.wake.notify_one();
    }

    pub(crate) fn poke(&self) {
        self.wake.notify_one();
    }
}

/// Subscribes to `node`'s table pushes over `conn` (a `TableRequest` on a unidirectional
/// stream) and hands every table it pushes to the refresher, until the connection ends.
pub(crate) async fn follow_pushes(conn: quinn::Connection, hint: Arc<TableHint>, node: SocketAddr) {
    let subscribed = async {
        let mut frame = Vec::new();
        encode_frame(&mut frame, FrameKind::TableRequest, 0, &[]);
        let mut stream = conn.open_uni().await.map_err(|e| e.to_string())?;
        stream.write_all(&frame).await.map_err(|e| e.to_string())?;
        stream.finish().map_err(|e| e.to_string())
    };
    if let Err(why) = tokio::time::timeout(FETCH_TIMEOUT, subscribed)
        .await
        .unwrap_or_else(|_| Err("timed out".to_owned()))
    {
        tracing::debug!(%node, "no table pushes: {why}");
        return;
    }
    while let Ok(mut recv) = conn.accept_uni().await {
        let Ok(Ok(bytes)) =
            tokio::time::timeout(FETCH_TIMEOUT, recv.read_to_end(MAX_TABLE_BYTES)).await
        else {
            continue;
        };
        let mut reader = FrameReader::new(MAX_TABLE_BYTES);
        reader.extend(&bytes);
        match reader.next_frame() {
            Ok(Some(frame)) if frame.kind == FrameKind::SlotTable => {
                match decode_slot_table(frame.version, &frame.payload) {
                    Ok(message) => match ClusterTable::from_message(message) {
                        Ok(table) => hint.pushed(table),
                        Err(why) => tracing::debug!(%node, "bad pushed table: {why}"),
                    },
                    Err((_, why)) => tracing::debug!(%node, "bad pushed table: {why}"),
                }
            }
            other => tracing::debug!(%node, "unexpected push: {other:?}"),
        }
    }
}

/// Asks for the table on a fresh stream of `conn` and validates the answer.
pub(crate) async fn request_table(conn: &quinn::Connection) -> Result<ClusterTable, String> {
    let frame = request_frame(
        conn,
        FrameKind::TableRequest,
        &[],
        FrameKind::SlotTable,
        MAX_TABLE_BYTES,
    )
    .await?;
    let message = decode_slot_table(frame.version, &frame.payload)
        .map_err(|(_, why)| AnswerError::Failed(why))?;
    ClusterTable::from_message(message)
}

/// Fetches the slot table from the first of `nodes` that gives one (for tools such as
/// `floodgate status`). Each node is given `config.connect_timeout` to resolve its name, and as
/// long to connect and answer; it is verified by `config.server_name`, else its host.
pub async fn fetch_slot_table<A: Clone + Into<HostPort>>(
    nodes: &[A],
    config: &ClientConfig,
) -> Result<ClusterTable, ClientError> {
    let nodes: Vec<HostPort> = nodes.iter().cloned().map(Into::into).collect();
    validate_nodes(&nodes)?;
    config.validate()?;
    let quic = tls::quinn_config(config)?;
    let mut errors = Vec::new();
    for node in &nodes {
        let addr = match resolve(node, config.connect_timeout).await {
            Ok(addrs) => addrs[0],
            Err(why) => {
                errors.push(why);
                continue;
            }
        };
        let endpoint = dial::endpoint_for(addr, quic.clone())?;
        let fetched = tokio::time::timeout(config.connect_timeout, async {
            let name = (config.server_name.clone()).unwrap_or_else(|| node.host().to_owned());
            let conn = dial::connect(&endpoint, addr, &name, config.connect_timeout).await?;
            let table = request_table(&conn).await;
            conn.close(0u32.into(), b"done");
            table
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", config.connect_timeout)));
        let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
        match fetched {
            Ok(table) => return Ok(table),
            Err(why) => errors.push(format!("{node}: {why}")),
        }
    }
    Err(ClientError::Unavailable(errors.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_wake_only_for_another_nonzero_version() {
        let hint = TableHint::default();
        hint.current.store(7, Ordering::Relaxed);
        let node: SocketAddr = "127.0.0.1:1".parse().unwrap();
        hint.saw(7, node);
        hint.saw(0, node);
        assert_eq!(*hint.from.lock(), None);
        hint.saw(8, node);
        assert_eq!(*hint.from.lock(), Some(node));
    }
}
