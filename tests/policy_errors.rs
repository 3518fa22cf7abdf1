//! Broken rules files are refused with the line and column of the mistake, and the error shows
//! where.

use floodgate::policy::{Policy, PolicyError};

const BASE: &str = "\
plans: [free, paid]
rules:
  - name: holds
    path: /v1/events/*/holds
    key: user
    limit: 5/min
";

/// `BASE` with line `line` (from 1) replaced.
fn with_line(line: usize, text: &str) -> String {
    let mut lines: Vec<&str> = BASE.lines().collect();
    lines[line - 1] = text;
    lines.join("\n") + "\n"
}

fn error(text: &str) -> PolicyError {
    match Policy::from_yaml(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

#[track_caller]
fn assert_error(text: &str, line: usize, column: usize, message: &str) {
    let e = error(text);
    assert_eq!(
        (e.line, e.column),
        (line, column),
        "{}",
        e.render("rules.yaml", text)
    );
    assert!(e.message.contains(message), "{e}");
}

#[test]
fn the_base_file_is_valid() {
    Policy::from_yaml(BASE).unwrap();
}

#[test]
fn errors_point_at_line_and_column() {
    let cases: Vec<(String, usize, usize, &str)> = vec![
        (
            with_line(6, "    limt: 5/min"),
            6,
            5,
            "unknown field `limt` in a rule",
        ),
        (
            with_line(6, "    limit: 10/fortnight"),
            6,
            12,
            "`10/fortnight` is not a rate",
        ),
        (
            with_line(6, "    limit: 0/min"),
            6,
            12,
            "rate must be at least 1",
        ),
        (
            with_line(6, "    limit: 100"),
            6,
            12,
            "expected a string for `limit`",
        ),
        (
            with_line(4, "    path: /v1/**/holds"),
            4,
            11,
            "`**` is only allowed as the last",
        ),
        (
            with_line(4, "    path: v1/holds"),
            4,
            11,
            "must start with `/`",
        ),
        (
            with_line(5, "    key: [user, shoe]"),
            5,
            17,
            "unknown key part `shoe`",
        ),
        (
            with_line(5, "    key: [global, user]"),
            5,
            10,
            "cannot be combined",
        ),
        (
            with_line(1, "plans: [free, free]"),
            1,
            15,
            "plan `free` is listed twice",
        ),
        (
            with_line(1, "plan: [free]"),
            1,
            1,
            "unknown field `plan` in the rules file",
        ),
        (
            with_line(3, "  - name: \"holds now\""),
            3,
            11,
            "rule name `holds now` must be",
        ),
        (with_line(4, "    pth: /x"), 4, 5, "unknown field `pth`"),
        (
            format!("{BASE}    burst: \"200\"\n"),
            7,
            12,
            "expected a non-negative integer",
        ),
        (
            format!("{BASE}    burst: 0\n"),
            7,
            12,
            "burst must be at least 1",
        ),
        (
            format!("{BASE}    algorithm: leaky\n"),
            7,
            16,
            "unknown algorithm `leaky`",
        ),
        (
            format!("{BASE}    algorithm: fixed-window\n    burst: 10\n"),
            8,
            12,
            "burst is a gcra setting",
        ),
        (
            format!("{BASE}    cost: 6\n"),
            7,
            11,
            "cost 6 exceeds the burst 5",
        ),
        (
            format!("{BASE}    max_wait: 11s\n"),
            7,
            15,
            "above the maximum of 10s",
        ),
        (
            format!("{BASE}    max_wait: soon\n"),
            7,
            15,
            "`soon` is not a duration",
        ),
        (
            format!("{BASE}    lease_above: 1/min\n"),
            7,
            18,
            "below 1/s",
        ),
        (
            format!("{BASE}    lease_above: lots\n"),
            7,
            18,
            "`lots` is not a rate",
        ),
        (
            format!("{BASE}    mode: loud\n"),
            7,
            11,
            "expected enforce or shadow",
        ),
        (
            format!("{BASE}    failure_mode: shut\n"),
            7,
            19,
            "expected open or closed",
        ),
        (
            format!("{BASE}    plans: {{ gold: 1/s }}\n"),
            7,
            14,
            "unknown plan `gold`",
        ),
        (
            format!("{BASE}    plans:\n      free: {{ limit: 1/s, unlimited: true }}\n"),
            8,
            38,
            "either `limit: RATE` or `unlimited: true`",
        ),
        (
            format!("{BASE}api_keys: {{ k1: gold }}\n"),
            7,
            17,
            "unknown plan `gold`",
        ),
        (
            format!("{BASE}trusted_proxies: [10.0.0.1/8]\n"),
            7,
            19,
            "bits set after",
        ),
        (
            format!("{BASE}max_waiting: -1\n"),
            7,
            14,
            "non-negative integer",
        ),
        (
            format!("{BASE}  - name: holds\n    path: /x\n    key: ip\n    limit: 1/s\n"),
            7,
            11,
            "duplicate rule name `holds` (first defined on line 3)",
        ),
        (
            "rules:\n  - name: a\n    key: ip\n    limit: 1/s\n".to_owned(),
            2,
            5,
            "missing field `path` in a rule",
        ),
        (
            "rules:\n  - name: a\n    path: /\n    key: ip\n".to_owned(),
            2,
            5,
            "needs a `limit`, per-plan limits",
        ),
        ("# nothing\n".to_owned(), 1, 1, "the rules file is empty"),
        ("plans: []\n".to_owned(), 1, 1, "missing field `rules`"),
        (
            "rules: {}\n".to_owned(),
            1,
            8,
            "expected a list for `rules`",
        ),
        (
            "x: &a [1]\ny: *a\n".to_owned(),
            2,
            4,
            "aliases (`*name`) are not supported",
        ),
        (
            "rules: []\n---\nrules: []\n".to_owned(),
            2,
            1,
            "one YAML document",
        ),
    ];
    for (text, line, column, message) in &cases {
        assert_error(text, *line, *column, message);
    }
}

#[test]
fn unknown_methods_are_refused_at_their_line_and_column() {
    let method_line = |method: &str| {
        let mut text = BASE.replace(
            "    path: /v1",
            &format!("    method: {method}\n    path: /v1"),
        );
        text.push('\n');
        text
    };
    // A typo would otherwise be a rule that never matches: a fail-closed login rule disabled.
    assert_error(&method_line("PSOT"), 4, 13, "did you mean `POST`");
    assert_error(
        &method_line("[GET, PURGE]"),
        4,
        19,
        "`PURGE` is not a standard HTTP method",
    );
    assert_error(&method_line("ext:GET"), 4, 13, "is a standard method");
    assert_error(
        &method_line("\"ext:BAD METHOD\""),
        4,
        13,
        "token characters",
    );
    let policy = Policy::from_yaml(&method_line("[post, ext:purge, Patch]")).unwrap();
    assert_eq!(policy.rules()[0].methods(), ["POST", "PURGE", "PATCH"]);
}

#[test]
fn default_plans_must_be_declared() {
    assert_error(
        &format!("default_plan: Free\n{BASE}"),
        1,
        15,
        "unknown plan `Free` (declared plans: free, paid)",
    );
    assert_error(
        &format!("{BASE}    default_plan: gold\n"),
        7,
        19,
        "unknown plan `gold`",
    );
    assert_error(
        &format!("{BASE}    default_plan: [free]\n"),
        7,
        19,
        "`default_plan`",
    );
}

#[test]
fn yaml_syntax_errors_point_at_the_broken_line() {
    let e = error(&with_line(5, "    key: [user"));
    assert!(e.message.starts_with("YAML syntax:"), "{e}");
    assert_eq!(e.line, 6, "{e}");
    let e = error(&with_line(5, "     key: user"));
    assert!(e.message.starts_with("YAML syntax:"), "{e}");
    assert_eq!(e.line, 5, "{e}");
    let e = error("rules:\n\t- name: x\n");
    assert!(e.message.starts_with("YAML syntax:"), "{e}");
    assert_eq!(e.line, 2, "{e}");
}

#[test]
fn errors_display_with_the_file_name_and_a_caret() {
    let text = with_line(6, "    limit: 10/fortnight");
    let e = error(&text);
    let shown = e.in_file("rules.yaml").to_string();
    assert!(
        shown.starts_with("rules.yaml:6:12: `10/fortnight` is not a rate"),
        "{shown}"
    );
    assert_eq!(
        e.render("rules.yaml", &text),
        format!("{shown}\n  |\n6 |     limit: 10/fortnight\n  |            ^\n")
    );
}

#[test]
fn deeply_nested_or_huge_files_are_refused_before_building_a_tree() {
    let deep = format!("rules: {}{}\n", "[".repeat(100), "]".repeat(100));
    assert!(error(&deep).message.contains("nesting deeper than"));
    let huge = format!(
        "rules: []\n#{}\n",
        "x".repeat(floodgate::policy::MAX_RULES_FILE_BYTES)
    );
    assert!(error(&huge).message.contains("the maximum is"));
}

/// `cost_from:` names one header, with an estimate and a `missing` cost the limit can pass,
/// and never beside `cost` or (for a response cost) `lease_above`.
#[test]
fn metered_rules_are_checked() {
    let rule = |extra: &str| format!("{}    {extra}\n", BASE);
    for (text, line, column, message) in [
        (
            rule("cost_from: { response_header: x-tokens, request_header: x-in }"),
            7,
            16,
            "`cost_from` names one header",
        ),
        (
            rule("cost_from: { response_header: \"x tokens\" }"),
            7,
            35,
            "is not a header name",
        ),
        (
            rule("cost_from: { response_header: x-tokens, estimate: 6 }"),
            7,
            55,
            "estimate` 6 exceeds 5",
        ),
        (
            rule("cost_from: { request_header: x-in, estimate: 1 }"),
            7,
            50,
            "`estimate` is for response costs",
        ),
        (
            rule("cost_from: { request_header: x-in, missing: 9 }"),
            7,
            49,
            "`missing` 9 exceeds 5",
        ),
        (
            format!("{BASE}    cost: 2\n    cost_from: {{ response_header: x-tokens }}\n"),
            7,
            11,
            "from `cost` or from `cost_from`, not both",
        ),
        (
            format!(
                "{BASE}    lease_above: 100/s\n    cost_from: {{ response_header: x-tokens }}\n"
            ),
            7,
            18,
            "takes no `lease_above`",
        ),
    ] {
        assert_error(&text, line, column, message);
    }
    let ok = Policy::from_yaml(&rule(
        "cost_from: { response_header: X-Usage-Tokens, estimate: 5, missing: 1000000 }",
    ))
    .unwrap();
    let from = ok.rules()[0].cost_from().unwrap();
    assert_eq!((from.estimate(), from.missing()), (5, 1_000_000));
}
