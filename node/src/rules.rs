//! The node's rules: loading and validating `--rules FILE`, versioning, hot reload, and answering
//! clients' `PolicyRequest` frames with the rules in force.
//!
//! The file is polled (metadata every [`POLL_INTERVAL`], content when it changed) rather than
//! watched with inotify: one code path on every platform and filesystem (bind mounts, NFS,
//! Kubernetes ConfigMap symlink swaps), and a quarter second is well inside the "about a second"
//! a rule change may take to reach gateways. A file that fails validation is rejected with its
//! rendered error (`FILE:LINE:COL` and a caret) and the rules in force stay; nothing half-parsed
//! is ever served.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use floodgate::policy::Policy;
use floodgate::wire::{
    ErrorCode, Frame, FrameKind, PolicyMessage, decode_policy_request, encode_message,
};
use metrics::{counter, gauge};
use tokio::sync::watch;

use crate::service::encode_error;

/// How often the rules file's metadata is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// After a rejected edit, the content is re-read on this many polls even if the metadata looks
/// unchanged: an editor's write may have been read half-done within one mtime tick.
const RECHECKS_AFTER_REJECT: u32 = 4;
/// The content is read at least every this many polls (2 s), whatever the metadata says.
const FULL_READ_EVERY: u32 = 8;

/// One version of the rules: the validated policy and the text it came from.
#[derive(Debug)]
pub struct LoadedRules {
    pub policy: Arc<Policy>,
    /// The file's text, sent to clients, which re-parse it.
    pub text: String,
    /// When this version was loaded.
    pub loaded_at: SystemTime,
}

impl LoadedRules {
    /// The content hash `Policy::version` gives: equal versions enforce equal rules.
    pub fn version(&self) -> &str {
        self.policy.version()
    }
}

/// What one look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// Nothing changed (or the content is the version in force).
    Unchanged,
    /// A new version is in force.
    Reloaded { version: String },
    /// The file changed but is invalid (or unreadable); the old version stays. The rendered error.
    Rejected { error: String },
}

/// Counts of edits to the rules file since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    pub applied: u64,
    pub rejected: u64,
}

/// The rules in force on this node, swapped whole on reload (a request sees one version).
#[derive(Debug)]
pub struct RulesHandle {
    path: PathBuf,
    current: RwLock<Arc<LoadedRules>>,
    watch: Mutex<WatchState>,
    /// Edits applied and rejected since start; a watch, so tests and tools can await the next.
    outcomes: watch::Sender<ReloadCounts>,
    last_error: Mutex<Option<String>>,
}

#[derive(Debug, Default)]
struct WatchState {
    /// Metadata seen at the last look: (modified, length).
    seen: Option<Fingerprint>,
    /// Polls since the content was last read: it is re-read every [`FULL_READ_EVERY`] polls
    /// whatever the metadata says (an in-place edit within one mtime tick keeps the length).
    since_read: u32,
    /// The text of the last rejected edit, so it is reported once, not every poll.
    rejected_text: Option<String>,
    recheck: u32,
}

impl RulesHandle {
    /// Loads and validates `path`; the error names the file, line and column.
    pub fn load(path: &Path) -> anyhow::Result<Arc<RulesHandle>> {
        crate::metrics::recorder();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the rules file {}", path.display()))?;
        let policy = Policy::from_yaml(&text).map_err(|e| {
            anyhow::anyhow!(
                "invalid rules file:\n{}",
                e.render(&path.display().to_string(), &text)
            )
        })?;
        let handle = Arc::new(RulesHandle {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(LoadedRules {
                policy: Arc::new(policy),
                text,
                loaded_at: SystemTime::now(),
            })),
            watch: Mutex::new(WatchState {
                seen: metadata(path),
                ..WatchState::default()
            }),
            outcomes: watch::Sender::new(ReloadCounts::default()),
            last_error: Mutex::new(None),
        });
        let current = handle.current();
        publish_version(None, current.version(), current.policy.rules().len());
        tracing::info!(
            file = %path.display(),
            version = current.version(),
            rules = current.policy.rules().len(),
            "rules loaded"
        );
        Ok(handle)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rules in force.
    pub fn current(&self) -> Arc<LoadedRules> {
        read(&self.current)
    }

    /// Successful reloads since start (the first load not counted).
    pub fn reloads(&self) -> u64 {
        self.outcomes.borrow().applied
    }

    /// Rejected edits since start.
    pub fn rejected(&self) -> u64 {
        self.outcomes.borrow().rejected
    }

    /// Wakes after every applied or rejected edit.
    pub fn watch_reloads(&self) -> watch::Receiver<ReloadCounts> {
        self.outcomes.subscribe()
    }

    /// The rendered error of the last rejected edit, if the file is still in that state.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Looks at the file once: reloads it when its content changed and is valid.
    pub fn poll(&self) -> ReloadOutcome {
        let mut watch = lock(&self.watch);
        let seen = metadata(&self.path);
        watch.since_read += 1;
        if seen == watch.seen && watch.recheck == 0 && watch.since_read < FULL_READ_EVERY {
            return ReloadOutcome::Unchanged;
        }
        watch.since_read = 0;
        watch.seen = seen;
        watch.recheck = watch.recheck.saturating_sub(1);
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) => {
                let error = format!("{}: cannot read the rules file: {e}", self.path.display());
                return self.reject(&mut watch, String::new(), error);
            }
        };
        if text == read(&self.current).text {
            // Back to the version in force (e.g. a bad edit undone): nothing to report any more.
            watch.rejected_text = None;
            *lock(&self.last_error) = None;
            return ReloadOutcome::Unchanged;
        }
        if watch.rejected_text.as_deref() == Some(text.as_str()) {
            return ReloadOutcome::Unchanged;
        }
        match Policy::from_yaml(&text) {
            Ok(policy) => {
                let loaded = Arc::new(LoadedRules {
                    policy: Arc::new(policy),
                    text,
                    loaded_at: SystemTime::now(),
                });
                let old = std::mem::replace(
                    &mut *self.current.write().unwrap_or_else(PoisonError::into_inner),
                    loaded.clone(),
                );
                watch.rejected_text = None;
                watch.recheck = 0;
                *lock(&self.last_error) = None;
                self.outcomes.send_modify(|c| c.applied += 1);
                counter!("floodgate_rules_reloads_total", "result" => "ok").increment(1);
                publish_version(
                    Some(old.version()),
                    loaded.version(),
                    loaded.policy.rules().len(),
                );
                tracing::info!(
                    file = %self.path.display(),
                    from = old.version(),
                    to = loaded.version(),
                    rules = loaded.policy.rules().len(),
                    "rules reloaded"
                );
                ReloadOutcome::Reloaded {
                    version: loaded.version().to_owned(),
                }
            }
            Err(e) => {
                let error = e.render(&self.path.display().to_string(), &text);
                self.reject(&mut watch, text, error)
            }
        }
    }

    fn reject(&self, watch: &mut WatchState, text: String, error: String) -> ReloadOutcome {
        watch.rejected_text = Some(text);
        watch.recheck = RECHECKS_AFTER_REJECT;
        // The error first: whoever the count wakes must find it.
        *lock(&self.last_error) = Some(error.clone());
        self.outcomes.send_modify(|c| c.rejected += 1);
        counter!("floodgate_rules_reloads_total", "result" => "rejected").increment(1);
        tracing::warn!(
            version = read(&self.current).version(),
            "rules edit rejected, the rules in force stay:\n{error}"
        );
        ReloadOutcome::Rejected { error }
    }

    /// The answer to a client's `PolicyRequest`: the text when the client's version differs,
    /// else only the version (unchanged).
    pub fn message_for(&self, client_version: &str) -> PolicyMessage {
        let current = self.current();
        PolicyMessage {
            version: current.version().to_owned(),
            text: if client_version == current.version() {
                String::new()
            } else {
                current.text.clone()
            },
        }
    }
}

// The locks guard plain values replaced whole, so a panic elsewhere cannot leave them half
// updated: a poisoned lock is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read().unwrap_or_else(PoisonError::into_inner).clone()
}

/// What identifies a version of the file without reading it: modification time, length, inode
/// and change time (a rename onto the path changes the inode even within one mtime tick).
type Fingerprint = (Option<SystemTime>, u64, u64, i64, i64);

fn metadata(path: &Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.modified().ok(),
        meta.len(),
        meta.ino(),
        meta.ctime(),
        meta.ctime_nsec(),
    ))
}

/// `floodgate_rules_version_info{version}`: 1 for the version in force, 0 for the one replaced;
/// `floodgate_rules` the number of rules; `floodgate_rules_loaded_timestamp_seconds`.
fn publish_version(old: Option<&str>, new: &str, rules: usize) {
    if let Some(old) = old.filter(|&o| o != new) {
        gauge!("floodgate_rules_version_info", "version" => old.to_owned()).set(0.0);
    }
    gauge!("floodgate_rules_version_info", "version" => new.to_owned()).set(1.0);
    gauge!("floodgate_rules").set(rules as f64);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    gauge!("floodgate_rules_loaded_timestamp_seconds").set(now.as_secs_f64());
}

/// Polls the rules file until shutdown.
pub(crate) async fn watch_file(rules: Arc<RulesHandle>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        // Reading a file blocks; it is small and local, but keep it off the I/O workers.
        let handle = rules.clone();
        if tokio::task::spawn_blocking(move || handle.poll())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Appends the answer to a `PolicyRequest` frame: the rules (or "no rules" when the node runs
/// without `--rules`). Returns the error code when the request was malformed.
pub fn answer_policy_request(
    rules: Option<&RulesHandle>,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Option<ErrorCode> {
    let request = match decode_policy_request(&frame.payload) {
        Ok(request) => request,
        Err((code, message)) => {
            encode_error(out, frame.request_id, code, message);
            return Some(code);
        }
    };
    let message = rules.map_or_else(PolicyMessage::none, |r| r.message_for(&request.version));
    encode_message(out, FrameKind::Policy, frame.request_id, &message);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "rules:\n  - name: a\n    path: /**\n    key: ip\n    limit: 5/s\n";

    fn write(path: &Path, text: &str) {
        // Write then rename, as editors and config managers do: the poll never sees half a file.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_valid_edit_is_taken_and_a_broken_one_rejected_keeping_the_old_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        write(&path, RULES);
        let rules = RulesHandle::load(&path).unwrap();
        let v1 = rules.current().version().to_owned();
        assert_eq!(rules.poll(), ReloadOutcome::Unchanged);

        write(&path, &RULES.replace("5/s", "7/s"));
        let ReloadOutcome::Reloaded { version: v2 } = rules.poll() else {
            panic!("not reloaded")
        };
        assert_ne!(v1, v2);
        assert_eq!(rules.current().version(), v2);
        assert_eq!(rules.reloads(), 1);

        write(&path, &RULES.replace("5/s", "seven per second"));
        let ReloadOutcome::Rejected { error } = rules.poll() else {
            panic!("not rejected")
        };
        assert!(error.contains("rules.yaml:5:12"), "{error}");
        assert!(error.contains('^'), "{error}");
        assert_eq!(rules.current().version(), v2, "the old rules stay");
        assert_eq!(rules.poll(), ReloadOutcome::Unchanged, "reported once");
        assert_eq!(rules.rejected(), 1);
        assert!(rules.last_error().is_some());

        // The client's version decides whether the text is sent again.
        assert!(rules.message_for(&v2).is_unchanged());
        assert_eq!(rules.message_for("old").text, rules.current().text);
    }

    #[test]
    fn a_broken_file_at_start_is_an_error_with_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        write(
            &path,
            "rules:\n  - name: a\n    path: /**\n    key: nobody\n",
        );
        let err = RulesHandle::load(&path).unwrap_err().to_string();
        assert!(err.contains("rules.yaml:4:"), "{err}");
    }
}
