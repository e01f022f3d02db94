//! CloudHub's WebSocket reader (`cloudhub::socket`): the bytes an edge sends after its
//! upgrade request, arriving in reads of 1 to 2041 bytes (the first input byte picks the
//! size). No message is larger than the frame limit, no control frame carries more than 125
//! bytes, an error ends the stream, and a first header announcing too much is refused before
//! its payload.
#![no_main]

use actix_ws::AggregatedMessage;
use edgehive_actors::cloud::cloudhub::{announced_over, read_frames};
use libfuzzer_sys::fuzz_target;

edgehive_fuzz::capped_allocator!();

/// A small frame limit, so inputs reach it.
const MAX_FRAME: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&first, bytes)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(first) * 8;
    let items = read_frames(bytes, chunk, MAX_FRAME);
    let mut total = 0;
    for (at, item) in items.iter().enumerate() {
        match item {
            Ok(AggregatedMessage::Text(text)) => {
                assert!(text.len() <= MAX_FRAME);
                total += text.len();
            }
            Ok(AggregatedMessage::Binary(bytes)) => {
                assert!(bytes.len() <= MAX_FRAME);
                total += bytes.len();
            }
            Ok(AggregatedMessage::Ping(bytes) | AggregatedMessage::Pong(bytes)) => {
                assert!(bytes.len() <= 125);
                total += bytes.len();
            }
            Ok(AggregatedMessage::Close(_)) => {}
            Err(_) => assert_eq!(at + 1, items.len(), "a message after an error"),
        }
    }
    assert!(total <= bytes.len());
    // A first header announcing too much is refused before its payload: for its length
    // (Overflow) or, read in pieces, for a bad bit or opcode seen before the length arrived.
    if announced_over(bytes, MAX_FRAME).is_some() {
        assert!(matches!(items.first(), Some(Err(_))), "{items:?}");
    }
});
