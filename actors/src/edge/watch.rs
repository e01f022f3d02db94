//! The edge API's watch stream: newline-delimited JSON events for stored objects.
//!
//! A watch starts with an `ADDED` event for every stored object of the type, then follows the
//! store's committed changes. The store's broadcast is bounded
//! ([`WATCH_CAPACITY`](super::store::WATCH_CAPACITY)) and never waits for a watcher: one that
//! reads too slowly gets a final `{"type":"ERROR",...}` line and the stream ends, so it knows
//! to list and watch again.

use std::collections::VecDeque;
use std::convert::Infallible;

use actix_web::web::Bytes;
use futures_util::Stream;
use serde_json::json;
use tokio::sync::broadcast::{self, error::RecvError};

use super::store::{ChangeKind, MetaRow, StoreEvent};

/// One JSON line.
fn line(value: &impl serde::Serialize) -> Bytes {
    let mut text = serde_json::to_vec(value).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

struct State {
    initial: VecDeque<MetaRow>,
    changes: broadcast::Receiver<StoreEvent>,
    resource_type: Option<String>,
    done: bool,
}

/// The watch stream: `initial` rows as ADDED, then the changes of `resource_type` (all types
/// when `None`). Subscribe before listing `initial` so no change falls between the two (a row
/// written in between may be reported twice, never missed).
pub fn watch_lines(
    initial: Vec<MetaRow>,
    changes: broadcast::Receiver<StoreEvent>,
    resource_type: Option<String>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let state = State {
        initial: initial.into(),
        changes,
        resource_type,
        done: false,
    };
    futures_util::stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        if let Some(row) = state.initial.pop_front() {
            let event = StoreEvent {
                kind: ChangeKind::Added,
                object: row,
            };
            return Some((Ok(line(&event)), state));
        }
        loop {
            match state.changes.recv().await {
                Ok(event) => {
                    let wanted = state
                        .resource_type
                        .as_ref()
                        .is_none_or(|kind| *kind == event.object.resource_type);
                    if wanted {
                        return Some((Ok(line(&event)), state));
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    state.done = true;
                    let error = json!({
                        "type": "ERROR",
                        "object": {
                            "message": format!(
                                "watcher fell {missed} changes behind and was cut off; list and watch again"
                            )
                        }
                    });
                    return Some((Ok(line(&error)), state));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}
