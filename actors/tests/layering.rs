//! The import rules ARCHITECTURE.md states, checked on the sources: `cloud` and `edge` never
//! import each other, and the files of every folder of `src/` import each other one way (no
//! cycle; `mod.rs` on top). Comments, string literals and `#[cfg(test)]` modules are not
//! imports and are skipped. (`edge_connection.rs` checks the edge's rule about EdgeHub's actor type.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file: its module path in the crate and its code without comments, literals
/// and test modules.
struct Source {
    path: PathBuf,
    module: Vec<String>,
    code: String,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `folder` (a folder of `src/`), recursively.
fn sources(folder: &str) -> Vec<Source> {
    let root = src();
    let mut found = Vec::new();
    let mut folders = vec![root.join(folder)];
    while let Some(dir) = folders.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(&root).unwrap().with_extension("");
                let mut module: Vec<String> = relative
                    .iter()
                    .map(|part| part.to_string_lossy().into_owned())
                    .collect();
                if module.last().is_some_and(|last| last == "mod") {
                    module.pop();
                }
                let text = std::fs::read_to_string(&path).unwrap();
                found.push(Source {
                    path,
                    module,
                    code: strip_test_modules(&code_only(&text)),
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// `text` with comments removed and string and char literals emptied; line breaks kept, so
/// line numbers still match.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // Keeps the line breaks of skipped text.
    let skip = |out: &mut String, from: usize, to: usize| {
        out.extend(chars[from..to].iter().filter(|c| **c == '\n'));
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len());
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < chars.len() && depth > 0 {
                if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 1;
                } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 1;
                }
                j += 1;
            }
            skip(&mut out, i, j);
            i = j;
        } else if c == 'r'
            && matches!(next, Some('"') | Some('#'))
            && !out.ends_with(|p: char| p.is_alphanumeric() || p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body_start = i + 2 + hashes;
            let rest: String = chars[body_start..].iter().collect();
            let end = body_start
                + rest
                    .find(&close)
                    .map(|at| rest[..at].chars().count() + close.len())
                    .unwrap_or(rest.chars().count());
            out.push_str("\"\"");
            skip(&mut out, i, end);
            i = end;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            skip(&mut out, i, j.min(chars.len()));
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\''); otherwise a lifetime or a label.
            let end = if next == Some('\\') {
                (i + 3..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` (from [`code_only`]) without its `#[cfg(test)] mod name { ... }` blocks.
fn strip_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_module = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        let open = trimmed.find(['{', ';']);
        match (is_module, open) {
            (true, Some(open)) if trimmed.as_bytes()[open] == b'{' => {
                let body = &trimmed[open..];
                let mut depth = 0usize;
                let mut end = body.len();
                for (j, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                out.push_str(&rest[..at]);
                let skipped = &rest[at..rest.len() - trimmed.len() + open + end];
                out.extend(skipped.chars().filter(|c| *c == '\n'));
                rest = &trimmed[open + end..];
            }
            _ => {
                let keep = at + "#[cfg(test)]".len();
                out.push_str(&rest[..keep]);
                rest = &rest[keep..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` that starts with `crate::`, `super::` or `self::`, resolved against
/// `module` to an absolute module path in the crate (its first two segments after the
/// prefix; each item of a `{...}` group its own path), with the line it is on.
fn absolute_paths(module: &[String], code: &str) -> Vec<(Vec<String>, usize)> {
    let mut paths = Vec::new();
    for (line_index, line) in code.lines().enumerate() {
        let mut at = 0;
        while at < line.len() {
            let rest = &line[at..];
            let starts_path = ["crate::", "super::", "self::"]
                .iter()
                .any(|prefix| rest.starts_with(prefix));
            // `pub(in crate::edge)` is a visibility, not an import.
            let preceded = line[..at].ends_with(is_ident)
                || line[..at].ends_with("::")
                || line[..at].ends_with("(in ");
            if !starts_path || preceded {
                at += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            }
            let mut base: Vec<String> = module.to_vec();
            let mut tail = rest;
            loop {
                if let Some(after) = tail.strip_prefix("crate::") {
                    base.clear();
                    tail = after;
                } else if let Some(after) = tail.strip_prefix("super::") {
                    base.pop();
                    tail = after;
                } else if let Some(after) = tail.strip_prefix("self::") {
                    tail = after;
                } else {
                    break;
                }
            }
            // A group may span lines: take the text up to its closing brace.
            let consumed = rest.len() - tail.len();
            let text_after: String = if tail.starts_with('{') {
                let from = code
                    .lines()
                    .take(line_index)
                    .map(|l| l.len() + 1)
                    .sum::<usize>()
                    + at
                    + consumed;
                group_text(&code[from..])
            } else {
                tail.chars()
                    .take_while(|c| is_ident(*c) || *c == ':')
                    .collect()
            };
            for item in group_items(&text_after) {
                let mut path = base.clone();
                path.extend(item.split("::").filter(|s| !s.is_empty()).map(String::from));
                paths.push((path, line_index + 1));
            }
            at += consumed + 1;
        }
    }
    paths
}

/// The `{ ... }` at the start of `text`, braces included.
fn group_text(text: &str) -> String {
    let mut depth = 0usize;
    for (j, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return text[..=j].to_owned();
                }
            }
            _ => {}
        }
    }
    text.to_owned()
}

/// The paths a use tree names at its top level: `a::b` → [`a::b`]; `{a::B, c, self}` → [`a`,
/// `c`, ``] (the first segment is what decides the file).
fn group_items(text: &str) -> Vec<String> {
    let Some(inner) = text.strip_prefix('{') else {
        return vec![text.trim_end_matches(':').to_owned()];
    };
    let inner = inner.strip_suffix('}').unwrap_or(inner);
    let mut items = Vec::new();
    let (mut depth, mut current) = (0usize, String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            current.push(c);
        }
    }
    items.push(current);
    items
        .into_iter()
        .filter_map(|item| {
            let first: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
            match first.as_str() {
                "" => None,
                "self" => Some(String::new()),
                _ => Some(first),
            }
        })
        .collect()
}

/// The file-level import graph of the folder `folder` (a module path such as
/// `cloud/cloudhub`, or `` for `src/` itself): its nodes are its files and its subfolders
/// (a subfolder counts as one node, all its files together), and `mod` for its `mod.rs`
/// (`lib.rs` at the top); an edge `a → b`, with the line that makes it, when `a` names
/// something of `b`. `mod.rs` declares every other file, so it depends on all of them; a name
/// `mod.rs` re-exports from a file (`pub use node::NodeActor;`) belongs to that file (and one
/// it re-exports from outside the folder to none), and a file that names an item defined in
/// `mod.rs` itself depends on `mod.rs`.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn folder_graph(folder: &str) -> Graph {
    let files = sources(folder);
    let folder_module: Vec<String> = folder
        .split('/')
        .filter(|part| !part.is_empty())
        .map(String::from)
        .collect();
    let is_top =
        |s: &Source| s.module == folder_module || (folder_module.is_empty() && s.module == ["lib"]);
    // The node a file belongs to: `mod`, a file of the folder, or a subfolder.
    let node_of = |s: &Source| {
        if is_top(s) {
            "mod".to_owned()
        } else {
            s.module[folder_module.len()].clone()
        }
    };
    let stems: BTreeSet<String> = files.iter().map(node_of).collect();
    let reexports = files
        .iter()
        .find(|s| is_top(s))
        .map(|top| reexported_names(&top.code, &stems))
        .unwrap_or_default();
    let mut graph = Graph::new();
    for stem in &stems {
        graph.entry(stem.clone()).or_default();
    }
    for source in &files {
        let from = node_of(source);
        let edges = graph.entry(from.clone()).or_default();
        if from == "mod" {
            for stem in stems.iter().filter(|stem| *stem != "mod") {
                edges.insert(stem.clone(), format!("mod.rs declares `mod {stem}`"));
            }
            continue;
        }
        for (path, line) in absolute_paths(&source.module, &source.code) {
            if !path.starts_with(&folder_module) {
                continue;
            }
            let to = match path.get(folder_module.len()) {
                Some(first) if stems.contains(first) && first != "mod" => first.clone(),
                Some(name) if reexports.contains_key(name) => reexports[name].clone(),
                _ => "mod".to_owned(),
            };
            if to != from && !to.is_empty() {
                let file = source.path.strip_prefix(src()).unwrap_or(&source.path);
                let text = source.code.lines().nth(line - 1).unwrap_or_default().trim();
                edges
                    .entry(to)
                    .or_insert_with(|| format!("{}:{line}: {text}", file.display()));
            }
        }
    }
    graph
}

/// The names the top file `code` (a `mod.rs` or `lib.rs`) re-exports (`pub use
/// node::{NodeActor, NodeInfo};`, `pub use a::B as C;`), each with its file, or `` when it
/// comes from outside the folder.
fn reexported_names(code: &str, stems: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let preceded = rest[..at].ends_with(is_ident);
        let after = &rest[at + "use ".len()..];
        let end = after.find(';').unwrap_or(after.len());
        let tree = &after[..end];
        rest = &after[end..];
        if preceded {
            continue;
        }
        let Some((first, leaves)) = tree.trim().split_once("::") else {
            continue;
        };
        if first == "mod" {
            continue;
        }
        // A name re-exported from outside the folder (`pub use edgehive_protocols::x;`)
        // belongs to no file of it: "" below.
        let owner = if stems.contains(first) { first } else { "" };
        let words: Vec<&str> = leaves
            .split(|c: char| !is_ident(c))
            .filter(|word| !word.is_empty())
            .collect();
        for (i, word) in words.iter().enumerate() {
            if *word == "as" || *word == "self" || words.get(i + 1) == Some(&"as") {
                continue;
            }
            names.insert((*word).to_owned(), owner.to_owned());
        }
    }
    names
}

/// The groups of files that import each other in a circle (each listed in name order).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let reaches = |from: &String, to: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(node) = stack.pop() {
            for next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
                if next == to {
                    return true;
                }
                if seen.insert(next) {
                    stack.push(next);
                }
            }
        }
        false
    };
    let mut placed = BTreeSet::new();
    let mut found = Vec::new();
    for node in &nodes {
        if placed.contains(*node) || !reaches(node, node) {
            continue;
        }
        let group: Vec<String> = nodes
            .iter()
            .filter(|other| reaches(node, other) && reaches(other, node))
            .map(|other| (*other).clone())
            .collect();
        placed.extend(group.iter().cloned());
        found.push(group);
    }
    found
}

/// The files in an order where each imports only files before it (bottom first).
fn layers(graph: &Graph) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    let mut left: BTreeSet<&String> = graph.keys().collect();
    while !left.is_empty() {
        let ready: Vec<&String> = left
            .iter()
            .filter(|node| {
                graph[**node]
                    .keys()
                    .all(|to| order.contains(to) || !graph.contains_key(to))
            })
            .copied()
            .collect();
        if ready.is_empty() {
            break;
        }
        for node in ready {
            order.push(node.clone());
            left.remove(node);
        }
    }
    order
}

fn describe(graph: &Graph, cycles: &[Vec<String>]) -> String {
    let mut text = String::new();
    for group in cycles {
        text.push_str(&format!("cycle among {}:\n", group.join(", ")));
        for from in group {
            for (to, why) in &graph[from] {
                if group.contains(to) {
                    text.push_str(&format!("  {from} -> {to}   ({why})\n"));
                }
            }
        }
    }
    text
}

#[test]
fn cloudhub_files_import_each_other_one_way() {
    let graph = folder_graph("cloud/cloudhub");
    assert!(
        graph.len() >= 15 && graph.contains_key("mod") && graph.contains_key("node"),
        "cloudhub's files not found: {:?}",
        graph.keys().collect::<Vec<_>>()
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "cloud/cloudhub/ has import cycles (dependencies must run one way, see \
         ARCHITECTURE.md):\n{}",
        describe(&graph, &found)
    );
    // Bottom first; mod.rs, which declares every file, is last.
    let order = layers(&graph);
    println!("cloud/cloudhub/, bottom first: {}", order.join(", "));
    for (from, edges) in &graph {
        let to: Vec<&String> = edges.keys().collect();
        println!("  {from} -> {to:?}");
    }
    assert_eq!(order.last().map(String::as_str), Some("mod"), "{order:?}");
}

/// Every folder of `src/` (`` for `src/` itself), sorted.
fn folders() -> Vec<String> {
    let root = src();
    let mut found = vec![String::new()];
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let relative = path.strip_prefix(&root).unwrap();
                found.push(relative.to_string_lossy().replace('\\', "/"));
                pending.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn no_folder_has_an_import_cycle() {
    let all = folders();
    for expected in [
        "",
        "hive",
        "identity",
        "cloud/cloudhub",
        "cloud/cluster",
        "edge",
    ] {
        assert!(
            all.iter().any(|f| f == expected),
            "src/{expected} not found: {all:?}"
        );
    }
    let mut report = String::new();
    for folder in &all {
        let graph = folder_graph(folder);
        let found = cycles(&graph);
        println!("src/{folder}/, bottom first: {}", layers(&graph).join(", "));
        if !found.is_empty() {
            report.push_str(&format!("src/{folder}/:\n{}", describe(&graph, &found)));
        }
    }
    assert!(
        report.is_empty(),
        "import cycles among the files of a folder (dependencies must run one way, see \
         ARCHITECTURE.md):\n{report}"
    );
}

#[test]
fn cloud_and_edge_never_import_each_other() {
    let mut offenders = Vec::new();
    for (side, other) in [("cloud", "edge"), ("edge", "cloud")] {
        let files = sources(side);
        assert!(
            files.len() >= 10,
            "only {} files under src/{side}",
            files.len()
        );
        for source in &files {
            for (path, line) in absolute_paths(&source.module, &source.code) {
                if path.first().is_some_and(|first| first == other) {
                    offenders.push(format!(
                        "{}:{line}: names crate::{}",
                        source.path.display(),
                        path.join("::")
                    ));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "cloud and edge import each other (what both need belongs in hive, identity or \
         protocols):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_import_checks_find_what_they_look_for() {
    let module: Vec<String> = ["cloud", "cloudhub", "node"].map(String::from).to_vec();
    let paths = |code: &str| -> Vec<String> {
        absolute_paths(&module, &strip_test_modules(&code_only(code)))
            .into_iter()
            .map(|(path, _)| path.join("::"))
            .collect()
    };
    assert_eq!(
        paths("use super::session::{Link, NodeSession};"),
        ["cloud::cloudhub::session"]
    );
    assert_eq!(
        paths("use super::{\n    Admit, gate,\n    self,\n};"),
        [
            "cloud::cloudhub::Admit",
            "cloud::cloudhub::gate",
            "cloud::cloudhub"
        ]
    );
    assert_eq!(
        paths("x.get(&super::metrics::ReasonLabels { reason })"),
        ["cloud::cloudhub::metrics::ReasonLabels"]
    );
    assert_eq!(paths("use crate::edge::contract;"), ["edge::contract"]);
    assert_eq!(
        paths("use super::super::contract::route;"),
        ["cloud::contract::route"]
    );
    assert!(paths("pub(in crate::edge) fn publish(&self) {}").is_empty());
    // Comments, strings and test modules are not imports.
    assert!(paths("// use super::session::Outgoing;\n/// [`super::node`]").is_empty());
    assert!(paths("let s = \"use super::node::X;\"; let c = '{';").is_empty());
    assert!(paths(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::dispatch::x;\n}\n"
    )
    .is_empty());

    // A circle is found, with the lines that make it; a one-way graph has none.
    let mut graph = Graph::new();
    let edge = |graph: &mut Graph, from: &str, to: &str| {
        graph
            .entry(from.into())
            .or_default()
            .insert(to.into(), format!("{from} uses {to}"));
        graph.entry(to.into()).or_default();
    };
    edge(&mut graph, "mod", "node");
    edge(&mut graph, "node", "dispatch");
    edge(&mut graph, "dispatch", "context");
    assert!(cycles(&graph).is_empty());
    assert_eq!(layers(&graph), ["context", "dispatch", "node", "mod"]);
    edge(&mut graph, "dispatch", "node");
    let found = cycles(&graph);
    assert_eq!(found, [vec!["dispatch".to_owned(), "node".to_owned()]]);
    assert!(describe(&graph, &found).contains("dispatch -> node   (dispatch uses node)"));

    // A name `mod.rs` re-exports belongs to the file it comes from; one from outside the
    // folder to none.
    let stems: BTreeSet<String> = ["hub", "node"].map(String::from).into();
    let names = reexported_names(
        "pub mod hub;\nmod node;\npub use hub::{CloudHub, Downstream as Down};\n\
         pub use node::NodeActor;\npub use crate::cloud::contract::DisconnectNode;\n",
        &stems,
    );
    assert_eq!(names.get("CloudHub").map(String::as_str), Some("hub"));
    assert_eq!(names.get("Down").map(String::as_str), Some("hub"));
    assert_eq!(names.get("Downstream"), None);
    assert_eq!(names.get("NodeActor").map(String::as_str), Some("node"));
    assert_eq!(names.get("DisconnectNode").map(String::as_str), Some(""));
}
