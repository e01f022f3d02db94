//! Delivering to a module whose mailbox may be momentarily full.

use std::time::Duration;

use edgehive_protocols::Message;

use crate::hive::{Hive, HiveError};

/// First wait after a full mailbox; doubled per attempt up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_millis(5);
/// Longest single wait.
const MAX_DELAY: Duration = Duration::from_millis(100);
/// Total time a message may wait for room before it is given up.
pub(crate) const RETRY_BUDGET: Duration = Duration::from_secs(2);

/// Sends `message` to module `name`, retrying while its mailbox is full.
///
/// Policy: a full mailbox is a burst, not a failure, so we wait (5 ms doubling to 100 ms) for
/// up to [`RETRY_BUDGET`]; after that the last `MailboxFull` error is returned and the caller
/// drops the message (everything we deliver this way is either resent by the cloud until it
/// is acknowledged or a state broadcast superseded by the next one). Any other error (unknown
/// module, module down) is returned at once.
pub(crate) async fn send_with_retry(
    hive: &Hive,
    name: &str,
    message: &Message,
) -> Result<(), HiveError> {
    retry((), |()| {
        hive.send(name, message.clone())
            .map_err(|error| (error, ()))
    })
    .await
    .map_err(|(error, ())| error)
}

/// Tells module `name` the typed `message`, retrying while its mailbox is full, with the
/// policy of [`send_with_retry`]. A module that does not take `M` (an extension) gives the
/// message back: `Err((HiveError::WrongType, message))`.
pub(crate) async fn tell_with_retry<M>(
    hive: &Hive,
    name: &str,
    message: M,
) -> Result<(), (HiveError, M)>
where
    M: actix::Message + Send + 'static,
    M::Result: Send,
{
    retry(message, |message| {
        hive.tell(name, message)
            .map_err(|refused| (refused.error, refused.message))
    })
    .await
}

/// Runs `attempt` until it succeeds, fails otherwise than with a full mailbox, or the
/// [`RETRY_BUDGET`] is spent; `attempt` gives the message back when it fails.
async fn retry<M>(
    mut message: M,
    mut attempt: impl FnMut(M) -> Result<(), (HiveError, M)>,
) -> Result<(), (HiveError, M)> {
    let deadline = tokio::time::Instant::now() + RETRY_BUDGET;
    let mut delay = FIRST_DELAY;
    loop {
        match attempt(message) {
            Err((HiveError::MailboxFull(_), back))
                if tokio::time::Instant::now() + delay <= deadline =>
            {
                message = back;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
            }
            other => return other,
        }
    }
}
