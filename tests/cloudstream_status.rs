//! CloudStream on the cloud's admin endpoint and status page: each node's stream tunnel with
//! its open streams and the bytes it sent the API server (`/api/v1/streams`, and `streams` in
//! `/api/v1/nodes`), over real HTTP, with a stand-in edgecore holding a `kubectl logs -f`.

use futures_util::StreamExt;
use serde_json::Value;

use crate::cloudstream_egress::{start, NODE, NODE_IP};
use crate::support::{eventually, http_get, http_json, start_cloud, WITHIN};
use crate::tls_join::{dial, node_cert};

fn node<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list["nodes"].as_array()?.iter().find(|n| n["node"] == name)
}

#[actix_rt::test]
async fn the_admin_endpoint_shows_each_nodes_open_streams_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |_| {}).await;
    let admin = setup.cloud.admin_addr();
    // The node's CloudHub connection (edgecore's EdgeHub) and its stream tunnel (EdgeStream).
    let cert = node_cert(&setup.ca, NODE);
    let _hub = dial(&setup.cloud, setup.ca.cert_der(), &cert, NODE)
        .await
        .unwrap();
    setup.edge().await;
    let streams = http_json(admin, "/api/v1/streams").await;
    assert_eq!(streams["enabled"], true);
    assert_eq!(streams["tunnels"], 1);
    assert_eq!(node(&streams, NODE).unwrap()["openStreams"], 0);

    // A `kubectl logs -f` held open: the edge sent one line.
    let api = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(setup.api.clone()))
        .timeout(WITHIN)
        .finish();
    let stream_addr = setup.cloud.cloud_stream().unwrap().stream_addr();
    let mut follow = api
        .get(format!(
            "https://{stream_addr}/containerLogs/default/printer/main?follow=true"
        ))
        .insert_header(("Host", format!("{NODE}:10250")))
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status().as_u16(), 200);
    let first = tokio::time::timeout(WITHIN, follow.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let line = format!("log of /containerLogs/default/printer/main on {NODE}\n");
    assert_eq!(&first[..], line.as_bytes());
    let sent = line.len() as u64;

    let streams = http_json(admin, "/api/v1/streams").await;
    assert_eq!(streams["openStreams"], 1, "{streams}");
    let entry = node(&streams, NODE).unwrap();
    assert_eq!(entry["openStreams"], 1, "{streams}");
    assert_eq!(entry["bytesToApiserver"], sent, "{streams}");
    assert_eq!(entry["internalIp"], NODE_IP, "{streams}");
    let nodes = eventually("the node is listed with its streams", WITHIN, || async {
        let nodes = http_json(admin, "/api/v1/nodes").await;
        (node(&nodes, NODE)?["streams"]["open"] == 1).then_some(nodes)
    })
    .await;
    assert_eq!(
        node(&nodes, NODE).unwrap()["streams"]["bytesToApiserver"],
        sent,
        "{nodes}"
    );

    // The client leaves: the stream closes, the bytes stay with the tunnel.
    drop(follow);
    eventually("the stream is closed", WITHIN, || async {
        let streams = http_json(admin, "/api/v1/streams").await;
        (node(&streams, NODE)?["openStreams"] == 0).then_some(())
    })
    .await;
    let nodes = http_json(admin, "/api/v1/nodes").await;
    let listed = &node(&nodes, NODE).unwrap()["streams"];
    assert_eq!(listed["open"], 0, "{nodes}");
    assert_eq!(listed["bytesToApiserver"], sent, "{nodes}");

    // The status page has the columns that show them.
    let (status, page) = http_get(admin, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains(r#"<th class="n">streams</th>"#));
    assert!(page.contains("n.streams.bytesToApiserver"));
    setup.cloud.stop().await;
}

#[actix_rt::test]
async fn without_cloudstream_the_admin_endpoint_says_it_is_off() {
    let cloud = start_cloud().await;
    let streams = http_json(cloud.admin_addr(), "/api/v1/streams").await;
    assert_eq!(streams["enabled"], false);
    assert_eq!(streams["tunnels"], 0);
    cloud.stop().await;
}
