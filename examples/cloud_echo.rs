//! A cloud extension module: answers the `user`-group messages edges send it, back to the
//! node each came from, with a prefix read from its own config section.
//!
//! It plugs in like the built-in modules: a `Module` recipe the plug starts on the cloud's
//! hive (`CloudProcess::start_with`), supervised and listed on `/api/v1/modules` like them.
//! It claims the upstream group `user`
//! (`edgehive_actors::cloud::contract::extension::claim_upstream_group`), so CloudHub hands it
//! every `user` message an edge sends (after authorization), and it answers through CloudHub
//! by name (`route::CLOUDHUB`, a `ToNodes`), with the controllers' delivery rules. Its
//! settings are `modules.echo` in `cloud.yaml`, which the loader keeps for it because the
//! program names the extension (`load_files_with_extensions`).
//!
//! Run: `cargo run --example cloud_echo`. It starts a cloud and one edge on loopback, sends a
//! `user` upload from the edge with `request_cloud`, and prints the cloud's answer; it fails
//! (exits non-zero) if the answer does not come back or is not the echo.

use std::path::Path;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use anyhow::{bail, Context as _};
use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::edge::EdgeProcess;
use edgehive_actors::cloud::contract::extension::{claim_upstream_group, reply};
use edgehive_actors::cloud::contract::{route, ToNodes};
use edgehive_actors::edge::contract::request_cloud;
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde::Deserialize;
use serde_json::json;

/// The extension's name: its module name, and its config section `modules.echo`.
const ECHO: &str = "echo";

/// `modules.echo` in `cloud.yaml`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EchoConfig {
    /// Put before the text of every answer.
    prefix: String,
}

/// The recipe: what every incarnation of the actor gets.
struct EchoModule {
    prefix: String,
}

impl Module for EchoModule {
    type Actor = Echo;

    fn name(&self) -> &str {
        ECHO
    }

    fn group(&self) -> &str {
        "user"
    }

    fn create(&self, hive: &Hive) -> Echo {
        Echo {
            hive: hive.clone(),
            prefix: self.prefix.clone(),
        }
    }
}

/// The actor: answers each message to the node it came from.
struct Echo {
    hive: Hive,
    prefix: String,
}

impl Actor for Echo {
    type Context = Context<Self>;
}

impl Handler<Envelope> for Echo {
    type Result = Option<Message>;

    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let request = envelope.into_message();
        let text = request.content_str().unwrap_or_default();
        let answer = reply(&request, json!(format!("{}{text}", self.prefix)));
        // The request's resource names its node (`node/{node}/…`), and so does the answer.
        if let Some(to_node) = ToNodes::from_message(answer) {
            if let Err(refused) = self.hive.tell(route::CLOUDHUB, to_node) {
                eprintln!("cloudhub did not take the answer: {}", refused.error);
            }
        }
        None
    }
}

/// The plug: claims its section and group, starts the module.
fn plug(plug: &edgehive::plug::Plug) -> anyhow::Result<()> {
    let config: EchoConfig = plug.config(ECHO)?;
    claim_upstream_group(plug.hive(), "user", ECHO)?;
    plug.hive().start_module(EchoModule {
        prefix: config.prefix,
    })?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    actix_rt::System::new().block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Plain ws:// keeps the example about modules; `edgehive demo` shows the TLS join.
    let cloud_yaml = r#"
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
modules:
  cloudHub:
    websocket:
      address: 127.0.0.1
      port: 0
      insecurePlaintext: true
  echo:
    prefix: "echo: "
embeddedCluster:
  database: ""
"#;
    let cloud_config =
        CloudConfig::from_text_with_extensions(Path::new("cloud.yaml"), cloud_yaml, &[ECHO])?;
    let cloud = CloudProcess::start_with(&cloud_config, None, plug).await?;
    let cluster = cloud
        .cluster()
        .context("no kubeAPIConfig: the embedded cluster")?;
    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "edge-e", "labels": {"node-role.kubernetes.io/edge": ""}},
    }))?;

    let mut edge_config = EdgeConfig::default();
    edge_config.modules.edged.hostname_override = "edge-e".into();
    edge_config.modules.edge_hub.websocket.server = cloud.websocket_addr().to_string();
    edge_config.database.data_source = dir.path().join("edge-e.db");
    edge_config.admin.bind_address = "127.0.0.1:0".into();
    edge_config.modules.edge_hub.websocket.insecure_plaintext = true;
    let edge = EdgeProcess::start(&edge_config).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !edge.status().await?.connected {
        if Instant::now() > deadline {
            bail!("the edge did not connect to the cloud");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // What KubeEdge's EventBus sends for an MQTT upload: group `user`, operation `upload`.
    let upload = Message::new(
        ModuleName::EventBus,
        Group::User,
        Operation::Upload,
        "default/echo/hello",
        json!("hello from edge-e"),
    );
    let answer = request_cloud(edge.hive(), upload.clone(), Duration::from_secs(10))
        .await
        .context("the cloud's echo module did not answer")?;
    let text = answer.content_str().unwrap_or_default().to_owned();
    println!(
        "edge-e sent {:?}, the cloud answered {text:?}",
        "hello from edge-e"
    );
    edge.stop().await;
    cloud.stop().await;
    if answer.parent_id() != Some(upload.id()) || text != "echo: hello from edge-e" {
        bail!("unexpected answer: {answer:?}");
    }
    Ok(())
}
