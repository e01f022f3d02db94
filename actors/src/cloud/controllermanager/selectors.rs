//! `spec.workloadScope.targetNodeLabels`: a Deployment made for the nodes a label selector
//! matches, as KubeEdge v1.22 makes it. Pure decisions, no I/O.
//!
//! - **Name.** `<manifest name>-ls-<8 hex digits>`: the first four bytes of SHA-256 over the
//!   selector's `matchLabels`, key then value, keys sorted (KubeEdge's name, so a selector of
//!   labels alone names its Deployment as KubeEdge does). A selector with `matchExpressions`
//!   adds each one (key, operator, values) to the hash, after the labels.
//! - **Placement.** The pod template's `affinity.nodeAffinity` becomes a required node
//!   affinity of one term: `<key> In [<value>]` for each label (sorted by key), then the
//!   selector's `matchExpressions` (In, NotIn, Exists, DoesNotExist are node selector
//!   operators too). The manifest's own `nodeSelector` is kept, as KubeEdge keeps it.
//!   KubeEdge reads `matchLabels` alone: a selector of expressions only would make the
//!   Deployment under the manifest's own name with no affinity, on every node.
//! - **Refused** ([`SelectorError`]): a selector that selects nothing in particular (no
//!   label and no expression), an expression without a key, with an operator outside the
//!   four, with no values for In or NotIn or with values for Exists or DoesNotExist.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// Why a `targetNodeLabels` entry is refused (the message a user reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SelectorError(pub(super) String);

/// A checked label selector of a `targetNodeLabels` entry.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct NodeLabels {
    labels: BTreeMap<String, String>,
    /// `(key, operator, values)`, in the given order.
    expressions: Vec<(String, String, Vec<String>)>,
}

impl NodeLabels {
    /// Reads and checks `labelSelector`.
    pub(super) fn read(selector: &Value) -> Result<NodeLabels, SelectorError> {
        let refuse = |why: String| Err(SelectorError(why));
        let mut labels = BTreeMap::new();
        for (key, value) in selector["matchLabels"].as_object().into_iter().flatten() {
            let Some(value) = value.as_str() else {
                return refuse(format!("matchLabels {key:?} is not a string"));
            };
            if key.is_empty() {
                return refuse("matchLabels has an empty key".to_owned());
            }
            labels.insert(key.clone(), value.to_owned());
        }
        let mut expressions = Vec::new();
        for expression in selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = expression["key"].as_str().unwrap_or_default();
            let operator = expression["operator"].as_str().unwrap_or_default();
            let values: Vec<String> = expression["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            if key.is_empty() {
                return refuse("a matchExpressions entry has no key".to_owned());
            }
            match operator {
                "In" | "NotIn" if values.is_empty() => {
                    return refuse(format!("matchExpressions {key:?} {operator} needs values"))
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return refuse(format!(
                        "matchExpressions {key:?} {operator} takes no values"
                    ))
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return refuse(format!(
                        "matchExpressions {key:?}: operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                    ))
                }
            }
            expressions.push((key.to_owned(), operator.to_owned(), values));
        }
        if labels.is_empty() && expressions.is_empty() {
            return refuse("the labelSelector selects no labels".to_owned());
        }
        Ok(NodeLabels {
            labels,
            expressions,
        })
    }

    /// The name suffix `ls-<8 hex digits>` (see the [module docs](self)).
    pub(super) fn suffix(&self) -> String {
        let mut hashed = Vec::new();
        for (key, value) in &self.labels {
            hashed.extend_from_slice(key.as_bytes());
            hashed.extend_from_slice(value.as_bytes());
        }
        for (key, operator, values) in &self.expressions {
            hashed.extend_from_slice(key.as_bytes());
            hashed.extend_from_slice(operator.as_bytes());
            for value in values {
                hashed.extend_from_slice(value.as_bytes());
            }
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, &hashed);
        let hex: String = digest.as_ref()[..4]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        format!("ls-{hex}")
    }

    /// Sets the required node affinity of Deployment `object`'s pod template.
    pub(super) fn place(&self, object: &mut Value) {
        let mut requirements: Vec<Value> = self
            .labels
            .iter()
            .map(|(key, value)| json!({"key": key, "operator": "In", "values": [value]}))
            .collect();
        for (key, operator, values) in &self.expressions {
            let mut requirement = json!({"key": key, "operator": operator});
            if !values.is_empty() {
                requirement["values"] = json!(values);
            }
            requirements.push(requirement);
        }
        let pod = &mut object["spec"]["template"]["spec"];
        if !pod["affinity"].is_object() {
            pod["affinity"] = json!({});
        }
        pod["affinity"]["nodeAffinity"] = json!({
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": requirements}],
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selector_of_labels_is_named_as_kubeedge_names_it_and_placed_by_node_affinity() {
        let selector =
            NodeLabels::read(&json!({"matchLabels": {"zone": "east", "arch": "arm64"}})).unwrap();
        // sha256("arch" "arm64" "zone" "east")[..4], keys sorted.
        let digest = ring::digest::digest(&ring::digest::SHA256, b"archarm64zoneeast");
        let want: String = digest.as_ref()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(selector.suffix(), format!("ls-{want}"));
        let mut object = json!({"spec": {"template": {"spec": {
            "nodeSelector": {"disk": "ssd"},
            "affinity": {"podAntiAffinity": {"x": 1}, "nodeAffinity": {"old": true}}}}}});
        selector.place(&mut object);
        let pod = &object["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"], json!({"disk": "ssd"}), "kept");
        assert_eq!(pod["affinity"]["podAntiAffinity"], json!({"x": 1}), "kept");
        assert_eq!(
            pod["affinity"]["nodeAffinity"],
            json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "arch", "operator": "In", "values": ["arm64"]},
                    {"key": "zone", "operator": "In", "values": ["east"]}]}]}})
        );
    }

    #[test]
    fn expressions_are_placed_and_named_and_malformed_selectors_refused() {
        let labels = NodeLabels::read(&json!({"matchLabels": {"zone": "east"}})).unwrap();
        let both = NodeLabels::read(&json!({"matchLabels": {"zone": "east"},
            "matchExpressions": [{"key": "gpu", "operator": "Exists"},
                                 {"key": "arch", "operator": "NotIn", "values": ["386"]}]}))
        .unwrap();
        assert_ne!(labels.suffix(), both.suffix());
        let mut object = json!({});
        both.place(&mut object);
        assert_eq!(
            object["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                ["matchExpressions"],
            json!([{"key": "zone", "operator": "In", "values": ["east"]},
                   {"key": "gpu", "operator": "Exists"},
                   {"key": "arch", "operator": "NotIn", "values": ["386"]}])
        );
        for bad in [
            json!({}),
            json!({"matchLabels": {}}),
            json!({"matchLabels": {"zone": 1}}),
            json!({"matchExpressions": [{"operator": "Exists"}]}),
            json!({"matchExpressions": [{"key": "k", "operator": "In"}]}),
            json!({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}),
            json!({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}),
        ] {
            assert!(NodeLabels::read(&bad).is_err(), "{bad}");
        }
    }
}
