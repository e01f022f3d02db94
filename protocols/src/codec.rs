//! The WebSocket frame codec: one [`Message`] per TEXT frame, encoded exactly as Go's
//! `encoding/json` via gorilla's `WriteJSON` does it.
//!
//! ```
//! use edgehive_protocols::{decode, encode, Message};
//!
//! let ping = Message::keepalive();
//! let frame = encode(&ping);
//! assert!(frame.ends_with("}\n"));
//! assert_eq!(decode(frame.as_bytes()), Ok(ping));
//! ```

use std::io;

use serde::de::IgnoredAny;
use serde::Serialize;
use serde_json::error::Category;
use serde_json::ser::Formatter;
use thiserror::Error;

use crate::message::Message;

/// The largest frame [`decode`] accepts.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Why a frame could not be turned into a [`Message`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The frame is longer than the limit; it was not parsed.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Frame length in bytes.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// The frame is empty or not valid JSON.
    #[error("frame is not JSON: {0}")]
    NotJson(String),
    /// The frame is JSON but not a beehive message (no header or msg_id, wrong field types).
    #[error("frame is not a message: {0}")]
    Invalid(String),
    /// The frame holds more than one message, or something after its message: a frame is
    /// one message (what follows would otherwise be dropped unseen).
    #[error("frame has {0} bytes after its message")]
    TrailingData(usize),
}

/// Encodes a message as one WebSocket TEXT payload, byte-compatible with Go.
///
/// The output is compact JSON in struct field order, with Go's HTML-safe escaping of `<`, `>`,
/// `&`, U+2028 and U+2029, Go's float formatting, and the trailing newline Go's `json.Encoder`
/// writes.
///
/// ```
/// use edgehive_protocols::{encode, Message};
///
/// let mut msg = Message::keepalive();
/// msg.header.id = "id-1".into();
/// msg.header.timestamp = 1700000000000;
/// msg.content = serde_json::json!("<a&b>");
/// assert_eq!(
///     encode(&msg),
///     concat!(
///         r#"{"header":{"msg_id":"id-1","timestamp":1700000000000},"#,
///         r#""route":{"source":"websocket","group":"resource","operation":"keepalive","resource":"node"},"#,
///         r#""content":"\u003ca\u0026b\u003e"}"#,
///         "\n"
///     )
/// );
/// ```
pub fn encode(message: &Message) -> String {
    let mut out = Vec::with_capacity(256);
    if let Err(err) = write_frame(message, &mut out) {
        // Unreachable: the writer is a Vec and every map key in a Message is a string, which
        // are serde_json's only failure sources. Sending nothing beats sending half a frame.
        debug_assert!(false, "encoding a Message failed: {err}");
        out.clear();
    }
    // serde_json only emits UTF-8 and every escape we add is ASCII, so this never loses data.
    String::from_utf8(out)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

/// Decodes a frame with the [`DEFAULT_MAX_FRAME_BYTES`] limit.
///
/// One JSON value per frame, as KubeEdge writes them: surrounding whitespace (Go's trailing
/// newline) is ignored; anything else after the value (a second message, garbage) refuses
/// the frame, so nothing in it is dropped unseen.
///
/// ```
/// use edgehive_protocols::{decode, DecodeError, Operation};
///
/// let frame = br#"{"header":{"msg_id":"m1","timestamp":5},"route":{"operation":"insert"},"content":null}
/// "#;
/// let msg = decode(frame).unwrap();
/// assert_eq!(msg.id(), "m1");
/// assert_eq!(msg.operation(), Some(&Operation::Insert));
///
/// assert!(matches!(decode(br#"{"route":{}}"#), Err(DecodeError::Invalid(_))));
/// assert!(matches!(decode(b"{"), Err(DecodeError::NotJson(_))));
/// ```
pub fn decode(frame: &[u8]) -> Result<Message, DecodeError> {
    decode_with_limit(frame, DEFAULT_MAX_FRAME_BYTES)
}

/// [`decode`] with a caller-chosen size limit; longer frames are rejected before parsing.
///
/// ```
/// use edgehive_protocols::codec::decode_with_limit;
/// use edgehive_protocols::DecodeError;
///
/// assert_eq!(
///     decode_with_limit(b"{}", 1),
///     Err(DecodeError::TooLarge { len: 2, max: 1 })
/// );
/// ```
pub fn decode_with_limit(frame: &[u8], max_bytes: usize) -> Result<Message, DecodeError> {
    if frame.len() > max_bytes {
        return Err(DecodeError::TooLarge {
            len: frame.len(),
            max: max_bytes,
        });
    }
    let first = frame.iter().find(|byte| !byte.is_ascii_whitespace());
    match first {
        None => return Err(DecodeError::NotJson("empty frame".to_owned())),
        // serde accepts a JSON array for a struct (fields by position); Go does not, so an
        // array must not sneak through as a message.
        Some(b'[') => return Err(classify_array(frame)),
        Some(_) => {}
    }
    let mut values = serde_json::Deserializer::from_slice(frame).into_iter::<Message>();
    match values.next() {
        Some(Ok(message)) => {
            let rest = &frame[values.byte_offset()..];
            match rest.iter().any(|byte| !byte.is_ascii_whitespace()) {
                true => Err(DecodeError::TrailingData(rest.trim_ascii().len())),
                false => Ok(message),
            }
        }
        Some(Err(err)) => Err(from_serde(&err)),
        None => Err(DecodeError::NotJson("empty frame".to_owned())),
    }
}

fn first_value<'de, T: serde::Deserialize<'de>>(
    frame: &'de [u8],
) -> Option<Result<T, serde_json::Error>> {
    serde_json::Deserializer::from_slice(frame)
        .into_iter::<T>()
        .next()
}

fn classify_array(frame: &[u8]) -> DecodeError {
    match first_value::<IgnoredAny>(frame) {
        Some(Err(err)) => from_serde(&err),
        _ => DecodeError::Invalid("expected a JSON object, found an array".to_owned()),
    }
}

fn from_serde(err: &serde_json::Error) -> DecodeError {
    match err.classify() {
        Category::Data => DecodeError::Invalid(err.to_string()),
        Category::Syntax | Category::Eof | Category::Io => DecodeError::NotJson(err.to_string()),
    }
}

fn write_frame(message: &Message, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let mut serializer = serde_json::Serializer::with_formatter(&mut *out, GoFormatter);
    message.serialize(&mut serializer)?;
    out.push(b'\n');
    Ok(())
}

/// Any value as Go's `json.Marshal` writes it (no trailing newline): the tunnel's connect data.
pub(crate) fn go_json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    if let Err(err) = value.serialize(&mut serializer) {
        // Unreachable for the string-keyed types it is used with; never half a value.
        debug_assert!(false, "encoding as Go JSON failed: {err}");
        out.clear();
    }
    out
}

/// Compact JSON with the two places where Go's `encoding/json` differs from serde_json:
/// HTML-safe string escaping and float formatting. Control characters, quotes and backslashes
/// are escaped identically by both (`\b \f \n \r \t`, else lowercase `\u00xx`), so serde_json's
/// own escaping is kept for those.
struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut start = 0;
        for (index, ch) in fragment.char_indices() {
            let escape = match ch {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..index])?;
            writer.write_all(escape.as_bytes())?;
            start = index + ch.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn write_f64<W>(&mut self, writer: &mut W, value: f64) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        writer.write_all(go_float(value).as_bytes())
    }
}

/// Go's float64 text: shortest round-trip digits, plain notation for 1e-6 <= |v| < 1e21,
/// otherwise exponent notation with an explicit sign and no zero padding (`1e+21`, `1e-7`).
fn go_float(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-6..1e21).contains(&magnitude) {
        // Rust's `{:e}` is also shortest round-trip, but writes `1e21` where Go writes `1e+21`.
        let text = format!("{value:e}");
        match text.split_once('e') {
            Some((mantissa, exponent)) if !exponent.starts_with('-') => {
                format!("{mantissa}e+{exponent}")
            }
            _ => text,
        }
    } else {
        // Rust's `Display` never uses an exponent and drops a trailing ".0", as Go does.
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{Group, ModuleName, Operation};
    use serde_json::json;

    fn fixed(mut message: Message, id: &str, timestamp: i64) -> Message {
        message.header.id = id.to_owned();
        message.header.timestamp = timestamp;
        message
    }

    #[test]
    fn keepalive_frame_is_exact() {
        let ping = fixed(
            Message::keepalive(),
            "0eecebaa-c796-454d-a6bf-28e239f31c3d",
            1795244489351,
        );
        assert_eq!(
            encode(&ping),
            "{\"header\":{\"msg_id\":\"0eecebaa-c796-454d-a6bf-28e239f31c3d\",\"timestamp\":1795244489351},\
             \"route\":{\"source\":\"websocket\",\"group\":\"resource\",\"operation\":\"keepalive\",\"resource\":\"node\"},\
             \"content\":\"ping\"}\n"
        );
    }

    #[test]
    fn pod_insert_frame_is_exact() {
        let pod = json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": "nginx", "namespace": "default", "resourceVersion": "1234"},
            "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "nginx"}]}
        });
        let msg = fixed(
            Message::new(
                ModuleName::EdgeController,
                Group::Resource,
                Operation::Insert,
                "default/pod/nginx",
                pod,
            )
            .with_resource_version("1234"),
            "m-1",
            1700000000000,
        );
        let frame = encode(&msg);
        assert_eq!(
            frame,
            "{\"header\":{\"msg_id\":\"m-1\",\"timestamp\":1700000000000,\"resourceversion\":\"1234\"},\
             \"route\":{\"source\":\"edgecontroller\",\"group\":\"resource\",\"operation\":\"insert\",\"resource\":\"default/pod/nginx\"},\
             \"content\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"nginx\",\"namespace\":\"default\",\"resourceVersion\":\"1234\"},\
             \"spec\":{\"nodeName\":\"edge-1\",\"containers\":[{\"name\":\"c\",\"image\":\"nginx\"}]}}}\n"
        );
        assert_eq!(decode(frame.as_bytes()), Ok(msg));
    }

    #[test]
    fn ack_frame_is_exact() {
        let push = fixed(
            Message::new(
                ModuleName::EdgeController,
                Group::Resource,
                Operation::Update,
                "default/configmap/cm-2",
                json!({}),
            )
            .with_resource_version("77"),
            "push-1",
            1,
        );
        let ack = fixed(Message::response_to(&push, json!("OK")), "ack-1", 2);
        assert_eq!(
            encode(&ack),
            "{\"header\":{\"msg_id\":\"ack-1\",\"parent_msg_id\":\"push-1\",\"timestamp\":2},\
             \"route\":{\"source\":\"edgecontroller\",\"group\":\"resource\",\"operation\":\"response\",\"resource\":\"default/configmap/cm-2\"},\
             \"content\":\"OK\"}\n"
        );
    }

    #[test]
    fn every_header_field_in_go_order() {
        let mut msg = fixed(Message::keepalive(), "i", -3);
        msg.header.parent_id = "p".into();
        msg.header.resource_version = "r".into();
        msg.header.sync = true;
        msg.header.context_type = "channel".into();
        msg.route.destination = "d".into();
        msg.content = serde_json::Value::Null;
        assert_eq!(
            encode(&msg),
            "{\"header\":{\"msg_id\":\"i\",\"parent_msg_id\":\"p\",\"timestamp\":-3,\"resourceversion\":\"r\",\"sync\":true,\"type\":\"channel\"},\
             \"route\":{\"source\":\"websocket\",\"destination\":\"d\",\"group\":\"resource\",\"operation\":\"keepalive\",\"resource\":\"node\"},\
             \"content\":null}\n"
        );
    }

    #[test]
    fn empty_message_matches_edgecore_goodbye() {
        let goodbye =
            "{\"header\":{\"msg_id\":\"\",\"timestamp\":0},\"route\":{},\"content\":null}\n";
        let msg = decode(goodbye.as_bytes()).unwrap();
        assert_eq!(msg.id(), "");
        assert_eq!(encode(&msg), goodbye);
    }

    #[test]
    fn go_string_escaping() {
        let mut msg = fixed(Message::keepalive(), "i", 0);
        msg.content = json!({"a<b": "x>y&z\u{2028}\u{2029}\u{8}\u{c}\n\r\t\u{1}\u{7f}\"\\é🦀"});
        let frame = encode(&msg);
        assert!(
            frame.contains(r#""content":{"a\u003cb":"x\u003ey\u0026z\u2028\u2029\b\f\n\r\t\u0001"#)
        );
        assert!(frame.ends_with("\u{7f}\\\"\\\\é🦀\"}}\n"));
        assert_eq!(decode(frame.as_bytes()).unwrap().content, msg.content);
    }

    #[test]
    fn go_float_formatting() {
        let cases = [
            (0.0, "0"),
            (-0.0, "-0"),
            (1.5, "1.5"),
            (3.0, "3"),
            (0.1, "0.1"),
            (1e-6, "0.000001"),
            (1e-7, "1e-7"),
            (1.25e-10, "1.25e-10"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (-1.5e300, "-1.5e+300"),
            (123456.789, "123456.789"),
        ];
        for (value, expected) in cases {
            assert_eq!(go_float(value), expected, "{value:?}");
        }
        let mut msg = fixed(Message::keepalive(), "i", 0);
        msg.content = json!([1.0e21, 2.5, 7, -7, 18446744073709551615u64]);
        assert!(encode(&msg).contains(r#""content":[1e+21,2.5,7,-7,18446744073709551615]"#));
    }

    #[test]
    fn decode_tolerates_whitespace_and_refuses_trailing_data() {
        let body = "{\"header\":{\"msg_id\":\"a\"}}";
        for frame in [format!("{body}\n"), format!(" \r\n\t{body} \n")] {
            assert_eq!(decode(frame.as_bytes()).unwrap().id(), "a", "{frame:?}");
        }
        for (frame, trailing) in [
            (format!("{body}{body}"), body.len()),
            (format!("{body}\n{body}\n"), body.len()),
            (format!("{body}garbage"), 7),
            (format!("{body} x "), 1),
        ] {
            assert_eq!(
                decode(frame.as_bytes()),
                Err(DecodeError::TrailingData(trailing)),
                "{frame:?}"
            );
        }
    }

    #[test]
    fn decode_errors() {
        let not_json = [&b""[..], b"  \n", b"hello", b"{", b"{\"header\":", b"[1,"];
        for frame in not_json {
            assert!(
                matches!(decode(frame), Err(DecodeError::NotJson(_))),
                "{:?}: {:?}",
                String::from_utf8_lossy(frame),
                decode(frame)
            );
        }
        let invalid = [
            &br#"{"route":{}}"#[..],
            br#"{}"#,
            br#"{"header":{}}"#,
            br#"{"header":{"msg_id":5}}"#,
            br#"{"header":{"msg_id":"a","timestamp":"x"}}"#,
            br#"{"header":{"msg_id":"a"},"route":{"operation":7}}"#,
            br#"{"header":null}"#,
            br#"[{"msg_id":"a"}]"#,
            b"42",
            b"\"text\"",
            b"null",
        ];
        for frame in invalid {
            assert!(
                matches!(decode(frame), Err(DecodeError::Invalid(_))),
                "{:?}: {:?}",
                String::from_utf8_lossy(frame),
                decode(frame)
            );
        }
    }

    #[test]
    fn decode_error_messages_are_short() {
        assert_eq!(
            decode(b"").unwrap_err().to_string(),
            "frame is not JSON: empty frame"
        );
        assert_eq!(
            decode(br#"{"route":{}}"#).unwrap_err().to_string(),
            "frame is not a message: missing field `header` at line 1 column 12"
        );
    }

    #[test]
    fn size_limit() {
        let frame = encode(&Message::keepalive());
        let len = frame.len();
        assert!(decode_with_limit(frame.as_bytes(), len).is_ok());
        assert_eq!(
            decode_with_limit(frame.as_bytes(), len - 1),
            Err(DecodeError::TooLarge { len, max: len - 1 })
        );
        let huge = vec![b' '; DEFAULT_MAX_FRAME_BYTES + 1];
        assert_eq!(
            decode(&huge),
            Err(DecodeError::TooLarge {
                len: DEFAULT_MAX_FRAME_BYTES + 1,
                max: DEFAULT_MAX_FRAME_BYTES
            })
        );
    }
}
