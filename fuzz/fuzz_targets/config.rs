//! The config loader (`edgehive::config`): any text as a cloud and as an edge config file.
//! A file the loader accepts also gives every setting the processes derive from it.
#![no_main]

use std::path::Path;

use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive_actors::cloud::cloudhub::GateMetrics;
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

fuzz_target!(|data: &[u8]| {
    // The loader reads files as UTF-8 text (`read_to_string`).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.yaml");
    if let Ok(cloud) = CloudConfig::from_text(path, text) {
        let hub = &cloud.modules.cloud_hub;
        let _ = (hub.options(), hub.tls_files(), hub.advertise_ips());
        let _ = (hub.handshake_limits(), hub.token_refresh());
        let _ = hub.cert_server_options(GateMetrics::default());
        let _ = cloud.embedded_cluster.event_retention();
        let _ = cloud.embedded_cluster.store_limits(hub);
        let _ = cloud.kube_api_config.kube_options();
    }
    if let Ok(edge) = EdgeConfig::from_text(path, text) {
        let _ = (
            edge.remote_query_timeout(),
            edge.node_name(),
            edge.admin_socket(),
        );
        let _ = (edge.node_options(), edge.edge_hub_options());
    }
});
