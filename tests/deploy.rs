//! The in-cluster manifests in deploy/ stay true to the code: each parses, the kustomization
//! lists every one, the CRDs are the ones config/crds/ holds, the ClusterRole grants exactly
//! the API calls the cloud's code makes (and fails when a new call is not granted), the
//! ConfigMap's config loads with the cloud's own loader, and the Deployment's ports, probes
//! and mounts are the ones that config names.
//!
//! `kubectl kustomize` (offline) builds the kustomization when kubectl is installed; a
//! `kubectl apply --dry-run=server` of every manifest runs only when
//! `EDGEHIVE_TEST_KUBECONFIG` names a kubeconfig of a reachable API server (skipped with a
//! message otherwise).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use edgehive::config::CloudConfig;
use edgehive_actors::cloud::cluster::kube::kind_info;
use serde_yaml_ng::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

fn manifest(name: &str) -> Value {
    let path = deploy().join("manifests").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .map(|items| {
            items
                .iter()
                .map(|item| item.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_manifest_parses_and_the_kustomization_lists_them_all() {
    let mut on_disk = BTreeSet::new();
    for sub in ["manifests", "crds"] {
        for path in yaml_files(&deploy().join(sub)) {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value = serde_yaml_ng::from_str(&text)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            for key in ["apiVersion", "kind", "metadata"] {
                assert!(!value[key].is_null(), "{} has no {key}", path.display());
            }
            on_disk.insert(format!(
                "{sub}/{}",
                path.file_name().unwrap().to_str().unwrap()
            ));
        }
    }
    let kustomization: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(deploy().join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let listed: BTreeSet<String> = strings(&kustomization["resources"]).into_iter().collect();
    assert_eq!(
        listed, on_disk,
        "kustomization.yaml's resources against deploy/'s files"
    );
    // The namespace goes first (`-f deploy/manifests/` applies files in name order too).
    assert_eq!(
        strings(&kustomization["resources"])[0],
        "manifests/00-namespace.yaml"
    );

    // The CRDs are the generated ones (kustomize reads no file outside deploy/, so a copy).
    let generated = yaml_files(&root().join("config/crds"));
    assert_eq!(generated.len(), yaml_files(&deploy().join("crds")).len());
    for path in generated {
        let copy = deploy().join("crds").join(path.file_name().unwrap());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            std::fs::read_to_string(&copy).unwrap_or_default(),
            "{} is not a copy of {}: cp config/crds/*.yaml deploy/crds/",
            copy.display(),
            path.display()
        );
    }

    match Command::new("kubectl")
        .args(["kustomize"])
        .arg(deploy())
        .output()
    {
        Ok(out) => {
            assert!(
                out.status.success(),
                "kubectl kustomize deploy/: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let built = String::from_utf8(out.stdout).unwrap();
            let kinds = built
                .lines()
                .filter(|line| line.starts_with("kind: "))
                .count();
            assert_eq!(kinds, on_disk.len(), "{built}");
        }
        Err(err) => eprintln!("SKIPPED kubectl kustomize deploy/: kubectl not runnable ({err})"),
    }
}

/// The calls whose kind is not a literal at the call site (an object's own kind, a kind from
/// an edge's request), with the module that makes them: (kind, subresource, verb, who).
/// Literal-kind calls are found in the source by [`literal_calls`].
const NON_LITERAL_CALLS: &[(&str, &str, &str, &str)] = &[
    // controllermanager/applications.rs: an EdgeApplication's workloads (below, from
    // `WORKLOAD_KINDS`).
    // controllermanager/workloads.rs: the workloads' ownerReferences set
    // blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission plugin
    // allows only to who may update the owner's finalizers.
    (
        "EdgeApplication",
        "finalizers",
        "update",
        "EdgeApplication controller (blockOwnerDeletion)",
    ),
    // edgecontroller/upstream.rs: a node registers itself, a node's update.
    ("Node", "", "create", "EdgeController upstream"),
    ("Node", "", "update", "EdgeController upstream"),
    (
        "Node",
        "status",
        "update",
        "EdgeController upstream (update_status)",
    ),
    // edgecontroller/upstream.rs: a mirror pod, a pod's status from its node.
    ("Pod", "", "create", "EdgeController upstream"),
    (
        "Pod",
        "status",
        "update",
        "EdgeController upstream (update_status)",
    ),
    // edgecontroller/upstream.rs: Request::Query for the five queryable kinds.
    ("ConfigMap", "", "get", "EdgeController upstream query"),
    ("Secret", "", "get", "EdgeController upstream query"),
    (
        "PersistentVolume",
        "",
        "get",
        "EdgeController upstream query",
    ),
    (
        "PersistentVolumeClaim",
        "",
        "get",
        "EdgeController upstream query",
    ),
    (
        "VolumeAttachment",
        "",
        "get",
        "EdgeController upstream query",
    ),
    // edgecontroller/upstream.rs: create_token.
    (
        "ServiceAccount",
        "token",
        "create",
        "EdgeController upstream",
    ),
    // edgecontroller/upstream.rs: leases and events from the edges.
    ("Lease", "", "create", "EdgeController upstream"),
    ("Lease", "", "update", "EdgeController upstream"),
    ("Event", "", "create", "EdgeController upstream"),
    ("Event", "", "update", "EdgeController upstream"),
    // devicecontroller/downstream.rs: a device's DeviceStatus.
    ("DeviceStatus", "", "create", "DeviceController"),
    // synccontroller: follows, gets and lists the kinds it keeps records for (those of
    // `resource`-group messages with an ACK: Pods, ConfigMaps, Secrets; not devices, whose
    // messages are `twin`), in its cache and at reconcile (`fetch`).
    ("Pod", "", "get", "SyncController"),
    ("ConfigMap", "", "list", "SyncController"),
    ("ConfigMap", "", "watch", "SyncController"),
    ("Secret", "", "list", "SyncController"),
    ("Secret", "", "watch", "SyncController"),
    ("Node", "", "get", "SyncController"),
    ("ConfigMap", "", "get", "SyncController"),
    ("Secret", "", "get", "SyncController"),
    ("Pod", "", "list", "SyncController"),
    ("Pod", "", "watch", "SyncController"),
    // src/cloud_secrets.rs: cloudcore's Secrets, written (create or update) by the cloud at
    // start and the token every tokenRefreshDuration; granted by the namespaced Role
    // (07-role.yaml), only in kubeedge and, for update, only those three names.
    ("Secret", "", "create", "cloud_secrets"),
    ("Secret", "", "update", "cloud_secrets"),
    // synccontroller/mod.rs `write`: its records, by the object's scope.
    ("ObjectSync", "", "create", "SyncController"),
    ("ObjectSync", "", "delete", "SyncController"),
    ("ObjectSync", "status", "patch", "SyncController"),
    ("ClusterObjectSync", "", "create", "SyncController"),
    ("ClusterObjectSync", "", "delete", "SyncController"),
    ("ClusterObjectSync", "status", "patch", "SyncController"),
    // synccontroller/mod.rs `write_checked` (replicas): read, then a status update at the
    // version read.
    ("ObjectSync", "", "get", "SyncController (replica)"),
    ("ObjectSync", "status", "update", "SyncController (replica)"),
    ("ClusterObjectSync", "", "get", "SyncController (replica)"),
    (
        "ClusterObjectSync",
        "status",
        "update",
        "SyncController (replica)",
    ),
    // ownership.rs: a replica's Lease and the nodes' Leases (create, update at the version
    // read).
    ("Lease", "", "create", "ownership"),
    ("Lease", "", "update", "ownership"),
];

/// `(group, resource[/subresource], verb)` as RBAC names it.
type Grant = (String, String, String);

fn grant(kind: &str, subresource: &str, verb: &str) -> Grant {
    let info =
        kind_info(kind).unwrap_or_else(|| panic!("{kind} is not a kind of the kube adapter"));
    let mut resource = info.resource.plural.clone();
    if !subresource.is_empty() {
        resource = format!("{resource}/{subresource}");
    }
    (info.resource.group.clone(), resource, verb.to_owned())
}

/// The cluster calls in the cloud's controllers whose kind is a string literal, as grants:
/// `.get("K"`, `.list("K"`, `.delete("K"`, `.patch("K", .., status_only)` and the watches
/// (`KindWatcher::new(.., "K")`, `follow("K"`: a list then a watch). Test code (after
/// `#[cfg(test)]`) is left out.
fn literal_calls() -> BTreeMap<Grant, String> {
    let mut found = BTreeMap::new();
    let mut files = Vec::new();
    // The Router extension (src/router/) follows and writes its rules like a controller.
    let mut dirs = vec![root().join("actors/src/cloud"), root().join("src/router")];
    // The binary's own cluster calls (cloudcore's Secrets).
    files.push(root().join("src/cloud_secrets.rs"));
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                // The port's adapters implement the calls; they make none of their own.
                if !path.ends_with("cluster") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        // Method chains broken over lines (`self\n.cluster\n.get(`) read as one.
        let code = code
            .replace("( ", "(")
            .replace(". ", ".")
            .replace(" .", ".");
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        let patterns: &[(&str, &[&str])] = &[
            ("cluster.get(\"", &["get"]),
            ("cluster.list(\"", &["list"]),
            ("cluster.delete(\"", &["delete"]),
            ("follow(\"", &["list", "watch"]),
        ];
        for (pattern, verbs) in patterns {
            for (at, _) in code.match_indices(pattern) {
                let rest = &code[at + pattern.len()..];
                let kind = &rest[..rest.find('"').unwrap()];
                if kind_info(kind).is_none() {
                    continue; // a cache's own follow(), not a cluster call
                }
                for verb in *verbs {
                    found.insert(grant(kind, "", verb), name.clone());
                }
            }
        }
        for (at, _) in code.match_indices(".patch(\"") {
            let rest = &code[at + ".patch(\"".len()..];
            let kind = &rest[..rest.find('"').unwrap()];
            let call = &rest[..rest.find(".await").unwrap_or(rest.len())];
            let status_only = call
                .trim_end()
                .trim_end_matches(')')
                .trim()
                .ends_with("true");
            let subresource =
                if status_only && kind_info(kind).is_some_and(|i| i.status_subresource) {
                    "status"
                } else {
                    ""
                };
            found.insert(grant(kind, subresource, "patch"), name.clone());
        }
        for (at, _) in code.match_indices("KindWatcher::new(") {
            let rest = &code[at..];
            let call = &rest[..rest.find(')').unwrap()];
            if let Some(start) = call.find('"') {
                let kind = &call[start + 1..call[start + 1..].find('"').unwrap() + start + 1];
                for verb in ["list", "watch"] {
                    found.insert(grant(kind, "", verb), name.clone());
                }
            }
        }
    }
    found
}

/// What the ClusterRole and the namespaced Role grant together.
fn role_grants() -> BTreeSet<Grant> {
    let mut grants = rules_of("02-clusterrole.yaml");
    grants.extend(rules_of("07-role.yaml"));
    grants
}

fn rules_of(file: &str) -> BTreeSet<Grant> {
    let role = manifest(file);
    let mut grants = BTreeSet::new();
    for rule in role["rules"].as_sequence().unwrap() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for name in [&group, &resource, &verb] {
                        assert!(
                            !name.contains('*'),
                            "a wildcard in the ClusterRole: {rule:?}"
                        );
                    }
                    grants.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    grants
}

#[test]
fn cluster_role_grants_exactly_the_calls_the_cloud_makes() {
    let role = role_grants();
    let literal = literal_calls();
    // The scan finds the calls it should (so a broken scan does not pass silently).
    for (kind, sub, verb) in [
        ("Node", "", "watch"),
        ("Pod", "status", "patch"),
        ("DeviceStatus", "", "patch"),
        ("ObjectSync", "", "list"),
        ("Pod", "", "delete"),
    ] {
        assert!(
            literal.contains_key(&grant(kind, sub, verb)),
            "the source scan no longer finds {verb} {kind}/{sub}: {literal:?}"
        );
    }
    let mut used: BTreeSet<Grant> = literal.keys().cloned().collect();
    for (kind, sub, verb, _) in NON_LITERAL_CALLS {
        used.insert(grant(kind, sub, verb));
    }
    // controllermanager/applications.rs: an EdgeApplication's workloads, of the kinds it
    // makes (get, then create or update; delete; a list at start finds those an earlier run
    // made that nothing asks for now).
    for (kind, _, _) in edgehive_actors::cloud::controllermanager::WORKLOAD_KINDS {
        for verb in ["get", "list", "create", "update", "delete"] {
            used.insert(grant(kind, "", verb));
        }
    }
    let missing: Vec<_> = used
        .difference(&role)
        .map(|g| {
            (
                g,
                literal
                    .get(g)
                    .cloned()
                    .unwrap_or_else(|| "NON_LITERAL_CALLS".into()),
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the cloud makes calls deploy/manifests/02-clusterrole.yaml does not grant (would be 403): {missing:?}"
    );
    let extra: Vec<_> = role.difference(&used).collect();
    assert!(
        extra.is_empty(),
        "the ClusterRole grants what no code calls: {extra:?}"
    );
}

fn cloud_config_text() -> String {
    let map = manifest("04-configmap.yaml");
    map["data"]["cloudcore.yaml"].as_str().unwrap().to_owned()
}

fn port_of(address: &str) -> u16 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn configmap_config_loads_and_the_deployment_matches_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloudcore.yaml");
    std::fs::write(&path, cloud_config_text()).unwrap();
    // The loader `edgehive cloud --config` uses.
    let config = CloudConfig::load_files(std::slice::from_ref(&path)).unwrap();
    let options = config
        .kube_api_config
        .kube_options()
        .expect("the config must name the API server, not the embedded cluster");
    assert!(
        options.kube_config.is_none(),
        "in-cluster: the service account's token, no kubeconfig file"
    );

    let deployment = manifest("05-deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "edgehive-cloud");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // The config file the container is started with is the ConfigMap's key.
    let args = strings(&container["args"]);
    assert_eq!(args[..2], ["cloud", "--config"]);
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let volumes = pod["volumes"].as_sequence().unwrap();
    let volume_of = |file: &Path| -> (&Value, &Value) {
        let mount = mounts
            .iter()
            .filter(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
            .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
            .unwrap_or_else(|| panic!("nothing is mounted for {}", file.display()));
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        (mount, volume)
    };
    let (_, config_volume) = volume_of(Path::new(&args[2]));
    assert_eq!(config_volume["configMap"]["name"], "edgehive-cloud");
    assert!(args[2].ends_with("/cloudcore.yaml"));

    // The admin token comes from a Secret; files the cloud writes (its CA and server
    // certificate, taken from cloudcore's Secrets at each start) go to writable volumes (the
    // root file system is read-only).
    let hub = &config.modules.cloud_hub;
    let token = &config.common_config.monitor_server.token_file;
    assert_eq!(
        volume_of(token).1["secret"]["secretName"],
        "edgehive-admin-token"
    );
    for file in [
        &hub.tls_ca_file,
        &hub.tls_ca_key_file,
        &hub.tls_cert_file,
        &hub.tls_private_key_file,
    ] {
        let (mount, volume) = volume_of(file);
        assert!(!volume["emptyDir"].is_null(), "{}", file.display());
        assert_ne!(mount["readOnly"], true);
    }

    // Ports: the container's and the Service's are the config's.
    let ports: BTreeMap<String, u16> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_u64().unwrap() as u16,
            )
        })
        .collect();
    let stream = &config.modules.cloud_stream;
    assert!(
        stream.egress.uds_name.as_os_str().is_empty(),
        "the egress server listens on its port in a pod"
    );
    let admin = port_of(&config.common_config.monitor_server.bind_address);
    let expected: BTreeMap<String, u16> = [
        ("websocket", hub.websocket.port),
        ("https", hub.https.port),
        ("stream", stream.stream_port),
        ("tunnel", stream.tunnel_port),
        // The API server's way in (docs/streams.md): a TCP port, never the Unix socket,
        // which a pod cannot offer on the API server's host.
        ("egress", stream.egress.port),
        ("admin", admin),
    ]
    .into_iter()
    .map(|(name, port)| (name.to_owned(), port))
    .collect();
    assert_eq!(ports, expected);
    let service = manifest("06-service.yaml");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    for port in service["spec"]["ports"].as_sequence().unwrap() {
        let target = port["targetPort"].as_str().unwrap();
        assert_eq!(
            Some(&(port["port"].as_u64().unwrap() as u16)),
            expected.get(target),
            "Service port {target}"
        );
        assert_ne!(target, "admin", "the admin endpoint is not for edges");
    }

    // Probes: the admin endpoint's open routes, on the port it listens on beyond loopback.
    let bind = &config.common_config.monitor_server.bind_address;
    assert!(
        bind.starts_with("0.0.0.0:"),
        "the kubelet must reach {bind}"
    );
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "admin", "{probe}");
    }
}

#[test]
fn manifests_pass_a_server_dry_run_when_an_api_server_is_given() {
    let Ok(kubeconfig) = std::env::var("EDGEHIVE_TEST_KUBECONFIG") else {
        eprintln!(
            "SKIPPED kubectl apply --dry-run=server -k deploy/: set EDGEHIVE_TEST_KUBECONFIG to \
             the kubeconfig of a reachable API server to run it"
        );
        return;
    };
    let out = Command::new("kubectl")
        .args([
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "--dry-run=server",
            "-k",
        ])
        .arg(deploy())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply --dry-run=server: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_cloud_started_with_the_configmap_uses_the_pods_service_account() {
    // The real process with the ConfigMap's config (files under a temporary folder, the
    // listeners on loopback): it loads it, and goes for the in-cluster service account,
    // which outside a pod it says it cannot find, before it listens on anything.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let text = cloud_config_text()
        .replace("/etc/kubeedge/", &format!("{d}/"))
        .replace("0.0.0.0", "127.0.0.1");
    let path = dir.path().join("cloudcore.yaml");
    std::fs::write(&path, text).unwrap();
    std::fs::create_dir_all(dir.path().join("admin")).unwrap();
    std::fs::write(dir.path().join("admin/token"), "x").unwrap();
    let out = Command::new(crate::support::process::BIN)
        .args(["cloud", "--config"])
        .arg(&path)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no in-cluster service account"),
        "the cloud did not go for the pod's service account: {stderr}"
    );
}

#[test]
fn the_cloud_writes_only_cloudcores_three_secrets_and_only_in_its_namespace() {
    let role = manifest("07-role.yaml");
    assert_eq!(role["kind"], "Role");
    assert_eq!(
        role["metadata"]["namespace"],
        edgehive::cloud_secrets::NAMESPACE
    );
    let binding = manifest("08-rolebinding.yaml");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], "edgehive-cloud");
    let names = [
        edgehive::cloud_secrets::CA_SECRET.0,
        edgehive::cloud_secrets::SERVER_SECRET.0,
        edgehive::cloud_secrets::TOKEN_SECRET.0,
    ];
    for rule in role["rules"].as_sequence().unwrap() {
        assert_eq!(strings(&rule["resources"]), ["secrets"]);
        if strings(&rule["verbs"]) != ["create"] {
            // Everything but create (which RBAC cannot limit by name) names the three.
            assert_eq!(strings(&rule["resourceNames"]), names, "{rule:?}");
        }
    }
    // The ClusterRole writes no Secret anywhere.
    for (_, resource, verb) in rules_of("02-clusterrole.yaml") {
        assert!(
            resource != "secrets" || ["get", "list", "watch"].contains(&verb.as_str()),
            "the ClusterRole lets the cloud {verb} secrets"
        );
    }
}

/// deploy/image/Containerfile as (instruction, arguments) lines: comments and blank lines
/// dropped, instruction upper-cased (the file continues no line with `\`).
fn containerfile() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy().join("image/Containerfile")).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            assert!(!line.ends_with('\\'), "a continued line: {line}");
            let (instruction, args) = line.split_once(' ').unwrap_or((line, ""));
            (instruction.to_uppercase(), args.trim().to_owned())
        })
        .collect()
}

/// The subcommands `edgehive --help` lists.
fn subcommands() -> BTreeSet<String> {
    let out = Command::new(crate::support::process::BIN)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .map(|line| line.split_whitespace().next().unwrap().to_owned())
        .collect()
}

#[test]
fn the_image_runs_the_deployments_command_as_its_user_from_what_the_build_script_makes() {
    let lines = containerfile();
    let all = |name: &str| -> Vec<&str> {
        lines
            .iter()
            .filter(|(instruction, _)| instruction == name)
            .map(|(_, args)| args.as_str())
            .collect()
    };
    // Nothing but the binary and empty folders: no base image, so no shell to RUN anything.
    assert_eq!(all("FROM"), ["scratch"]);
    for (instruction, _) in &lines {
        assert!(
            ["FROM", "COPY", "USER", "ENTRYPOINT"].contains(&instruction.as_str()),
            "{instruction} in a scratch image"
        );
    }
    let copies: BTreeMap<&str, &str> = all("COPY")
        .into_iter()
        .map(|args| {
            let words: Vec<&str> = args.split_whitespace().collect();
            assert_eq!(words.len(), 2, "COPY {args}: one source, one destination");
            (words[1], words[0])
        })
        .collect();

    // The entrypoint is the binary the image holds, in exec form (there is no shell), and the
    // Deployment gives it only arguments, the first a subcommand the binary has.
    let entrypoint: Vec<String> = serde_json::from_str(all("ENTRYPOINT")[0]).unwrap();
    assert_eq!(entrypoint.len(), 1, "{entrypoint:?}");
    let binary_source = copies
        .get(entrypoint[0].as_str())
        .unwrap_or_else(|| panic!("no COPY puts {} in the image", entrypoint[0]));
    let deployment = manifest("05-deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(
        container["command"].is_null(),
        "a command would replace the image's entrypoint"
    );
    let commands = subcommands();
    let args = strings(&container["args"]);
    assert!(
        commands.contains(&args[0]),
        "{} not in {commands:?}",
        args[0]
    );
    for command in ["cloud", "edge"] {
        assert!(commands.contains(command), "{command} not in {commands:?}");
    }

    // The image's user is the Deployment's, by number (runAsNonRoot can check only a number).
    let user = all("USER");
    assert_eq!(user.len(), 1);
    let security = &pod["securityContext"];
    assert_eq!(
        user[0],
        format!(
            "{}:{}",
            security["runAsUser"].as_u64().unwrap(),
            security["runAsGroup"].as_u64().unwrap()
        )
    );
    assert_ne!(security["runAsUser"].as_u64(), Some(0));

    // The build context is what deploy/image/build.sh makes: every COPY source is a file or
    // folder it puts in the context, the binary copied from where its cargo build writes it.
    let script = std::fs::read_to_string(deploy().join("image/build.sh")).unwrap();
    let value = |name: &str| -> String {
        let prefix = format!("{name}=");
        let line = script
            .lines()
            .map(|line| line.trim_start_matches("export ").trim())
            .find(|line| line.starts_with(&prefix))
            .unwrap_or_else(|| panic!("build.sh sets no {name}"));
        line[prefix.len()..]
            .trim_matches('"')
            .replace("$PWD/", "")
            .to_owned()
    };
    let context = value("CONTEXT");
    let target_dir = value("CARGO_TARGET_DIR");
    let target = value("TARGET");
    assert!(
        context.starts_with(&format!("{target_dir}/")),
        "the context {context} is outside the build's {target_dir}"
    );
    let built = format!("{target_dir}/$TARGET/release/edgehive");
    assert!(
        script.contains(&format!("cp \"{built}\" \"$CONTEXT/{binary_source}\"")),
        "build.sh does not copy {built} ({target}) to $CONTEXT/{binary_source}"
    );
    assert!(script.contains("--bin edgehive --target \"$TARGET\""));
    // The other COPYs bring folders build.sh makes in the context; the Deployment's root file
    // system is read-only, so each is a writable emptyDir there.
    let made: Vec<&str> = script
        .lines()
        .filter_map(|line| line.strip_prefix("mkdir -p "))
        .flat_map(str::split_whitespace)
        .filter_map(|folder| folder.trim_matches('"').strip_prefix("$CONTEXT/"))
        .collect();
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let volumes = pod["volumes"].as_sequence().unwrap();
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let mut folders = 0;
    for (destination, source) in &copies {
        if *destination == entrypoint[0] {
            continue;
        }
        let source = source.trim_end_matches('/');
        for folder in made.iter().filter_map(|m| m.strip_prefix(source)) {
            folders += 1;
            let in_image = format!("{}{folder}", destination.trim_end_matches('/'));
            let mount = mounts
                .iter()
                .find(|m| m["mountPath"] == in_image.as_str())
                .unwrap_or_else(|| panic!("{in_image} (COPY {source}/) is not mounted"));
            assert_ne!(mount["readOnly"], true, "{in_image}");
            let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
            assert!(!volume["emptyDir"].is_null(), "{in_image}");
        }
    }
    assert_eq!(
        folders,
        made.len(),
        "build.sh makes {made:?}; the Containerfile COPYs {copies:?}"
    );
    // The commands the Containerfile and docs/deploying.md give build that context.
    let documented = "-f deploy/image/Containerfile -t \"edgehive:$VERSION\" \"$CONTEXT\"";
    assert!(script.contains(documented), "build.sh: {documented}");
    let version = env!("CARGO_PKG_VERSION");
    let by_hand = format!("-f deploy/image/Containerfile -t edgehive:{version} {context}");
    for doc in ["deploy/image/Containerfile", "docs/deploying.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        assert!(text.contains(&by_hand), "{doc} does not say {by_hand}");
    }

    // The image name and tag: the build script tags `edgehive --version`'s version; the
    // Deployment and the kustomization's `images:` name that tag.
    let out = Command::new(crate::support::process::BIN)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!("edgehive {version}")
    );
    assert_eq!(container["image"], format!("edgehive:{version}"));
    let kustomization: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(deploy().join("kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let images = kustomization["images"].as_sequence().unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["name"], "edgehive");
    assert_eq!(images[0]["newTag"], version);
}
