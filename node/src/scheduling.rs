//! How the kernel schedules the node's threads (`--scheduling`).
//!
//! A node serves many small frames, often on the same cores as its callers (a gateway's
//! sidecar, or a cluster's nodes sharing hosts). Under Linux's default policy a thread woken by
//! a datagram may preempt whatever runs on its core, and one that has mostly slept usually does:
//! the caller is switched out mid-batch, the node decides the one frame that woke it, answers
//! and sleeps, so frames stay small and each costs a pair of context switches. Under
//! `SCHED_BATCH` a node's wake-up does not preempt: it runs at once on an idle core, else when
//! the running thread blocks or its slice ends, and then finds the frames queued meanwhile.
//! With a core idle, nothing changes.

/// `--scheduling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheduling {
    /// Linux's `SCHED_BATCH`, when the node was started under the default policy (a real-time
    /// or idle policy given by the operator is kept).
    Batch,
    /// The policy the node was started with, unchanged.
    Inherit,
}

/// What to do, given the policy asked for and the one the process runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    SetBatch,
    Keep,
}

/// Linux's policy numbers (`sched.h`), named for the log.
const SCHED_OTHER: i32 = 0;
const SCHED_BATCH: i32 = 3;

fn policy_name(policy: i32) -> &'static str {
    match policy {
        SCHED_OTHER => "SCHED_OTHER",
        1 => "SCHED_FIFO",
        2 => "SCHED_RR",
        SCHED_BATCH => "SCHED_BATCH",
        5 => "SCHED_IDLE",
        6 => "SCHED_DEADLINE",
        _ => "an unknown policy",
    }
}

fn step(asked: Scheduling, current: i32) -> Step {
    match (asked, current) {
        (Scheduling::Batch, SCHED_OTHER) => Step::SetBatch,
        _ => Step::Keep,
    }
}

/// Applies `asked` to the calling thread, which every thread started after it inherits: call it
/// first, before the runtime's threads exist. Never fails the start: the outcome is returned
/// as a line for the log.
pub fn apply(asked: Scheduling) -> String {
    let current = match os::current_policy() {
        Ok(policy) => policy,
        Err(e) => return format!("scheduling policy unchanged: cannot read it ({e})"),
    };
    match step(asked, current) {
        Step::Keep => format!("scheduling policy {} (as started)", policy_name(current)),
        Step::SetBatch => match os::set_batch() {
            Ok(()) => "scheduling policy SCHED_BATCH".to_owned(),
            Err(e) => format!(
                "scheduling policy {} (as started): SCHED_BATCH refused ({e})",
                policy_name(current)
            ),
        },
    }
}

#[cfg(target_os = "linux")]
mod os {
    use std::io;

    pub(super) fn current_policy() -> io::Result<i32> {
        // SAFETY: takes no pointer; pid 0 is the calling thread.
        #[allow(unsafe_code)]
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(policy)
    }

    pub(super) fn set_batch() -> io::Result<()> {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid `sched_param` that outlives the call, which only reads it;
        // pid 0 is the calling thread. An unprivileged thread may move between the normal
        // policies.
        #[allow(unsafe_code)]
        let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use std::io;

    pub(super) fn current_policy() -> io::Result<i32> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "only Linux has SCHED_BATCH",
        ))
    }

    pub(super) fn set_batch() -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_replaces_only_the_default_policy() {
        assert_eq!(step(Scheduling::Batch, SCHED_OTHER), Step::SetBatch);
        for operators in [1, 2, SCHED_BATCH, 5, 6] {
            assert_eq!(
                step(Scheduling::Batch, operators),
                Step::Keep,
                "{operators}"
            );
        }
    }

    #[test]
    fn inherit_keeps_every_policy() {
        for policy in [SCHED_OTHER, 1, 2, SCHED_BATCH, 5, 6] {
            assert_eq!(step(Scheduling::Inherit, policy), Step::Keep, "{policy}");
        }
    }
}
