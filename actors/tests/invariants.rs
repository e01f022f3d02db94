//! ARCHITECTURE.md's "one of each" rules, checked by reading the product's sources (every
//! crate's `src/`, tests excluded): a rule written there must fail a test when code breaks it.

use std::path::{Path, PathBuf};

/// The workspace's product sources: the actors crate, the binary, the protocol crate and the
/// load tool.
fn product_sources() -> Vec<(PathBuf, String)> {
    let actors = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = actors.parent().unwrap();
    let mut files = Vec::new();
    for dir in [
        actors.join("src"),
        root.join("src"),
        root.join("protocols/src"),
        root.join("loadtest/src"),
    ] {
        let mut folders = vec![dir];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    files.push((path, product_code(&text)));
                }
            }
        }
    }
    assert!(files.len() > 60, "only {} sources found", files.len());
    files
}

/// `text` without its unit-test module (`#[cfg(test)]` then `mod …`, at the end of a file as
/// everywhere in this workspace) and without line comments.
fn product_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|pair| {
            pair[0].trim() == "#[cfg(test)]" && pair[1].trim_start().starts_with("mod ")
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .map(|line| match line.find("//") {
            // `"https://…"` inside a string is not a comment: keep lines where `//` follows a
            // quote's opening.
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines of `files` that `offends` picks, as `path:line: text`.
fn offenders(files: &[(PathBuf, String)], offends: impl Fn(&Path, &str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for (path, code) in files {
        for (number, line) in code.lines().enumerate() {
            if offends(path, line) {
                found.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

/// The hive's ways of addressing a module by name, as they appear in a call.
const ADDRESSING: [&str; 7] = [
    ".tell(",
    ".ask(",
    ".request(",
    ".send(",
    ".send_to_group(",
    ".call::<",
    "request_cloud(",
];

/// Whether `code` (a whole file) passes a string literal as the module or group a hive call
/// addresses: names are spelled once, in the contracts' `route` modules.
fn literal_addresses(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for call in ADDRESSING {
        for (at, _) in code.match_indices(call) {
            let mut rest = &code[at + call.len()..];
            if call == ".call::<" {
                // Past the turbofish to the argument list.
                match rest.find(">(") {
                    Some(close) => rest = &rest[close + 2..],
                    None => continue,
                }
            }
            if call == "request_cloud(" {
                // request_cloud(&hive, name, …): the name is the second argument.
                match rest.find(',') {
                    Some(comma) => rest = &rest[comma + 1..],
                    None => continue,
                }
            }
            if rest.trim_start().starts_with('"') {
                let line_end = code[at..].find('\n').map_or(code.len(), |end| at + end);
                found.push(code[at..line_end].trim().to_owned());
            }
        }
    }
    found
}

/// "Module names are spelled once": every hive call names its module with a route constant.
#[test]
fn hive_calls_name_modules_by_the_route_constants() {
    let mut found = Vec::new();
    for (path, code) in product_sources() {
        for call in literal_addresses(&code) {
            found.push(format!("{}: {call}", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "a module addressed by a string literal (use cloud::contract::route or \
         edge::contract::route):\n{}",
        found.join("\n")
    );
}

/// "One lock helper": only `hive::locks` takes a guard from a poisoned lock, and no product
/// code unwraps a lock (which would turn one panic into a panic in every later holder).
#[test]
fn poisoned_locks_are_handled_only_by_the_lock_helper() {
    let files = product_sources();
    let found = offenders(&files, |path, line| {
        let helper = path.ends_with("hive/locks.rs");
        (!helper && (line.contains("poisoned") || line.contains("PoisonError")))
            || [
                ".lock().unwrap(",
                ".lock().expect(",
                ".read().unwrap(",
                ".write().unwrap(",
            ]
            .iter()
            .any(|bad| line.contains(bad))
    });
    assert!(
        found.is_empty(),
        "lock handling outside hive::locks:\n{}",
        found.join("\n")
    );
}

/// "What a pod uses" is read in one place (`protocols::object`), so delivery and
/// authorization cannot disagree about which ConfigMaps and Secrets a pod may read.
#[test]
fn what_a_pod_uses_is_read_only_by_the_protocol_helper() {
    let files = product_sources();
    let found = offenders(&files, |path, line| {
        !path.ends_with("protocols/src/object.rs")
            && [
                "[\"configMap\"]",
                "[\"secretName\"]",
                "[\"configMapRef\"]",
                "[\"secretRef\"]",
                "[\"configMapKeyRef\"]",
                "[\"secretKeyRef\"]",
            ]
            .iter()
            .any(|key| line.contains(key))
    });
    assert!(
        found.is_empty(),
        "a pod's ConfigMap/Secret references read outside protocols::object:\n{}",
        found.join("\n")
    );
}

/// The checks above find what they look for (a check that cannot fail proves nothing).
#[test]
fn the_source_checks_find_what_they_look_for() {
    assert_eq!(
        literal_addresses("hive.tell(\"edgecontroller\", msg)").len(),
        1
    );
    assert_eq!(
        literal_addresses("hive\n    .ask(\n        \"twin\",\n        q, t)").len(),
        1
    );
    assert_eq!(
        literal_addresses("hive.call::<DeviceTwin, _>(\"twin\", q, t)").len(),
        1
    );
    assert_eq!(
        literal_addresses("request_cloud(&hive, \"websocket\", r)").len(),
        1
    );
    assert!(literal_addresses("hive.tell(route::EDGECONTROLLER, msg)").is_empty());
    assert!(literal_addresses("hive.call::<DeviceTwin, _>(TWIN, q, t)").is_empty());
    let code = product_code(
        "let a = 1; // hive.tell(\"x\", m)\nlet u = \"https://x\";\n#[cfg(test)]\nmod tests {\n    \
         hive.tell(\"x\", m);\n}\n",
    );
    assert!(literal_addresses(&code).is_empty());
    assert!(code.contains("https://x"));
}

/// Modules address each other by name and message type: no product code names a module's
/// actor type to reach it (`Hive::call::<Actor, _>` is for tests).
#[test]
fn no_product_code_calls_a_module_by_its_actor_type() {
    let files = product_sources();
    let found = offenders(&files, |path, line| {
        !path.ends_with("hive/registry.rs") && line.contains(".call::<")
    });
    assert!(
        found.is_empty(),
        "a module reached by its actor type (use Hive::ask/tell with a route constant):\n{}",
        found.join("\n")
    );
}
