//! The import rule of the core: within each module directory, every module imports only
//! modules that do not import it back, directly or through others. A `super::x` or
//! `crate::dir::x` reference in sibling `y` is an edge `y -> x`; the edges must form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The directories checked (each one's files are siblings; `mod.rs` is the parent, not one).
const DIRECTORIES: &[&str] = &[
    "policy",
    "region",
    "region/sim",
    "store",
    "wire",
    "algorithm",
    "cluster",
    "cluster/ownership",
];

/// Sibling module name -> the siblings it refers to.
fn edges(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut sources = BTreeMap::new();
    for entry in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())) {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            sources.insert(stem.to_owned(), std::fs::read_to_string(&path).unwrap());
        }
    }
    let names: BTreeSet<String> = sources.keys().cloned().collect();
    let crate_prefix = format!("crate::{}::", dir.replace('/', "::"));
    sources
        .iter()
        .map(|(name, text)| {
            let mut to = BTreeSet::new();
            for prefix in ["super::", crate_prefix.as_str()] {
                for (at, _) in text.match_indices(prefix) {
                    // `super::super::x` names the parent's sibling, not this directory's.
                    if prefix == "super::" && text[..at].ends_with("super::") {
                        continue;
                    }
                    let rest = &text[at + prefix.len()..];
                    let word: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if word != *name && names.contains(&word) {
                        to.insert(word);
                    }
                }
            }
            (name.clone(), to)
        })
        .collect()
}

/// A cycle in the graph, if any (depth-first search over the edges).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for dir in DIRECTORIES {
        let graph = edges(dir);
        assert!(graph.len() > 1, "src/{dir} has no sibling modules to check");
        if let Some(found) = cycle(&graph) {
            panic!("import circle in src/{dir}: {}", found.join(" -> "));
        }
    }
}

/// The check finds a circle when there is one.
#[test]
fn a_circle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
