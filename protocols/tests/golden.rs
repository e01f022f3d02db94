//! Round-trips every frame captured from real KubeEdge v1.22.0 (see tests/data, copied from the
//! shared golden captures) through `decode` and `encode`.

use std::path::Path;

use edgehive_protocols::{decode, encode, trim_for_edge, EdgeResource, Message};
use serde_json::Value;

const FILES: [&str; 4] = [
    "fake-edge-real-cloudcore-edge-2.jsonl",
    "fake-edge-session-end-edge-2.jsonl",
    "real-edgecore-node-delete-edge-3.jsonl",
    "real-edgecore-real-cloudcore-edge-3.jsonl",
];

/// Frames whose route may lack known values. Only edgecore's empty goodbye frame on SIGTERM
/// (`"msg_id":""`, `"route":{}`); every source, group and operation actually captured is in our
/// vocabularies.
const ALLOWED_UNKNOWN: [(&str, u64); 1] = [("real-edgecore-real-cloudcore-edge-3.jsonl", 48)];

/// Edge-side resources that are not `{ns}/{type}[/{name}]`.
const NON_OBJECT_RESOURCES: [&str; 5] =
    ["", "node", "membership", "membership/detail", "k8s/ca.crt"];

struct Frame {
    file: &'static str,
    upstream: bool,
    seq: u64,
    raw: String,
}

fn frames() -> Vec<Frame> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut frames = Vec::new();
    for file in FILES {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let record: Value = serde_json::from_str(line).unwrap();
            let dir = record["dir"].as_str().unwrap();
            if dir != "cloud->edge" && dir != "edge->cloud" {
                continue;
            }
            frames.push(Frame {
                file,
                upstream: dir == "edge->cloud",
                seq: record["seq"].as_u64().unwrap(),
                raw: record["raw"].as_str().unwrap().to_owned(),
            });
        }
    }
    frames
}

fn decoded(frame: &Frame) -> Message {
    decode(frame.raw.as_bytes())
        .unwrap_or_else(|err| panic!("{} seq {}: {err}", frame.file, frame.seq))
}

#[test]
fn all_frames_round_trip_byte_for_byte() {
    let frames = frames();
    // 86 + 78 + 8 + 3 frames per the golden README.
    assert_eq!(frames.len(), 175);
    for frame in &frames {
        let encoded = encode(&decoded(frame));
        let raw_value: Value = serde_json::from_str(&frame.raw).unwrap();
        let encoded_value: Value = serde_json::from_str(&encoded).unwrap();
        assert_eq!(
            encoded_value, raw_value,
            "{} seq {}: value differs",
            frame.file, frame.seq
        );
        // No exceptions are needed: the captures hold no floats, and strings, integers and key
        // order are reproduced exactly.
        assert_eq!(
            encoded, frame.raw,
            "{} seq {}: bytes differ",
            frame.file, frame.seq
        );
    }
}

#[test]
fn html_escapes_are_reproduced() {
    let escaped: Vec<_> = frames()
        .into_iter()
        .filter(|frame| frame.raw.contains("\\u003c") && frame.raw.contains("\\u0026"))
        .collect();
    assert!(
        !escaped.is_empty(),
        "captures should contain Go's HTML escapes"
    );
    for frame in &escaped {
        assert_eq!(encode(&decoded(frame)), frame.raw);
    }
}

#[test]
fn route_vocabulary_is_known() {
    let mut unknown = Vec::new();
    for frame in frames() {
        let msg = decoded(&frame);
        let route = &msg.route;
        let known = route.source.as_ref().is_some_and(|v| v.is_known())
            && route.group.as_ref().is_some_and(|v| v.is_known())
            && route.operation.as_ref().is_some_and(|v| v.is_known());
        if known {
            continue;
        }
        let summary = format!(
            "{} seq {}: source={:?} group={:?} operation={:?}",
            frame.file, frame.seq, route.source, route.group, route.operation
        );
        println!("unknown route values: {summary}");
        if !ALLOWED_UNKNOWN.contains(&(frame.file, frame.seq)) {
            unknown.push(summary);
        }
    }
    assert!(
        unknown.is_empty(),
        "unexpected unknown values: {unknown:#?}"
    );
}

#[test]
fn resources_are_edge_side_objects() {
    for frame in frames() {
        let msg = decoded(&frame);
        let resource = msg.resource();
        // The edge never sees cloud-side prefixes in either direction.
        assert_eq!(
            trim_for_edge(resource),
            resource,
            "{} seq {}",
            frame.file,
            frame.seq
        );
        if NON_OBJECT_RESOURCES.contains(&resource) {
            continue;
        }
        let parsed = EdgeResource::parse(resource)
            .unwrap_or_else(|err| panic!("{} seq {}: {err}", frame.file, frame.seq));
        assert!(parsed.resource_type.is_known(), "{resource}");
        assert_eq!(parsed.key(), resource);
    }
}

#[test]
fn replies_answer_a_frame_from_the_other_side() {
    let frames = frames();
    let mut replies = 0;
    for reply in &frames {
        let msg = decoded(reply);
        if !msg.is_response() {
            continue;
        }
        replies += 1;
        let parent = msg.parent_id().unwrap_or_default();
        let request = frames.iter().find(|request| {
            request.file == reply.file
                && request.upstream != reply.upstream
                && decoded(request).id() == parent
        });
        assert!(
            request.is_some(),
            "{} seq {}: parent {parent:?} not sent by the peer",
            reply.file,
            reply.seq
        );
    }
    assert!(replies > 50, "only {replies} replies");
}
