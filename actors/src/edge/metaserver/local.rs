//! Lists and gets answered from the edge's store: the rows of the kind's store type, in key
//! order, narrowed to the namespace and the selectors, paged with `limit`/`continue`, and
//! shaped as the API server shapes them (`PodList` with `apiVersion`, `metadata` and `items`
//! whose `kind`/`apiVersion` are set).

use base64::Engine as _;
use serde_json::{json, Value};

use super::history::History;
use super::kinds::Kind;
use super::request::{ListOptions, ResourceRequest};
use super::selector::Selector;
use super::status::Failure;
use crate::edge::store::{MetaRow, MetaStore};

/// The object a row holds, with `kind` and `apiVersion` set; `None` when the row holds no
/// object.
pub(super) fn object_of(kind: &Kind, value: &Value) -> Option<Value> {
    into_object(kind, value.clone())
}

/// [`object_of`], taking the row's value (a list of 1,000 pods no longer copies each).
fn into_object(kind: &Kind, mut object: Value) -> Option<Value> {
    let map = object.as_object_mut()?;
    map.entry("apiVersion")
        .or_insert_with(|| Value::from(kind.api_version()));
    map.entry("kind").or_insert_with(|| Value::from(kind.kind));
    Some(object)
}

/// The object's name: `metadata.name`, else the key's last part.
fn name_of(row: &MetaRow) -> &str {
    row.value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_else(|| row.key.rsplit('/').next().unwrap_or_default())
}

/// Whether the row is in the request's namespace (any, for a cluster-scoped kind or a list
/// across namespaces): the key's first part, as the store keys it.
pub(super) fn in_namespace(kind: &Kind, namespace: &str, key: &str) -> bool {
    !kind.namespaced || namespace.is_empty() || key.split('/').next() == Some(namespace)
}

fn encode_continue(key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.as_bytes())
}

fn decode_continue(token: &str) -> Result<String, Failure> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.as_bytes())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            Failure::bad_request("bad_request", "continue: not a token this server gave")
        })
}

/// A list from the store.
pub(super) async fn list(
    store: &MetaStore,
    history: &History,
    kind: &Kind,
    request: &ResourceRequest,
    options: &ListOptions,
    selector: &Selector,
) -> Result<Value, Failure> {
    let after = options
        .continue_token
        .as_deref()
        .map(decode_continue)
        .transpose()?;
    let version = history.high();
    let rows = store
        .list(Some(kind.store_type.to_owned()))
        .await
        .map_err(|error| Failure::internal(&format!("store: {error}")))?;
    let mut items = Vec::new();
    let mut remaining = 0u64;
    let mut last_key = None;
    let limit = options.limit.unwrap_or(u64::MAX);
    for row in rows {
        if after
            .as_ref()
            .is_some_and(|after| row.key.as_str() <= after.as_str())
            || !in_namespace(kind, &request.namespace, &row.key)
        {
            continue;
        }
        let Some(object) = into_object(kind, row.value) else {
            continue;
        };
        if !selector.matches(&object) {
            continue;
        }
        if (items.len() as u64) < limit {
            items.push(object);
            last_key = Some(row.key);
        } else {
            remaining += 1;
        }
    }
    let mut metadata = json!({"resourceVersion": version.to_string()});
    if remaining > 0 {
        if let Some(last) = last_key {
            metadata["continue"] = Value::from(encode_continue(&last));
            metadata["remainingItemCount"] = Value::from(remaining);
        }
    }
    Ok(json!({
        "apiVersion": kind.api_version(),
        "items": items,
        "kind": kind.list_kind(),
        "metadata": metadata,
    }))
}

/// One object from the store; 404 when it is not there.
pub(super) async fn get(
    store: &MetaStore,
    kind: &Kind,
    request: &ResourceRequest,
) -> Result<Value, Failure> {
    let missing = || Failure::not_found(kind.plural, &request.name);
    let row = if kind.namespaced {
        if request.namespace.is_empty() {
            return Err(Failure::no_such_path());
        }
        store
            .get(format!(
                "{}/{}/{}",
                request.namespace, kind.store_type, request.name
            ))
            .await
    } else {
        // Cluster-scoped objects are stored under a namespace of the edge's choosing
        // (`default/node/{name}`): found by name.
        store
            .list(Some(kind.store_type.to_owned()))
            .await
            .map(|rows| rows.into_iter().find(|row| name_of(row) == request.name))
    }
    .map_err(|error| Failure::internal(&format!("store: {error}")))?;
    row.and_then(|row| object_of(kind, &row.value))
        .ok_or_else(missing)
}
