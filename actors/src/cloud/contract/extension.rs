//! What a cloud extension module (one a plug starts on the cloud's hive, see
//! `CloudProcess::start_with` in the `edgehive` crate and docs/extending.md) uses to talk to
//! edges, through the same API an outside author has.
//!
//! - Upstream: KubeEdge's fixed routes hold (a `user` upload goes to the module named
//!   `router`, task operations to group `taskmanager`); besides, a module may claim an
//!   upstream group with [`claim_upstream_group`]: every message of that group an edge sends
//!   (after CloudHub's authorization, with its resource in cloud form, `node/{node}/…`) then
//!   reaches that module by name, in an [`Envelope`](crate::hive::Envelope). Only group `user`
//!   and groups the cloud does not know may be claimed: the built-in groups stay with the
//!   built-in controllers.
//! - Downstream: [`reply`] (an answer to an upstream message, for the node it came from; or
//!   [`reply_error`], a refusal of it) and
//!   [`to_node`] build the beehive message; [`ToNodes::from_message`](super::ToNodes::from_message)
//!   makes it a delivery, and CloudHub takes it by name and type
//!   (`hive.tell(route::CLOUDHUB, to_nodes)`, refused at once when CloudHub's mailbox is full;
//!   or `hive.ask(…)`, which waits for a slot) with the same delivery rules as the
//!   controllers' messages: KubeEdge's lane (`user` group: written once, no ACK), the node's
//!   pool across disconnects.

use std::collections::HashMap;
use std::sync::Mutex;

use edgehive_protocols::{prefix_for_cloud, Group, Message, ModuleName, Operation};
use serde_json::Value;

use crate::hive::locks;
use crate::hive::Hive;

/// Why [`claim_upstream_group`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The group is one the cloud's built-in routes own (`resource`, `twin`, …).
    #[error("upstream group {0:?} belongs to the cloud's built-in modules; only group \"user\" and groups the cloud does not know may be claimed")]
    BuiltIn(String),
    /// Another module claimed the group first.
    #[error("upstream group {group:?} is already claimed by module {module:?}")]
    Taken {
        /// The group.
        group: String,
        /// The module that holds it.
        module: String,
    },
    /// An empty group or module name.
    #[error("a claim needs a group and a module name")]
    Empty,
}

/// The upstream groups extension modules claimed, per hive (`Hive::shared`).
#[derive(Debug, Default)]
struct UpstreamClaims(Mutex<HashMap<String, String>>);

/// Whether an edge's messages of `group` may go to an extension: group `user` and any group
/// the cloud does not know; never a built-in one.
fn claimable(group: &Group) -> bool {
    matches!(group, Group::User | Group::Other(_))
}

/// Routes every upstream message of `group` to the module named `module` (an extension
/// started on `hive`, before or after the claim), and the edges' `response`s of that group
/// that are not the ACK of the message CloudHub has in flight to their node (answers to
/// the extension's own requests). A message for a claimed group whose module
/// is not running is dropped and counted like any message without a route
/// (`edgehive_cloudhub_dropped_messages_total{reason="no_route"}`).
pub fn claim_upstream_group(hive: &Hive, group: &str, module: &str) -> Result<(), ClaimError> {
    if group.is_empty() || module.is_empty() {
        return Err(ClaimError::Empty);
    }
    if !claimable(&Group::from(group)) {
        return Err(ClaimError::BuiltIn(group.to_owned()));
    }
    let claims = hive.shared::<UpstreamClaims>();
    let mut claims = locks::lock(&claims.0);
    match claims.get(group) {
        Some(holder) if holder != module => Err(ClaimError::Taken {
            group: group.to_owned(),
            module: holder.clone(),
        }),
        _ => {
            claims.insert(group.to_owned(), module.to_owned());
            Ok(())
        }
    }
}

/// The module that claimed `message`'s group, if any (CloudHub's dispatch).
pub(crate) fn claimant(hive: &Hive, message: &Message) -> Option<String> {
    let group = message.group().filter(|group| claimable(group))?;
    let claims = hive.shared::<UpstreamClaims>();
    let claims = locks::lock(&claims.0);
    claims.get(group.as_str()).cloned()
}

/// The answer to `request`, an upstream message an extension received (resource in cloud
/// form, as CloudHub hands it): operation `response`, parent = the request's id, source and
/// group as the request's (KubeEdge's `NewRespByMessage`), for the node the request came
/// from, so an edge's `request_cloud` gets it.
pub fn reply(request: &Message, content: Value) -> Message {
    Message::response_to(request, content)
}

/// A refusal of `request`, an upstream message an extension received: operation `error`,
/// parent = the request's id, content the text, resource as the request's (KubeEdge's
/// `NewErrorMessage`), so an edge's `request_cloud` gets it at once instead of waiting out
/// its timeout. CloudHub writes any error reply once (no ACK), whatever its group; source
/// and group are the request's (as [`reply`]) because a real edgecore routes a reply by its
/// group and drops one without.
pub fn reply_error(request: &Message, text: impl Into<String>) -> Message {
    let mut refusal = Message::error_to(request, text);
    refusal.route.source = request.route.source.clone();
    refusal.route.group = request.route.group.clone();
    refusal
}

/// A message from extension module `source` for `node`: `resource` in edge form
/// (`{ns}/{type}/{name}`), group and operation as given (a `user` group message takes the
/// no-ACK lane, as in KubeEdge).
pub fn to_node(
    node: &str,
    source: &str,
    group: &str,
    operation: &str,
    resource: &str,
    content: Value,
) -> Message {
    Message::new(
        ModuleName::from(source),
        Group::from(group),
        Operation::from(operation),
        prefix_for_cloud(node, resource),
        content,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_groups_cannot_be_claimed_and_a_group_has_one_claimant() {
        actix::System::new().block_on(async {
            let hive = Hive::new("cloud");
            for group in ["resource", "twin", "dynamiccontroller", "cloudhub", "meta"] {
                assert_eq!(
                    claim_upstream_group(&hive, group, "x"),
                    Err(ClaimError::BuiltIn(group.into()))
                );
            }
            claim_upstream_group(&hive, "user", "echo").unwrap();
            claim_upstream_group(&hive, "user", "echo").unwrap();
            assert!(matches!(
                claim_upstream_group(&hive, "user", "other"),
                Err(ClaimError::Taken { .. })
            ));
            claim_upstream_group(&hive, "mygroup", "other").unwrap();
            let upload = to_node(
                "n1",
                "eventbus",
                "user",
                "upload",
                "default/a/b",
                Value::Null,
            );
            assert_eq!(upload.resource(), "node/n1/default/a/b");
            assert_eq!(claimant(&hive, &upload).as_deref(), Some("echo"));
            let resource = to_node(
                "n1",
                "edged",
                "resource",
                "update",
                "default/pod/p",
                Value::Null,
            );
            assert_eq!(claimant(&hive, &resource), None);
        });
    }
}
