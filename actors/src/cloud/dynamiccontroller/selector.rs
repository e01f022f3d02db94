//! Label and field selectors, as an application's `Option` carries them (Kubernetes' string
//! syntax): labels `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`; fields
//! `path=value`, `path==value`, `path!=value` on any dotted path of the object
//! (`spec.nodeName`, `metadata.name`). Requirements are joined by commas; all must hold.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed selector; the empty one matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Selector {
    requirements: Vec<Requirement>,
    fields: bool,
}

/// Splits on commas outside parentheses.
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (at, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn set(text: &str) -> Result<Vec<String>, String> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| format!("{text:?} is not a set (a, b)"))?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

impl Selector {
    /// A label selector; `Err` says what is wrong.
    pub(super) fn labels(text: &str) -> Result<Self, String> {
        Self::parse(text, false)
    }

    /// A field selector; `Err` says what is wrong.
    pub(super) fn fields(text: &str) -> Result<Self, String> {
        Self::parse(text, true)
    }

    fn parse(text: &str, fields: bool) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Selector {
                requirements,
                fields,
            });
        }
        for part in split_top(text) {
            let part = part.trim();
            let requirement = if let Some((key, value)) = part.split_once("!=") {
                Requirement {
                    key: key.trim().to_owned(),
                    op: Op::NotEq(value.trim().to_owned()),
                }
            } else if let Some((key, value)) =
                part.split_once("==").or_else(|| part.split_once('='))
            {
                Requirement {
                    key: key.trim().to_owned(),
                    op: Op::Eq(value.trim().to_owned()),
                }
            } else if fields {
                return Err(format!(
                    "field selector {part:?} is not path=value or path!=value"
                ));
            } else if let Some((key, values)) = part.split_once(" notin ") {
                Requirement {
                    key: key.trim().to_owned(),
                    op: Op::NotIn(set(values)?),
                }
            } else if let Some((key, values)) = part.split_once(" in ") {
                Requirement {
                    key: key.trim().to_owned(),
                    op: Op::In(set(values)?),
                }
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement {
                    key: key.trim().to_owned(),
                    op: Op::NotExists,
                }
            } else {
                Requirement {
                    key: part.to_owned(),
                    op: Op::Exists,
                }
            };
            if !valid_key(&requirement.key) {
                return Err(format!("selector {part:?} has no valid key"));
            }
            requirements.push(requirement);
        }
        Ok(Selector {
            requirements,
            fields,
        })
    }

    /// Whether `obj` is selected.
    pub(super) fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|req| {
            let value = if self.fields {
                field(obj, &req.key)
            } else {
                obj["metadata"]["labels"][req.key.as_str()]
                    .as_str()
                    .map(str::to_owned)
            };
            match &req.op {
                Op::Eq(want) => {
                    value.as_deref().unwrap_or("") == want && (self.fields || value.is_some())
                }
                Op::NotEq(want) => value.as_deref() != Some(want.as_str()),
                Op::In(set) => value.is_some_and(|v| set.contains(&v)),
                Op::NotIn(set) => !value.is_some_and(|v| set.contains(&v)),
                Op::Exists => value.is_some(),
                Op::NotExists => value.is_none(),
            }
        })
    }
}

/// The value at dotted `path` as text (`""` when absent: a field selector compares to it).
fn field(obj: &Value, path: &str) -> Option<String> {
    let mut at = obj;
    for part in path.split('.') {
        at = &at[part];
    }
    Some(match at {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_select_as_kubernetes_does() {
        let pod = json!({"metadata": {"name": "p", "labels": {"app": "golden", "tier": "web"}},
            "spec": {"nodeName": "vm"}});
        let labels = |text: &str| Selector::labels(text).unwrap().matches(&pod);
        assert!(labels("app=golden"));
        assert!(labels("app==golden,tier"));
        assert!(!labels("app!=golden"));
        assert!(labels("app in (golden, other),!missing"));
        assert!(!labels("tier notin (web)"));
        assert!(!labels("missing=x"));
        assert!(labels(""));
        let fields = |text: &str| Selector::fields(text).unwrap().matches(&pod);
        assert!(fields("spec.nodeName=vm"));
        assert!(!fields("spec.nodeName=other"));
        assert!(fields("metadata.name=p,spec.nodeName!=other"));
        assert!(Selector::fields("spec.nodeName").is_err());
        assert!(Selector::labels("=x").is_err());
        assert!(Selector::labels("a in x").is_err());
    }
}
