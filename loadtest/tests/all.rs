//! Every integration test of the load tool, built as one test binary (as the other crates'
//! `tests/all.rs`). Run one file's tests with a filter on its module, e.g.
//! `cargo test -p edgehive-loadtest --test all loadtest::`.

// Shared helpers.
mod support;
#[path = "../../tests/unlisted.rs"]
mod unlisted;

// One module per file of tests.
mod cluster_mode;
mod loadtest;
mod product_build;

/// Cargo builds only this file as a test (`autotests = false`), so a new file in `tests/` runs
/// only once it is listed above. This test fails until it is.
#[test]
fn every_test_file_is_listed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let missing = unlisted::unlisted(dir, include_str!("all.rs"));
    assert!(
        missing.is_empty(),
        "tests/all.rs does not list: {missing:?}"
    );
}
