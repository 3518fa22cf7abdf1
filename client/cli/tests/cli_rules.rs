//! `floodgate rules check FILE`: the command's rules-file validation, exit codes and messages.

const RULES: &str = "\
rules:
  - name: items
    path: /v1/items
    key: user
    limit: 3/min
";

/// `floodgate rules check FILE`: the example file is valid (exit 0, one line per rule); a broken
/// file is named with line, column and a caret (exit 2).
#[test]
fn rules_check_validates_a_file_and_points_at_errors() {
    let bin = env!("CARGO_BIN_EXE_floodgate");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../rules/example.yaml");
    let ok = std::process::Command::new(bin)
        .args(["rules", "check", example])
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(out.starts_with("policy "), "{out}");
    assert!(
        out.contains("login: POST /v1/auth/login per ip: gcra 10/1min; fails closed"),
        "{out}"
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, RULES.replace("3/min", "lots")).unwrap();
    let err = std::process::Command::new(bin)
        .args(["rules", "check", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(err.status.code(), Some(2));
    let text = String::from_utf8_lossy(&err.stderr);
    assert!(
        text.contains("bad.yaml:5:12: `lots` is not a rate"),
        "{text}"
    );
    assert!(text.contains("5 |     limit: lots"), "{text}");
}
