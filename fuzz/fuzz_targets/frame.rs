//! The WebSocket frame codec (`edgehive_protocols::codec`): any bytes an edge or cloudcore
//! sends in a TEXT frame. Besides not panicking: the size limit refuses before parsing and
//! otherwise changes nothing, and a decoded message encodes to a frame that decodes again and
//! re-encodes to the same bytes (what CloudHub forwards is what it read). A frame the session's
//! keepalive fast path (`is_keepalive`) takes is one the decoder decodes as a keepalive.
#![no_main]

use edgehive_protocols::codec::decode_with_limit;
use edgehive_protocols::{decode, encode, is_keepalive, DecodeError, Operation};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

fuzz_target!(|data: &[u8]| {
    let decoded = decode(data);
    if is_keepalive(data, data.len()) {
        assert!(
            matches!(&decoded, Ok(message) if message.operation() == Some(&Operation::Keepalive)),
            "the fast path took what is not a keepalive: {decoded:?}"
        );
    }
    assert_eq!(decode_with_limit(data, data.len()), decoded);
    if let Some(shorter) = data.len().checked_sub(1) {
        assert!(matches!(
            decode_with_limit(data, shorter),
            Err(DecodeError::TooLarge { .. })
        ));
    }
    if let Ok(message) = decoded {
        let frame = encode(&message);
        let again = match decode(frame.as_bytes()) {
            Ok(again) => again,
            Err(error) => panic!("an encoded message does not decode: {error}: {frame}"),
        };
        assert_eq!(encode(&again), frame, "re-encoding changed the frame");
        // What the router reads of every message.
        let _ = (
            again.operation(),
            again.group(),
            again.source(),
            again.parent_id(),
        );
        let _ = (
            again.resource_version(),
            again.is_response(),
            again.content_json(),
        );
    }
});
