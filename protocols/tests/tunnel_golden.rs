//! Decodes every tunnel frame captured between a real edgecore v1.22 and cloudcore
//! (`tests/data/stream-tunnel-frames.txt`: the unique payloads of the shared golden captures
//! `stream-tunnel-vm.jsonl` and `stream-tunnel-identity.jsonl`) and re-encodes it byte for byte.

use std::path::Path;

use base64::Engine as _;
use edgehive_protocols::tunnel::{decode_tunnel, ConnectRequest, TunnelType};

struct Golden {
    at: String,
    upstream: bool,
    connect_id: u64,
    kind: u64,
    data_len: usize,
    payload: Vec<u8>,
}

fn frames() -> Vec<Golden> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/stream-tunnel-frames.txt");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields.len(), 6, "{line}");
            Golden {
                at: fields[0].to_owned(),
                upstream: fields[1] == "up",
                connect_id: fields[2].parse().unwrap(),
                kind: fields[3].parse().unwrap(),
                data_len: fields[4].parse().unwrap(),
                payload: base64::engine::general_purpose::STANDARD
                    .decode(fields[5])
                    .unwrap(),
            }
        })
        .collect()
}

#[test]
fn every_golden_tunnel_frame_decodes_and_re_encodes_byte_identically() {
    let frames = frames();
    assert!(frames.len() > 150, "{} frames", frames.len());
    let mut kinds = std::collections::HashSet::new();
    for golden in &frames {
        let frame =
            decode_tunnel(&golden.payload).unwrap_or_else(|err| panic!("{}: {err}", golden.at));
        assert_eq!(frame.connect_id, golden.connect_id, "{}", golden.at);
        assert_eq!(frame.kind.code(), golden.kind, "{}", golden.at);
        assert_eq!(frame.data.len(), golden.data_len, "{}", golden.at);
        assert_eq!(frame.encode(), golden.payload, "{}", golden.at);
        kinds.insert((golden.upstream, frame.kind));
    }
    // Every type the captures hold, in the direction it travelled.
    for kind in [
        TunnelType::LogsConnect,
        TunnelType::ExecConnect,
        TunnelType::MetricConnect,
        TunnelType::AttachConnect,
        TunnelType::CloseConnect,
    ] {
        assert!(kinds.contains(&(false, kind)), "no {}", kind.name());
    }
    assert!(kinds.contains(&(true, TunnelType::Data)));
    assert!(kinds.contains(&(true, TunnelType::RemoveConnect)));
    assert!(kinds.contains(&(false, TunnelType::RemoveConnect)));
}

#[test]
fn every_golden_connect_request_parses_and_re_encodes_as_go_wrote_it() {
    let mut seen = 0;
    for golden in frames() {
        let frame = decode_tunnel(&golden.payload).unwrap();
        if !frame.kind.is_connect() {
            continue;
        }
        seen += 1;
        let request = ConnectRequest::from_json(frame.data)
            .unwrap_or_else(|err| panic!("{}: {err}", golden.at));
        assert_eq!(request.mess_id, frame.connect_id, "{}", golden.at);
        assert_eq!(request.url.host, "127.0.0.1:10350", "{}", golden.at);
        assert_eq!(
            request.method.is_some(),
            matches!(
                frame.kind,
                TunnelType::ExecConnect | TunnelType::AttachConnect
            ),
            "{}",
            golden.at
        );
        assert_eq!(
            String::from_utf8(request.to_json()).unwrap(),
            String::from_utf8(frame.data.to_vec()).unwrap(),
            "{}",
            golden.at
        );
    }
    assert!(seen >= 15, "{seen} connect requests");
}
