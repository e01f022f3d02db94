//! `edgehive join --service` and `edgehive reset` as an operator runs them (real processes,
//! files in a temporary folder standing for /etc; systemctl is never called: no `--enable`).
//! The unit is checked with `systemd-analyze verify` where it is installed.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::process::BIN;

fn token() -> String {
    format!("{}.{}", "a".repeat(64), "header.payload.sig")
}

fn join(dir: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["join", "--cloud", "127.0.0.1:10000", "--token", &token()])
        .args(["--node", "unit-edge", "--service"])
        .arg("--config")
        .arg(dir.join("etc/kubeedge/config/edge.yaml"))
        .arg("--data-dir")
        .arg(dir.join("etc/kubeedge"))
        .arg("--unit-dir")
        .arg(dir.join("etc/systemd/system"))
        .args(extra)
        .output()
        .unwrap()
}

fn reset(dir: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .arg("reset")
        .arg("--config")
        .arg(dir.join("etc/kubeedge/config/edge.yaml"))
        .args(extra)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn join_service_writes_a_unit_systemd_accepts_and_reset_removes_only_what_join_created() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // What the host had before: the unit folder, and a file of the operator's in the data
    // folder.
    std::fs::create_dir_all(root.join("etc/systemd/system")).unwrap();
    std::fs::create_dir_all(root.join("etc/kubeedge")).unwrap();
    std::fs::write(root.join("etc/kubeedge/operator-notes.txt"), "mine").unwrap();
    std::fs::write(root.join("etc/systemd/system/other.service"), "[Unit]\n").unwrap();

    let out = join(root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let config = root.join("etc/kubeedge/config/edge.yaml");
    let unit_path = root.join("etc/systemd/system/edgecore.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    for line in [
        "After=network-online.target",
        "Wants=network-online.target",
        "Restart=always",
        "WantedBy=multi-user.target",
        &format!("ExecStart=\"{BIN}\" edge --config \"{}\"", config.display()),
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line:?} in:\n{unit}");
    }

    match Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit_path)
        .output()
    {
        Ok(out) => assert!(
            out.status.success() && !text(&out).contains("edgecore.service"),
            "systemd-analyze verify: {}",
            text(&out)
        ),
        Err(err) => eprintln!("SKIPPED systemd-analyze verify: not runnable here ({err})"),
    }

    // What the edge writes from that config once it runs: its certificate and key, the CA,
    // its database (stood in for here: the edge would need a cloud).
    for file in [
        "etc/kubeedge/ca/rootCA.crt",
        "etc/kubeedge/certs/server.crt",
        "etc/kubeedge/certs/server.key",
        "etc/kubeedge/edgecore.db",
        "etc/kubeedge/edgecore.db-wal",
    ] {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "x").unwrap();
    }

    // Without --force: a list, nothing removed.
    let out = reset(root, &[]);
    assert!(!out.status.success());
    let listed = text(&out);
    assert!(listed.contains("--force"), "{listed}");
    assert!(
        listed.contains(unit_path.to_str().unwrap()) && listed.contains("server.key"),
        "{listed}"
    );
    assert!(!listed.contains("operator-notes"), "{listed}");
    assert!(unit_path.exists() && config.exists());

    let out = reset(root, &["--force"]);
    assert!(out.status.success(), "{}", text(&out));
    for gone in [
        "etc/systemd/system/edgecore.service",
        "etc/kubeedge/config",
        "etc/kubeedge/ca",
        "etc/kubeedge/certs",
        "etc/kubeedge/edgecore.db",
        "etc/kubeedge/edgecore.db-wal",
    ] {
        assert!(!root.join(gone).exists(), "{gone} is still there");
    }
    // What join did not create stays.
    for kept in [
        "etc/kubeedge/operator-notes.txt",
        "etc/systemd/system/other.service",
    ] {
        assert!(root.join(kept).exists(), "{kept} was removed");
    }

    // Reset again: nothing to go by, nothing removed.
    let out = reset(root, &["--force"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("removes nothing"), "{}", text(&out));
}

#[test]
fn join_service_keeps_an_existing_unit_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let unit_path = root.join("etc/systemd/system/edgecore.service");
    std::fs::create_dir_all(unit_path.parent().unwrap()).unwrap();
    std::fs::write(&unit_path, "[Unit]\nDescription=KubeEdge's own\n").unwrap();

    let out = join(root, &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--force"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&unit_path).unwrap(),
        "[Unit]\nDescription=KubeEdge's own\n"
    );
    assert!(
        !root.join("etc/kubeedge/config/edge.yaml").exists(),
        "nothing is written when the unit is refused"
    );

    let out = join(root, &["--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::read_to_string(&unit_path)
        .unwrap()
        .contains("Restart=always"));
}

#[test]
fn reset_without_a_join_manifest_removes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("etc/kubeedge/config/edge.yaml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(
        &config,
        "apiVersion: edgecore.config.kubeedge.io/v1alpha2\n",
    )
    .unwrap();
    let out = reset(dir.path(), &["--force"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("edgehive-join.yaml"), "{}", text(&out));
    assert!(config.exists(), "a config join did not write is kept");
}
