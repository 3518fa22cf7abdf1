//! Where calls go: the routes (links, and the slot → link map of the table in force) every
//! call reads, replaced whole when the table or the links change.

use std::sync::Arc;

use arc_swap::ArcSwap;
use floodgate::cluster::{SLOTS, slot_of};
use tokio::sync::watch;

use crate::cluster_table::ClusterTable;
use crate::link::NodeLink;
use crate::router::Router;
use crate::table_feed::TableHint;

/// No link for a slot's owner.
pub(crate) const NONE: u16 = u16::MAX;

/// Where calls go now: a snapshot, replaced whole when the table or the links change.
#[derive(Debug)]
pub(crate) struct Routes {
    /// The seeds first (in the order given to `connect`), then the members discovered.
    pub(crate) links: Vec<Arc<NodeLink>>,
    pub(crate) table: Option<Arc<ClusterTable>>,
    /// Per slot, the index in `links` of its owner's link (`NONE`: no table, or no link).
    pub(crate) slot_link: Box<[u16]>,
    /// Per slot, the index in `links` of its successor's link (`NONE`: none).
    pub(crate) successor_link: Box<[u16]>,
    /// Before a table is known: a stable hash over the seeds.
    pub(crate) fallback: Router,
}

impl Routes {
    fn seeds_only(seeds: Vec<Arc<NodeLink>>) -> Self {
        Routes {
            fallback: Router::new(seeds.len()),
            links: seeds,
            table: None,
            slot_link: vec![NONE; SLOTS].into_boxed_slice(),
            successor_link: vec![NONE; SLOTS].into_boxed_slice(),
        }
    }

    /// Index in `links` of the node that decides a call whose first key is `key`.
    pub(crate) fn route(&self, key: &[u8]) -> usize {
        if self.table.is_some() {
            let index = self.slot_link[usize::from(slot_of(key))];
            if index != NONE {
                return usize::from(index);
            }
        }
        self.fallback.route(key)
    }

    /// Index in `links` of the node that takes over `key`'s slot when its owner is
    /// unreachable, if the table names one with a link.
    pub(crate) fn successor(&self, key: &[u8]) -> Option<usize> {
        let index = self.successor_link[usize::from(slot_of(key))];
        (index != NONE).then_some(usize::from(index))
    }
}

/// The routing state the client reads on every call and the refresher replaces: read through
/// an `ArcSwap` (a reference count, no lock: a watch's read lock moved its cache line between
/// the cores of callers on every call), and announced through a watch, so callers can await
/// the next table ([`TableChanges`]).
#[derive(Debug)]
pub(crate) struct Routing {
    current: ArcSwap<Routes>,
    changes: watch::Sender<Arc<Routes>>,
    pub(crate) hint: Arc<TableHint>,
}

impl Routing {
    /// Routing over the seeds until a table arrives.
    pub(crate) fn new(seeds: Vec<Arc<NodeLink>>) -> Self {
        let hint = Arc::new(TableHint::default());
        for link in &seeds {
            let _ = link.table_hint.set(hint.clone());
        }
        let routes = Arc::new(Routes::seeds_only(seeds));
        Routing {
            current: ArcSwap::new(routes.clone()),
            changes: watch::Sender::new(routes),
            hint,
        }
    }

    /// The current routes (a cheap snapshot: one reference count).
    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.current.load_full()
    }

    /// Routes every later call by `routes`, and wakes those waiting for a change.
    pub(crate) fn replace(&self, routes: Routes) {
        let routes = Arc::new(routes);
        self.current.store(routes.clone());
        self.changes.send_replace(routes);
    }

    /// The table calls are routed by, once one was fetched.
    pub(crate) fn table(&self) -> Option<Arc<ClusterTable>> {
        self.current.load().table.clone()
    }

    pub(crate) fn changes(&self) -> TableChanges {
        TableChanges(self.changes.subscribe())
    }
}

/// Wakes each time the client adopts new routes (a new slot table, or links to new members):
/// for tools and tests that wait for discovery instead of polling.
#[derive(Debug)]
pub struct TableChanges(watch::Receiver<Arc<Routes>>);

impl TableChanges {
    /// Waits for the next change; false once the client is gone.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}
