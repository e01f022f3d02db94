//! Every integration test of this crate, built as one test binary: one link instead of one per
//! file, which is most of what a clean `cargo test` build costs. Run one file's tests with a
//! filter on its module, e.g. `cargo test --test all delivery_faults::`.

// Shared helpers.
mod support;

// One module per file of tests.
mod cloud_controller_admin;
mod delivery_faults;
mod devices_end_to_end;
mod edge_api;
mod edge_autonomy;
mod edge_rss;
mod end_to_end;
mod handshake_flood;
mod join;
mod kubeedge_config;
mod loadtest;
mod log_flood;
mod node_actors;
mod node_module;
mod processes;
mod status_page;
mod tls_join;
mod tls_token_cli;
mod twin_durable;

/// Cargo builds only this file as a test (`autotests = false`), so a new file in `tests/` runs
/// only once it is listed above. This test fails until it is.
#[test]
fn every_test_file_is_listed() {
    let listed = include_str!("all.rs");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the tests directory") {
        let path = entry.expect("read a directory entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs")
            && stem != "all"
            && !listed.contains(&format!("mod {stem};"))
        {
            missing.push(stem.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/all.rs does not list: {missing:?}"
    );
}
