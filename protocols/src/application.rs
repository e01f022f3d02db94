//! KubeEdge's `Application`: how an edge's MetaServer asks the cloud's DynamicController to
//! list, get or watch Kubernetes objects over the CloudHub link, and how the answer comes back.
//!
//! Upstream the message is `route {source: "metaserver", group: "dynamiccontroller",
//! operation: "null", resource: "null"}` with an `Application` as content (`Status`
//! `InApplying`); the cloud answers with `route {source: "dynamiccontroller", group:
//! "resource", operation: "applicationResponse", resource: "ignore/Application/ignore"}`,
//! `parent_msg_id` the request's id, and the same `Application` with `Status` `Approved` and
//! `RespBody` the API server's JSON, or `Rejected` with `Error.ErrStatus` a Kubernetes
//! `Status`. A watch that ends is told with resource `watchapp/sync` and content `{}` both
//! ways. `Option` and `RespBody` are Go `[]byte`, so base64 in JSON. The shapes are those of
//! `shared/golden/metaserver-cloudhub-vm.jsonl` (v1.22), which the tests replay.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `route.operation` and `route.resource` of a MetaServer request (Go's `"null"`).
pub const APPLICATION_REQUEST_OPERATION: &str = "null";
/// `route.resource` of a MetaServer request.
pub const APPLICATION_REQUEST_RESOURCE: &str = "null";
/// `route.resource` of DynamicController's answer.
pub const APPLICATION_RESPONSE_RESOURCE: &str = "ignore/Application/ignore";
/// `route.resource` of the message that ends a watch (both ways; the edge's content maps the
/// watch applications it still holds by ID, `{}` for none).
pub const WATCH_SYNC_RESOURCE: &str = "watchapp/sync";

/// What an application asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// A list (`Key` without a name).
    List,
    /// One object (`Key` with a name), or a non-resource path such as `/version`.
    Get,
    /// A watch: the cloud registers it and pushes the objects as ordinary messages.
    Watch,
    /// Writes, which KubeEdge supports behind a feature gate; edgehive refuses them.
    Create,
    /// See [`Verb::Create`].
    Update,
    /// See [`Verb::Create`].
    Patch,
    /// See [`Verb::Create`].
    Delete,
    /// See [`Verb::Create`].
    UpdateStatus,
}

/// Where an application stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplicationStatus {
    /// The request, on its way to the cloud.
    InApplying,
    /// Answered: `RespBody` holds the answer.
    Approved,
    /// Refused or failed: `Error.ErrStatus` says why.
    Rejected,
    /// Completed (KubeEdge uses it for watches it has closed).
    Completed,
    /// Any other value a peer sends.
    #[serde(other)]
    Unknown,
}

/// `Error`: Go's `apierrors.StatusError`, `{"ErrStatus": Status}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusError {
    /// The Kubernetes `Status` (`{"metadata":{}}` when there is no error).
    #[serde(rename = "ErrStatus")]
    pub err_status: Value,
}

impl Default for StatusError {
    fn default() -> Self {
        Self {
            err_status: serde_json::json!({"metadata": {}}),
        }
    }
}

/// One MetaServer request and, filled in by the cloud, its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Application {
    /// sha256 hex of the request (the edge's choice; the cloud echoes it).
    #[serde(rename = "ID", default)]
    pub id: String,
    /// `/group/version/resource/namespace/name` (`core` for the core group, `null` for an
    /// empty part), or a non-resource path such as `/version` or `/healthz`.
    #[serde(rename = "Key", default)]
    pub key: String,
    /// What is asked.
    #[serde(rename = "Verb")]
    pub verb: Verb,
    /// The asking node.
    #[serde(rename = "Nodename", default)]
    pub nodename: String,
    /// The JSON list or get options (`{"labelSelector":...,"limit":500}`), base64 on the wire.
    #[serde(rename = "Option", with = "bytes_b64", default)]
    pub option: Vec<u8>,
    /// A write's body (unused: writes are refused).
    #[serde(rename = "ReqBody", with = "bytes_b64", default)]
    pub req_body: Vec<u8>,
    /// A subresource (`status`), or empty.
    #[serde(rename = "Subresource", default)]
    pub subresource: String,
    /// The answer's JSON, base64 on the wire.
    #[serde(rename = "RespBody", with = "bytes_b64", default)]
    pub resp_body: Vec<u8>,
    /// Where it stands.
    #[serde(rename = "Status")]
    pub status: ApplicationStatus,
    /// Free text.
    #[serde(rename = "Reason", default)]
    pub reason: String,
    /// The error, for `Rejected`.
    #[serde(rename = "Error", default)]
    pub error: StatusError,
    /// Go's zero time unless the edge set it.
    #[serde(rename = "Timestamp", default = "zero_time")]
    pub timestamp: String,
}

fn zero_time() -> String {
    "0001-01-01T00:00:00Z".to_owned()
}

/// Go marshals an empty `[]byte` as `null` (nil) or `""`; both read as empty here, and
/// empty is written as `null`.
mod bytes_b64 {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        if bytes.is_empty() {
            serializer.serialize_none()
        } else {
            serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        match text {
            None => Ok(Vec::new()),
            Some(text) => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(serde::de::Error::custom),
        }
    }
}

/// The parts of an application's `Key` for a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationKey {
    /// API group, empty for the core group (`core` on the wire).
    pub group: String,
    /// API version (`v1`).
    pub version: String,
    /// Plural resource (`pods`).
    pub resource: String,
    /// Namespace, empty for all namespaces or a cluster-scoped kind.
    pub namespace: String,
    /// Name, empty for a list or watch.
    pub name: String,
}

/// Why a `Key` is not a resource key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("application key {0:?} is not /group/version/resource/namespace/name")]
pub struct KeyError(pub String);

impl ApplicationKey {
    /// Reads `/core/v1/pods/default/null`; a non-resource path (`/version`) is an error.
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        let part = |value: &str| {
            if value == "null" {
                String::new()
            } else {
                value.to_owned()
            }
        };
        let rest = key.strip_prefix('/').ok_or_else(|| KeyError(key.into()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [group, version, resource, namespace, name] = parts.as_slice() else {
            return Err(KeyError(key.into()));
        };
        if version.is_empty() || resource.is_empty() || *resource == "null" {
            return Err(KeyError(key.into()));
        }
        Ok(Self {
            group: if *group == "core" {
                String::new()
            } else {
                part(group)
            },
            version: (*version).to_owned(),
            resource: (*resource).to_owned(),
            namespace: part(namespace),
            name: part(name),
        })
    }

    /// The wire form (`/core/v1/pods/null/null`).
    pub fn render(&self) -> String {
        let part = |value: &str| {
            if value.is_empty() {
                "null".to_owned()
            } else {
                value.to_owned()
            }
        };
        let group = if self.group.is_empty() {
            "core".to_owned()
        } else {
            self.group.clone()
        };
        format!(
            "/{group}/{}/{}/{}/{}",
            self.version,
            self.resource,
            part(&self.namespace),
            part(&self.name)
        )
    }
}

impl Application {
    /// A new request from `node` (status `InApplying`, no answer yet).
    pub fn request(id: String, key: String, verb: Verb, node: &str, option: Vec<u8>) -> Self {
        Self {
            id,
            key,
            verb,
            nodename: node.to_owned(),
            option,
            req_body: Vec::new(),
            subresource: String::new(),
            resp_body: Vec::new(),
            status: ApplicationStatus::InApplying,
            reason: String::new(),
            error: StatusError::default(),
            timestamp: zero_time(),
        }
    }

    /// This application answered with `body` (`Approved`).
    pub fn approved(mut self, body: Vec<u8>) -> Self {
        self.status = ApplicationStatus::Approved;
        self.resp_body = body;
        self
    }

    /// This application refused with a Kubernetes `Status` (`Rejected`).
    pub fn rejected(mut self, status: Value) -> Self {
        self.status = ApplicationStatus::Rejected;
        self.resp_body = Vec::new();
        self.error = StatusError { err_status: status };
        self
    }

    /// The options as JSON (`{}` when empty or not JSON).
    pub fn options(&self) -> Value {
        serde_json::from_slice(&self.option).unwrap_or_else(|_| serde_json::json!({}))
    }
}

/// A Kubernetes `Status` for an error (`reason` such as `NotFound`, `Forbidden`).
pub fn kube_status(code: u16, reason: &str, message: &str) -> Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_and_write_as_the_metaserver_spells_them() {
        let key = ApplicationKey::parse("/core/v1/pods/null/null").unwrap();
        assert_eq!(key.group, "");
        assert_eq!(key.resource, "pods");
        assert_eq!(key.namespace, "");
        assert_eq!(key.render(), "/core/v1/pods/null/null");
        let key = ApplicationKey::parse("/apps/v1/deployments/default/web").unwrap();
        assert_eq!((key.group.as_str(), key.name.as_str()), ("apps", "web"));
        assert!(ApplicationKey::parse("/version").is_err());
        assert!(ApplicationKey::parse("core/v1/pods/null/null").is_err());
        assert!(ApplicationKey::parse("/core/v1/null/null/null").is_err());
    }

    #[test]
    fn empty_byte_fields_are_null_and_full_ones_base64() {
        let app = Application::request(
            "x".into(),
            "/healthz".into(),
            Verb::Get,
            "vm",
            b"{}".to_vec(),
        );
        let json = serde_json::to_value(&app).unwrap();
        assert_eq!(json["Option"], "e30=");
        assert_eq!(json["RespBody"], Value::Null);
        assert_eq!(json["Status"], "InApplying");
        let back: Application = serde_json::from_value(
            serde_json::to_value(app.clone().approved(b"ok".to_vec())).unwrap(),
        )
        .unwrap();
        assert_eq!(back.resp_body, b"ok");
        // Go's `""` for an empty []byte reads as empty too.
        let mut json = json;
        json["RespBody"] = Value::String(String::new());
        let back: Application = serde_json::from_value(json).unwrap();
        assert!(back.resp_body.is_empty());
    }
}
