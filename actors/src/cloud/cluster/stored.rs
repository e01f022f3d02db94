//! How the embedded cluster keeps an object: its compact JSON text, not a `Value` tree.
//!
//! A small object (a Pod, a Node) as a `serde_json::Value` with ordered maps takes about
//! 4 KiB of heap (a map, a key `String` and a `Value` per field, each its own allocation);
//! its text takes its length, about a sixth of that. The text is the one the datastore
//! stores, made once per write anyway. A read (get, list, the object a patch starts from)
//! parses it again, a few microseconds for such an object; a watch event carries the `Value`
//! the write made, so the fan-out parses nothing. The text is shared (`Arc`): a list copies
//! pointers under the cluster's lock, and a watcher's relist keeps the texts, not trees.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

/// One object of the embedded cluster, as compact JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored(Arc<str>);

#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    metadata: Option<Meta<'a>>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
}

impl Stored {
    /// Keeps `text`, the compact JSON of an object (as `Value::to_string` writes it).
    pub(super) fn from_text(text: String) -> Self {
        Stored(Arc::from(text))
    }

    /// The text, shared.
    pub(super) fn shared(&self) -> Arc<str> {
        Arc::clone(&self.0)
    }

    /// The object's JSON text.
    pub(super) fn text(&self) -> &str {
        &self.0
    }

    /// The object, parsed again. The text was written from a `Value` (or checked to be an
    /// object when the datastore was read), so it parses; `Null` is never returned for an
    /// object the cluster holds.
    pub(super) fn value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// Whether its `metadata.uid` is `uid`, without building the object.
    pub(super) fn has_uid(&self, uid: &str) -> bool {
        serde_json::from_str::<Head<'_>>(&self.0)
            .ok()
            .and_then(|head| head.metadata)
            .and_then(|meta| meta.uid)
            .is_some_and(|stored| stored == uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_reads_back_as_written_with_its_key_order_and_numbers() {
        let object = json!({"kind": "Pod", "metadata": {"name": "a", "uid": "u-\"1\""},
                            "spec": {"z": 1, "a": 0.1, "big": u64::MAX, "list": [null, true]}});
        let stored = Stored::from_text(object.to_string());
        assert_eq!(stored.value(), object);
        assert_eq!(stored.value().to_string(), object.to_string());
        assert!(stored.has_uid("u-\"1\""));
        assert!(!stored.has_uid("u-1"));
        assert!(!Stored::from_text(json!({"kind": "Pod"}).to_string()).has_uid(""));
    }
}
