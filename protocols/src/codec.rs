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
use serde::{Deserialize, Serialize};
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

/// Whether `frame` is a keepalive, told from a borrowed parse that builds no [`Message`]: no
/// id, route or content is allocated. `true` only for a frame [`decode_with_limit`] (with the
/// same `max_bytes`) decodes into a message whose operation is
/// [`Operation::Keepalive`](crate::Operation::Keepalive); `false` says nothing either way, so
/// the caller decodes the frame in full as before (a frame this parse is stricter about than
/// the decoder: content other than a string or null, a form feed after the message).
///
/// ```
/// use edgehive_protocols::codec::is_keepalive;
/// use edgehive_protocols::{encode, Message};
///
/// let ping = encode(&Message::keepalive());
/// assert!(is_keepalive(ping.as_bytes(), 1 << 20));
/// assert!(!is_keepalive(ping.as_bytes(), 10), "over the limit");
/// assert!(!is_keepalive(br#"{"header":{"msg_id":"m"},"route":{"resource":"keepalive"}}"#, 1 << 20));
/// ```
pub fn is_keepalive(frame: &[u8], max_bytes: usize) -> bool {
    if frame.len() > max_bytes {
        return false;
    }
    // The decoder refuses an array where a message should be; so does this.
    if frame.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return false;
    }
    if keepalive::is_gos(frame) {
        return true;
    }
    let mut parser = serde_json::Deserializer::from_slice(frame);
    match keepalive::Probe::deserialize(&mut parser) {
        Ok(probe) => parser.end().is_ok() && probe.route.operation.0,
        Err(_) => false,
    }
}

/// The borrowed shape [`is_keepalive`] parses: every field [`Message`] decodes, in the same
/// order (a JSON array in a field's place is read by position, as the decoder reads it), with
/// the same types and the same rules for absent fields, so a duplicate or mistyped field
/// fails here where it fails there; strings are compared in place, never kept.
mod keepalive {
    use serde::de::{Deserializer, Error, Visitor};
    use serde::Deserialize;
    use std::fmt;

    #[derive(Deserialize)]
    pub(super) struct Probe {
        #[serde(rename = "header")]
        _header: Header,
        #[serde(default)]
        pub(super) route: Route,
        #[serde(default, rename = "content")]
        _content: Content,
    }

    #[derive(Deserialize)]
    struct Header {
        #[serde(rename = "msg_id", deserialize_with = "required")]
        _id: Word,
        #[serde(rename = "parent_msg_id", default)]
        _parent_id: Word,
        #[serde(rename = "timestamp", default)]
        _timestamp: i64,
        #[serde(rename = "resourceversion", default)]
        _resource_version: Word,
        #[serde(rename = "sync", default)]
        _sync: bool,
        #[serde(rename = "type", default)]
        _context_type: Word,
    }

    #[derive(Deserialize, Default)]
    pub(super) struct Route {
        #[serde(rename = "source", default)]
        _source: Word,
        #[serde(rename = "destination", default)]
        _destination: Word,
        #[serde(rename = "group", default)]
        _group: Word,
        #[serde(default)]
        pub(super) operation: Word,
        #[serde(rename = "resource", default)]
        _resource: Word,
    }

    /// Whether `frame` is a keepalive exactly as edgecore's Go code writes one (any msg_id
    /// of printable ASCII without escapes, any timestamp), compared byte by byte: the form
    /// almost every keepalive has, checked without a parser. Such a frame is valid JSON that
    /// decodes to a keepalive.
    pub(super) fn is_gos(frame: &[u8]) -> bool {
        const HEAD: &[u8] = br#"{"header":{"msg_id":""#;
        const MIDDLE: &[u8] = br#"","timestamp":"#;
        const TAIL: &[u8] = br#"},"route":{"source":"websocket","group":"resource","operation":"keepalive","resource":"node"},"content":"ping"}"#;
        let Some(rest) = frame.strip_prefix(HEAD) else {
            return false;
        };
        let Some(id) = rest.iter().position(|byte| *byte == b'"') else {
            return false;
        };
        if !rest[..id]
            .iter()
            .all(|byte| matches!(byte, 0x20..=0x7e) && *byte != b'\\')
        {
            return false;
        }
        let Some(rest) = rest[id..].strip_prefix(MIDDLE) else {
            return false;
        };
        // An i64 in JSON: digits, no leading zero; at most 18 cannot overflow.
        let digits = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
        if digits == 0 || digits > 18 || (digits > 1 && rest[0] == b'0') {
            return false;
        }
        let Some(rest) = rest[digits..].strip_prefix(TAIL) else {
            return false;
        };
        // What serde_json takes as whitespace after a value (Go writes one "\n").
        rest.iter()
            .all(|byte| matches!(byte, b' ' | b'\n' | b'\r' | b'\t'))
    }

    /// A string field as the decoder takes one (a JSON string, or null for ""), noted only
    /// for whether it says "keepalive".
    #[derive(Default)]
    pub(super) struct Word(pub(super) bool);

    /// A field the decoder requires (an absent one is an error, not a default).
    fn required<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Word, D::Error> {
        Word::deserialize(deserializer)
    }

    struct WordVisitor;

    impl<'de> Visitor<'de> for WordVisitor {
        type Value = Word;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string or null")
        }

        fn visit_none<E: Error>(self) -> Result<Word, E> {
            Ok(Word(false))
        }

        fn visit_unit<E: Error>(self) -> Result<Word, E> {
            Ok(Word(false))
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Word, D::Error> {
            deserializer.deserialize_str(WordVisitor)
        }

        fn visit_str<E: Error>(self, text: &str) -> Result<Word, E> {
            Ok(Word(text == "keepalive"))
        }
    }

    impl<'de> Deserialize<'de> for Word {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Word, D::Error> {
            deserializer.deserialize_option(WordVisitor)
        }
    }

    /// The content: a string or null only (KubeEdge's keepalive says "ping"); anything else
    /// is left to the full decoder.
    #[derive(Default)]
    struct Content;

    impl<'de> Deserialize<'de> for Content {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Content, D::Error> {
            deserializer
                .deserialize_option(WordVisitor)
                .map(|_| Content)
        }
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

    /// What the full decoder says a frame is: a keepalive or not (malformed is not).
    fn decodes_as_keepalive(frame: &[u8]) -> bool {
        decode(frame).is_ok_and(|message| message.operation() == Some(&Operation::Keepalive))
    }

    /// The golden captures' frames, both directions, every origin: `(origin, raw)`.
    fn golden_frames() -> Vec<(String, String)> {
        let files = [
            include_str!("../tests/data/real-edgecore-real-cloudcore-edge-3.jsonl"),
            include_str!("../tests/data/real-edgecore-node-delete-edge-3.jsonl"),
            include_str!("../tests/data/fake-edge-real-cloudcore-edge-2.jsonl"),
            include_str!("../tests/data/fake-edge-session-end-edge-2.jsonl"),
        ];
        let mut frames = Vec::new();
        for line in files.iter().flat_map(|file| file.lines()) {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(raw) = record["raw"].as_str() {
                let origin = record["origin"].as_str().unwrap_or_default();
                frames.push((origin.to_owned(), raw.to_owned()));
            }
        }
        frames
    }

    #[test]
    fn a_real_edgecore_keepalive_takes_the_fast_path_and_no_other_golden_frame_does() {
        let frames = golden_frames();
        let mut real_keepalives = 0;
        for (origin, raw) in &frames {
            let fast = is_keepalive(raw.as_bytes(), DEFAULT_MAX_FRAME_BYTES);
            assert_eq!(
                fast,
                decodes_as_keepalive(raw.as_bytes()),
                "{origin}: {raw}"
            );
            if fast && origin == "edgecore" {
                real_keepalives += 1;
                assert!(keepalive::is_gos(raw.as_bytes()), "{raw}");
            }
            if keepalive::is_gos(raw.as_bytes()) {
                assert!(decodes_as_keepalive(raw.as_bytes()), "{raw}");
            }
        }
        assert!(
            real_keepalives >= 5,
            "{real_keepalives} edgecore keepalives"
        );
        assert!(frames.len() > 100 + real_keepalives);
        // Ours as well, and over the limit it is left to the decoder (which refuses it).
        let ours = encode(&Message::keepalive());
        assert!(is_keepalive(ours.as_bytes(), ours.len()));
        assert!(!is_keepalive(ours.as_bytes(), ours.len() - 1));
    }

    #[test]
    fn a_frame_that_only_looks_like_a_keepalive_is_decoded_in_full() {
        let golden = r#"{"header":{"msg_id":"fde400bc-5161-4efd-8fca-a578ae2285fa","timestamp":1795245280130},"route":{"source":"websocket","group":"resource","operation":"keepalive","resource":"node"},"content":"ping"}"#;
        assert!(is_keepalive(golden.as_bytes(), DEFAULT_MAX_FRAME_BYTES));
        // Each a small change to the golden frame, with what the full decoder makes of it.
        let like = |from: &str, to: &str| golden.replacen(from, to, 1);
        let not_keepalive = [
            // "keepalive" elsewhere than the operation.
            like(
                r#""operation":"keepalive","resource":"node""#,
                r#""operation":"insert","resource":"keepalive""#,
            ),
            like(r#""content":"ping""#, r#""content":"keepalive""#)
                .replace(r#""operation":"keepalive""#, r#""operation":"update""#),
            like(r#""source":"websocket""#, r#""source":"keepalive""#)
                .replace(r#""operation":"keepalive""#, r#""operation":"query""#),
            like(
                r#""msg_id":"fde400bc-5161-4efd-8fca-a578ae2285fa""#,
                r#""msg_id":"keepalive""#,
            )
            .replace(r#""operation":"keepalive""#, r#""operation":"response""#),
            // Not the same word.
            like("keepalive", "Keepalive"),
            like("keepalive", "keepalive "),
            like("keepalive", "keepalivex"),
            // The operation in the wrong place: outside the route, inside the content.
            like(r#""route":{"#, r#""operation":"keepalive","route":{"#)
                .replace(r#","operation":"keepalive","resource""#, r#","resource""#),
            like(
                r#""content":"ping""#,
                r#""content":{"route":{"operation":"keepalive"}}"#,
            )
            .replace(
                r#""operation":"keepalive","resource""#,
                r#""operation":"insert","resource""#,
            ),
            like(
                r#""route":{"#,
                r#""header2":{"operation":"keepalive"},"route":{"#,
            )
            .replace(r#""operation":"keepalive","resource""#, r#""resource""#),
        ];
        for frame in &not_keepalive {
            assert!(!keepalive::is_gos(frame.as_bytes()), "{frame}");
            assert!(!decodes_as_keepalive(frame.as_bytes()), "{frame}");
            assert!(
                !is_keepalive(frame.as_bytes(), DEFAULT_MAX_FRAME_BYTES),
                "{frame}"
            );
        }
        // Malformed ones the decoder refuses: never a keepalive on the fast path either.
        let malformed = [
            like(
                r#""operation":"keepalive""#,
                r#""operation":"keepalive","operation":"insert""#,
            ),
            like(
                r#""operation":"keepalive""#,
                r#""operation":"insert","operation":"keepalive""#,
            ),
            like(r#""msg_id":"fde400bc-5161-4efd-8fca-a578ae2285fa","#, ""),
            like(
                r#""timestamp":1795245280130"#,
                r#""timestamp":"1795245280130""#,
            ),
            like(r#""source":"websocket""#, r#""source":7"#),
            like(
                r#""msg_id":"fde400bc-5161-4efd-8fca-a578ae2285fa""#,
                r#""msg_id":"a","msg_id":"b""#,
            ),
            like(
                r#""content":"ping""#,
                r#""content":"ping","content":"pong""#,
            ),
            format!("{golden}{golden}"),
            format!("{golden} x"),
            format!("[{golden}]"),
            golden[..golden.len() - 1].to_owned(),
            r#"{"route":{"operation":"keepalive"}}"#.to_owned(),
        ];
        for frame in &malformed {
            assert!(!keepalive::is_gos(frame.as_bytes()), "{frame}");
            assert!(decode(frame.as_bytes()).is_err(), "{frame}");
            assert!(
                !is_keepalive(frame.as_bytes(), DEFAULT_MAX_FRAME_BYTES),
                "{frame}"
            );
        }
        // Keepalives in other forms: the fast path agrees with the decoder, or leaves them to it.
        let other_forms = [
            format!("  {golden}\n\r\t"),
            like("\"keepalive\"", r#""keep\u0061live""#),
            like(r#""content":"ping""#, r#""content":null"#),
            like(r#","content":"ping""#, ""),
            like(r#""source":"websocket""#, r#""source":null"#),
            like(
                r#""timestamp":1795245280130"#,
                r#""timestamp":1,"extra":[1,{"a":2}]"#,
            ),
            r#"{"header":["m", null, 5], "route":["websocket", "", "resource", "keepalive"]}"#
                .to_owned(),
        ];
        for frame in &other_forms {
            assert!(decodes_as_keepalive(frame.as_bytes()), "{frame}");
            assert!(
                is_keepalive(frame.as_bytes(), DEFAULT_MAX_FRAME_BYTES),
                "{frame}"
            );
        }
        // Go's form with what Go never writes in it: left to the parser, which agrees with
        // the decoder.
        for (from, to) in [
            ("1795245280130", "01795245280130"),
            ("1795245280130", "-1795245280130"),
            ("1795245280130", "17952452801309999999"),
            ("1795245280130", "1.5"),
            ("fde400bc", r#"fde\u0034"#),
            ("fde400bc", "fd\u{e9}"),
            ("fde400bc", "fd\t"),
        ] {
            let frame = like(from, to);
            assert!(!keepalive::is_gos(frame.as_bytes()), "{frame}");
            let decoded = decodes_as_keepalive(frame.as_bytes());
            let fast = is_keepalive(frame.as_bytes(), DEFAULT_MAX_FRAME_BYTES);
            assert!(!fast || decoded, "{frame}");
        }
        let mut invalid_utf8 = golden.as_bytes().to_vec();
        invalid_utf8[25] = 0xff;
        assert!(!is_keepalive(&invalid_utf8, DEFAULT_MAX_FRAME_BYTES));
        assert!(decode(&invalid_utf8).is_err());
        // Stricter than the decoder (left to it): content that is not a string.
        let left = like(r#""content":"ping""#, r#""content":{"a":[1e400]}"#);
        assert!(!is_keepalive(left.as_bytes(), DEFAULT_MAX_FRAME_BYTES));
        let left = like(r#""content":"ping""#, r#""content":{"a":1}"#);
        assert!(decodes_as_keepalive(left.as_bytes()));
        assert!(!is_keepalive(left.as_bytes(), DEFAULT_MAX_FRAME_BYTES));
    }
}
