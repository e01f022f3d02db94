//! Every integration test of this crate, built as one test binary: one link instead of one per
//! file, which is most of what a clean `cargo test` build costs. Run one file's tests with a
//! filter on its module, e.g. `cargo test --test all delivery_faults::`.

// Shared helpers.
mod support;
mod unlisted;

// One module per file of tests.
mod cloud_controller_admin;
mod cloud_extensions;
mod cloud_secrets;
mod cloudstream;
mod cloudstream_egress;
mod cloudstream_status;
mod delivery_faults;
mod deploy;
mod devices_end_to_end;
mod dynamiccontroller;
mod edge_api;
mod edge_autonomy;
mod edge_failover;
mod edge_metaserver;
mod edge_rss;
mod edgestream;
mod end_to_end;
mod eventbus;
mod handshake_flood;
mod join;
mod join_service;
mod kubeedge_config;
mod log_flood;
mod node_actors;
mod node_module;
mod nodegroups;
mod nodegroups_standin;
mod processes;
mod replica_faults;
mod replica_forwarding;
mod router;
mod security_admin;
mod security_config;
mod security_dynamiccontroller;
mod security_network;
mod security_node;
mod service_topology;
mod standin_cluster;
mod status_page;
mod tls_join;
mod tls_token_cli;
mod twin_durable;

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
