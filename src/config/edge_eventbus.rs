//! `modules.eventBus`: KubeEdge's keys (`enable`, `mqttMode`, `mqttServerExternal`, `mqttQOS`,
//! `mqttRetain`, `mqttSessionQueueSize`, `mqttUsername`, `mqttPassword`, `mqttSubClientID`,
//! `eventBusTLS`); `mqttServerInternal` and `mqttPubClientID` are accepted and ignored (no
//! internal broker; one client). Only the external broker mode (`mqttMode: 2`) is built: 0
//! (internal) and 1 (both) are refused at start.

use std::path::PathBuf;

use edgehive_actors::edge::eventbus::{EventBusOptions, EventBusTls};
use serde::{Deserialize, Serialize};

use super::{within, EdgeConfig, Refusal};

/// `modules.eventBus`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EventBusConfig {
    /// Whether EventBus runs (as in KubeEdge, on by default; without a broker it retries
    /// with backoff and nothing else waits for it).
    pub enable: bool,
    /// KubeEdge's 0 internal, 1 both, 2 external broker; only 2 is built.
    pub mqtt_mode: u8,
    /// The node's broker: `tcp://host:port` (also `ssl://` or `tls://` with `eventBusTLS`).
    pub mqtt_server_external: String,
    /// QoS of what EventBus publishes and subscribes: 0, 1 or 2.
    #[serde(rename = "mqttQOS")]
    pub mqtt_qos: u8,
    /// The retain flag of what EventBus publishes.
    pub mqtt_retain: bool,
    /// Messages waiting to be published (and device messages waiting to be handled), at most.
    pub mqtt_session_queue_size: usize,
    /// The broker's user name, if it asks for one.
    pub mqtt_username: String,
    /// The broker's password.
    pub mqtt_password: String,
    /// The MQTT client id; empty: `edgehive-eventbus-{node}`.
    #[serde(rename = "mqttSubClientID")]
    pub mqtt_sub_client_id: String,
    /// TLS to the broker.
    #[serde(rename = "eventBusTLS")]
    pub event_bus_tls: EventBusTlsConfig,
}

/// `modules.eventBus.eventBusTLS`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EventBusTlsConfig {
    /// Whether the broker is reached over TLS.
    pub enable: bool,
    /// The CA (PEM) the broker's certificate must chain to.
    #[serde(rename = "tlsMqttCAFile")]
    pub tls_mqtt_ca_file: PathBuf,
    /// The client certificate (PEM); empty: none.
    pub tls_mqtt_cert_file: PathBuf,
    /// The client certificate's P-256 key (PEM); empty: none.
    pub tls_mqtt_private_key_file: PathBuf,
}

impl Default for EventBusConfig {
    fn default() -> Self {
        EventBusConfig {
            enable: true,
            mqtt_mode: 2,
            mqtt_server_external: "tcp://127.0.0.1:1883".into(),
            mqtt_qos: 0,
            mqtt_retain: false,
            mqtt_session_queue_size: 100,
            mqtt_username: String::new(),
            mqtt_password: String::new(),
            mqtt_sub_client_id: String::new(),
            event_bus_tls: EventBusTlsConfig::default(),
        }
    }
}

impl Default for EventBusTlsConfig {
    fn default() -> Self {
        EventBusTlsConfig {
            enable: false,
            tls_mqtt_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_mqtt_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_mqtt_private_key_file: "/etc/kubeedge/certs/server.key".into(),
        }
    }
}

impl EventBusConfig {
    /// The broker's host and port.
    fn broker(&self) -> Option<(String, u16)> {
        let rest = ["tcp", "ssl", "tls", "mqtt", "mqtts"]
            .iter()
            .find_map(|scheme| {
                self.mqtt_server_external
                    .strip_prefix(scheme)?
                    .strip_prefix("://")
            })?;
        let (host, port) = rest.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port.parse().ok()?;
        (!host.is_empty() && port != 0 && !host.contains('/')).then(|| (host.to_owned(), port))
    }

    pub(super) fn validate(&self) -> Result<(), Refusal> {
        if !self.enable {
            return Ok(());
        }
        if self.mqtt_mode != 2 {
            return Err((
                "modules.eventBus.mqttMode",
                format!(
                    "expected 2 (an external broker, mqttServerExternal), found {}: edgehive has no internal MQTT broker (modes 0 and 1); run mosquitto on the node or set modules.eventBus.enable: false",
                    self.mqtt_mode
                ),
            ));
        }
        if self.broker().is_none() {
            return Err((
                "modules.eventBus.mqttServerExternal",
                format!(
                    "expected tcp://host:port (or ssl://host:port), found {:?}",
                    self.mqtt_server_external
                ),
            ));
        }
        within(
            "modules.eventBus.mqttQOS",
            u64::from(self.mqtt_qos),
            0..=2,
            "",
        )?;
        within(
            "modules.eventBus.mqttSessionQueueSize",
            self.mqtt_session_queue_size as u64,
            1..=100_000,
            "messages",
        )?;
        if self.event_bus_tls.enable && self.event_bus_tls.tls_mqtt_ca_file.as_os_str().is_empty() {
            return Err((
                "modules.eventBus.eventBusTLS.tlsMqttCAFile",
                "expected a file path".into(),
            ));
        }
        Ok(())
    }
}

impl EdgeConfig {
    /// EventBus's options (`modules.eventBus`); `None` when it is off.
    pub fn event_bus_options(&self) -> Option<EventBusOptions> {
        let bus = &self.modules.event_bus;
        if !bus.enable {
            return None;
        }
        let (host, port) = bus.broker()?;
        let client_id = if bus.mqtt_sub_client_id.is_empty() {
            format!("edgehive-eventbus-{}", self.node_name())
        } else {
            bus.mqtt_sub_client_id.clone()
        };
        let tls = &bus.event_bus_tls;
        let optional = |path: &PathBuf| (!path.as_os_str().is_empty()).then(|| path.clone());
        Some(EventBusOptions {
            host,
            port,
            qos: bus.mqtt_qos,
            retain: bus.mqtt_retain,
            queue_size: bus.mqtt_session_queue_size,
            client_id,
            credentials: (!bus.mqtt_username.is_empty())
                .then(|| (bus.mqtt_username.clone(), bus.mqtt_password.clone())),
            tls: tls.enable.then(|| EventBusTls {
                ca_file: tls.tls_mqtt_ca_file.clone(),
                cert_file: optional(&tls.tls_mqtt_cert_file),
                key_file: optional(&tls.tls_mqtt_private_key_file),
            }),
        })
    }
}
