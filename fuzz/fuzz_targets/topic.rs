//! EventBus's topics (`edgehive_actors::edge::bus_topics`): what a DeviceTwin topic asks, the
//! checks of a rule's topics, MQTT filter matching and which filter covers which. The input
//! is up to three lines: a filter, a topic and a node name. Besides not panicking: a request
//! is read only from a topic EventBus subscribes and never uploads; a rule topic never
//! reaches a `$` topic; a publish topic matches itself and is not DeviceTwin's; matching
//! agrees with a level-by-level reading of MQTT 3.1.1 (4.7); a filter that covers another
//! matches every topic the other matches.
#![no_main]

use edgehive_actors::edge::bus_topics::{
    check_publish_topic, check_rule_topic, covers, fixed_topics, is_twin_topic, parse_topic,
    topic_matches, Request, DEVICE_PREFIX, NODE_PREFIX, UPLOAD_TOPICS,
};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

/// A valid MQTT filter: non-empty, wildcards only as whole levels, `#` only last.
fn valid_filter(filter: &str) -> bool {
    let levels: Vec<&str> = filter.split('/').collect();
    !filter.is_empty()
        && !filter.contains('\0')
        && levels.iter().enumerate().all(|(index, level)| {
            !level.contains(['+', '#'])
                || *level == "+"
                || (*level == "#" && index + 1 == levels.len())
        })
}

/// A valid MQTT topic name: non-empty, no wildcard, no NUL.
fn valid_topic(topic: &str) -> bool {
    !topic.is_empty() && !topic.contains(['+', '#', '\0'])
}

/// MQTT 3.1.1's matching, read differently: filter and topic as level lists.
fn reference_match(filter: &[&str], topic: &[&str], first: bool) -> bool {
    if first && topic.first().is_some_and(|level| level.starts_with('$')) {
        match filter.first() {
            Some(&"+") | Some(&"#") => return false,
            _ => {}
        }
    }
    match (filter.first(), topic.first()) {
        (Some(&"#"), _) => true,
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some(&"+"), Some(_)) => reference_match(&filter[1..], &topic[1..], false),
        (Some(want), Some(got)) => want == got && reference_match(&filter[1..], &topic[1..], false),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.splitn(3, '\n');
    let filter = lines.next().unwrap_or_default();
    let topic = lines.next().unwrap_or_default();
    let node = lines.next().unwrap_or("edge-1");

    for candidate in [filter, topic] {
        let request = parse_topic(candidate, node);
        if let Some(request) = request {
            assert!(is_twin_topic(candidate), "{candidate:?} read but uploaded");
            let subscribed = fixed_topics(node)
                .iter()
                .any(|fixed| topic_matches(fixed, candidate));
            assert!(subscribed, "{candidate:?} read but never subscribed");
            let rebuilt = match request {
                Request::TwinUpdate(device) => {
                    format!("{DEVICE_PREFIX}{}/twin/update", device.levels())
                }
                Request::TwinGet(device) => format!("{DEVICE_PREFIX}{}/twin/get", device.levels()),
                Request::StateUpdate(device) => {
                    format!("{DEVICE_PREFIX}{}/state/update", device.levels())
                }
                Request::MembershipGet => format!("{NODE_PREFIX}{node}/membership/get"),
            };
            assert_eq!(rebuilt, candidate);
            if let Request::TwinUpdate(device)
            | Request::TwinGet(device)
            | Request::StateUpdate(device) = request
            {
                assert!(!device.name.contains('/') && !device.name.is_empty());
                assert!(device
                    .namespace
                    .is_none_or(|namespace| !namespace.contains('/') && !namespace.is_empty()));
            }
            // A request's replies are never read as a request (no loop through the broker).
            for reply in ["result", "delta", "document"] {
                assert!(parse_topic(&format!("{candidate}/{reply}"), node).is_none());
            }
        }
        if check_publish_topic(candidate).is_ok() {
            assert!(valid_topic(candidate));
            assert!(topic_matches(candidate, candidate));
            assert!(!is_twin_topic(candidate) && request.is_none());
        }
        if check_rule_topic(candidate).is_ok() {
            assert!(valid_filter(candidate), "{candidate:?}");
            for dollar in ["$hw/events/device/d/twin/update", "$SYS/a", "$"] {
                assert!(
                    !topic_matches(candidate, dollar),
                    "{candidate:?} reaches {dollar}"
                );
            }
        }
    }

    if valid_filter(filter) && valid_topic(topic) {
        let levels: Vec<&str> = filter.split('/').collect();
        let topic_levels: Vec<&str> = topic.split('/').collect();
        assert_eq!(
            topic_matches(filter, topic),
            reference_match(&levels, &topic_levels, true),
            "{filter:?} against {topic:?}"
        );
        for general in UPLOAD_TOPICS.iter().copied().chain([filter]) {
            for specific in [filter, topic] {
                if valid_filter(specific)
                    && covers(general, specific)
                    && topic_matches(specific, topic)
                {
                    assert!(
                        topic_matches(general, topic),
                        "{general:?} covers {specific:?} but misses {topic:?}"
                    );
                }
            }
        }
        assert!(covers(filter, filter), "{filter:?} does not cover itself");
    }
});
