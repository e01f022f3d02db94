//! Edges of one list of cloud addresses (`websocket.servers`) whose cloud dies spread over the
//! clouds left instead of all dialing the next address: real EdgeHubs over loopback
//! WebSockets to three listeners that take sessions as CloudHub does and note whose they are.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions};
use edgehive_actors::hive::Hive;

/// Nodes with a session open on one listener.
type Sessions = Arc<Mutex<BTreeSet<String>>>;

/// Takes the WebSocket of `node_id` and holds it until the edge or the server ends it.
async fn session(
    req: HttpRequest,
    body: web::Payload,
    open: web::Data<Sessions>,
) -> Result<HttpResponse, actix_web::Error> {
    let node = req
        .headers()
        .get("node_id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (response, session, mut stream) = actix_ws::handle(&req, body)?;
    let open = open.get_ref().clone();
    open.lock().unwrap().insert(node.clone());
    actix_web::rt::spawn(async move {
        // Keepalives are read and ignored; the session ends with the stream.
        while let Some(Ok(item)) = stream.recv().await {
            if matches!(item, actix_ws::Message::Close(_)) {
                break;
            }
        }
        open.lock().unwrap().remove(&node);
        drop(session);
    });
    Ok(response)
}

/// A listener on loopback taking sessions; its handle stops it (and every session on it).
fn listener() -> (String, Sessions, actix_web::dev::ServerHandle) {
    let open = Sessions::default();
    let data = web::Data::new(open.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .default_service(web::to(session))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let address = server.addrs()[0].to_string();
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    (address, open, handle)
}

/// Polls `check` every 50 ms until it is true, failing after a minute.
async fn within_a_minute(what: &str, mut check: impl FnMut() -> Option<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let Some(state) = check() else { return };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {state}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn the_edges_of_a_dead_cloud_spread_over_the_clouds_left() {
    const EDGES: usize = 20;
    let (first, on_first, first_server) = listener();
    let (second, on_second, _second_server) = listener();
    let (third, on_third, _third_server) = listener();
    let servers = vec![first, second.clone(), third.clone()];
    let mut edges = Vec::new();
    for index in 0..EDGES {
        let node = format!("spread-{index}");
        let hive = Hive::new(&node);
        hive.start_module(EdgeHubModule::new(EdgeHubOptions {
            servers: servers.clone(),
            node_name: node,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(400),
            ..EdgeHubOptions::default()
        }))
        .unwrap();
        edges.push(hive);
    }
    // Every edge dials the first address first while it answers.
    within_a_minute("every edge on the first cloud", || {
        let count = on_first.lock().unwrap().len();
        (count < EDGES).then(|| format!("{count} of {EDGES}"))
    })
    .await;
    // The first cloud dies: its sessions end and its address refuses.
    first_server.stop(false).await;
    within_a_minute("every edge on one of the two clouds left", || {
        let (second, third) = (on_second.lock().unwrap(), on_third.lock().unwrap());
        let back: BTreeSet<&String> = second.union(&third).collect();
        (back.len() < EDGES || second.len() + third.len() != EDGES).then(|| {
            format!(
                "{} on {second:?}, {} on {third:?}",
                second.len(),
                third.len()
            )
        })
    })
    .await;
    let (on_second, on_third) = (
        on_second.lock().unwrap().len(),
        on_third.lock().unwrap().len(),
    );
    // Spread by a hash of the node name: not all on the next address (as each of them dialing
    // the one after the lost one would do), and no survivor left with only a few.
    for (address, count) in [(&second, on_second), (&third, on_third)] {
        assert!(
            count >= 4,
            "{address} took {count} of {EDGES} edges ({on_second} and {on_third})"
        );
    }
    for edge in edges {
        edge.shutdown();
    }
}
