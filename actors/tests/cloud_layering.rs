//! Source-reading checks of the cloud's written rules (ARCHITECTURE.md): beehive messages
//! are built only in `cloud/contract/` and in CloudHub (a controller names what it sends
//! through the contract and never builds or edits a `Message` itself), and only the one watch
//! machinery (`cloud/watcher.rs`) watches the cluster.

use std::path::{Path, PathBuf};

/// The crate's sources: the directory cargo runs the test in (set at run time, so the check
/// can be pointed at another checkout: `CARGO_MANIFEST_DIR=/other/actors ./all cloud_layering`).
fn crate_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Every `.rs` file under `root` but those under `skipped` folders.
fn sources(root: &Path, skipped: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !skipped.contains(&path) {
                    folders.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The code of a source file that is not its tests (what follows the first `#[cfg(test)]`)
/// and not comments.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, line)| line.trim() != "#[cfg(test)]")
        .map(|(number, line)| (number + 1, line.split("//").next().unwrap_or_default()))
}

/// Whether `code` builds or edits a beehive message: a `Message::` constructor
/// (`Message::new`, `Message::response_to`, …), a `Message { … }` literal, or an assignment to
/// a message's `route` or `header` fields. `NodeMessage::`, `ActixMessage` and the like are
/// other types; `struct`/`impl … for` lines and return types declare, not build.
fn builds_message(code: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let constructs = code.match_indices("Message").any(|(at, word)| {
        let before = &code[..at];
        let after = &code[at + word.len()..];
        if before.ends_with(is_ident) {
            return false;
        }
        // `struct Message {`, `impl … for Message {`, `fn f() -> Message {`: not a literal.
        let declares = ["struct", "enum", "for", "impl", "->"]
            .iter()
            .any(|keyword| before.trim_end().ends_with(keyword));
        after.starts_with("::") || (after.starts_with(" {") && !declares)
    });
    let edits = [".route.", ".header."].iter().any(|field| {
        code.match_indices(field).any(|(at, field)| {
            let rest = &code[at + field.len()..];
            let rest = rest.trim_start_matches(is_ident).trim_start();
            rest.starts_with('=') && !rest.starts_with("==")
        })
    });
    constructs || edits
}

/// "Beehive messages are built only in `cloud/contract/` and CloudHub": no other cloud source
/// (tests excluded) constructs a `Message` or sets its router or header fields.
#[test]
fn cloud_controllers_build_no_beehive_message_outside_the_contract() {
    let cloud = crate_dir().join("src/cloud");
    let files = sources(&cloud, &[cloud.join("contract"), cloud.join("cloudhub")]);
    assert!(
        files.len() >= 15,
        "only {} cloud sources found under {cloud:?}",
        files.len()
    );
    let mut offenders = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        for (number, code) in code_lines(&text) {
            if builds_message(code) {
                offenders.push(format!("{}:{number}: {}", path.display(), code.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "cloud modules building beehive messages (add a constructor to cloud/contract/ and \
         name what is sent instead):\n{}",
        offenders.join("\n")
    );
}

/// "One watch machinery": no cloud source but the cluster adapters and `cloud/watcher.rs`
/// (tests excluded) opens a watch or handles a lagged one; every follower uses `KindWatcher`.
#[test]
fn only_the_watch_machinery_watches_the_cluster() {
    let cloud = crate_dir().join("src/cloud");
    let files = sources(&cloud, &[cloud.join("cluster")]);
    let mut offenders = Vec::new();
    for path in files.iter().filter(|path| !path.ends_with("watcher.rs")) {
        let text = std::fs::read_to_string(path).unwrap();
        for (number, code) in code_lines(&text) {
            if code.contains(".watch(") || code.contains("WatchError::Lagged") {
                offenders.push(format!("{}:{number}: {}", path.display(), code.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "cloud modules with a watch loop of their own (follow the kind with \
         cloud::watcher::KindWatcher instead):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_message_check_finds_what_it_looks_for() {
    assert!(builds_message("        self.outbox.send(Message::new("));
    assert!(builds_message(
        "let reply = Message::response_to(&request, json!(\"OK\"));"
    ));
    assert!(builds_message("let m = edgehive_protocols::Message {"));
    assert!(builds_message(
        "    reply.route.source = Some(ModuleName::DeviceController);"
    ));
    assert!(builds_message(
        "message.header.resource_version = String::new();"
    ));
    assert!(!builds_message(
        "message: NodeMessage::from_owned(message),"
    ));
    assert!(!builds_message("pub struct Message {"));
    assert!(!builds_message("impl Handler<Envelope> for Message {"));
    assert!(!builds_message(
        "    fn pod_gone(&self, name: &str) -> Message {"
    ));
    assert!(!builds_message(
        "if reply.header.sync == other.header.sync {"
    ));
    assert!(!builds_message("#[derive(Debug, ActixMessage)]"));
    assert!(!builds_message(
        "fn handle(&mut self, m: Message) -> Option<Message> {"
    ));
    let tests = "fn a() {}\n#[cfg(test)]\nmod tests { fn b() { Message::new(x); } }";
    assert_eq!(code_lines(tests).count(), 1, "tests are not read");
}
