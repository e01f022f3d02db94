//! The certificate server's `/edge.crt` body: a DER certificate signing request, signed by
//! the CA when it is valid for the node (`CertAuthority::sign_node_csr`, what
//! `cloudhub::certserver` calls). Input: `{NodeName header}\n{CSR DER}` (no newline: the
//! node `edge-2`). A certificate it issues names that node and no other.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use edgehive_actors::identity::certs::{node_of_cert, CertAuthority};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

static CA: OnceLock<CertAuthority> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let (node, csr) = match data.iter().position(|&byte| byte == b'\n') {
        Some(at) => (String::from_utf8_lossy(&data[..at]), &data[at + 1..]),
        None => ("edge-2".into(), data),
    };
    let ca = CA.get_or_init(|| match CertAuthority::generate() {
        Ok(ca) => ca,
        Err(error) => panic!("cannot make the fuzz CA: {error}"),
    });
    if let Ok(cert) = ca.sign_node_csr(csr, &node, Duration::from_secs(365 * 24 * 3600)) {
        assert_eq!(node_of_cert(&cert).as_deref(), Some(&*node));
    }
});
