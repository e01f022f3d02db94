//! The cloud's plug hook (`CloudProcess::start_with`): an extension module started by a plug
//! answers an edge's `user` message back to that node, shows on the cloud's
//! `/api/v1/modules`, is restarted by the supervisor after a panic, and gets its config
//! section `modules.<name>`; a section no extension reads is refused, naming its key.

use std::path::Path;
use std::time::Duration;

use actix::{Actor, Context, Handler};
use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::edge::EdgeProcess;
use edgehive::plug::Plug;
use edgehive_actors::cloud::contract::extension::{claim_upstream_group, reply};
use edgehive_actors::cloud::contract::{route, ToNodes};
use edgehive_actors::edge::contract::request_cloud;
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::support::{edge_config, edge_node, eventually, http_get, http_json, WITHIN};

const ECHO: &str = "echo";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EchoConfig {
    prefix: String,
}

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

/// Answers each message to its node with the configured prefix; panics on `"panic"`.
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
        let text = request.content_str().unwrap_or_default().to_owned();
        assert!(text != "panic", "asked to panic");
        let answer = reply(&request, json!(format!("{}{text}", self.prefix)));
        let to_node = ToNodes::from_message(answer).expect("the request names its node");
        self.hive.tell(route::CLOUDHUB, to_node).unwrap();
        None
    }
}

fn echo_plug(plug: &Plug) -> anyhow::Result<()> {
    let config: EchoConfig = plug.config(ECHO)?;
    claim_upstream_group(plug.hive(), "user", ECHO)?;
    plug.hive().start_module(EchoModule {
        prefix: config.prefix,
    })?;
    Ok(())
}

const CLOUD_YAML: &str = r#"
embeddedCluster:
  database: ""
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
    prefix: "from the cloud: "
"#;

fn cloud_config(yaml: &str) -> CloudConfig {
    CloudConfig::from_text_with_extensions(Path::new("cloud.yaml"), yaml, &[ECHO]).unwrap()
}

fn upload(text: &str) -> Message {
    Message::new(
        ModuleName::EventBus,
        Group::User,
        Operation::Upload,
        "default/echo/hello",
        json!(text),
    )
}

fn module<'a>(modules: &'a Value, name: &str) -> &'a Value {
    modules["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{name} listed in {modules}"))
}

/// The edge's `request_cloud` of a `user` upload, once the edge is connected.
async fn ask(edge: &EdgeProcess, text: &str, timeout: Duration) -> anyhow::Result<Message> {
    let message = upload(text);
    let answer = request_cloud(edge.hive(), message.clone(), timeout).await?;
    assert_eq!(answer.parent_id(), Some(message.id()), "{answer:?}");
    Ok(answer)
}

#[actix_rt::test]
async fn a_cloud_extension_answers_an_edges_user_message_and_is_supervised_like_the_built_in_modules(
) {
    let dir = tempfile::tempdir().unwrap();
    let cloud = CloudProcess::start_with(&cloud_config(CLOUD_YAML), None, echo_plug)
        .await
        .unwrap();
    cloud.cluster().unwrap().apply(edge_node("edge-x")).unwrap();
    let edge = EdgeProcess::start(&edge_config("edge-x", cloud.websocket_addr(), dir.path()))
        .await
        .unwrap();
    eventually("the edge connects", WITHIN, || async {
        edge.status().await.unwrap().connected.then_some(())
    })
    .await;

    // The round trip, with the prefix from `modules.echo`.
    let answer = ask(&edge, "hi", WITHIN).await.unwrap();
    assert_eq!(answer.content_str(), Some("from the cloud: hi"));
    assert_eq!(answer.group(), Some(&Group::User));

    // The answer goes to the node that asked, whatever node its resource names: CloudHub
    // puts the sender's name in front (`node/edge-x/…`) before the extension sees it.
    for resource in ["node/edge-v/default/echo/x", "/node/edge-v", "node"] {
        let mut spoof = upload("spoof");
        spoof.route.resource = resource.into();
        let answer = request_cloud(edge.hive(), spoof.clone(), WITHIN)
            .await
            .unwrap();
        assert_eq!(answer.parent_id(), Some(spoof.id()));
        assert_eq!(answer.content_str(), Some("from the cloud: spoof"));
    }

    // Listed on the cloud's supervision tree, like the built-in modules.
    let admin = cloud.admin_addr();
    let before = http_json(admin, "/api/v1/modules").await;
    assert_eq!(module(&before, ECHO)["group"], "user");
    assert_eq!(module(&before, ECHO)["restarts"], 0);
    assert_eq!(module(&before, ECHO)["state"], "running");

    // A panic: the supervisor starts it again, counted, and it answers again (its claim on
    // the group outlives the actor).
    let panicked = ask(&edge, "panic", Duration::from_secs(2)).await;
    assert!(panicked.is_err(), "{panicked:?}");
    eventually("the restart on /api/v1/modules", WITHIN, || async {
        let modules = http_json(admin, "/api/v1/modules").await;
        let echo = module(&modules, ECHO);
        (echo["restarts"] == 1 && echo["state"] == "running").then_some(())
    })
    .await;
    let metrics = http_get(admin, "/metrics").await.1;
    assert!(
        metrics.contains("edgehive_module_restarts_total{module=\"echo\"} 1"),
        "{metrics}"
    );
    let after = eventually("an answer after the restart", WITHIN, || async {
        ask(&edge, "again", Duration::from_secs(3)).await.ok()
    })
    .await;
    assert_eq!(after.content_str(), Some("from the cloud: again"));
    let modules = http_json(admin, "/api/v1/modules").await;
    assert_eq!(module(&modules, route::CLOUDHUB)["restarts"], 0);
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_extension_section_no_extension_reads_is_refused_naming_its_key() {
    // At load: a section of a name no extension declared, next to the one that is.
    let typo = format!("{CLOUD_YAML}  ehco:\n    prefix: x\n");
    let error = CloudConfig::from_text_with_extensions(Path::new("cloud.yaml"), &typo, &[ECHO])
        .unwrap_err()
        .to_string();
    assert!(error.contains("modules.ehco"), "{error}");
    // A built-in module's key stays checked with extensions declared.
    let built_in = CLOUD_YAML.replace("insecurePlaintext", "insecurePlaintxt");
    let error = CloudConfig::from_text_with_extensions(Path::new("cloud.yaml"), &built_in, &[ECHO])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("modules.cloudHub.websocket.insecurePlaintxt"),
        "{error}"
    );
    // An extension cannot take a built-in module's section.
    let error =
        CloudConfig::from_text_with_extensions(Path::new("cloud.yaml"), CLOUD_YAML, &["cloudHub"])
            .unwrap_err()
            .to_string();
    assert!(error.contains("modules.cloudHub"), "{error}");
    // Without the extension declared, its section is an unknown key, as before.
    let error = CloudConfig::from_text(Path::new("cloud.yaml"), CLOUD_YAML)
        .unwrap_err()
        .to_string();
    assert!(error.contains("modules.echo"), "{error}");

    // At start: a section the plug's modules do not read (declared, but no module claims it).
    let error = CloudProcess::start_with(&cloud_config(CLOUD_YAML), None, |_| Ok(()))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("modules.echo"), "{error}");
    // A value of the wrong type names the section's key.
    let wrong = CLOUD_YAML.replace("prefix: \"from the cloud: \"", "prefix: [1]");
    let error = CloudProcess::start_with(&cloud_config(&wrong), None, echo_plug)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("modules.echo.prefix"), "{error}");

    // The edge: the same for `edge.yaml`.
    let dir = tempfile::tempdir().unwrap();
    let edge_yaml = format!(
        "database:\n  dataSource: {}\nadmin:\n  bindAddress: 127.0.0.1:0\nmodules:\n  edgeHub:\n    websocket:\n      insecurePlaintext: true\n      server: 127.0.0.1:9\n  edged:\n    hostnameOverride: edge-y\n  taskManager:\n    port: 0\n",
        dir.path().join("edge-y.db").display()
    );
    let config =
        EdgeConfig::from_text_with_extensions(Path::new("edge.yaml"), &edge_yaml, &["taskManager"])
            .unwrap();
    let mut unread = config.clone();
    unread.database.data_source = dir.path().join("edge-z.db");
    let error = EdgeProcess::start_with(&unread, |_| Ok(()))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("modules.taskManager"), "{error}");
    let seen = std::cell::Cell::new(None);
    let edge = EdgeProcess::start_with(&config, |plug| {
        seen.set(plug.section("taskManager").cloned());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(seen.take(), Some(json!({"port": 0})));
    edge.stop().await;
}
