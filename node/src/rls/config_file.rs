//! `--rls-config PATH`: envoyproxy/ratelimit's configuration (a file, or a directory of `.yaml`
//! / `.yml` files), validated at start and hot-reloaded by polling like `--rules`: a bad edit is
//! rejected with its file, line and column, and the configuration in force stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context;
use floodgate::rls::RlsConfig;
use metrics::counter;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::rules::POLL_INTERVAL;

/// Most files read from a configuration directory.
pub const MAX_CONFIG_FILES: usize = 1_000;
/// Most bytes read over all files (each file is also bounded by the YAML loader).
pub const MAX_CONFIG_BYTES: usize = 16 << 20;

/// The content is read at least every this many polls (2 s), whatever the metadata says: an
/// in-place edit within one mtime tick can keep every length.
const FULL_READ_EVERY: u32 = 8;

/// The files of one version: (name, text), in name order.
type Files = Vec<(String, String)>;

/// What the metadata says: each file's (path, modified, length). Cheap to take every poll.
type Fingerprint = Vec<(PathBuf, Option<SystemTime>, u64)>;

#[derive(Debug, Default)]
struct PollState {
    fingerprint: Option<Fingerprint>,
    since_read: u32,
}

/// The configuration in force, swapped whole on reload.
#[derive(Debug)]
pub struct RlsConfigHandle {
    path: PathBuf,
    current: RwLock<Arc<RlsConfig>>,
    /// The files the configuration in force came from, and the last rejected ones.
    seen: Mutex<(Files, Option<Files>)>,
    /// (applied, rejected) reloads since start; a watch so tests await the next.
    outcomes: watch::Sender<(u64, u64)>,
    last_error: Mutex<Option<String>>,
    polls: Mutex<PollState>,
}

impl RlsConfigHandle {
    /// Reads and validates the configuration; the error names the file, line and column.
    pub fn load(path: &Path) -> anyhow::Result<Arc<RlsConfigHandle>> {
        let files = read_files(path)?;
        let config =
            parse(&files).map_err(|e| anyhow::anyhow!("invalid RLS configuration: {e}"))?;
        tracing::info!(path = %path.display(), domains = config.domain_count(), "RLS configuration loaded");
        Ok(Arc::new(RlsConfigHandle {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new((files, None)),
            outcomes: watch::Sender::new((0, 0)),
            last_error: Mutex::new(None),
            polls: Mutex::new(PollState {
                fingerprint: fingerprint(path),
                since_read: 0,
            }),
        }))
    }

    pub fn current(&self) -> Arc<RlsConfig> {
        self.current.read().clone()
    }

    /// Wakes after every applied or rejected edit: (applied, rejected) since start.
    pub fn watch_reloads(&self) -> watch::Receiver<(u64, u64)> {
        self.outcomes.subscribe()
    }

    /// The error of the last rejected edit, while the files are still in that state.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Looks at the files once: reads them when their metadata changed (or every
    /// [`FULL_READ_EVERY`] polls, or while an edit is rejected) and applies them when their
    /// content changed and is valid.
    pub fn poll(&self) {
        {
            let mut polls = self.polls.lock();
            let now = fingerprint(&self.path);
            polls.since_read += 1;
            let unchanged = now.is_some() && now == polls.fingerprint;
            if unchanged && polls.since_read < FULL_READ_EVERY && self.last_error.lock().is_none() {
                return;
            }
            polls.fingerprint = now;
            polls.since_read = 0;
        }
        let files = match read_files(&self.path) {
            Ok(files) => files,
            Err(e) => return self.reject(format!("{e:#}")),
        };
        let mut seen = self.seen.lock();
        if files == seen.0 {
            seen.1 = None;
            *self.last_error.lock() = None;
            return;
        }
        if seen.1.as_ref() == Some(&files) {
            return;
        }
        match parse(&files) {
            Ok(config) => {
                tracing::info!(path = %self.path.display(), domains = config.domain_count(), "RLS configuration reloaded");
                *self.current.write() = Arc::new(config);
                *seen = (files, None);
                *self.last_error.lock() = None;
                counter!("floodgate_rls_config_reloads_total", "result" => "ok").increment(1);
                self.outcomes.send_modify(|c| c.0 += 1);
            }
            Err(e) => {
                seen.1 = Some(files);
                drop(seen);
                self.reject(e.to_string());
            }
        }
    }

    fn reject(&self, error: String) {
        if self.last_error.lock().as_deref() == Some(error.as_str()) {
            return;
        }
        tracing::warn!(path = %self.path.display(), %error, "RLS configuration edit rejected; the previous one stays in force");
        *self.last_error.lock() = Some(error);
        counter!("floodgate_rls_config_reloads_total", "result" => "rejected").increment(1);
        self.outcomes.send_modify(|c| c.1 += 1);
    }
}

/// Polls the configuration until shutdown.
pub(crate) async fn watch_config(
    handle: Arc<RlsConfigHandle>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let handle = handle.clone();
                // File reads block: off the runtime's workers.
                let _ = tokio::task::spawn_blocking(move || handle.poll()).await;
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// The metadata of the file, or of the directory's YAML files; `None` when unreadable.
fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let paths = yaml_paths(path).ok()?;
    Some(
        paths
            .into_iter()
            .map(|p| {
                let meta = std::fs::metadata(&p).ok();
                let modified = meta.as_ref().and_then(|m| m.modified().ok());
                let len = meta.map_or(0, |m| m.len());
                (p, modified, len)
            })
            .collect(),
    )
}

fn parse(files: &Files) -> Result<RlsConfig, floodgate::rls::RlsConfigError> {
    RlsConfig::from_files(files.iter().map(|(n, t)| (n.as_str(), t.as_str())))
}

/// The file itself, or a directory's `.yaml`/`.yml` files (not recursive, hidden ones skipped:
/// Kubernetes ConfigMaps keep their versions in `..data` directories), in name order.
fn yaml_paths(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("reading the RLS configuration {}", path.display()))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(path)
        .with_context(|| format!("listing the RLS configuration directory {}", path.display()))?
    {
        let entry_path = entry?.path();
        let name = entry_path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if yaml && !name.starts_with('.') && entry_path.is_file() {
            paths.push(entry_path);
        }
        anyhow::ensure!(
            paths.len() <= MAX_CONFIG_FILES,
            "{} holds more than {MAX_CONFIG_FILES} YAML files",
            path.display()
        );
    }
    paths.sort();
    Ok(paths)
}

/// Every file's text, in name order, within [`MAX_CONFIG_BYTES`] in all.
fn read_files(path: &Path) -> anyhow::Result<Files> {
    let paths = yaml_paths(path)?;
    let mut total = 0usize;
    let mut files = Vec::with_capacity(paths.len());
    for file in paths {
        // Looked at before reading, so a huge file is refused without being loaded.
        let len = std::fs::metadata(&file).map_or(0, |m| m.len());
        anyhow::ensure!(
            (total as u64).saturating_add(len) <= MAX_CONFIG_BYTES as u64,
            "the RLS configuration is over {MAX_CONFIG_BYTES} bytes (at {})",
            file.display()
        );
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading the RLS configuration file {}", file.display()))?;
        total += text.len();
        anyhow::ensure!(
            total <= MAX_CONFIG_BYTES,
            "the RLS configuration is over {MAX_CONFIG_BYTES} bytes"
        );
        files.push((file.display().to_string(), text));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

    #[test]
    fn a_directory_loads_every_yaml_file_and_a_bad_edit_keeps_the_old_configuration() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("one.yaml"), GOOD).unwrap();
        std::fs::write(dir.path().join("two.yml"), "domain: e\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not yaml").unwrap();
        let handle = RlsConfigHandle::load(dir.path()).unwrap();
        assert_eq!(handle.current().domain_count(), 2);
        std::fs::write(
            dir.path().join("two.yml"),
            "domain: e\ndescriptors:\n  - value: x\n",
        )
        .unwrap();
        handle.poll();
        let error = handle.last_error().unwrap();
        assert!(
            error.contains("two.yml:3:5: missing field `key`"),
            "{error}"
        );
        assert_eq!(*handle.watch_reloads().borrow(), (0, 1));
        assert_eq!(handle.current().domain_count(), 2);
        std::fs::write(dir.path().join("two.yml"), "domain: f\n").unwrap();
        handle.poll();
        assert_eq!(*handle.watch_reloads().borrow(), (1, 1));
        assert!(handle.current().has_domain("f"));
        assert_eq!(handle.last_error(), None);
    }

    #[test]
    fn a_broken_file_at_start_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(
            &file,
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon}\n",
        )
        .unwrap();
        let error = RlsConfigHandle::load(&file).unwrap_err().to_string();
        assert!(
            error.contains("c.yaml:4:24: invalid rate limit unit `eon`"),
            "{error}"
        );
    }
}
