//! `edgehive token`: prints the join token from the cloud's CA files, without the cloud running.

use std::process::Command;
use std::time::SystemTime;

use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::token::{check_ca_hash, verify_jwt};

fn token(config: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_edgehive"))
        .args(["token", "--config", config.to_str().unwrap()])
        .output()
        .unwrap()
}

#[test]
fn token_is_printed_from_the_ca_files_and_verifies_against_them() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca/rootCA.crt");
    let key_file = dir.path().join("ca/rootCA.key");
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "modules:\n  cloudHub:\n    tlsCAFile: {}\n    tlsCAKeyFile: {}\n    tokenRefreshDuration: 1\n",
            ca_file.display(),
            key_file.display()
        ),
    )
    .unwrap();

    let missing = token(&config);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("cannot read the cloud CA"), "{stderr}");
    assert!(stderr.contains("rootCA.crt"), "{stderr}");

    // What the cloud writes on its first start.
    let (ca, created) = CertAuthority::load_or_create(&ca_file, &key_file).unwrap();
    assert!(created);
    let output = token(&config);
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8(output.stdout).unwrap();
    let printed = printed.trim();
    let jwt = check_ca_hash(printed, ca.cert_der()).unwrap();
    verify_jwt(jwt, ca.key_sec1_der(), SystemTime::now()).unwrap();
    // tokenRefreshDuration 1 h: valid for one to two hours from now.
    let later = SystemTime::now() + std::time::Duration::from_secs(2 * 3600 + 1);
    assert!(verify_jwt(jwt, ca.key_sec1_der(), later).is_err());
}
