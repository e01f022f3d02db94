//! Kubernetes label and field selectors, applied to stored objects.
//!
//! Labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does
//! not exist), joined by commas. Fields: `=`, `==`, `!=` on `metadata.name`,
//! `metadata.namespace`, `spec.nodeName`, `status.phase` and `type`. Anything else is an
//! error, which MetaServer answers with 400 BadRequest.

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Label {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// One field requirement: the JSON pointer, the value, and whether it must differ.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    pointer: &'static str,
    value: String,
    negate: bool,
}

/// A label and a field selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Selector {
    labels: Vec<Label>,
    fields: Vec<Field>,
}

/// Splits at commas outside parentheses.
fn split_top(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced parentheses in {text:?}"))?
            }
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {text:?}"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

/// A label key or value: Kubernetes' characters (`[A-Za-z0-9._/-]`), at most 317 bytes.
fn token(text: &str, what: &str, may_be_empty: bool) -> Result<String, String> {
    let text = text.trim();
    let valid = text.len() <= 317
        && (may_be_empty || !text.is_empty())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!("invalid {what} {text:?}"))
    }
}

fn parse_label(requirement: &str) -> Result<Label, String> {
    let requirement = requirement.trim();
    if let Some(key) = requirement.strip_prefix('!') {
        return Ok(Label::NotExists(token(key, "label key", false)?));
    }
    if let Some(open) = requirement.find('(') {
        let close = requirement
            .strip_suffix(')')
            .ok_or_else(|| format!("expected ')' at the end of {requirement:?}"))?;
        let head = &requirement[..open];
        let values = close[open + 1..]
            .split(',')
            .map(|value| token(value, "label value", true))
            .collect::<Result<Vec<_>, _>>()?;
        let mut words = head.split_whitespace();
        let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!(
                "expected 'key in (…)' or 'key notin (…)', found {requirement:?}"
            ));
        };
        let key = token(key, "label key", false)?;
        return match op {
            "in" => Ok(Label::In(key, values)),
            "notin" => Ok(Label::NotIn(key, values)),
            other => Err(format!("unknown set operator {other:?}")),
        };
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = requirement.split_once(op) {
            let key = token(key, "label key", false)?;
            let value = token(value, "label value", true)?;
            return Ok(if negate {
                Label::NotEquals(key, value)
            } else {
                Label::Equals(key, value)
            });
        }
    }
    Ok(Label::Exists(token(requirement, "label key", false)?))
}

/// The JSON pointer of a field selector's field.
fn field_pointer(field: &str) -> Option<&'static str> {
    Some(match field {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        "spec.nodeName" => "/spec/nodeName",
        "status.phase" => "/status/phase",
        "type" => "/type",
        _ => return None,
    })
}

fn parse_field(requirement: &str) -> Result<Field, String> {
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((field, value)) = requirement.split_once(op) {
            let field = field.trim();
            let pointer = field_pointer(field)
                .ok_or_else(|| format!("field label not supported: {field}"))?;
            return Ok(Field {
                pointer,
                value: value.trim().to_owned(),
                negate,
            });
        }
    }
    Err(format!(
        "invalid field selector requirement {requirement:?}"
    ))
}

impl Selector {
    /// Reads `labelSelector` and `fieldSelector` (either may be absent or empty).
    pub(super) fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selector, String> {
        let mut selector = Selector::default();
        if let Some(labels) = labels.filter(|text| !text.trim().is_empty()) {
            for requirement in split_top(labels)? {
                selector.labels.push(parse_label(requirement)?);
            }
        }
        if let Some(fields) = fields.filter(|text| !text.trim().is_empty()) {
            for requirement in split_top(fields)? {
                selector.fields.push(parse_field(requirement)?);
            }
        }
        Ok(selector)
    }

    /// Whether `object` meets every requirement.
    pub(super) fn matches(&self, object: &Value) -> bool {
        let label = |key: &str| {
            object
                .pointer("/metadata/labels")
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
        };
        let labels_match = self.labels.iter().all(|requirement| match requirement {
            Label::Equals(key, value) => label(key) == Some(value.as_str()),
            Label::NotEquals(key, value) => label(key) != Some(value.as_str()),
            Label::In(key, values) => {
                label(key).is_some_and(|found| values.iter().any(|v| v == found))
            }
            Label::NotIn(key, values) => {
                label(key).is_none_or(|found| values.iter().all(|v| v != found))
            }
            Label::Exists(key) => label(key).is_some(),
            Label::NotExists(key) => label(key).is_none(),
        });
        labels_match
            && self.fields.iter().all(|field| {
                let found = object
                    .pointer(field.pointer)
                    .and_then(Value::as_str)
                    .unwrap_or("");
                (found == field.value) != field.negate
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value, node: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}, "spec": {"nodeName": node}})
    }

    #[test]
    fn label_selectors_of_every_form() {
        let p = pod(json!({"app": "web", "tier": "front"}), "n1");
        for (selector, expected) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web,db)", false),
            ("tier,app=web", true),
            ("!tier", false),
            ("!missing", true),
            ("missing", false),
            ("missing!=x", true),
            ("app in (db),tier", false),
        ] {
            let parsed = Selector::parse(Some(selector), None).unwrap();
            assert_eq!(parsed.matches(&p), expected, "{selector}");
        }
        for bad in ["app in (web", "app=w b", "a in b (c)", "app>3", "=x"] {
            assert!(Selector::parse(Some(bad), None).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selectors_on_the_supported_fields() {
        let p = pod(json!({}), "n1");
        let select = |text| Selector::parse(None, Some(text));
        assert!(select("spec.nodeName=n1").unwrap().matches(&p));
        assert!(!select("spec.nodeName!=n1").unwrap().matches(&p));
        assert!(select("metadata.name=p,metadata.namespace=ns")
            .unwrap()
            .matches(&p));
        assert!(!select("metadata.name=q").unwrap().matches(&p));
        assert!(select("spec.containers=x").is_err());
        assert!(select("nonsense").is_err());
    }
}
