//! Remote queries: which resource types MetaManager asks the cloud for, and what a cloud reply
//! means for the store (facts §7, "Remote").

use edgehive_protocols::ResourceType;
use serde_json::Value;

/// Resource types a query fetches from the cloud while connected (KubeEdge v1.23; v1.22 also
/// asked for `node`). Everything else is answered from the store.
pub(crate) const REMOTE_TYPES: [&str; 9] = [
    "configmap",
    "secret",
    "persistentvolume",
    "persistentvolumeclaim",
    "volumeattachment",
    "serviceaccounttoken",
    "lease",
    "certificatesigningrequest",
    "k8s/ca.crt",
];

/// Whether a query for `resource_type` goes to the cloud when connected.
pub(crate) fn is_remote_type(resource_type: &str) -> bool {
    REMOTE_TYPES.contains(&resource_type)
}

/// What a cloud reply to a remote query carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReplyContent {
    /// An object to store under the query's key (and pass on).
    Object(Value),
    /// An error, `"OK"`, or nothing storable: passed on, the store is left alone.
    PassOn,
}

/// Reads a cloud reply's content the way MetaManager must:
/// - `{"Object": .., "Err": ..}` (EdgeController's ObjectResp, no JSON tags): an error when
///   `Err` is set, else `Object` is stored;
/// - a Kubernetes error (`{"ErrStatus": ..}`): passed on. KubeEdge stores any other object,
///   which would save the error as if it were the configmap; we do not;
/// - any other object: stored;
/// - a string: `"OK"` or error text, passed on, except for `k8s/ca.crt` whose answer is the
///   CA certificate itself (a string, empty when the cluster has none).
pub(crate) fn read_reply(content: &Value, resource_type: &str) -> ReplyContent {
    match content {
        Value::Object(map) if map.len() == 2 && map.contains_key("Object") => {
            match (map.get("Object"), map.get("Err")) {
                (Some(object), Some(Value::Null) | None) if object.is_object() => {
                    ReplyContent::Object(object.clone())
                }
                _ => ReplyContent::PassOn,
            }
        }
        Value::Object(map) if map.contains_key("ErrStatus") => ReplyContent::PassOn,
        Value::Object(_) => ReplyContent::Object(content.clone()),
        Value::String(text) if resource_type == ResourceType::K8sCaCrt.as_str() => {
            ReplyContent::Object(Value::String(text.clone()))
        }
        _ => ReplyContent::PassOn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reply(content: Value) -> Value {
        content
    }

    #[test]
    fn object_resp_is_unwrapped_or_passed_on() {
        let cm = json!({"kind": "ConfigMap", "data": {"k": "v"}});
        assert_eq!(
            read_reply(&reply(json!({"Object": cm, "Err": null})), "configmap"),
            ReplyContent::Object(cm.clone())
        );
        assert_eq!(
            read_reply(
                &reply(json!({"Object": null, "Err": {"ErrStatus": {"code": 404}}})),
                "configmap"
            ),
            ReplyContent::PassOn
        );
        assert_eq!(
            read_reply(&reply(json!({"Object": cm, "Err": {}})), "configmap"),
            ReplyContent::PassOn
        );
    }

    #[test]
    fn plain_objects_are_stored_errors_and_strings_are_not() {
        let cm = json!({"kind": "ConfigMap"});
        assert_eq!(
            read_reply(&reply(cm.clone()), "configmap"),
            ReplyContent::Object(cm)
        );
        assert_eq!(
            read_reply(&reply(json!({"ErrStatus": {"code": 404}})), "configmap"),
            ReplyContent::PassOn
        );
        assert_eq!(
            read_reply(&reply(json!("OK")), "configmap"),
            ReplyContent::PassOn
        );
        assert_eq!(
            read_reply(&reply(json!("")), "k8s/ca.crt"),
            ReplyContent::Object(json!(""))
        );
    }

    #[test]
    fn remote_types_are_the_facts_list() {
        assert!(is_remote_type("configmap"));
        assert!(is_remote_type("k8s/ca.crt"));
        assert!(!is_remote_type("pod"));
        assert!(!is_remote_type("node"));
    }
}
