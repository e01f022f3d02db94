//! Kubernetes `Status` objects for the stand-in's errors, and the refusals it counts.
//!
//! An answer of the cluster (404 NotFound, 409 AlreadyExists or Conflict, 422 Invalid) is the
//! API's ordinary answer and is not counted; a request the stand-in refuses before it reaches
//! the cluster (no or a wrong token, a path or method it does not serve, a bad or oversized
//! body, a parameter it cannot honour, too many watches) is a [`Refusal`], answered with a
//! `Status` and counted in `edgehive_standin_refused_total{reason}`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};

use crate::cloud::cloudhub::ReasonLabels;
use crate::cloud::cluster::ClusterError;
use crate::hive::Hive;

/// A `Status` of kind `details_kind` (the plural, as the API server names it) and `name`.
pub(super) fn status(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<(&str, &str)>,
) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": if code < 400 { "Success" } else { "Failure" },
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some((kind, name)) = details {
        status["details"] = json!({"name": name, "kind": kind});
    }
    status
}

/// The `Status` the API server answers `error` with, for object `name` of `plural`.
pub(super) fn cluster_status(error: &ClusterError, plural: &str, name: &str) -> (u16, Value) {
    let code = error.status();
    (
        code,
        status(code, error.reason(), &error.message(), Some((plural, name))),
    )
}

/// A request refused before the cluster saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    /// The HTTP status.
    pub(super) code: u16,
    /// Kubernetes' `reason` (`Unauthorized`, `NotFound`, `BadRequest`, ...).
    pub(super) reason: &'static str,
    /// The metric's `reason` label.
    pub(super) label: &'static str,
    /// What was wrong, for the client.
    pub(super) message: String,
}

impl Refusal {
    pub(super) fn new(
        code: u16,
        reason: &'static str,
        label: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Refusal {
            code,
            reason,
            label,
            message: message.into(),
        }
    }

    /// 400 BadRequest, counted under `label`.
    pub(super) fn bad(label: &'static str, message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", label, message)
    }

    /// A parameter or form the stand-in does not serve (400, `unsupported`).
    pub(super) fn unsupported(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", "unsupported", message)
    }

    pub(super) fn to_status(&self) -> Value {
        status(self.code, self.reason, &self.message, None)
    }
}

/// The stand-in's counters, in the process's registry.
#[derive(Debug, Clone, Default)]
pub(super) struct StandinMetrics {
    refused: Family<ReasonLabels, Counter>,
    requests: Family<VerbLabels, Counter>,
}

/// Label set of the stand-in's request counter: the HTTP method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VerbLabels {
    verb: String,
}

impl StandinMetrics {
    pub(super) fn register(hive: &Hive) -> Self {
        let metrics = StandinMetrics::default();
        hive.metrics().register(
            "edgehive_standin_refused",
            "Requests the stand-in API server refused before they reached the cluster, by \
             reason (token, path, method, body, too_large, media_type, unsupported, \
             resource_version, watches)",
            metrics.refused.clone(),
        );
        hive.metrics().register(
            "edgehive_standin_requests",
            "Requests the stand-in API server received, by HTTP method (writes: POST, PUT, \
             PATCH, DELETE), refused ones included",
            metrics.requests.clone(),
        );
        metrics
    }

    pub(super) fn request(&self, verb: &str) {
        self.requests
            .get_or_create(&VerbLabels {
                verb: verb.to_owned(),
            })
            .inc();
    }

    pub(super) fn refused(&self, refusal: &Refusal) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: refusal.label.to_owned(),
            })
            .inc();
    }
}
