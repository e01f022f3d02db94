//! Join tokens in KubeEdge's format: `{sha256 hex of the CA DER}.{JWT}`.
//!
//! The JWT is HS256 keyed with the CA private key's SEC1 DER and carries only `exp`. An edge
//! checks the hash part against the CA it downloads and sends only the JWT as its bearer token.
//!
//! KubeEdge stores a token made at `now + 2 × refresh` in a Secret and remakes it every
//! `refresh`. edgehive has no Secret store, so the token is a pure function of the CA files
//! and the clock: the expiry is aligned to the `refresh` grid
//! (`exp = floor(now / refresh) · refresh + 2 · refresh`), which gives the same rotation (a new
//! token every `refresh`, each valid between `refresh` and `2 × refresh` from when it was
//! issued) and lets `edgehive token` print the current token without the running process.
//! Validation is KubeEdge's: a valid signature and an `exp` in the future.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::hmac;
use serde_json::Value;

use super::certs::CertAuthority;

/// JOSE header of KubeEdge's tokens (golang-jwt's field order).
const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// Why a token was refused (the text goes back to the edge in the 401 body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts with a JSON header and claims.
    #[error("token is malformed: {0}")]
    Malformed(String),
    /// Signed with another key or another algorithm.
    #[error("token signature is invalid")]
    BadSignature,
    /// `exp` is in the past (or missing).
    #[error("token is expired")]
    Expired,
    /// A join token's CA hash part does not match the CA.
    #[error("the CA hash in the token does not match the cloud's CA certificate")]
    CaMismatch,
}

/// The current join token of `ca` at `now`, for tokens rotated every `refresh`.
pub fn join_token(ca: &CertAuthority, now: SystemTime, refresh: Duration) -> String {
    format!(
        "{}.{}",
        ca.hash_hex(),
        jwt(ca.key_sec1_der(), expiry(now, refresh))
    )
}

/// Unix seconds of the expiry of the token current at `now`.
pub(crate) fn expiry(now: SystemTime, refresh: Duration) -> u64 {
    let now = unix(now);
    let step = refresh.as_secs().max(1);
    now / step * step + 2 * step
}

/// An HS256 JWT with claims `{"exp": exp}` keyed with `key`.
pub fn jwt(key: &[u8], exp: u64) -> String {
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(HEADER),
        URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{exp}}}"#))
    );
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        signing_input.as_bytes(),
    );
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// Checks a bearer JWT: HS256 signed with `key` and not expired at `now`.
pub fn verify_jwt(token: &str, key: &[u8], now: SystemTime) -> Result<(), TokenError> {
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed(
            "token contains an invalid number of segments".into(),
        ));
    };
    let json = |part: &str, what: &str| -> Result<Value, TokenError> {
        let bytes = URL_SAFE_NO_PAD
            .decode(part.trim_end_matches('='))
            .map_err(|error| {
                TokenError::Malformed(format!("could not base64 decode {what}: {error}"))
            })?;
        serde_json::from_slice(&bytes).map_err(|error| {
            TokenError::Malformed(format!("could not JSON decode {what}: {error}"))
        })
    };
    let header_json = json(header, "header")?;
    if header_json["alg"] != "HS256" {
        return Err(TokenError::BadSignature);
    }
    let claims_json = json(claims, "claims")?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature.trim_end_matches('='))
        .map_err(|_| TokenError::BadSignature)?;
    let signing_input = &token[..header.len() + 1 + claims.len()];
    hmac::verify(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        signing_input.as_bytes(),
        &signature,
    )
    .map_err(|_| TokenError::BadSignature)?;
    let exp = claims_json["exp"]
        .as_u64()
        .or_else(|| claims_json["exp"].as_f64().map(|f| f as u64));
    match exp {
        Some(exp) if exp > unix(now) => Ok(()),
        _ => Err(TokenError::Expired),
    }
}

/// Splits a join token into the CA hash and the JWT, checking the hash against `ca_der` as
/// an edge does before it trusts the CA it downloaded.
pub fn check_ca_hash<'t>(token: &'t str, ca_der: &[u8]) -> Result<&'t str, TokenError> {
    let (hash, jwt) = token
        .split_once('.')
        .ok_or_else(|| TokenError::Malformed("expected {ca hash}.{jwt}".into()))?;
    if jwt.split('.').count() != 3 {
        return Err(TokenError::Malformed("expected {ca hash}.{jwt}".into()));
    }
    if !hash.eq_ignore_ascii_case(&super::certs::sha256_hex(ca_der)) {
        return Err(TokenError::CaMismatch);
    }
    Ok(jwt)
}

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn token_is_kubeedge_shaped_and_verifies() {
        let ca = CertAuthority::generate().unwrap();
        let now = SystemTime::now();
        let token = join_token(&ca, now, 12 * HOUR);
        assert_eq!(token.split('.').count(), 4);
        let jwt = check_ca_hash(&token, ca.cert_der()).unwrap();
        verify_jwt(jwt, ca.key_sec1_der(), now).unwrap();
        let header = jwt.split('.').next().unwrap();
        assert_eq!(URL_SAFE_NO_PAD.decode(header).unwrap(), HEADER.as_bytes());
        // Valid between one and two refresh periods.
        let exp = expiry(now, 12 * HOUR);
        let now_s = unix(now);
        assert!(exp > now_s + 12 * 3600 - 1 && exp <= now_s + 24 * 3600);
        assert!(verify_jwt(jwt, ca.key_sec1_der(), now + 25 * HOUR) == Err(TokenError::Expired));
    }

    #[test]
    fn same_window_gives_the_same_token() {
        let ca = CertAuthority::generate().unwrap();
        let start = UNIX_EPOCH + Duration::from_secs(1_000 * 3600);
        assert_eq!(
            join_token(&ca, start, HOUR),
            join_token(&ca, start + Duration::from_secs(1800), HOUR)
        );
        assert_ne!(
            join_token(&ca, start, HOUR),
            join_token(&ca, start + HOUR, HOUR)
        );
    }

    #[test]
    fn other_key_or_garbage_is_refused() {
        let ca = CertAuthority::generate().unwrap();
        let other = CertAuthority::generate().unwrap();
        let now = SystemTime::now();
        let token = join_token(&other, now, HOUR);
        let jwt = token.split_once('.').unwrap().1;
        assert_eq!(
            verify_jwt(jwt, ca.key_sec1_der(), now),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            check_ca_hash(&token, ca.cert_der()),
            Err(TokenError::CaMismatch)
        );
        assert!(matches!(
            verify_jwt("bad.token.x", ca.key_sec1_der(), now),
            Err(TokenError::Malformed(_))
        ));
    }
}
