//! The string vocabularies of a beehive route: operations, resource types, groups and
//! module names.
//!
//! Each vocabulary is an enum of the values KubeEdge is known to put on the wire plus an
//! `Other(String)` catch-all. Peers run many KubeEdge versions and modules we do not model, so an
//! unknown value must survive a decode/encode round trip instead of failing the whole frame.
//!
//! ```
//! use edgehive_protocols::Operation;
//!
//! let op: Operation = "keepalive".into();
//! assert_eq!(op, Operation::Keepalive);
//! assert_eq!(op.to_string(), "keepalive");
//!
//! let odd = Operation::from("reboot");
//! assert!(!odd.is_known());
//! assert_eq!(odd.as_str(), "reboot");
//! ```

/// Generates a string-backed enum with an `Other(String)` fallback and all its conversions.
///
/// Each variant automatically gets a doc line naming its wire string; extra attributes written
/// before a variant are kept, so a variant that needs more explanation can have it.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $(
                #[doc = concat!("Wire value `\"", $wire, "\"`.")]
                $(#[$vmeta])*
                $variant,
            )+
            /// Any value not listed above, kept verbatim so it round-trips.
            ///
            /// Build values through `From`/`FromStr` rather than this variant directly: those
            /// map known strings to their named variant, so equality comparisons stay reliable.
            Other(String),
        }

        impl $name {
            /// The exact string used on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $wire, )+
                    Self::Other(value) => value,
                }
            }

            /// `false` only for [`Self::Other`], i.e. a value this crate does not list.
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Other(_))
            }

            fn from_known(value: &str) -> Option<Self> {
                match value {
                    $( $wire => Some(Self::$variant), )+
                    _ => None,
                }
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::from_known(value).unwrap_or_else(|| Self::Other(value.to_owned()))
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                // Reuse the caller's allocation for unknown values instead of copying.
                Self::from_known(&value).unwrap_or(Self::Other(value))
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::convert::Infallible;

            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Ok(Self::from(value))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct WireVisitor;

                impl serde::de::Visitor<'_> for WireVisitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a string")
                    }

                    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<$name, E> {
                        Ok($name::from(value))
                    }

                    fn visit_string<E: serde::de::Error>(self, value: String) -> Result<$name, E> {
                        Ok($name::from(value))
                    }
                }

                deserializer.deserialize_str(WireVisitor)
            }
        }
    };
}

string_enum! {
    /// `route.operation`: what the receiver should do with the message.
    Operation {
        Insert => "insert",
        Delete => "delete",
        Query => "query",
        Update => "update",
        Patch => "patch",
        Upload => "upload",
        /// Replies, including the edge's ACKs of downstream messages.
        Response => "response",
        /// Error replies; the cloud only logs these, they are not ACKs.
        Error => "error",
        UnholdUpgrade => "unhold-upgrade",
        /// The edge's heartbeat, sent every `heartbeat` seconds.
        Keepalive => "keepalive",
        /// Cloudhub-internal: a node's session started.
        Connected => "connected",
        /// Cloudhub-internal: a node's session ended.
        Disconnected => "disconnected",
        /// Edge-internal connection-state broadcast from edgehub.
        Connect => "connect",
        /// Device twin's `membership/detail` request.
        Get => "get",
        /// Metaserver replies.
        ApplicationResponse => "applicationResponse",
        CreateVolume => "createvolume",
        DeleteVolume => "deletevolume",
        ControllerPublishVolume => "controllerpublishvolume",
        ControllerUnpublishVolume => "controllerunpublishvolume",
        Prepull => "prepull",
        Upgrade => "upgrade",
        UpdateNodeActionStatus => "UpdateNodeActionStatus",
    }
}

string_enum! {
    /// The resource type token of a resource string (`{ns}/{type}/{name}` and friends).
    ///
    /// Some types contain a `/` (`k8s/ca.crt`, `membership/detail`, ...); they are single
    /// values all the same.
    ResourceType {
        Pod => "pod",
        Event => "event",
        ConfigMap => "configmap",
        ServiceAccountToken => "serviceaccounttoken",
        Secret => "secret",
        Node => "node",
        PodList => "podlist",
        PodStatus => "podstatus",
        PodPatch => "podpatch",
        NodeStatus => "nodestatus",
        NodePatch => "nodepatch",
        Rule => "rule",
        RuleEndpoint => "ruleendpoint",
        RuleStatus => "rulestatus",
        Lease => "lease",
        ServiceAccountAccess => "serviceaccountaccess",
        CertificateSigningRequest => "certificatesigningrequest",
        /// The cluster CA, answered by cloudhub itself.
        K8sCaCrt => "k8s/ca.crt",
        Service => "service",
        Endpoints => "endpoints",
        PersistentVolume => "persistentvolume",
        PersistentVolumeClaim => "persistentvolumeclaim",
        VolumeAttachment => "volumeattachment",
        /// CSI volume operations.
        Volume => "volume",
        Device => "device",
        DeviceModel => "devicemodel",
        DeviceMapper => "devicemapper",
        Membership => "membership",
        Twin => "twin",
        MembershipDetail => "membership/detail",
        TwinEdgeUpdated => "twin/edge_updated",
        TwinCloudUpdated => "twin/cloud_updated",
        StateUpdate => "state/update",
        /// Edge-internal connection-state broadcasts.
        NodeConnection => "node/connection",
    }
}

string_enum! {
    /// `route.group`: the beehive module group a message is addressed to.
    Group {
        /// Kubernetes and device objects, keepalives and ACKs.
        Resource => "resource",
        Func => "func",
        /// Device membership and twin messages.
        Twin => "twin",
        /// Router, eventbus and servicebus traffic.
        User => "user",
        TaskManager => "taskmanager",
        /// Edgehub's group.
        Hub => "hub",
        /// Metamanager's group.
        Meta => "meta",
        /// Eventbus and servicebus.
        Bus => "bus",
        Edged => "edged",
        EdgeStream => "edgestream",
        CloudHub => "cloudhub",
        EdgeController => "edgecontroller",
        DeviceController => "devicecontroller",
        SyncController => "synccontroller",
        /// The cloud's DynamicController, which a MetaServer's applications are sent to.
        DynamicController => "dynamiccontroller",
    }
}

string_enum! {
    /// `route.source`: the beehive module that built the message.
    ModuleName {
        CloudHub => "cloudhub",
        EdgeController => "edgecontroller",
        DeviceController => "devicecontroller",
        SyncController => "synccontroller",
        DynamicController => "dynamiccontroller",
        Router => "router",
        TaskManager => "taskmanager",
        /// Edgehub's beehive module name (it is registered as "websocket", not "edgehub").
        WebSocket => "websocket",
        /// Source of edgehub's edge-internal connection broadcasts.
        EdgeHub => "edgehub",
        MetaManager => "metamanager",
        /// Seen as the source of real edges' device ACKs.
        Meta => "meta",
        /// Devicetwin's module name.
        Twin => "twin",
        Edged => "edged",
        EventBus => "eventbus",
        ServiceBus => "servicebus",
        MetaServer => "metaserver",
        RouterEventBus => "router_eventbus",
        RouterServiceBus => "router_servicebus",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_map_to_variants() {
        assert_eq!(Operation::from("unhold-upgrade"), Operation::UnholdUpgrade);
        assert_eq!(
            Operation::from("UpdateNodeActionStatus".to_owned()),
            Operation::UpdateNodeActionStatus
        );
        assert_eq!(ResourceType::from("k8s/ca.crt"), ResourceType::K8sCaCrt);
        assert_eq!(Group::from("hub"), Group::Hub);
        assert_eq!(ModuleName::from("websocket"), ModuleName::WebSocket);
        assert_eq!(
            "router_servicebus".parse::<ModuleName>(),
            Ok(ModuleName::RouterServiceBus)
        );
    }

    #[test]
    fn wire_strings_are_case_sensitive() {
        let op = Operation::from("Insert");
        assert_eq!(op, Operation::Other("Insert".to_owned()));
        assert!(!op.is_known());
        assert_eq!(op.as_str(), "Insert");
    }

    #[test]
    fn serde_round_trips_known_and_unknown_values() {
        for text in [r#""cloudhub""#, r#""policycontroller""#, r#""""#] {
            let name: ModuleName = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&name).unwrap(), text);
        }
        assert_eq!(
            serde_json::from_str::<Group>(r#""edgestream""#).unwrap(),
            Group::EdgeStream
        );
    }

    #[test]
    fn non_string_json_is_rejected() {
        assert!(serde_json::from_str::<Operation>("5").is_err());
        assert!(serde_json::from_str::<Operation>("null").is_err());
    }

    #[test]
    fn display_matches_as_str() {
        assert_eq!(
            ResourceType::MembershipDetail.to_string(),
            "membership/detail"
        );
        assert_eq!(
            Operation::ApplicationResponse.to_string(),
            "applicationResponse"
        );
    }
}
