//! Reads every MetaServer ⇄ DynamicController message captured between a real edgecore v1.22
//! and cloudcore (`tests/data/metaserver-application-frames.jsonl`, taken from the shared
//! golden capture `metaserver-cloudhub-vm.jsonl`) as an `Application` and writes it back to
//! the same JSON.

use std::path::Path;

use edgehive_protocols::application::{
    Application, ApplicationKey, ApplicationStatus, Verb, APPLICATION_REQUEST_RESOURCE,
    APPLICATION_RESPONSE_RESOURCE, WATCH_SYNC_RESOURCE,
};
use edgehive_protocols::{decode, Group, ModuleName, Operation};
use serde_json::Value;

fn frames() -> Vec<(u64, String, edgehive_protocols::Message)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/metaserver-application-frames.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            let raw = record["raw"].as_str().unwrap();
            (
                record["seq"].as_u64().unwrap(),
                record["dir"].as_str().unwrap().to_owned(),
                decode(raw.trim_end().as_bytes()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn every_captured_application_reads_and_writes_back_to_the_same_json() {
    let frames = frames();
    assert_eq!(frames.len(), 12);
    let mut applications = 0;
    for (seq, dir, message) in &frames {
        if message.resource() == WATCH_SYNC_RESOURCE {
            assert_eq!(&message.content, &serde_json::json!({}), "seq {seq}");
            continue;
        }
        let app: Application = serde_json::from_value(message.content.clone())
            .unwrap_or_else(|err| panic!("seq {seq}: {err}"));
        applications += 1;
        let mut expected = message.content.clone();
        // Go writes an empty []byte as `null` or `""`; edgehive writes `null`.
        if expected["RespBody"] == "" {
            expected["RespBody"] = Value::Null;
        }
        assert_eq!(serde_json::to_value(&app).unwrap(), expected, "seq {seq}");
        if dir == "edge->cloud" {
            assert_eq!(message.route.source, Some(ModuleName::MetaServer));
            assert_eq!(message.route.group, Some(Group::DynamicController));
            assert_eq!(message.resource(), APPLICATION_REQUEST_RESOURCE);
            assert_eq!(app.status, ApplicationStatus::InApplying);
        } else {
            assert_eq!(message.route.source, Some(ModuleName::DynamicController));
            assert_eq!(
                message.route.operation,
                Some(Operation::ApplicationResponse)
            );
            assert_eq!(message.resource(), APPLICATION_RESPONSE_RESOURCE);
            assert_ne!(app.status, ApplicationStatus::InApplying);
        }
    }
    assert_eq!(applications, 10);
}

#[test]
fn captured_answers_carry_the_api_servers_json_or_its_status() {
    for (seq, _, message) in frames() {
        let Ok(app) = serde_json::from_value::<Application>(message.content.clone()) else {
            continue;
        };
        match (seq, app.status) {
            (25, ApplicationStatus::Approved) => {
                let list: Value = serde_json::from_slice(&app.resp_body).unwrap();
                assert_eq!(list["kind"], "PodList");
                assert_eq!(app.verb, Verb::List);
                assert_eq!(ApplicationKey::parse(&app.key).unwrap().resource, "pods");
            }
            (41, ApplicationStatus::Rejected) => {
                assert_eq!(app.error.err_status["reason"], "NotFound");
                assert_eq!(app.error.err_status["code"], 404);
            }
            (43, ApplicationStatus::Approved) => {
                let version: Value = serde_json::from_slice(&app.resp_body).unwrap();
                assert_eq!(version["gitVersion"], "v1.31.14");
                assert!(ApplicationKey::parse(&app.key).is_err());
            }
            (46, ApplicationStatus::InApplying) => {
                assert_eq!(app.options()["labelSelector"], "app=golden");
            }
            (100, ApplicationStatus::InApplying) => {
                assert_eq!(app.verb, Verb::Watch);
                assert_eq!(app.options()["resourceVersion"], "844");
            }
            (101, ApplicationStatus::Approved) => assert!(app.resp_body.is_empty()),
            (seq, status) if [25, 41, 43, 46, 100, 101].contains(&seq) => {
                panic!("seq {seq}: unexpected status {status:?}")
            }
            _ => {}
        }
    }
}
