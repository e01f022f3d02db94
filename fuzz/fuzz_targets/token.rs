//! Join and bearer tokens as the certificate server reads them (`identity::token`): the
//! `Authorization: Bearer` header of `/edge.crt`, and the join token an edge is given.
//! A token that verifies under one key fails under another.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use edgehive_actors::identity::token::{check_ca_hash, verify_jwt};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

/// The key the seeds are signed with (`fuzz/seeds.py`).
const KEY: &[u8] = b"edgehive fuzz key";
/// The "CA certificate" the seeds' join tokens hash.
const CA_DER: &[u8] = b"edgehive fuzz ca";

fuzz_target!(|data: &[u8]| {
    // Header values reach the verifier as text.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    if verify_jwt(text, KEY, now).is_ok() {
        assert!(verify_jwt(text, b"another key", now).is_err());
    }
    if let Ok(jwt) = check_ca_hash(text, CA_DER) {
        if verify_jwt(jwt, KEY, now).is_ok() {
            assert!(verify_jwt(jwt, b"another key", now).is_err());
        }
    }
});
