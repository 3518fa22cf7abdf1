//! The node's import rule: every module imports only modules that do not import it back,
//! directly or through others. A `crate::x` reference (or `x` in `use crate::{x, ..}`) inside
//! module `y` is an edge `y -> x`; a module's submodules (the files of its directory) count as
//! part of it. The edges must form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// The top-level modules `text` refers to through `crate::`.
fn referred(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let word = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut to = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c}`: each item's first name.
            let group = &group[..group.find('}').unwrap_or(group.len())];
            to.extend(group.split(',').map(|item| word(item.trim())));
        } else {
            to.insert(word(rest));
        }
    }
    to.retain(|m| modules.contains(m));
    to
}

/// Top-level module of the node -> the modules it refers to.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for path in sources(&root) {
        let relative = path.strip_prefix(&root).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // Test modules may reach anywhere; the rule is for the node's own code.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        texts.entry(module).or_default().push_str(code);
    }
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    texts
        .iter()
        .map(|(module, text)| {
            let mut to = referred(text, &modules);
            to.remove(module);
            (module.clone(), to)
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
fn no_node_module_imports_one_that_imports_it_back() {
    let graph = edges();
    // The graph is read from the sources: the composition root refers to the cluster.
    assert!(graph["server"].contains("cluster"), "{graph:?}");
    assert!(graph["state"].contains("cluster"), "{graph:?}");
    if let Some(found) = cycle(&graph) {
        panic!("import circle in node/src: {}", found.join(" -> "));
    }
}

/// The reading sees grouped and plain references, and the check finds a circle when there is one.
#[test]
fn references_are_read_and_a_circle_is_found() {
    let modules: BTreeSet<String> = ["a", "b", "c"].iter().map(|m| m.to_string()).collect();
    let text = "use crate::{a::X, b};\nfn f() { crate::c::g(); crate::core::h(); }";
    assert_eq!(referred(text, &modules), modules);
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), BTreeSet::from([v.to_owned()])))
        .collect();
    assert_eq!(
        cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
