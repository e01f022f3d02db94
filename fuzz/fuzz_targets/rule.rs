//! The Router's rule model (`edgehive::router::rules`): a REST call's path
//! `/{node}/{namespace}/{path}`, a Rule or RuleEndpoint object as the API server sends it
//! (any JSON) read into the Router's rule, the match of a rule's path against a call's, and
//! an edge's upload resource. The input is a path line, then the object's JSON. Besides not
//! panicking: a parsed path names an object-name node and namespace and clean segments, and
//! prints back to a path that parses to itself; a rule's path has no empty segment; a match
//! gives the rest of the call's path after the rule's; a path matches itself with nothing
//! left; an upload resource, and a ServiceBus upload's (node and target URL), splits back to
//! itself.
#![no_main]

use edgehive::router::rules::{
    endpoint_type, is_clean_segment, is_object_name, is_target_url, join, key_of, match_path,
    parse_rest_path, parse_service_resource, parse_upload_resource, properties, RuleSpec,
};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (path, object) = text.split_once('\n').unwrap_or((text, ""));

    let parsed = parse_rest_path(path);
    if let Some(call) = &parsed {
        assert!(is_object_name(call.node) && is_object_name(call.namespace));
        assert!(call
            .segments
            .iter()
            .all(|s| is_clean_segment(s) && !s.contains('/')));
        let printed = format!(
            "/{}/{}/{}",
            call.node,
            call.namespace,
            call.segments.join("/")
        );
        assert_eq!(parse_rest_path(&printed).as_ref(), Some(call));
        let own: Vec<String> = call.segments.iter().map(|s| (*s).to_owned()).collect();
        let literal = own
            .iter()
            .filter(|s| !(s.starts_with('{') && s.ends_with('}') && s.len() > 2))
            .count();
        assert_eq!(
            match_path(&own, &call.segments),
            Some((literal, String::new()))
        );
    }

    if let Some((node, namespace, topic)) = parse_upload_resource(path) {
        assert_eq!(format!("node/{node}/{namespace}/{topic}"), path);
        assert!(!node.contains('/') && !namespace.contains('/'));
    }

    if let Some((node, url)) = parse_service_resource(path) {
        assert_eq!(format!("node/{node}/{url}"), path);
        assert!(!node.contains('/') && is_target_url(url));
    }

    let Ok(object) = serde_json::from_str::<serde_json::Value>(object) else {
        return;
    };
    let _ = (key_of(&object), endpoint_type(&object), properties(&object));
    let spec = RuleSpec::of(&object);
    assert_eq!(RuleSpec::of(&object), spec);
    let Some(rule_path) = spec.rest_path() else {
        return;
    };
    assert!(rule_path.iter().all(|s| !s.is_empty() && !s.contains('/')));
    if let Some(call) = &parsed {
        if let Some((literal, param)) = match_path(&rule_path, &call.segments) {
            assert!(literal <= rule_path.len() && rule_path.len() <= call.segments.len());
            assert_eq!(param, call.segments[rule_path.len()..].join("/"));
            if let Some(topic) = spec.target_resource.get("topic") {
                let resource = join(topic, &param);
                assert!(resource.ends_with(&param) && resource.len() >= param.len());
            }
        }
    }
});
