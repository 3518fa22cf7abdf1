//! Where the gateway's rules come from until a node serves them: `--rules FILE`, else the cache
//! of the rules a node served last (`--rules-cache FILE`); and keeping that cache up to date.
//! Shared by `main.rs` and the tests (`client/tests/gateway_offline.rs` includes this file).

#![allow(dead_code)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use floodgate_client::core::policy::{MAX_RULES_FILE_BYTES, Policy};
use floodgate_client::{PolicySource, RateLimiter};
use tokio::sync::watch;

/// The rules cache's format. A cache is the rules text a node served, under one comment line
/// that names the format (`# floodgate rules cache, format 1`): a YAML comment, so a gateway of
/// the build before the line (which wrote and reads the bare text) reads this build's cache,
/// and this build reads its cache (no line: format 1). A cache of a later format is skipped
/// with a warning, as a broken one is: its rules may use what this build does not know.
pub const CACHE_FORMAT: u32 = 1;
const CACHE_HEADER: &str = "# floodgate rules cache, format ";

/// Rules the gateway holds before any node served some.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalRules {
    /// `--rules FILE`.
    File(PathBuf),
    /// `--rules-cache FILE`: what a node served on an earlier run.
    Cache(PathBuf),
}

impl fmt::Display for LocalRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalRules::File(path) => write!(f, "the rules file {}", path.display()),
            LocalRules::Cache(path) => write!(
                f,
                "the rules cache {} (what a node served last)",
                path.display()
            ),
        }
    }
}

/// The rules to start from: `rules` when given (a broken file is an error), else the cache
/// when it exists (a broken cache is skipped with a warning: the nodes may still answer).
pub fn load_local(
    rules: Option<&Path>,
    cache: Option<&Path>,
) -> anyhow::Result<Option<(Policy, LocalRules)>> {
    if let Some(path) = rules {
        let policy = read_policy(path)?;
        return Ok(Some((policy, LocalRules::File(path.to_owned()))));
    }
    let Some(path) = cache.filter(|p| p.exists()) else {
        return Ok(None);
    };
    match read_cache(path) {
        Ok(policy) => Ok(Some((policy, LocalRules::Cache(path.to_owned())))),
        Err(e) => {
            tracing::warn!("ignoring the rules cache: {e:#}");
            Ok(None)
        }
    }
}

/// A cache's rules, its format line (if any) checked and left out of the text parsed, so the
/// rules' version is the one the node served.
fn read_cache(path: &Path) -> anyhow::Result<Policy> {
    let text = read_text(path)?;
    let rules = match text.strip_prefix(CACHE_HEADER) {
        Some(rest) => {
            let (format, rules) = rest.split_once('\n').unwrap_or((rest, ""));
            match format.trim().parse::<u32>() {
                Ok(format) if format <= CACHE_FORMAT => rules,
                _ => bail!(
                    "{} is a rules cache of format {}; this gateway reads formats up to \
                     {CACHE_FORMAT} (written by a newer gateway)",
                    path.display(),
                    format.trim()
                ),
            }
        }
        None => text.as_str(),
    };
    Policy::from_yaml(rules)
        .map_err(|e| anyhow::anyhow!("{}", e.render(&path.display().to_string(), rules)))
}

fn read_policy(path: &Path) -> anyhow::Result<Policy> {
    let text = read_text(path)?;
    Policy::from_yaml(&text)
        .map_err(|e| anyhow::anyhow!("{}", e.render(&path.display().to_string(), &text)))
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size > MAX_RULES_FILE_BYTES as u64 {
        bail!(
            "{} is {size} bytes; a rules file is at most {MAX_RULES_FILE_BYTES}",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// One line on where the rules in force came from, for the start-up message.
pub fn describe(limiter: &RateLimiter, local: Option<&LocalRules>) -> String {
    let version = limiter.policy_version().unwrap_or_default();
    match (limiter.policy_source(), local) {
        (Some(PolicySource::Node { addr, .. }), _) => {
            format!("rules {version} from node {addr}")
        }
        (Some(PolicySource::Local), Some(local)) => format!(
            "rules {version} from {local}: no node answered yet, so each rule's failure mode \
             applies (fail-open rules through local fallback buckets, fail-closed rules answer \
             503) until one does"
        ),
        (Some(PolicySource::Local), None) => format!("rules {version} given locally"),
        (None, _) => "no rules".to_owned(),
    }
}

/// Writes the rules in force to `path` when a node served them and they differ from `last`
/// (what was written before). Write then rename, so a crash never leaves half a file. Returns
/// whether it wrote.
pub fn save_if_from_node(
    limiter: &RateLimiter,
    path: &Path,
    last: &mut Option<Arc<str>>,
) -> std::io::Result<bool> {
    let Some(PolicySource::Node { text, .. }) = limiter.policy_source() else {
        return Ok(false);
    };
    if last.as_ref() == Some(&text) {
        return Ok(false);
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{CACHE_HEADER}{CACHE_FORMAT}\n{text}"))?;
    std::fs::rename(&tmp, path)?;
    *last = Some(text);
    Ok(true)
}

/// Keeps `path` holding the rules the nodes serve, until `shutdown` turns true.
pub async fn keep_cache(limiter: RateLimiter, path: PathBuf, mut shutdown: watch::Receiver<bool>) {
    let mut changes = limiter.policy_changes();
    let mut last = None;
    loop {
        let saved = {
            let (limiter, path, mut previous) = (limiter.clone(), path.clone(), last.take());
            tokio::task::spawn_blocking(move || {
                let result = save_if_from_node(&limiter, &path, &mut previous);
                (result, previous)
            })
            .await
        };
        match saved {
            Ok((Ok(wrote), written)) => {
                last = written;
                if wrote {
                    tracing::debug!(path = %path.display(), "rules cache updated");
                }
            }
            Ok((Err(e), written)) => {
                last = written;
                tracing::warn!(path = %path.display(), "cannot write the rules cache: {e}");
            }
            Err(_) => return,
        }
        tokio::select! {
            alive = changes.changed() => if !alive { return },
            _ = shutdown.wait_for(|&stop| stop) => return,
        }
    }
}
