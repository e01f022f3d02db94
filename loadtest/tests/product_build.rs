//! The hooks only tests and this tool use (edgehive-actors' `test-hooks`: the node-actor
//! crash drill, edges linked in memory) stay out of the product: a build of the `edgehive`
//! package alone, as `cargo build -p edgehive --release` and the edge-only build make it,
//! does not turn the feature on, while the tool's build does.
//!
//! Cargo unifies features over the packages of one build, so `cargo test --workspace` builds
//! the product with the hooks; what matters is what a build of the product alone resolves,
//! which `cargo tree` tells without building anything.

use std::process::Command;

/// The features `cargo tree` resolves for edgehive-actors in a build of `package` with `args`
/// (normal and build dependencies only, as `cargo build` uses them).
fn actor_features(package: &str, args: &[&str]) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["tree", "--frozen", "-p", package, "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p} [{f}]"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find(|line| line.starts_with("edgehive-actors "))
        .unwrap_or_else(|| panic!("no edgehive-actors in {stdout}"));
    let features = line
        .rsplit_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .map_or("", |(features, _)| features);
    features
        .split(',')
        .filter(|feature| !feature.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_product_build_has_no_test_hooks_and_the_tool_build_has_them() {
    let product = actor_features("edgehive", &[]);
    assert!(product.contains(&"cloud".to_owned()), "{product:?}");
    assert!(!product.contains(&"test-hooks".to_owned()), "{product:?}");
    let edge_only = actor_features("edgehive", &["--no-default-features"]);
    assert!(edge_only.is_empty(), "{edge_only:?}");
    let tool = actor_features("edgehive-loadtest", &[]);
    assert!(tool.contains(&"test-hooks".to_owned()), "{tool:?}");
}
