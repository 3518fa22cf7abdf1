//! The layout has no import circles: in every crate of the repository, at every level of the
//! module tree, the sibling modules import each other in one direction only, directly or through
//! others. A module's submodules count as part of it, and the module's own file (its `mod.rs` or
//! the crate root) is the parent, not a sibling, so a façade that re-exports its children and a
//! child that uses its parent's items do not count. Circles make a part impossible to read,
//! test or move alone; this test keeps them from coming back.
//!
//! The graph is read from the source text: `use` statements and inline `crate::`/`super::`/
//! `self::` paths, with names re-exported by a parent (`pub use child::Name`) followed to the
//! child that defines them. Test modules at the end of a file (`#[cfg(test)] mod tests`) are
//! left out: tests may reach across.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside one crate, e.g. `["wire", "messages"]`; the crate root is `[]`.
type ModPath = Vec<String>;

struct Crate {
    name: String,
    /// Module path → the source of that module's own file (comments and tests removed).
    modules: BTreeMap<ModPath, String>,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every crate of the repository: each directory with a `Cargo.toml` and a `src/`.
fn crates() -> Vec<Crate> {
    let mut found = Vec::new();
    let mut stack = vec![repo_root()];
    while let Some(dir) = stack.pop() {
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            found.push(read_crate(&dir));
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() && !name.starts_with('.') && name != "target" && name != "src" {
                stack.push(path);
            }
        }
    }
    assert!(found.len() >= 4, "expected the workspace's crates");
    found
}

fn read_crate(dir: &Path) -> Crate {
    let src = dir.join("src");
    let mut modules = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(&src).unwrap();
            // `src/bin/*` are separate crates that reach the library by its name.
            if rel.starts_with("bin") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut parts: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let last = parts.last().unwrap().as_str();
            if last == "mod" || (parts.len() == 1 && (last == "lib" || last == "main")) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            modules
                .entry(parts)
                .and_modify(|t: &mut String| t.push_str(&strip(&text)))
                .or_insert_with(|| strip(&text));
        }
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let name = manifest
        .lines()
        .find_map(|line| line.strip_prefix("name = "))
        .map_or_else(
            || dir.display().to_string(),
            |n| n.trim_matches('"').to_string(),
        );
    Crate { name, modules }
}

/// The text without line comments and without a trailing `#[cfg(test)] mod ...` block.
fn strip(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let code = line.split("//").next().unwrap();
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every path the text uses: `use` trees expanded, plus inline `crate::`, `super::` and
/// `self::` paths.
fn used_paths(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = find_use(rest) {
        let after = &rest[at..];
        let end = after.find(';').unwrap_or(after.len());
        expand_use_tree(after[..end].trim(), &mut Vec::new(), &mut paths);
        rest = &after[end..];
    }
    let bytes = text.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(start) {
            let i = from + i;
            from = i + start.len();
            let boundary =
                i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
            if !boundary || (i >= 2 && &text[i - 2..i] == "::") {
                continue;
            }
            let tail: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push(
                tail.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    paths
}

/// The byte offset just after the next `use ` keyword that starts a statement.
fn find_use(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find("use ") {
        let i = from + i;
        let before = text[..i].trim_end();
        let starts_statement = before.is_empty()
            || before.ends_with(';')
            || before.ends_with('{')
            || before.ends_with('}')
            || before.ends_with(']')
            || before.ends_with("pub")
            || before.ends_with(')');
        if starts_statement {
            return Some(i + 4);
        }
        from = i + 4;
    }
    None
}

fn expand_use_tree(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let depth = prefix.len();
        prefix.extend(head);
        for item in split_top_level(inner) {
            expand_use_tree(item, prefix, out);
        }
        prefix.truncate(depth);
        return;
    }
    let name = tree.split(" as ").next().unwrap().trim();
    if name.is_empty() {
        return;
    }
    let mut path = prefix.clone();
    for part in name.split("::").map(str::trim) {
        if part != "self" || path.is_empty() {
            path.push(part.to_string());
        }
    }
    out.push(path);
}

fn split_top_level(list: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items
}

impl Crate {
    /// The module a path (as written inside `from`) lands in, following re-exports; `None` for
    /// paths outside the crate.
    fn resolve(&self, from: &ModPath, path: &[String], hops: usize) -> Option<ModPath> {
        let mut here: ModPath = match path.first()?.as_str() {
            "crate" => Vec::new(),
            "super" | "self" => from.clone(),
            _ => return None,
        };
        let mut rest = path;
        while let Some(first) = rest.first() {
            match first.as_str() {
                "crate" | "self" => {}
                "super" => {
                    here.pop();
                }
                _ => break,
            }
            rest = &rest[1..];
        }
        for (i, segment) in rest.iter().enumerate() {
            let mut child = here.clone();
            child.push(segment.clone());
            if self.modules.contains_key(&child) {
                here = child;
                continue;
            }
            // An item: follow a re-export to the module that defines it.
            if hops < 8
                && let Some(target) = self.reexport(&here, segment)
                && let Some(module) = self.resolve(&here, &target, hops + 1)
            {
                let _ = i;
                return Some(module);
            }
            break;
        }
        Some(here)
    }

    /// Where `module` re-exports `name` from, as a path written inside `module`.
    fn reexport(&self, module: &ModPath, name: &str) -> Option<Vec<String>> {
        let text = self.modules.get(module)?;
        let mut paths = Vec::new();
        let mut rest = text.as_str();
        while let Some(i) = rest
            .find("pub use ")
            .or_else(|| rest.find("pub(crate) use "))
        {
            let after = &rest[i..];
            let start = after.find("use ").unwrap() + 4;
            let end = after.find(';').unwrap_or(after.len());
            expand_use_tree(&after[start..end], &mut Vec::new(), &mut paths);
            rest = &after[end..];
        }
        paths
            .into_iter()
            .find(|p| p.last().is_some_and(|last| last == name) && p.len() > 1)
            .map(|mut p| {
                if !matches!(p[0].as_str(), "crate" | "super" | "self") {
                    p.insert(0, "self".into());
                }
                p
            })
    }

    /// Edges between modules, as `from → to` pairs of module paths.
    fn edges(&self) -> BTreeSet<(ModPath, ModPath)> {
        let mut edges = BTreeSet::new();
        for (module, text) in &self.modules {
            for path in used_paths(text) {
                if let Some(target) = self.resolve(module, &path, 0)
                    && &target != module
                {
                    edges.insert((module.clone(), target));
                }
            }
        }
        edges
    }
}

/// Circles among the children of `parent`: each child stands for its whole subtree.
fn circles_under(parent: &ModPath, edges: &BTreeSet<(ModPath, ModPath)>) -> Vec<Vec<String>> {
    let child_of = |m: &ModPath| -> Option<String> {
        (m.len() > parent.len() && m.starts_with(parent)).then(|| m[parent.len()].clone())
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges {
        if let (Some(a), Some(b)) = (child_of(from), child_of(to))
            && a != b
        {
            graph.entry(a).or_default().insert(b);
        }
    }
    strongly_connected(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[w.as_str()].min(s.low[v]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w.as_str()) {
                let low = s.index[w.as_str()].min(s.low[v]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    for krate in crates() {
        let edges = krate.edges();
        for parent in krate.modules.keys() {
            for circle in circles_under(parent, &edges) {
                let at = if parent.is_empty() {
                    "crate".to_string()
                } else {
                    parent.join("::")
                };
                found.push(format!("{}: in {at}: {}", krate.name, circle.join(" <-> ")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other (directly or through others):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_sees_a_known_circle() {
    // The checker itself must be able to fail: a made-up crate with a → b → a.
    let krate = Crate {
        name: "example".into(),
        modules: BTreeMap::from([
            (vec![], "mod a; mod b;".to_string()),
            (vec!["a".into()], "use crate::b::Thing;".to_string()),
            (vec!["b".into()], "pub fn f() { crate::a::g() }".to_string()),
            (
                vec!["c".into()],
                "use super::{a, b::{self, Other}};".to_string(),
            ),
        ]),
    };
    let circles = circles_under(&vec![], &krate.edges());
    assert_eq!(circles, vec![vec!["a".to_string(), "b".to_string()]]);
}
