//! The `replay` command prints the agreed counts for a reviewed trace, as its last
//! line, exactly `allowed A of T`.

use std::io::Write;
use std::process::{Command, Stdio};

fn replay(args: &[&str], input: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate-bench"))
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn floodgate-bench");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let code = out.status.code().unwrap_or(-1);
    (
        code,
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn design_review_trace_through_the_command() {
    let trace = "0.99\n".repeat(10) + &"1.01\n".repeat(10);
    for (algorithm, allowed) in [
        ("fixed-window", 20),
        ("sliding-log", 10),
        ("sliding-window", 11),
        ("gcra", 10),
    ] {
        let (code, stdout, stderr) = replay(&["--algorithm", algorithm, "--limit", "10/s"], &trace);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(
            stdout.lines().last(),
            Some(format!("allowed {allowed} of 20").as_str()),
            "{algorithm}"
        );
    }
}

#[test]
fn bad_input_is_a_clear_error_with_exit_code_2() {
    let (code, _, stderr) = replay(&["--limit", "10/s"], "0.5\nnot-a-time\n");
    assert_eq!(code, 2);
    assert!(stderr.contains("line 2"), "{stderr}");
    let (code, _, stderr) = replay(&["--algorithm", "sliding-log", "--limit", "5000/s"], "");
    assert_eq!(code, 2);
    assert!(stderr.contains("at most 1000"), "{stderr}");
}

#[test]
fn the_limit_is_a_rate_as_in_floodgate_check() {
    // 5 per 10 s: of 20 arrivals in the first second, 5 pass.
    let trace = "0.5\n".repeat(20);
    let (code, stdout, stderr) = replay(&["--limit", "5/10s"], &trace);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().last(), Some("allowed 5 of 20"));
    // A bare count (the old `--limit 10 --period 1s`) is refused, naming the syntax.
    for old in [
        &["--limit", "10"][..],
        &["--limit", "10/s", "--period", "1s"],
    ] {
        let (code, _, stderr) = replay(old, "");
        assert_eq!(code, 2, "{old:?}: {stderr}");
        assert!(
            stderr.contains("not a rate") || stderr.contains("--period"),
            "{old:?}: {stderr}"
        );
    }
}

#[test]
fn version_is_printed() {
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate-bench"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("floodgate-bench ") && stdout.contains(env!("CARGO_PKG_VERSION")),
        "{stdout}"
    );
}
