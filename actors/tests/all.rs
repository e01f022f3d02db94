//! Every integration test of this crate, built as one test binary: one link instead of one per
//! file, which is most of what a clean `cargo test` build costs. Run one file's tests with a
//! filter on its module, e.g. `cargo test -p edgehive-actors --test all hub_delivery::`.

// Shared helpers.
mod cloud_support;
mod edge_support;
#[path = "../../tests/unlisted.rs"]
mod unlisted;

// One module per file of tests.
mod cloud_controller_downstream;
mod cloud_controller_upstream;
mod cloud_dynamiccontroller;
mod cloud_edgecontroller;
mod cloud_hub;
mod cloud_kube;
mod cloud_kube_controllers;
mod cloud_layering;
mod cloud_replicas;
mod cloud_watch_faults;
mod cloudstream;
mod devices_controller;
mod edge_connection;
mod edge_metamanager;
mod edge_metaserver;
mod edge_node_golden;
mod edge_node_kube;
mod edge_requests;
mod edge_spread;
mod edge_store;
mod edge_twin;
mod edge_walking_skeleton;
mod edge_watch;
mod hive;
mod hub_delivery;
mod invariants;
mod kube_crds;
mod layering;
mod sync_kube;
mod sync_reconcile;
mod write_limits;

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
