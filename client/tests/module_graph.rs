//! No import circles in the client: every module imports only modules that do not import it
//! back, directly or through others. A `crate::x` path inside module `y` is an edge `y -> x`;
//! a submodule's paths count as its parent's (read from the sources in `src/`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its sources name through `crate::`.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let named = graph.entry(top.clone()).or_default();
        for target in crate_paths(&text) {
            if target != top {
                named.insert(target);
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for targets in graph.values_mut() {
        targets.retain(|t| modules.contains(t));
    }
    graph
}

/// The first segment after every `crate::`, and every name in a `use crate::{a, b::c}` group.
fn crate_paths(text: &str) -> Vec<String> {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|part| word(part.trim())));
        } else {
            out.push(word(rest));
        }
    }
    out.retain(|name| name.starts_with(|c: char| c.is_ascii_lowercase()));
    out
}

#[test]
fn no_client_module_imports_one_that_imports_it_back() {
    let graph = edges();
    assert!(graph.contains_key("link") && graph.contains_key("routing"));
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut next = vec![from.to_owned()];
        while let Some(module) = next.pop() {
            for target in graph.get(&module).into_iter().flatten() {
                if target == to {
                    return true;
                }
                if seen.insert(target.clone()) {
                    next.push(target.clone());
                }
            }
        }
        false
    };
    let circles: Vec<String> = graph
        .iter()
        .flat_map(|(from, targets)| targets.iter().map(move |to| (from, to)))
        .filter(|(from, to)| reaches(to, from))
        .map(|(from, to)| format!("{from} -> {to} -> ... -> {from}"))
        .collect();
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn the_reader_sees_paths_and_groups() {
    let text = "use crate::a::B;\nuse crate::{b, c::D};\nlet x = crate::d::f();\ncrate::E";
    assert_eq!(crate_paths(text), ["a", "b", "c", "d"]);
}
