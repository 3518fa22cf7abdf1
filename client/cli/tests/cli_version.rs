//! `--version` on the `floodgate` binary: the crate's version and the protocol versions it
//! speaks, exit 0, no node needed.

use std::process::Command;

#[test]
fn version_prints_the_name_and_the_crate_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        format!(
            "floodgate {} (protocol versions {})",
            env!("CARGO_PKG_VERSION"),
            floodgate::protocol::SUPPORTED
        )
    );
}

/// A misspelt method is refused by `floodgate rules check` with file, line and column.
#[test]
fn rules_check_refuses_a_misspelt_method_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(
        &file,
        "rules:\n  - name: login\n    method: PSOT\n    path: /login\n    key: ip\n    limit: 10/min\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["rules", "check", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "rules.yaml:3:13: `PSOT` is not a standard HTTP method; did you mean `POST`?"
        ),
        "{stderr}"
    );
}
