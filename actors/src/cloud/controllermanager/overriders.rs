//! A target group's container overriders (KubeEdge's v1alpha1 `Overriders`), applied to a
//! pod template's containers. Pure decisions, no I/O. Each overrider names its container
//! (`containerName`); a container of another name, or an operator the CRD does not list, is
//! left as it is.
//!
//! - `envOverriders` (`operator` `add`, `remove`, `replace`; `value` a list of EnvVars): `add`
//!   appends them; `remove` drops the variables of those names; `replace` puts each in place
//!   of the variable of its name, appending the ones the container lacks.
//! - `commandOverriders`, `argsOverriders` (`operator` `add`, `remove`; `value` strings): `add`
//!   appends them (making the list when there is none); `remove` drops every item equal to
//!   one of them.
//! - `resourcesOverriders` (`value` a ResourceRequirements): each non-zero quantity of
//!   `requests` and `limits` is set for its resource, the others kept.

use serde_json::{json, Map, Value};

/// Applies `overriders`' env, command, args and resources overriders to `containers`.
pub(super) fn apply(containers: &mut [Value], overriders: &Value) {
    for overrider in list(&overriders["envOverriders"]) {
        for container in named(containers, overrider) {
            override_env(container, overrider);
        }
    }
    for (field, key) in [("command", "commandOverriders"), ("args", "argsOverriders")] {
        for overrider in list(&overriders[key]) {
            for container in named(containers, overrider) {
                override_strings(container, field, overrider);
            }
        }
    }
    for overrider in list(&overriders["resourcesOverriders"]) {
        for container in named(containers, overrider) {
            override_resources(container, &overrider["value"]);
        }
    }
}

fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// The containers `overrider` names.
fn named<'a>(
    containers: &'a mut [Value],
    overrider: &'a Value,
) -> impl Iterator<Item = &'a mut Value> {
    let name = overrider["containerName"].as_str().unwrap_or_default();
    containers
        .iter_mut()
        .filter(move |container| !name.is_empty() && container["name"].as_str() == Some(name))
}

fn override_env(container: &mut Value, overrider: &Value) {
    let values: Vec<&Value> = list(&overrider["value"])
        .filter(|var| var["name"].as_str().is_some_and(|n| !n.is_empty()))
        .collect();
    let mut env: Vec<Value> = container["env"].as_array().cloned().unwrap_or_default();
    match overrider["operator"].as_str() {
        Some("add") => env.extend(values.into_iter().cloned()),
        Some("remove") => env.retain(|var| !values.iter().any(|v| v["name"] == var["name"])),
        Some("replace") => {
            for value in values {
                match env.iter_mut().find(|var| var["name"] == value["name"]) {
                    Some(var) => *var = value.clone(),
                    None => env.push(value.clone()),
                }
            }
        }
        _ => return,
    }
    set_list(container, "env", env);
}

fn override_strings(container: &mut Value, field: &str, overrider: &Value) {
    let values: Vec<&str> = list(&overrider["value"])
        .filter_map(Value::as_str)
        .collect();
    let mut items: Vec<Value> = container[field].as_array().cloned().unwrap_or_default();
    match overrider["operator"].as_str() {
        Some("add") => items.extend(values.iter().map(|v| json!(v))),
        Some("remove") => items.retain(|item| !item.as_str().is_some_and(|i| values.contains(&i))),
        _ => return,
    }
    set_list(container, field, items);
}

/// Sets `field` to `items`, or removes it when empty (an empty list means the default).
fn set_list(container: &mut Value, field: &str, items: Vec<Value>) {
    if let Some(fields) = container.as_object_mut() {
        if items.is_empty() {
            fields.remove(field);
        } else {
            fields.insert(field.to_owned(), Value::Array(items));
        }
    }
}

fn override_resources(container: &mut Value, value: &Value) {
    for part in ["requests", "limits"] {
        let Some(quantities) = value[part].as_object() else {
            continue;
        };
        for (resource, quantity) in quantities {
            let text = match quantity {
                Value::String(text) => text.clone(),
                Value::Number(number) => number.to_string(),
                _ => continue,
            };
            if is_zero(&text) {
                continue;
            }
            if !container["resources"].is_object() {
                container["resources"] = Value::Object(Map::new());
            }
            if !container["resources"][part].is_object() {
                container["resources"][part] = Value::Object(Map::new());
            }
            container["resources"][part][resource] = json!(text);
        }
    }
}

/// Whether a Kubernetes quantity (`0`, `0m`, `0.0Gi`) is zero; one that does not read as a
/// number is not.
fn is_zero(quantity: &str) -> bool {
    let number: String = quantity
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '+' | '-'))
        .collect();
    number.parse::<f64>().is_ok_and(|n| n == 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn containers() -> Vec<Value> {
        vec![
            json!({"name": "app", "image": "i", "command": ["serve"], "args": ["--port", "80", "-v"],
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                "resources": {"requests": {"cpu": "100m"}}}),
            json!({"name": "sidecar", "image": "s"}),
        ]
    }

    fn applied(overriders: Value) -> Vec<Value> {
        let mut containers = containers();
        apply(&mut containers, &overriders);
        containers
    }

    #[test]
    fn env_overriders_add_remove_and_replace_by_name() {
        let env = |operator: &str, value: Value| json!({"envOverriders": [{"containerName": "app", "operator": operator, "value": value}]});
        let added = applied(env("add", json!([{"name": "C", "value": "3"}])));
        assert_eq!(
            added[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}])
        );
        assert!(
            added[1].get("env").is_none(),
            "another container is untouched"
        );
        let removed = applied(env("remove", json!([{"name": "A"}])));
        assert_eq!(removed[0]["env"], json!([{"name": "B", "value": "2"}]));
        let replaced = applied(env(
            "replace",
            json!([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "D", "value": "4"}]),
        ));
        assert_eq!(
            replaced[0]["env"],
            json!([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "B", "value": "2"}, {"name": "D", "value": "4"}])
        );
        // An env removed whole leaves no empty list; an unknown operator changes nothing.
        let gone = applied(env("remove", json!([{"name": "A"}, {"name": "B"}])));
        assert!(gone[0].get("env").is_none());
        assert_eq!(
            applied(env("upsert", json!([{"name": "A"}])))[0],
            containers()[0]
        );
        // A container without env gets one.
        let mut sidecar = containers();
        apply(
            &mut sidecar,
            &json!({"envOverriders": [{"containerName": "sidecar", "operator": "replace",
                "value": [{"name": "X", "value": "y"}]}]}),
        );
        assert_eq!(sidecar[1]["env"], json!([{"name": "X", "value": "y"}]));
    }

    #[test]
    fn command_and_args_overriders_append_or_drop_items() {
        let added = applied(json!({
            "commandOverriders": [{"containerName": "app", "operator": "add", "value": ["--fast"]}],
            "argsOverriders": [{"containerName": "app", "operator": "remove", "value": ["-v", "80"]},
                {"containerName": "sidecar", "operator": "add", "value": ["--x"]}],
        }));
        assert_eq!(added[0]["command"], json!(["serve", "--fast"]));
        assert_eq!(added[0]["args"], json!(["--port"]));
        assert_eq!(added[1]["args"], json!(["--x"]));
        // `replace` is not an operator of command/args (the CRD lists add and remove).
        let same = applied(json!({"commandOverriders": [
            {"containerName": "app", "operator": "replace", "value": ["x"]}]}));
        assert_eq!(same[0]["command"], json!(["serve"]));
        // A container named by no overrider, or a missing name, is untouched.
        let none = applied(json!({"argsOverriders": [{"operator": "add", "value": ["x"]}]}));
        assert_eq!(none, containers());
    }

    #[test]
    fn resources_overriders_set_non_zero_quantities() {
        let set = applied(
            json!({"resourcesOverriders": [{"containerName": "app", "value": {
            "requests": {"memory": "64Mi", "cpu": "0"}, "limits": {"cpu": "500m"}}},
            {"containerName": "sidecar", "value": {"limits": {"memory": "1Gi"}}}]}),
        );
        assert_eq!(
            set[0]["resources"],
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m"}})
        );
        assert_eq!(set[1]["resources"], json!({"limits": {"memory": "1Gi"}}));
        assert!(is_zero("0") && is_zero("0m") && is_zero("0.0Gi"));
        assert!(!is_zero("1") && !is_zero("100m") && !is_zero("abc"));
    }
}
