//! EventBus's topics, pure (no I/O; fuzzed by `fuzz/fuzz_targets/topic.rs`): the topics it
//! subscribes after every connect, what a DeviceTwin topic asks (either device form:
//! [`parse_topic`]), which topics a Router rule
//! may name, and MQTT's filter matching.
//!
//! KubeEdge's edgecore (external broker mode) subscribes, besides DeviceTwin's topics, three
//! fixed upload topics ([`UPLOAD_TOPICS`]): whatever a mapper or an application publishes
//! there goes up to the cloud's Router as an `upload` (source `bus`, group `user`, resource
//! the topic), as every message on a topic that is not DeviceTwin's does ([`is_twin_topic`]).

/// The prefix of the device topics (`$hw/events/device/{device}/...`).
pub const DEVICE_PREFIX: &str = "$hw/events/device/";
/// The prefix of the node topics (`$hw/events/node/{node}/...`).
pub const NODE_PREFIX: &str = "$hw/events/node/";
/// KubeEdge's fixed upload topics: an application's records (`$hw/events/upload/...`,
/// `SYS/dis/upload_records`) and any namespace's `user` tree (`{namespace}/user/...`).
pub const UPLOAD_TOPICS: [&str; 3] = ["$hw/events/upload/#", "SYS/dis/upload_records", "+/user/#"];
/// The longest topic a rule may name (KubeEdge's `sub_topics.topic` is `varchar(256)`).
pub const MAX_TOPIC_BYTES: usize = 256;

/// The device a DeviceTwin topic names: KubeEdge v1.16+'s `{namespace}/{name}` (two topic
/// levels, as edgecore v1.22 reads them), or the pre-1.16 `{name}` alone (one level).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct DeviceRef<'a> {
    /// The Device's namespace, `None` in the pre-1.16 form.
    pub namespace: Option<&'a str>,
    /// The Device's name.
    pub name: &'a str,
}

impl DeviceRef<'_> {
    /// The topic levels naming the device (`{namespace}/{name}` or `{name}`): replies to a
    /// request go on the form it came in.
    pub fn levels(&self) -> String {
        match self.namespace {
            Some(namespace) => format!("{namespace}/{}", self.name),
            None => self.name.to_owned(),
        }
    }
}

/// What a DeviceTwin topic asks.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Request<'a> {
    /// `$hw/events/device/{namespace}/{name}/twin/update` (or `{name}/twin/update`): a
    /// mapper's reading.
    TwinUpdate(DeviceRef<'a>),
    /// `.../twin/get`: the device's twins.
    TwinGet(DeviceRef<'a>),
    /// `.../state/update`: the device's state.
    StateUpdate(DeviceRef<'a>),
    /// `$hw/events/node/{node}/membership/get`: the node's devices.
    MembershipGet,
}

/// The request `topic` makes of node `node`'s DeviceTwin, or `None` for a topic EventBus
/// does not serve. A device topic is told apart by its number of levels, as a name holds no
/// `/`: `$hw/events/device/{a}/{b}/{c}` (six levels) is the pre-1.16 form, device `a`;
/// `$hw/events/device/{a}/{b}/{c}/{d}` (seven) the namespaced form, device `b` of namespace
/// `a`. No request of one form has the other's length, and the other form's replies
/// (`.../twin/update/result`, seven levels) never read as a request (`update/result` is
/// no action).
pub fn parse_topic<'a>(topic: &'a str, node: &str) -> Option<Request<'a>> {
    if let Some(rest) = topic.strip_prefix(DEVICE_PREFIX) {
        let levels: Vec<&str> = rest.split('/').collect();
        if levels.iter().any(|level| level.is_empty()) {
            return None;
        }
        let (device, action) = match levels.as_slice() {
            [name, first, second] => (
                DeviceRef {
                    namespace: None,
                    name,
                },
                (*first, *second),
            ),
            [namespace, name, first, second] => (
                DeviceRef {
                    namespace: Some(namespace),
                    name,
                },
                (*first, *second),
            ),
            _ => return None,
        };
        return match action {
            ("twin", "update") => Some(Request::TwinUpdate(device)),
            ("twin", "get") => Some(Request::TwinGet(device)),
            ("state", "update") => Some(Request::StateUpdate(device)),
            _ => None,
        };
    }
    let rest = topic.strip_prefix(NODE_PREFIX)?;
    (rest.strip_prefix(node)? == "/membership/get").then_some(Request::MembershipGet)
}

/// Whether a message on `topic` is DeviceTwin's (`$hw/events/device/...`,
/// `$hw/events/node/...`); any other topic EventBus gets a message on is uploaded, as
/// edgecore's EventBus does.
pub fn is_twin_topic(topic: &str) -> bool {
    topic.starts_with(DEVICE_PREFIX) || topic.starts_with(NODE_PREFIX)
}

/// The topics EventBus subscribes for node `node` whatever the rules: DeviceTwin's (edgecore
/// v1.22's namespaced filters, `twin/+` as edgecore subscribes it, then the pre-1.16 forms),
/// then KubeEdge's [`UPLOAD_TOPICS`].
pub fn fixed_topics(node: &str) -> Vec<String> {
    let mut topics = vec![
        format!("{DEVICE_PREFIX}+/+/state/update"),
        format!("{DEVICE_PREFIX}+/+/twin/+"),
        format!("{DEVICE_PREFIX}+/twin/update"),
        format!("{DEVICE_PREFIX}+/twin/get"),
        format!("{DEVICE_PREFIX}+/state/update"),
        format!("{NODE_PREFIX}{node}/membership/get"),
    ];
    topics.extend(UPLOAD_TOPICS.iter().map(|topic| (*topic).to_owned()));
    topics
}

/// Why a topic a rule publishes on is refused, if it is.
pub fn check_publish_topic(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES || topic.contains('\0') {
        return Err("empty, longer than 256 bytes or holding NUL");
    }
    if topic.contains(['+', '#']) {
        return Err("a wildcard in a topic to publish on");
    }
    if topic.starts_with('$') {
        return Err("a $ topic (the broker's and DeviceTwin's)");
    }
    Ok(())
}

/// Why a rule topic to subscribe is refused, if it is: `{namespace}/{topic}` with a
/// namespace's name first (so never a `$` topic, and no first-level wildcard), MQTT's
/// wildcard rules after it.
pub fn check_rule_topic(topic: &str) -> Result<(), &'static str> {
    if topic.len() > MAX_TOPIC_BYTES || topic.contains('\0') {
        return Err("longer than 256 bytes or holding NUL");
    }
    let Some((namespace, rest)) = topic.split_once('/') else {
        return Err("not {namespace}/{topic}");
    };
    let label = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    if !label || rest.is_empty() {
        return Err("not {namespace}/{topic}");
    }
    let levels: Vec<&str> = rest.split('/').collect();
    for (index, level) in levels.iter().enumerate() {
        let wild = level.contains(['+', '#']);
        if wild && *level != "+" && *level != "#" {
            return Err("a wildcard that is not a whole level");
        }
        if *level == "#" && index + 1 != levels.len() {
            return Err("# before the last level");
        }
    }
    Ok(())
}

/// Whether MQTT filter `filter` matches topic `topic` (MQTT 3.1.1, 4.7: `+` one level, a
/// last `#` any number of levels, its parent included; a filter starting with a wildcard
/// matches no `$` topic).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && !filter.starts_with('$') {
        return false;
    }
    let mut topic_levels = topic.split('/');
    for level in filter.split('/') {
        match level {
            "#" => return true,
            "+" => {
                if topic_levels.next().is_none() {
                    return false;
                }
            }
            exact => {
                if topic_levels.next() != Some(exact) {
                    return false;
                }
            }
        }
    }
    topic_levels.next().is_none()
}

/// Whether filter `general` matches every topic filter `specific` matches (so subscribing
/// both would deliver a message twice). Wildcards in `general` cover any level of
/// `specific` but a `#`, or a `$` first level.
pub fn covers(general: &str, specific: &str) -> bool {
    let mut wanted = specific.split('/').peekable();
    let mut first = true;
    let mut levels = general.split('/').peekable();
    while let Some(level) = levels.next() {
        let dollar = first && specific.starts_with('$');
        first = false;
        if level == "#" {
            return !dollar;
        }
        let Some(want) = wanted.next() else {
            // `specific` ended before `general` (only a last `#` takes the parent: above).
            return false;
        };
        match level {
            "+" if want != "#" && !dollar => {}
            "+" => return false,
            exact if exact == want => {}
            _ => return false,
        }
        if levels.peek().is_none() {
            return wanted.next().is_none();
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_the_device_and_the_request() {
        let legacy = |name| DeviceRef {
            namespace: None,
            name,
        };
        let namespaced = |namespace, name| DeviceRef {
            namespace: Some(namespace),
            name,
        };
        assert_eq!(
            parse_topic("$hw/events/device/sensor-1/twin/update", "n1"),
            Some(Request::TwinUpdate(legacy("sensor-1")))
        );
        assert_eq!(
            parse_topic("$hw/events/device/s/state/update", "n1"),
            Some(Request::StateUpdate(legacy("s")))
        );
        assert_eq!(
            parse_topic("$hw/events/device/default/s/twin/get", "n1"),
            Some(Request::TwinGet(namespaced("default", "s")))
        );
        // A namespaced device named `twin` is not the pre-1.16 form's `twin/...`.
        assert_eq!(
            parse_topic("$hw/events/device/ns/twin/twin/update", "n1"),
            Some(Request::TwinUpdate(namespaced("ns", "twin")))
        );
        for unserved in [
            "$hw/events/device/s/twin/get/result",
            "$hw/events/device/ns/s/twin/update/result",
            "$hw/events/device/ns/s/twin/cloud_updated",
            "$hw/events/device/ns//twin/update",
            "$hw/events/device//s/twin/update",
            "$hw/events/device/a/b/c/twin/update",
            "$hw/events/device/twin/update",
        ] {
            assert_eq!(parse_topic(unserved, "n1"), None, "{unserved}");
        }
        for topic in [
            "$hw/events/device/ns/s/twin/update",
            "$hw/events/device/ns/s/state/update",
            "$hw/events/device/s/twin/update",
        ] {
            assert!(
                fixed_topics("n1").iter().any(|f| topic_matches(f, topic)),
                "{topic}"
            );
        }
        // Neither form's replies reach a filter EventBus subscribes (no loop).
        for reply in [
            "$hw/events/device/ns/s/twin/update/result",
            "$hw/events/device/ns/s/twin/update/delta",
            "$hw/events/device/s/twin/update/delta",
            "$hw/events/device/s/twin/get/result",
            "$hw/events/device/s/state/update/result",
        ] {
            assert!(
                !fixed_topics("n1").iter().any(|f| topic_matches(f, reply)),
                "{reply}"
            );
        }
        assert_eq!(
            parse_topic("$hw/events/node/n1/membership/get", "n1"),
            Some(Request::MembershipGet)
        );
        assert_eq!(parse_topic("$hw/events/node/n2/membership/get", "n1"), None);
        assert_eq!(parse_topic("$hw/events/device//twin/update", "n1"), None);
        assert_eq!(
            parse_topic("$hw/events/device/s/twin/update/result", "n1"),
            None
        );
        assert!(!is_twin_topic("$hw/events/upload/x"));
        assert!(!is_twin_topic("SYS/dis/upload_records"));
        assert!(is_twin_topic("$hw/events/device/d/twin/update"));
    }

    #[test]
    fn rule_topics_start_with_a_namespace_and_never_reach_dollar_topics() {
        for good in ["default/a", "default/a/+/b", "ns-1/#", "default/+"] {
            assert_eq!(check_rule_topic(good), Ok(()), "{good}");
        }
        for bad in [
            "#",
            "+/x",
            "$hw/events/device/+/twin/update",
            "default",
            "default/",
            "Default/a",
            "default/a#",
            "default/#/a",
            "-x/a",
            "default/a+b",
        ] {
            assert!(check_rule_topic(bad).is_err(), "{bad}");
        }
        assert!(check_rule_topic(&format!("default/{}", "a".repeat(300))).is_err());
        for bad in [
            "",
            "$hw/events/device/d/twin/update/delta",
            "a/+",
            "a/#",
            "$SYS/x",
        ] {
            assert!(check_publish_topic(bad).is_err(), "{bad}");
        }
        assert_eq!(check_publish_topic("test/a"), Ok(()));
    }

    #[test]
    fn filters_match_as_mqtt_does() {
        assert!(topic_matches("default/a", "default/a"));
        assert!(!topic_matches("default/a", "default/a/b"));
        assert!(topic_matches("default/+", "default/a"));
        assert!(!topic_matches("default/+", "default/a/b"));
        assert!(topic_matches("default/#", "default/a/b"));
        assert!(topic_matches("default/#", "default"));
        assert!(!topic_matches(
            "default/#",
            "$hw/events/device/d/twin/update"
        ));
        assert!(!topic_matches("default/a", "other/a"));
        assert!(topic_matches("+/user/#", "default/user/a/b"));
        assert!(!topic_matches("+/user/#", "$hw/user/a"));
    }

    #[test]
    fn a_filter_covers_the_filters_whose_topics_it_all_matches() {
        assert!(covers("+/user/#", "default/user/a"));
        assert!(covers("+/user/#", "default/user/#"));
        assert!(covers("+/user/#", "default/user"));
        assert!(covers("+/user/#", "+/user/+"));
        assert!(covers("a/#", "a"));
        assert!(covers("a/b", "a/b"));
        assert!(!covers("+/user/#", "default/other"));
        assert!(!covers("+/user", "default/user/a"));
        assert!(!covers("a/+", "a/#"));
        assert!(!covers("a/b", "a/+"));
        assert!(!covers("+/user/#", "$hw/user/a"));
        assert!(!covers("#", "$SYS/a"));
        assert!(covers("$hw/events/upload/#", "$hw/events/upload/a"));
    }
}
