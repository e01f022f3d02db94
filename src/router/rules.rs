//! Rule and RuleEndpoint (`rules.kubeedge.io/v1`) as the Router reads them, and how a REST
//! path or an edge's topic finds its rule. Pure: no I/O, so it is tested on its own, and
//! public for the fuzz target that feeds it any bytes (`fuzz/fuzz_targets/rule.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The hive's one lock helper: the Router's locks guard counters, specs and maps, whole
/// after any panic of a holder.
pub(crate) use edgehive_actors::hive::locks::lock;

/// A RuleEndpoint's type (`spec.ruleEndpointType`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointType {
    /// The cloud's REST port (source) or an HTTP URL (target).
    Rest,
    /// An edge's EventBus (MQTT).
    EventBus,
    /// An edge's ServiceBus (HTTP on the node).
    ServiceBus,
    /// Anything else: no rule with it is served.
    Other(String),
}

impl EndpointType {
    fn parse(text: &str) -> Self {
        match text {
            "rest" => EndpointType::Rest,
            "eventbus" => EndpointType::EventBus,
            "servicebus" => EndpointType::ServiceBus,
            other => EndpointType::Other(other.to_owned()),
        }
    }
}

/// `(namespace, name)`.
pub type Key = (String, String);

/// The key of a watched object.
pub fn key_of(object: &Value) -> Option<Key> {
    let meta = &object["metadata"];
    let name = meta["name"].as_str()?;
    let namespace = meta["namespace"].as_str().unwrap_or("default");
    Some((namespace.to_owned(), name.to_owned()))
}

/// The RuleEndpoint's type.
pub fn endpoint_type(object: &Value) -> EndpointType {
    EndpointType::parse(object["spec"]["ruleEndpointType"].as_str().unwrap_or(""))
}

/// A RuleEndpoint's `spec.properties`.
pub fn properties(object: &Value) -> HashMap<String, String> {
    string_map(&object["spec"]["properties"])
}

/// A Rule's spec: endpoint names and their resources (KubeEdge's string maps).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSpec {
    /// The source RuleEndpoint's name (`spec.source`).
    pub source: String,
    /// `spec.sourceResource` (`path` for a rest source, `topic` and `node_name` for an
    /// eventbus one); values that are not strings are left out.
    pub source_resource: HashMap<String, String>,
    /// The target RuleEndpoint's name (`spec.target`).
    pub target: String,
    /// `spec.targetResource` (`topic`, `resource` (a URL) or `path`).
    pub target_resource: HashMap<String, String>,
}

fn string_map(value: &Value) -> HashMap<String, String> {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

impl RuleSpec {
    /// The spec of Rule `object` (any JSON: what is missing or not a string is empty).
    pub fn of(object: &Value) -> Self {
        let spec = &object["spec"];
        RuleSpec {
            source: spec["source"].as_str().unwrap_or_default().to_owned(),
            source_resource: string_map(&spec["sourceResource"]),
            target: spec["target"].as_str().unwrap_or_default().to_owned(),
            target_resource: string_map(&spec["targetResource"]),
        }
    }

    /// The REST source's path segments (KubeEdge trims the slashes of `path`).
    pub fn rest_path(&self) -> Option<Vec<String>> {
        let path = self.source_resource.get("path")?.trim_matches('/');
        Some(
            path.split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }
}

/// A token bucket: `rate` per second, at most `burst` at once.
#[derive(Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(crate) fn full(burst: u32) -> Self {
        Bucket {
            tokens: f64::from(burst),
            last: Instant::now(),
        }
    }

    /// Takes a token if there is one.
    pub(crate) fn take(&mut self, rate: u32, burst: u32) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * f64::from(rate)).min(f64::from(burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One Rule as the Router keeps it: its spec, its limiter and its counts (written back to
/// its status every `statusInterval`).
#[derive(Debug)]
pub(crate) struct RuleState {
    pub key: Key,
    pub spec: Mutex<RuleSpec>,
    pub bucket: Mutex<Bucket>,
    pub success: AtomicU64,
    pub fail: AtomicU64,
    pub errors: Mutex<VecDeque<String>>,
    pub dirty: AtomicBool,
    /// The REST target's queue (the rule's own worker drains it).
    pub queue: tokio::sync::mpsc::Sender<Delivery>,
}

/// A message for a rule's REST target.
#[derive(Debug)]
pub(crate) struct Delivery {
    /// The target's URL.
    pub url: String,
    /// What is POSTed.
    pub body: Vec<u8>,
    /// The edge's ServiceBus upload this answers (a servicebus-source rule's): the target's
    /// answer goes back to it; `None` for an EventBus upload, which nobody waits for.
    pub answer: Option<edgehive_protocols::Message>,
}

impl RuleState {
    /// A rule first seen as `object` (its status counts carried on), with its REST-target
    /// queue's sender.
    pub(crate) fn new(
        key: Key,
        object: &Value,
        burst: u32,
        queue: tokio::sync::mpsc::Sender<Delivery>,
    ) -> Self {
        let status = &object["status"];
        let errors = status["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .filter_map(|e| e.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        RuleState {
            key,
            spec: Mutex::new(RuleSpec::of(object)),
            bucket: Mutex::new(Bucket::full(burst)),
            success: AtomicU64::new(status["successMessages"].as_u64().unwrap_or(0)),
            fail: AtomicU64::new(status["failMessages"].as_u64().unwrap_or(0)),
            errors: Mutex::new(errors),
            dirty: AtomicBool::new(false),
            queue,
        }
    }

    /// One message delivered.
    pub(crate) fn succeeded(&self) {
        self.success.fetch_add(1, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Release);
    }

    /// One message failed: counted, and `error` kept among the last `keep`.
    pub(crate) fn failed(&self, error: String, keep: usize) {
        self.fail.fetch_add(1, Ordering::Relaxed);
        let mut errors = lock(&self.errors);
        errors.push_back(error);
        while errors.len() > keep {
            errors.pop_front();
        }
        drop(errors);
        self.dirty.store(true, Ordering::Release);
    }

    /// The status to write if anything changed since the last write (and marks it written).
    pub(crate) fn take_status(&self) -> Option<Value> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return None;
        }
        let errors: Vec<String> = lock(&self.errors).iter().cloned().collect();
        Some(json!({"status": {
            "successMessages": self.success.load(Ordering::Relaxed),
            "failMessages": self.fail.load(Ordering::Relaxed),
            "errors": errors,
        }}))
    }
}

/// How well the rule path `rule` matches the request path `path` (segments after the
/// namespace): `None` when it does not, else the number of literal segments (the most
/// specific rule wins). A rule path matches the path itself and anything under it; a
/// segment `{name}` matches any one segment. Returns the rest (KubeEdge's `param`).
pub fn match_path(rule: &[String], path: &[&str]) -> Option<(usize, String)> {
    if rule.len() > path.len() {
        return None;
    }
    let mut literal = 0;
    for (want, got) in rule.iter().zip(path) {
        if want.starts_with('{') && want.ends_with('}') && want.len() > 2 {
            continue;
        }
        if want != got {
            return None;
        }
        literal += 1;
    }
    Some((literal, path[rule.len()..].join("/")))
}

/// A Kubernetes object name (RFC 1123 subdomain): what a node and a namespace must be, so
/// a REST path can name nothing else.
pub fn is_object_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && text
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && text
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric())
}

/// A topic or path segment the Router passes on: no empty, `.` or `..` segment, no control
/// character, no MQTT wildcard.
pub fn is_clean_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment != "."
        && segment != ".."
        && !segment
            .chars()
            .any(|c| c.is_control() || c == '+' || c == '#')
}

/// A REST call's path `/{node}/{namespace}/{path}`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestPath<'a> {
    /// The edge node the message is for.
    pub node: &'a str,
    /// The namespace whose rules are searched.
    pub namespace: &'a str,
    /// The path's segments after the namespace (empty ones left out), matched against the
    /// rules' `sourceResource.path`.
    pub segments: Vec<&'a str>,
}

/// Splits a REST call's path: `None` unless the node and the namespace are object names
/// ([`is_object_name`]) and every segment after them is clean ([`is_clean_segment`]).
pub fn parse_rest_path(path: &str) -> Option<RestPath<'_>> {
    let mut segments = path.trim_start_matches('/').split('/');
    let (node, namespace) = (segments.next()?, segments.next()?);
    let segments: Vec<&str> = segments.filter(|s| !s.is_empty()).collect();
    (is_object_name(node)
        && is_object_name(namespace)
        && segments.iter().all(|s| is_clean_segment(s)))
    .then_some(RestPath {
        node,
        namespace,
        segments,
    })
}

/// An edge's upload resource in the cloud's form, `node/{node}/{namespace}/{topic…}`: node,
/// namespace and topic (KubeEdge's key of an eventbus-source rule), or `None`.
pub fn parse_upload_resource(resource: &str) -> Option<(&str, &str, &str)> {
    let mut parts = resource.splitn(4, '/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("node"), Some(node), Some(namespace), Some(topic)) => Some((node, namespace, topic)),
        _ => None,
    }
}

/// An edge ServiceBus's upload resource in the cloud's form, `node/{node}/{target_url}`
/// (CloudHub put the node before the application's `targetURL`): node and target URL (the
/// key of a servicebus-source rule), or `None`.
pub fn parse_service_resource(resource: &str) -> Option<(&str, &str)> {
    let mut parts = resource.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("node"), Some(node), Some(url)) if is_target_url(url) => Some((node, url)),
        _ => None,
    }
}

/// The longest `sourceResource.target_url` a servicebus-source rule may have.
pub const MAX_TARGET_URL_BYTES: usize = 256;

/// A servicebus source's `target_url` (the key an application on the node names): 1 to
/// [`MAX_TARGET_URL_BYTES`] bytes, no control character or space.
pub fn is_target_url(url: &str) -> bool {
    !url.is_empty()
        && url.len() <= MAX_TARGET_URL_BYTES
        && !url.chars().any(|c| c.is_control() || c == ' ')
}

/// `base` (a topic or a servicebus path), then the rest of the REST path after it
/// (KubeEdge's `param`), one `/` between.
pub fn join(base: &str, param: &str) -> String {
    if param.is_empty() {
        base.to_owned()
    } else {
        format!("{}/{}", base.trim_end_matches('/'), param)
    }
}

/// The Router's wait before a status is written again, at the least.
pub(crate) const MIN_STATUS_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(path: &str) -> Vec<String> {
        path.split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_rule_path_matches_itself_and_below_and_braces_match_one_segment() {
        assert_eq!(match_path(&segs("/a"), &["a"]), Some((1, String::new())));
        assert_eq!(
            match_path(&segs("/a"), &["a", "b", "c"]),
            Some((1, "b/c".into()))
        );
        assert_eq!(match_path(&segs("/a"), &["ab"]), None);
        assert_eq!(match_path(&segs("/a/b"), &["a"]), None);
        assert_eq!(
            match_path(&segs("/a/{id}"), &["a", "7"]),
            Some((1, String::new()))
        );
        assert!(is_object_name("edge-1"));
        assert!(!is_object_name("Edge"));
        assert!(!is_object_name("-a"));
        assert!(!is_object_name(".."));
        assert!(!is_clean_segment(".."));
        assert!(!is_clean_segment("a+b"));
    }

    #[test]
    fn a_servicebus_upload_names_its_node_and_target_url() {
        assert_eq!(
            parse_service_resource("node/edge-1//a"),
            Some(("edge-1", "/a"))
        );
        assert_eq!(
            parse_service_resource("node/edge-1/a/b"),
            Some(("edge-1", "a/b"))
        );
        assert_eq!(parse_service_resource("node/edge-1/"), None);
        assert_eq!(parse_service_resource("node/edge-1/a\nb"), None);
        assert_eq!(parse_service_resource("node/edge-1/a b"), None);
        assert_eq!(parse_service_resource("rule/x/y"), None);
        assert!(!is_target_url(&"a".repeat(MAX_TARGET_URL_BYTES + 1)));
    }

    #[test]
    fn a_bucket_gives_its_burst_then_refuses() {
        let mut bucket = Bucket::full(3);
        assert!((0..3).all(|_| bucket.take(0, 3)));
        assert!(!bucket.take(0, 3));
    }

    #[test]
    fn status_keeps_the_last_errors_and_is_written_only_when_changed() {
        let (queue, _) = tokio::sync::mpsc::channel(1);
        let rule = RuleState::new(
            ("default".into(), "r".into()),
            &json!({"status": {"successMessages": 4}}),
            1,
            queue,
        );
        assert_eq!(rule.take_status(), None);
        rule.succeeded();
        for n in 0..5 {
            rule.failed(format!("e{n}"), 3);
        }
        let status = rule.take_status().unwrap();
        assert_eq!(status["status"]["successMessages"], 5);
        assert_eq!(status["status"]["failMessages"], 5);
        assert_eq!(status["status"]["errors"], json!(["e2", "e3", "e4"]));
        assert_eq!(rule.take_status(), None);
    }
}
