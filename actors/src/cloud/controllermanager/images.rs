//! A target's `imageOverriders` (KubeEdge's v1alpha1 `ImageOverrider`), applied to a
//! Deployment made for it. Pure decisions, no I/O.
//!
//! An image is read as `[registry/]repository[:tag|@digest]` (the registry is the first part
//! when it holds a `.` or `:` or is `localhost`). `component` `Registry`, `Repository` or
//! `Tag` (the tag, or the digest) is changed by `operator`: `add` appends `value` to it,
//! `replace` sets it, `remove` drops it (a repository is never dropped: an image needs one).
//! A tag value that is neither a tag nor a digest (`sha256:<hex>`) changes nothing, as
//! KubeEdge's.
//!
//! Without `predicate`, every container of the pod template (`spec.template.spec.containers`)
//! is changed. With `predicate.path`, only the image that path names: a JSON-pointer-like
//! path into the object, which here must name a container image of the pod template,
//! `/spec/template/spec/{containers|initContainers}/<index>/image`, of a container that
//! exists. Any other path is refused ([`PredicateError`]): KubeEdge lets the path name any
//! string field of the object, so an "image" override could rewrite the object's namespace,
//! name or owner.

use serde_json::{json, Value};

/// Why an image overrider's predicate is refused (the message a user reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PredicateError(pub(super) String);

/// Applies `overriders`' image overriders to Deployment `object`, in order.
pub(super) fn apply(object: &mut Value, overriders: &Value) -> Result<(), PredicateError> {
    for (index, overrider) in overriders["imageOverriders"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let predicate = &overrider["predicate"];
        if predicate.is_null() {
            let containers = object["spec"]["template"]["spec"]["containers"].as_array_mut();
            for container in containers.into_iter().flatten() {
                if let Some(image) = container["image"].as_str() {
                    container["image"] = json!(override_image(image, overrider));
                }
            }
            continue;
        }
        let path = predicate["path"].as_str().unwrap_or_default();
        let image = image_at(object, path).map_err(|why| {
            PredicateError(format!(
                "imageOverriders[{index}].predicate.path {path:?}: {why}"
            ))
        })?;
        let image = image.as_str().unwrap_or_default().to_owned();
        if let Ok(slot) = image_at(object, path) {
            *slot = json!(override_image(&image, overrider));
        }
    }
    Ok(())
}

/// The image field `path` names in `object`: see the [module docs](self).
fn image_at<'a>(object: &'a mut Value, path: &str) -> Result<&'a mut Value, &'static str> {
    let segments: Vec<&str> = path.split('/').collect();
    let ["", "spec", "template", "spec", list @ ("containers" | "initContainers"), index, "image"] =
        segments.as_slice()
    else {
        return Err("must be /spec/template/spec/containers/<index>/image (or initContainers)");
    };
    let index: usize = index
        .parse()
        .map_err(|_| "the container index is not a number")?;
    let container = object["spec"]["template"]["spec"][*list]
        .as_array_mut()
        .and_then(|containers| containers.get_mut(index))
        .ok_or("no container at that index")?;
    match container.get_mut("image") {
        Some(image) if image.is_string() => Ok(image),
        _ => Err("that container has no image"),
    }
}

/// An image read as its parts.
#[derive(Debug, Default, PartialEq)]
struct Image {
    registry: String,
    repository: String,
    tag: String,
    digest: String,
}

impl Image {
    fn parse(image: &str) -> Image {
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => (rest, digest.to_owned()),
            None => (image, String::new()),
        };
        let (rest, tag) = match rest.rsplit_once(':') {
            Some((rest, tag)) if !tag.contains('/') => (rest, tag.to_owned()),
            _ => (rest, String::new()),
        };
        let (registry, repository) = match rest.split_once('/') {
            Some((first, repository))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_owned(), repository.to_owned())
            }
            _ => (String::new(), rest.to_owned()),
        };
        Image {
            registry,
            repository,
            tag,
            digest,
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        if !self.registry.is_empty() {
            out.push_str(&self.registry);
            out.push('/');
        }
        out.push_str(&self.repository);
        if !self.tag.is_empty() {
            out.push(':');
            out.push_str(&self.tag);
        } else if !self.digest.is_empty() {
            out.push('@');
            out.push_str(&self.digest);
        }
        out
    }

    /// Sets the tag or the digest, whichever `value` reads as; anything else changes nothing.
    fn set_tag_or_digest(&mut self, value: &str) {
        if is_tag(value) {
            self.tag = value.to_owned();
            self.digest.clear();
        } else if is_digest(value) {
            self.digest = value.to_owned();
            self.tag.clear();
        }
    }
}

/// A tag: a word character, then up to 127 word characters, `.` or `-`.
fn is_tag(value: &str) -> bool {
    let mut chars = value.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && value.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A digest: `algorithm:hex` (at least 32 hex digits).
fn is_digest(value: &str) -> bool {
    value.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && algorithm
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c))
            && hex.len() >= 32
            && hex.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// `image` with one image overrider applied (see the [module docs](self)).
pub(super) fn override_image(image: &str, overrider: &Value) -> String {
    let mut parts = Image::parse(image);
    let value = overrider["value"].as_str().unwrap_or_default();
    let operator = overrider["operator"].as_str().unwrap_or_default();
    match (
        overrider["component"].as_str().unwrap_or_default(),
        operator,
    ) {
        ("Registry", "add") => parts.registry.push_str(value),
        ("Registry", "replace") => parts.registry = value.to_owned(),
        ("Registry", "remove") => parts.registry.clear(),
        ("Repository", "add") => parts.repository.push_str(value),
        ("Repository", "replace") if !value.is_empty() => parts.repository = value.to_owned(),
        ("Tag", "add") => {
            let current = if parts.tag.is_empty() {
                &parts.digest
            } else {
                &parts.tag
            };
            let added = format!("{current}{value}");
            parts.set_tag_or_digest(&added);
        }
        ("Tag", "replace") => parts.set_tag_or_digest(value),
        ("Tag", "remove") => {
            if parts.tag.is_empty() {
                parts.digest.clear();
            } else {
                parts.tag.clear();
            }
        }
        _ => return image.to_owned(),
    }
    parts.text()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn over(component: &str, operator: &str, value: &str) -> Value {
        json!({"component": component, "operator": operator, "value": value})
    }

    #[test]
    fn image_overriders_add_replace_or_remove_one_component() {
        let cases = [
            ("nginx:1.27", over("Tag", "replace", "1.28"), "nginx:1.28"),
            (
                "docker.io/library/nginx:1.27",
                over("Registry", "replace", "r.example:5000"),
                "r.example:5000/library/nginx:1.27",
            ),
            // `add` appends to the component (KubeEdge's), which for a missing registry
            // is the value itself.
            (
                "nginx",
                over("Registry", "add", "r.example"),
                "r.example/nginx",
            ),
            (
                "registry.k8s.io/pause:3.9",
                over("Registry", "add", ".cn"),
                "registry.k8s.io.cn/pause:3.9",
            ),
            (
                "nginx:1.27",
                over("Tag", "add", "-alpine"),
                "nginx:1.27-alpine",
            ),
            (
                "nginx:1.27",
                over("Repository", "add", "-edge"),
                "nginx-edge:1.27",
            ),
            (
                "r.example/nginx:1",
                over("Tag", "remove", ""),
                "r.example/nginx",
            ),
            (
                "r.example/nginx:1",
                over("Registry", "remove", ""),
                "nginx:1",
            ),
            // A digest replaces the tag; a tag value that is neither changes nothing.
            (
                "nginx:1.27",
                over("Tag", "replace", &format!("sha256:{}", "ab".repeat(32))),
                &format!("nginx@sha256:{}", "ab".repeat(32)),
            ),
            ("nginx:1.27", over("Tag", "replace", "a/b"), "nginx:1.27"),
            // Unknown components or operators, or a repository removed, change nothing.
            ("nginx:1.27", over("Name", "replace", "x"), "nginx:1.27"),
            ("nginx:1.27", over("Tag", "upsert", "x"), "nginx:1.27"),
            ("nginx:1.27", over("Repository", "remove", ""), "nginx:1.27"),
        ];
        for (image, overrider, want) in cases {
            assert_eq!(
                override_image(image, &overrider),
                want,
                "{image} {overrider}"
            );
        }
    }

    fn deployment() -> Value {
        json!({"spec": {"template": {"spec": {
            "initContainers": [{"name": "init", "image": "busybox:1"}],
            "containers": [{"name": "a", "image": "nginx:1.27"}, {"name": "b", "image": "redis:7"}],
        }}}})
    }

    fn images(object: &Value) -> Vec<&str> {
        let spec = &object["spec"]["template"]["spec"];
        spec["initContainers"]
            .as_array()
            .into_iter()
            .chain(spec["containers"].as_array())
            .flatten()
            .map(|c| c["image"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_predicate_changes_only_the_image_its_path_names_and_other_paths_are_refused() {
        let tag = |path: Option<&str>| {
            let mut overrider = over("Tag", "replace", "2");
            if let Some(path) = path {
                overrider["predicate"] = json!({ "path": path });
            }
            json!({ "imageOverriders": [overrider] })
        };
        let mut all = deployment();
        apply(&mut all, &tag(None)).unwrap();
        assert_eq!(images(&all), ["busybox:1", "nginx:2", "redis:2"]);
        let mut second = deployment();
        apply(
            &mut second,
            &tag(Some("/spec/template/spec/containers/1/image")),
        )
        .unwrap();
        assert_eq!(images(&second), ["busybox:1", "nginx:1.27", "redis:2"]);
        let mut init = deployment();
        apply(
            &mut init,
            &tag(Some("/spec/template/spec/initContainers/0/image")),
        )
        .unwrap();
        assert_eq!(images(&init), ["busybox:2", "nginx:1.27", "redis:7"]);
        for path in [
            "/metadata/namespace",
            "/metadata/name",
            "spec/template/spec/containers/0/image",
            "/spec/template/spec/containers/0/name",
            "/spec/template/spec/containers/x/image",
            "/spec/template/spec/containers/2/image",
            "/spec/template/spec/containers/-1/image",
            "",
        ] {
            let mut object = deployment();
            let error = apply(&mut object, &tag(Some(path))).unwrap_err();
            assert!(error.0.contains("predicate.path"), "{path}: {error:?}");
            assert_eq!(object, deployment(), "{path}: nothing changed");
        }
        // A predicate without a path is refused too (the CRD requires it).
        let mut object = deployment();
        let no_path = json!({"imageOverriders": [{"component": "Tag", "operator": "replace",
            "value": "2", "predicate": {}}]});
        assert!(apply(&mut object, &no_path).is_err());
    }
}
