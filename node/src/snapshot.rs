//! `--state-dir`: long-period buckets written to disk every second (when changed) and at
//! shutdown, and loaded at start, so a used-up daily quota survives a restart.
//!
//! Writes are atomic (temporary file, fsync, rename, fsync of the directory): after `kill -9` the
//! file is the last complete snapshot, at most one interval old. A file that fails validation is
//! logged at ERROR with the reason, moved aside (never overwritten), and the node starts empty.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use floodgate::store::snapshot::{
    SNAPSHOT_HEADER_BYTES, SNAPSHOT_TRAILER_BYTES, decode_snapshot_limited, encode_snapshot,
    is_live, is_long_period, max_snapshot_bytes, snapshot_content_hash,
};
use floodgate::{BucketStore, Clock, EpochClock};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::metrics::NodeMetrics;

/// The snapshot's file name inside the state directory.
pub const SNAPSHOT_FILE: &str = "buckets.snapshot";
/// How often the store is checked for changes worth writing: what `kill -9` can lose at most.
const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);

/// Writes and loads the snapshot of one state directory. One writer at a time (the periodic task
/// and the final write on shutdown share the lock).
#[derive(Debug)]
pub(crate) struct Snapshots {
    dir: PathBuf,
    writer: Mutex<Writer>,
}

#[derive(Debug, Default)]
struct Writer {
    /// Content hash of the last snapshot written or found unchanged; `None` until the first.
    written: Option<u64>,
    /// When the file was last known to match the store.
    current_at: Option<Instant>,
}

/// What one snapshot attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Written { buckets: usize, bytes: usize },
    Unchanged,
}

impl Snapshots {
    /// Creates the directory when missing and removes a temporary file a crash left behind (it
    /// is incomplete by definition; the real file is the last complete snapshot).
    pub(crate) fn open(dir: &Path) -> anyhow::Result<Arc<Snapshots>> {
        fs::create_dir_all(dir)
            .with_context(|| format!("--state-dir {}: cannot create it", dir.display()))?;
        let snapshots = Snapshots {
            dir: dir.to_owned(),
            writer: Mutex::new(Writer::default()),
        };
        match fs::remove_file(snapshots.temp_path()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(e).with_context(|| {
                    format!(
                        "--state-dir {}: cannot remove the unfinished {}",
                        dir.display(),
                        snapshots.temp_path().display()
                    )
                });
            }
            _ => {}
        }
        Ok(Arc::new(snapshots))
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_FILE)
    }

    fn temp_path(&self) -> PathBuf {
        self.dir.join(format!("{SNAPSHOT_FILE}.tmp"))
    }

    /// Loads the snapshot into `store` through the same merge as state received from peers.
    /// Returns how many buckets were loaded. Never fails: a missing file means a first start, a
    /// bad one is reported, moved aside, and the node starts empty.
    pub(crate) fn load(
        &self,
        store: &BucketStore,
        clock: &EpochClock,
        metrics: &NodeMetrics,
    ) -> usize {
        let now_ns = clock.now_ns();
        let path = self.path();
        let bytes = match read_bounded(&path, snapshot_bound(store)) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                tracing::info!(file = %path.display(), "no snapshot yet: starting empty");
                return 0;
            }
            Err(reason) => {
                metrics.snapshot_refused.increment(1);
                self.refuse(&path, &reason);
                return 0;
            }
        };
        let snapshot = match decode_snapshot_limited(&bytes, store.max_keys()) {
            Ok(snapshot) => snapshot,
            Err(e) => {
                metrics.snapshot_refused.increment(1);
                self.refuse(&path, &e.to_string());
                return 0;
            }
        };
        let total = snapshot.buckets.len();
        let live: Vec<_> = snapshot
            .buckets
            .into_iter()
            .filter(|b| is_live(b, now_ns))
            .collect();
        let refused = store.merge(&live, now_ns);
        let age_s = now_ns.saturating_sub(snapshot.written_unix_ns) as f64 / 1e9;
        tracing::info!(
            file = %path.display(),
            loaded = live.len() - refused,
            expired = total - live.len(),
            refused_for_room = refused,
            age_s,
            "snapshot loaded"
        );
        live.len() - refused
    }

    /// Logs why the file was refused and moves it aside, so the next write cannot replace the
    /// evidence and the next start does not trip over it again.
    fn refuse(&self, path: &Path, reason: &str) {
        let aside = self.dir.join(format!(
            "{SNAPSHOT_FILE}.corrupt-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        ));
        match fs::rename(path, &aside) {
            Ok(()) => tracing::error!(
                "snapshot {} refused: {reason}; starting with no saved buckets; the file is kept as {}",
                path.display(),
                aside.display()
            ),
            Err(e) => tracing::error!(
                "snapshot {} refused: {reason}; starting with no saved buckets; moving it aside to {} failed ({e}), so the next snapshot will replace it",
                path.display(),
                aside.display()
            ),
        }
    }

    /// Writes the store's long-period buckets if they changed since the last write. Blocking
    /// (file system calls and fsync): run it off the async workers.
    pub(crate) fn write_if_changed(&self, store: &BucketStore, now_ns: u64) -> io::Result<Outcome> {
        let mut writer = self.writer.lock();
        let mut buckets = Vec::new();
        store.export_matching(now_ns, &|b| is_long_period(b, now_ns), &mut buckets);
        let mut bytes = Vec::new();
        encode_snapshot(&buckets, now_ns, &mut bytes);
        let hash = snapshot_content_hash(&bytes);
        if writer.written == Some(hash) {
            writer.current_at = Some(Instant::now());
            return Ok(Outcome::Unchanged);
        }
        write_atomically(&self.dir, &self.temp_path(), &self.path(), &bytes)?;
        writer.written = Some(hash);
        writer.current_at = Some(Instant::now());
        Ok(Outcome::Written {
            buckets: buckets.len(),
            bytes: bytes.len(),
        })
    }

    /// Seconds since the file was last known to match the store (`None` before the first).
    fn age(&self) -> Option<Duration> {
        self.writer.lock().current_at.map(|at| at.elapsed())
    }
}

/// Most bytes a snapshot of `store` can have: no entry is encoded larger than what its bucket
/// costs in the store's budget, so a store within its budget writes at most that much.
fn snapshot_bound(store: &BucketStore) -> u64 {
    let by_bytes = (store.max_bytes() + SNAPSHOT_HEADER_BYTES + SNAPSHOT_TRAILER_BYTES) as u64;
    max_snapshot_bytes(store.max_keys()).min(by_bytes)
}

/// Reads the file unless it is larger than `max` bytes; `Ok(None)` when it does not exist.
fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot be read: {e}")),
    };
    let mut bytes = Vec::new();
    // Read one byte past the bound to tell "exactly max" from "larger".
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "larger than the {max} bytes a snapshot of this store's capacity (--max-keys, \
             --max-store-bytes) can need"
        ));
    }
    Ok(Some(bytes))
}

/// Temporary file, fsync, rename over the old file, fsync the directory (so the rename itself
/// survives a power loss).
fn write_atomically(dir: &Path, temp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = File::create(temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(temp, path)?;
    File::open(dir)?.sync_all()
}

/// One snapshot attempt, off the async workers, with its metrics.
pub(crate) async fn snapshot_once(
    snapshots: &Arc<Snapshots>,
    store: &Arc<BucketStore>,
    clock: EpochClock,
    metrics: &NodeMetrics,
) {
    let (task_snapshots, task_store) = (snapshots.clone(), store.clone());
    let result = tokio::task::spawn_blocking(move || {
        let now_ns = clock.now_ns();
        task_snapshots.write_if_changed(&task_store, now_ns)
    })
    .await;
    match result {
        Ok(Ok(Outcome::Written { buckets, bytes })) => {
            metrics.snapshot_writes.increment(1);
            metrics.snapshot_bytes.set(bytes as f64);
            metrics.snapshot_buckets.set(buckets as f64);
            tracing::debug!(buckets, bytes, "snapshot written");
        }
        Ok(Ok(Outcome::Unchanged)) => {}
        Ok(Err(e)) => {
            metrics.snapshot_failures.increment(1);
            tracing::error!(
                "writing the snapshot {} failed: {e}; the previous snapshot stays",
                snapshots.path().display()
            );
        }
        Err(e) => {
            metrics.snapshot_failures.increment(1);
            tracing::error!("the snapshot task failed: {e}");
        }
    }
    if let Some(age) = snapshots.age() {
        metrics.snapshot_age.set(age.as_secs_f64());
    }
}

/// Every [`SNAPSHOT_INTERVAL`], writes the snapshot if it changed; stops at shutdown (the final
/// write is the shutdown path's, after the last check has been answered).
pub(crate) async fn run(
    snapshots: Arc<Snapshots>,
    store: Arc<BucketStore>,
    clock: EpochClock,
    metrics: Arc<NodeMetrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(SNAPSHOT_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        snapshot_once(&snapshots, &store, clock, &metrics).await;
    }
}

#[cfg(test)]
mod tests {
    use floodgate::{BucketKey, Limit, NANOS_PER_SEC, StoreConfig};

    use super::*;

    const NOW: u64 = 1_700_000_000 * NANOS_PER_SEC;

    #[test]
    fn writes_only_when_the_long_period_buckets_changed() {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = Snapshots::open(dir.path()).unwrap();
        let store = BucketStore::new(StoreConfig {
            max_keys: 64,
            shards: 4,
        })
        .unwrap();
        let written = |now| snapshots.write_if_changed(&store, now).unwrap();
        assert_eq!(
            written(NOW),
            Outcome::Written {
                buckets: 0,
                bytes: 40
            }
        );
        assert_eq!(written(NOW + 1), Outcome::Unchanged);
        // A per-second key is not worth keeping: nothing to write.
        let per_second = Limit::gcra(10, NANOS_PER_SEC, 10).unwrap();
        store
            .check(BucketKey::for_key(b"burst"), &per_second, 5, NOW)
            .unwrap();
        assert_eq!(written(NOW + 2), Outcome::Unchanged);
        let daily = Limit::gcra(5, 86_400 * NANOS_PER_SEC, 5).unwrap();
        store
            .check(BucketKey::for_key(b"quota"), &daily, 1, NOW)
            .unwrap();
        assert!(matches!(
            written(NOW + 3),
            Outcome::Written { buckets: 1, .. }
        ));
        assert_eq!(written(NOW + 4), Outcome::Unchanged);
        assert!(!snapshots.temp_path().exists());
    }

    #[test]
    fn an_unfinished_temporary_file_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join(format!("{SNAPSHOT_FILE}.tmp"));
        fs::write(&temp, b"half a snapshot").unwrap();
        Snapshots::open(dir.path()).unwrap();
        assert!(!temp.exists());
    }
}
