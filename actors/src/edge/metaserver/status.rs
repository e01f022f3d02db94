//! Kubernetes `Status` answers: what MetaServer says when it cannot give an object.

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde_json::{json, Map, Value};

/// A failed request: the HTTP code and the `Status` body, and the refusal reason it is
/// counted under (none for an ordinary 404).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Failure {
    pub(super) code: u16,
    pub(super) body: Value,
    pub(super) refusal: Option<&'static str>,
}

/// A `Status` with `details` (`{"name":…,"kind":…}`) when given, in the API server's field
/// order.
pub(super) fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut body = Map::new();
    body.insert("kind".into(), json!("Status"));
    body.insert("apiVersion".into(), json!("v1"));
    body.insert("metadata".into(), json!({}));
    body.insert("status".into(), json!("Failure"));
    body.insert("message".into(), json!(message));
    body.insert("reason".into(), json!(reason));
    if let Some(details) = details {
        body.insert("details".into(), details);
    }
    body.insert("code".into(), json!(code));
    Value::Object(body)
}

impl Failure {
    /// `code`/`reason` with `message`, counted as `refusal`.
    pub(super) fn refused(code: u16, reason: &str, refusal: &'static str, message: &str) -> Self {
        Failure {
            code,
            body: status(code, reason, message, None),
            refusal: Some(refusal),
        }
    }

    /// 404 for the object `name` of `plural`, as the API server says it.
    pub(super) fn not_found(plural: &str, name: &str) -> Self {
        Failure {
            code: 404,
            body: status(
                404,
                "NotFound",
                &format!("{plural} {name:?} not found"),
                Some(json!({"name": name, "kind": plural})),
            ),
            refusal: None,
        }
    }

    /// 404 for a path MetaServer does not serve.
    pub(super) fn no_such_path() -> Self {
        Failure {
            code: 404,
            body: status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            ),
            refusal: None,
        }
    }

    /// 403 for a resource this edge does not serve to local clients, counted as `refusal`.
    pub(super) fn forbidden(refusal: &'static str, plural: &str, message: &str) -> Self {
        Failure {
            code: 403,
            body: status(403, "Forbidden", message, Some(json!({"kind": plural}))),
            refusal: Some(refusal),
        }
    }

    /// 400 BadRequest, counted as `refusal`.
    pub(super) fn bad_request(refusal: &'static str, message: &str) -> Self {
        Self::refused(400, "BadRequest", refusal, message)
    }

    /// 410 Gone: the resourceVersion is older than the history MetaServer keeps.
    pub(super) fn expired(message: &str) -> Self {
        Self::refused(410, "Expired", "expired", message)
    }

    /// 500 for the store failing.
    pub(super) fn internal(message: &str) -> Self {
        Failure {
            code: 500,
            body: status(500, "InternalError", message, None),
            refusal: None,
        }
    }

    /// The HTTP answer.
    pub(super) fn response(&self) -> HttpResponse {
        json_response(self.code, &self.body)
    }
}

/// `body` as JSON with `code`.
pub(super) fn json_response(code: u16, body: &Value) -> HttpResponse {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(code)
        .content_type("application/json")
        .body(body.to_string())
}
