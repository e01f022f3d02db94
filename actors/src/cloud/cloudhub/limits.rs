//! What one edge node may make the cloud write and hold: a size limit on every object it
//! writes (tighter for events) and a per-node write rate. Checked by the node's actor before
//! authorization and dispatch, for every upstream `insert`, `update` and `patch`, whatever
//! the kind; a refusal is an `error` reply to the edge, counted in
//! `edgehive_cloudhub_denied_total{reason="too_large"|"rate_limited"}`.
//!
//! A well-behaved edge never meets them: KubeEdge's edge writes at most `messageQPS` (30) a
//! second, far under the default rate here, and its objects are a few KiB.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use edgehive_protocols::{Message, Operation, ResourceType};

use super::auth::{BindingView, Denied};

/// The limits; see `limits.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    /// Largest write (its frame) an edge may send, in bytes; the API server's own limit is
    /// about 1.5 MiB (etcd's request size).
    pub max_object_bytes: usize,
    /// Largest event write, in bytes (an event is a line of text and some references).
    pub max_event_bytes: usize,
    /// Sustained writes a second per node.
    pub writes_per_second: u32,
    /// Writes a node may make at once after a quiet spell.
    pub write_burst: u32,
    /// Pods a node may create itself (mirror pods) and hold at once.
    pub mirror_pods_per_node: usize,
}

impl Default for WriteLimits {
    fn default() -> Self {
        WriteLimits {
            max_object_bytes: 1024 * 1024,
            max_event_bytes: 16 * 1024,
            writes_per_second: 50,
            write_burst: 300,
            mirror_pods_per_node: 32,
        }
    }
}

/// Whether `message` asks the cloud to write something.
pub(super) fn is_write(message: &Message) -> bool {
    matches!(
        message.operation(),
        Some(Operation::Insert | Operation::Update | Operation::Patch)
    )
}

/// How long a pod insert let through counts as pending when the cluster does not show the pod
/// (its create failed, or the cluster view lags).
const PENDING_FOR: Duration = Duration::from_secs(10);

/// A node's pod inserts let through whose pods the cluster may not show yet: `(namespace,
/// name, when)`. At most the quota's worth (beyond, inserts are refused).
pub(super) type PendingPods = VecDeque<(String, String, Instant)>;

/// Checks the quota on what a node creates and keeps in the cluster: a pod it inserts (a
/// mirror pod) is refused once its mirror pods in the cluster, and the inserts let through
/// that the cluster does not show yet (`pending`: a burst is counted before its creates
/// land), reach [`WriteLimits::mirror_pods_per_node`]. Its Node and Lease are one each by
/// authorization; its events have their own share in the embedded cluster.
pub(super) fn check_quota(
    limits: &WriteLimits,
    node: &str,
    message: &Message,
    view: Option<&dyn BindingView>,
    pending: &mut PendingPods,
    now: Instant,
) -> Result<(), Denied> {
    let mut parts = message.resource().split('/');
    let (namespace, kind, name) = (parts.next(), parts.next(), parts.next());
    let pod_insert =
        message.operation() == Some(&Operation::Insert) && kind == Some(ResourceType::Pod.as_str());
    let Some(view) = view.filter(|_| pod_insert) else {
        return Ok(());
    };
    let (namespace, name) = (namespace.unwrap_or_default(), name.unwrap_or_default());
    pending.retain(|(namespace, name, at)| {
        now.saturating_duration_since(*at) < PENDING_FOR && view.pod_node(namespace, name).is_none()
    });
    let held = view.mirror_pods_on_node(node) + pending.len();
    if held >= limits.mirror_pods_per_node {
        return Err(Denied {
            reason: "quota_exceeded",
            text: format!(
                "node {node} holds {held} pods it created, its quota (mirrorPodsPerNode) is {}; delete one first",
                limits.mirror_pods_per_node
            ),
        });
    }
    pending.push_back((namespace.to_owned(), name.to_owned(), now));
    Ok(())
}

/// A node's write budget: a token bucket of [`WriteLimits::writes_per_second`].
#[derive(Debug, Clone)]
pub(super) struct WriteBudget {
    tokens: f64,
    last: Instant,
}

impl WriteBudget {
    /// A full bucket.
    pub(super) fn new(limits: &WriteLimits) -> Self {
        WriteBudget {
            tokens: f64::from(limits.write_burst.max(1)),
            last: Instant::now(),
        }
    }

    /// Checks a write of `bytes` (its frame) from `node`: within the size limit for its
    /// kind, and within the node's rate (spending one token).
    pub(super) fn check(
        &mut self,
        limits: &WriteLimits,
        node: &str,
        message: &Message,
        bytes: usize,
        now: Instant,
    ) -> Result<(), Denied> {
        let event = message.resource().split('/').nth(1) == Some(ResourceType::Event.as_str());
        let max = if event {
            limits.max_event_bytes
        } else {
            limits.max_object_bytes
        };
        if bytes > max {
            return Err(Denied {
                reason: "too_large",
                text: format!(
                    "node {node}: a {} write of {bytes} bytes is over the limit of {max} bytes",
                    if event { "event" } else { "object" }
                ),
            });
        }
        let rate = f64::from(limits.writes_per_second.max(1));
        let burst = f64::from(limits.write_burst.max(1));
        let earned = now.saturating_duration_since(self.last).as_secs_f64() * rate;
        self.tokens = (self.tokens + earned).min(burst);
        self.last = now;
        if self.tokens < 1.0 {
            return Err(Denied {
                reason: "rate_limited",
                text: format!(
                    "node {node}: more than {} writes a second (burst {}); try again later",
                    limits.writes_per_second, limits.write_burst
                ),
            });
        }
        self.tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::{Group, ModuleName};
    use serde_json::json;
    use std::time::Duration;

    fn write(resource: &str) -> Message {
        Message::new(
            ModuleName::from("edged"),
            Group::Resource,
            Operation::Insert,
            resource.to_owned(),
            json!({}),
        )
    }

    #[test]
    fn sizes_are_checked_per_kind_and_the_rate_refills() {
        let limits = WriteLimits {
            writes_per_second: 10,
            write_burst: 3,
            ..WriteLimits::default()
        };
        let mut budget = WriteBudget::new(&limits);
        let now = Instant::now();
        let event = write("default/event/e1");
        let denied = budget
            .check(&limits, "n1", &event, 20 * 1024, now)
            .unwrap_err();
        assert_eq!(denied.reason, "too_large");
        assert!(denied.text.contains("event"), "{}", denied.text);
        let pod = write("default/pod/p1");
        assert!(budget.check(&limits, "n1", &pod, 20 * 1024, now).is_ok());
        assert!(budget.check(&limits, "n1", &pod, 100, now).is_ok());
        assert!(budget.check(&limits, "n1", &pod, 100, now).is_ok());
        // A too-large write spent nothing; the burst of 3 is used up now.
        let denied = budget.check(&limits, "n1", &pod, 100, now).unwrap_err();
        assert_eq!(denied.reason, "rate_limited");
        // A tenth of a second later one more is allowed (10 a second).
        let later = now + Duration::from_millis(100);
        assert!(budget.check(&limits, "n1", &pod, 100, later).is_ok());
        assert!(budget.check(&limits, "n1", &pod, 100, later).is_err());
        assert!(is_write(&pod));
    }
}
