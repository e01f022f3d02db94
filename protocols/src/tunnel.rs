//! KubeEdge's stream tunnel (EdgeStream ↔ CloudStream): one WebSocket per node at
//! [`TUNNEL_PATH`], each TEXT frame one message `uvarint(connectID) uvarint(type) data`
//! (`data` is arbitrary bytes: SPDY frames travel in DATA messages, so a receiver must not check
//! UTF-8 on these text frames). The `*_CONNECT` messages carry a [`ConnectRequest`] in Go's JSON.
//!
//! ```
//! use edgehive_protocols::tunnel::{decode_tunnel, encode_tunnel, TunnelType};
//!
//! let frame = encode_tunnel(300, TunnelType::Data, b"line\n");
//! assert_eq!(frame, b"\xac\x02\x03line\n");
//! let decoded = decode_tunnel(&frame).unwrap();
//! assert_eq!((decoded.connect_id, decoded.kind, decoded.data), (300, TunnelType::Data, &b"line\n"[..]));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The tunnel server's WebSocket path.
pub const TUNNEL_PATH: &str = "/v1/kubeedge/connect";
/// The header in which edgecore names its node (Go writes it `Sessionhostnameoverride`).
pub const SESSION_HOST_HEADER: &str = "SessionHostNameOverride";
/// The header in which edgecore names the node's internal IP.
pub const SESSION_IP_HEADER: &str = "SessionInternalIP";
/// The largest `data` [`decode_tunnel`] accepts (edgecore sends at most 256 bytes of logs per
/// DATA message; exec/attach SPDY frames are a few KiB).
pub const DEFAULT_MAX_TUNNEL_DATA: usize = 1024 * 1024;
/// The longest uvarint (a u64 in 7-bit groups).
const MAX_VARINT_LEN: usize = 10;

/// The message types, numbered as KubeEdge numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TunnelType {
    /// 0: open a `kubectl logs` stream (data: a [`ConnectRequest`]).
    LogsConnect,
    /// 1: open an exec stream.
    ExecConnect,
    /// 2: open a metrics/stats request.
    MetricConnect,
    /// 3: bytes of an open stream, either way.
    Data,
    /// 4: the stream ended (either side; duplicates and unknown IDs occur and are harmless).
    RemoveConnect,
    /// 5: the cloud closes the session (connectID 0, data a reason).
    CloseConnect,
    /// 6: open an attach stream.
    AttachConnect,
}

impl TunnelType {
    const ALL: [TunnelType; 7] = [
        TunnelType::LogsConnect,
        TunnelType::ExecConnect,
        TunnelType::MetricConnect,
        TunnelType::Data,
        TunnelType::RemoveConnect,
        TunnelType::CloseConnect,
        TunnelType::AttachConnect,
    ];

    /// The number on the wire.
    pub fn code(self) -> u64 {
        match self {
            TunnelType::LogsConnect => 0,
            TunnelType::ExecConnect => 1,
            TunnelType::MetricConnect => 2,
            TunnelType::Data => 3,
            TunnelType::RemoveConnect => 4,
            TunnelType::CloseConnect => 5,
            TunnelType::AttachConnect => 6,
        }
    }

    /// The type a wire number names, if any.
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.code() == code)
    }

    /// KubeEdge's name for it (`LOGS_CONNECT`, `DATA`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TunnelType::LogsConnect => "LOGS_CONNECT",
            TunnelType::ExecConnect => "EXEC_CONNECT",
            TunnelType::MetricConnect => "METRIC_CONNECT",
            TunnelType::Data => "DATA",
            TunnelType::RemoveConnect => "REMOVE_CONNECT",
            TunnelType::CloseConnect => "CLOSE_CONNECT",
            TunnelType::AttachConnect => "ATTACH_CONNECT",
        }
    }

    /// Whether it opens a stream (its data is a [`ConnectRequest`]).
    pub fn is_connect(self) -> bool {
        matches!(
            self,
            TunnelType::LogsConnect
                | TunnelType::ExecConnect
                | TunnelType::MetricConnect
                | TunnelType::AttachConnect
        )
    }
}

/// One decoded tunnel message; `data` borrows from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelFrame<'a> {
    /// The stream it belongs to (the stream server numbers them; 0 for CLOSE_CONNECT).
    pub connect_id: u64,
    /// What it is.
    pub kind: TunnelType,
    /// Its payload.
    pub data: &'a [u8],
}

impl TunnelFrame<'_> {
    /// The frame's bytes (what [`encode_tunnel`] gives).
    pub fn encode(&self) -> Vec<u8> {
        encode_tunnel(self.connect_id, self.kind, self.data)
    }
}

/// Which uvarint of the header a [`TunnelError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarintField {
    /// The first one.
    ConnectId,
    /// The second one.
    MessageType,
}

impl std::fmt::Display for VarintField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VarintField::ConnectId => "connectID",
            VarintField::MessageType => "message type",
        })
    }
}

/// Why a frame is not a tunnel message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TunnelError {
    /// The frame ends inside a uvarint (or is empty).
    #[error("tunnel frame ends inside its {0}")]
    Truncated(VarintField),
    /// A uvarint longer than a u64.
    #[error("tunnel frame's {0} overflows 64 bits")]
    Overflow(VarintField),
    /// A uvarint with a redundant trailing zero group (Go never writes one; refused so a frame
    /// means one thing and re-encodes to itself).
    #[error("tunnel frame's {0} is not minimally encoded")]
    NonMinimal(VarintField),
    /// A message type KubeEdge does not define.
    #[error("unknown tunnel message type {0}")]
    UnknownType(u64),
    /// More data than the limit; nothing was kept.
    #[error("tunnel message data of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Data length in bytes.
        len: usize,
        /// The limit in force.
        max: usize,
    },
}

impl TunnelError {
    /// A short label for metrics (`reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            TunnelError::Truncated(_) => "truncated",
            TunnelError::Overflow(_) => "varint_overflow",
            TunnelError::NonMinimal(_) => "varint_not_minimal",
            TunnelError::UnknownType(_) => "unknown_type",
            TunnelError::TooLarge { .. } => "too_large",
        }
    }
}

/// Decodes one tunnel message with [`DEFAULT_MAX_TUNNEL_DATA`].
pub fn decode_tunnel(frame: &[u8]) -> Result<TunnelFrame<'_>, TunnelError> {
    decode_tunnel_with_limit(frame, DEFAULT_MAX_TUNNEL_DATA)
}

/// Decodes one tunnel message whose data may be at most `max_data` bytes.
pub fn decode_tunnel_with_limit(
    frame: &[u8],
    max_data: usize,
) -> Result<TunnelFrame<'_>, TunnelError> {
    let (connect_id, used) = read_uvarint(frame, VarintField::ConnectId)?;
    let rest = frame.get(used..).unwrap_or_default();
    let (code, used) = read_uvarint(rest, VarintField::MessageType)?;
    let data = rest.get(used..).unwrap_or_default();
    let kind = TunnelType::from_code(code).ok_or(TunnelError::UnknownType(code))?;
    if data.len() > max_data {
        return Err(TunnelError::TooLarge {
            len: data.len(),
            max: max_data,
        });
    }
    Ok(TunnelFrame {
        connect_id,
        kind,
        data,
    })
}

/// Encodes one tunnel message as edgecore and cloudcore do.
pub fn encode_tunnel(connect_id: u64, kind: TunnelType, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * MAX_VARINT_LEN + data.len());
    write_uvarint(&mut out, connect_id);
    write_uvarint(&mut out, kind.code());
    out.extend_from_slice(data);
    out
}

fn write_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // Truncation intended: the low 7 bits with the continuation bit.
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_uvarint(buf: &[u8], field: VarintField) -> Result<(u64, usize), TunnelError> {
    let mut value: u64 = 0;
    for (index, &byte) in buf.iter().enumerate().take(MAX_VARINT_LEN) {
        // The tenth group holds only the 64th bit.
        if index == MAX_VARINT_LEN - 1 && byte > 1 {
            return Err(TunnelError::Overflow(field));
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte < 0x80 {
            if byte == 0 && index > 0 {
                return Err(TunnelError::NonMinimal(field));
            }
            return Ok((value, index + 1));
        }
    }
    if buf.len() >= MAX_VARINT_LEN {
        Err(TunnelError::Overflow(field))
    } else {
        Err(TunnelError::Truncated(field))
    }
}

/// Go's `url.URL` as `encoding/json` writes it (field names and order are Go's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct GoUrl {
    pub scheme: String,
    pub opaque: String,
    /// `*url.Userinfo`; always `null` here.
    pub user: Option<serde_json::Value>,
    pub host: String,
    pub path: String,
    pub raw_path: String,
    pub omit_host: bool,
    pub force_query: bool,
    pub raw_query: String,
    pub fragment: String,
    pub raw_fragment: String,
}

/// The data of a `*_CONNECT` message: the request the edge replays to its kubelet API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectRequest {
    /// The connectID again.
    #[serde(rename = "MessID")]
    pub mess_id: u64,
    /// Where the edge sends it (`http://127.0.0.1:10350/containerLogs/...`).
    pub url: GoUrl,
    /// The API server's request headers (Go's `http.Header`; keys sorted, as Go writes maps).
    pub header: BTreeMap<String, Vec<String>>,
    /// `POST` for exec and attach; absent for logs and metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// Why a `*_CONNECT` data is not a [`ConnectRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("connect request is not valid: {0}")]
pub struct ConnectError(String);

impl ConnectRequest {
    /// The JSON bytes, as Go's `json.Marshal` writes them (HTML-safe escapes, no newline).
    pub fn to_json(&self) -> Vec<u8> {
        crate::codec::go_json(self)
    }

    /// Parses a `*_CONNECT` data.
    pub fn from_json(data: &[u8]) -> Result<Self, ConnectError> {
        serde_json::from_slice(data).map_err(|err| ConnectError(err.to_string()))
    }

    /// Each header value of the API server's request, as `(name, value)`, in Go's order
    /// (names sorted, values as sent).
    pub fn header_values(&self) -> impl Iterator<Item = (&str, &str)> {
        self.header.iter().flat_map(|(name, values)| {
            values
                .iter()
                .map(move |value| (name.as_str(), value.as_str()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_at_the_edges() {
        for value in [0, 1, 127, 128, 300, 16_383, 16_384, u64::MAX / 2, u64::MAX] {
            let frame = encode_tunnel(value, TunnelType::RemoveConnect, b"");
            let decoded = decode_tunnel(&frame).unwrap();
            assert_eq!(decoded.connect_id, value);
            assert_eq!(decoded.kind, TunnelType::RemoveConnect);
            assert!(decoded.data.is_empty());
        }
    }

    #[test]
    fn malformed_frames_get_clear_errors() {
        use TunnelError::*;
        use VarintField::*;
        assert_eq!(decode_tunnel(b""), Err(Truncated(ConnectId)));
        assert_eq!(decode_tunnel(b"\x80"), Err(Truncated(ConnectId)));
        assert_eq!(decode_tunnel(b"\x01"), Err(Truncated(MessageType)));
        assert_eq!(decode_tunnel(b"\x01\x07"), Err(UnknownType(7)));
        assert_eq!(decode_tunnel(b"\x80\x00\x03"), Err(NonMinimal(ConnectId)));
        assert_eq!(decode_tunnel(b"\x01\x83\x00"), Err(NonMinimal(MessageType)));
        assert_eq!(decode_tunnel(&[0xff; 10]), Err(Overflow(ConnectId)));
        assert_eq!(decode_tunnel(&[0xff; 11]), Err(Overflow(ConnectId)));
        let mut max = vec![0xff; 9];
        max.push(0x01);
        max.push(0x03);
        assert_eq!(decode_tunnel(&max).unwrap().connect_id, u64::MAX);
        assert_eq!(
            decode_tunnel_with_limit(b"\x01\x03abc", 2),
            Err(TooLarge { len: 3, max: 2 })
        );
        assert_eq!(
            decode_tunnel(b"\x01\x07").unwrap_err().reason(),
            "unknown_type"
        );
    }

    #[test]
    fn connect_request_json_is_gos() {
        let mut header = BTreeMap::new();
        header.insert(
            "User-Agent".to_owned(),
            vec!["Go-http-client/1.1".to_owned()],
        );
        let request = ConnectRequest {
            mess_id: 2,
            url: GoUrl {
                scheme: "http".into(),
                host: "127.0.0.1:10350".into(),
                path: "/containerLogs/default/printer/main".into(),
                raw_query: "tailLines=2&timestamps=true".into(),
                ..GoUrl::default()
            },
            header,
            method: None,
        };
        assert_eq!(
            String::from_utf8(request.to_json()).unwrap(),
            concat!(
                r#"{"MessID":2,"url":{"Scheme":"http","Opaque":"","User":null,"Host":"127.0.0.1:10350","#,
                r#""Path":"/containerLogs/default/printer/main","RawPath":"","OmitHost":false,"ForceQuery":false,"#,
                r#""RawQuery":"tailLines=2\u0026timestamps=true","Fragment":"","RawFragment":""},"#,
                r#""header":{"User-Agent":["Go-http-client/1.1"]}}"#
            )
        );
    }
}
