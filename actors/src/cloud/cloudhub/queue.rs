//! A bounded queue between a session and what carries its frames that holds no memory while
//! it is empty: a session's writer queue (frames waiting for the socket) and an in-process
//! edge's link (`memory.rs`).
//!
//! tokio's bounded channel allocates its first block of 32 slots when it is made, and its
//! cache-padded state besides: about 1.8 KiB for a queue of [`super::link::Outgoing`], per
//! connection, held for as long as the connection lives though almost every connection is
//! idle almost all the time. This one is a `VecDeque` under a lock: empty, it is one small
//! allocation; what it grows to while frames wait is given back once it is drained.
//!
//! Senders may be cloned; the queue is closed for the receiver once every sender is gone and
//! what was queued has been taken, and for the senders once the receiver is gone.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::hive::locks;

/// What a drained queue may keep of its buffer (items); a larger one is freed.
const KEPT_WHEN_EMPTY: usize = 4;

struct State<T> {
    items: VecDeque<T>,
    capacity: usize,
    senders: usize,
    receiver_alive: bool,
    /// The receiver, waiting for an item.
    receiver: Option<Waker>,
    /// Senders waiting for room (only [`QueueSender::send`] waits).
    waiting: Vec<Waker>,
}

type Shared<T> = Arc<Mutex<State<T>>>;

/// Why a send to a queue did not queue an item (it is given back).
#[derive(Debug, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// The queue holds its capacity.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

/// The sending end; see the [module docs](self).
pub(crate) struct QueueSender<T> {
    shared: Shared<T>,
}

/// The receiving end; see the [module docs](self).
pub(crate) struct QueueReceiver<T> {
    shared: Shared<T>,
}

/// A queue of at most `capacity` items (at least one).
pub(crate) fn queue<T>(capacity: usize) -> (QueueSender<T>, QueueReceiver<T>) {
    let shared = Arc::new(Mutex::new(State {
        items: VecDeque::new(),
        capacity: capacity.max(1),
        senders: 1,
        receiver_alive: true,
        receiver: None,
        waiting: Vec::new(),
    }));
    (
        QueueSender {
            shared: shared.clone(),
        },
        QueueReceiver { shared },
    )
}

impl<T> QueueSender<T> {
    /// Queues `item` unless the queue is full or its receiver is gone.
    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let waker = {
            let mut state = locks::lock(&self.shared);
            if !state.receiver_alive {
                return Err(TrySendError::Closed(item));
            }
            if state.items.len() >= state.capacity {
                return Err(TrySendError::Full(item));
            }
            state.items.push_back(item);
            state.receiver.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// Queues `item`, waiting for room; gives it back if the receiver is gone. (The
    /// in-process link's, behind `test-hooks`; sockets' writers never wait.)
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) async fn send(&self, item: T) -> Result<(), T> {
        let mut item = Some(item);
        poll_fn(|cx| {
            let Some(next) = item.take() else {
                return Poll::Ready(Ok(()));
            };
            match self.try_send(next) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TrySendError::Closed(back)) => Poll::Ready(Err(back)),
                Err(TrySendError::Full(back)) => {
                    let mut state = locks::lock(&self.shared);
                    if state.items.len() < state.capacity || !state.receiver_alive {
                        // Room was made (or the receiver left) meanwhile: try again at once.
                        cx.waker().wake_by_ref();
                    } else if !state.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                        state.waiting.push(cx.waker().clone());
                    }
                    item = Some(back);
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        locks::lock(&self.shared).senders += 1;
        QueueSender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = locks::lock(&self.shared);
            state.senders = state.senders.saturating_sub(1);
            if state.senders > 0 {
                return;
            }
            state.receiver.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> QueueReceiver<T> {
    /// The next item; `None` once every sender is gone and nothing is left.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next item if one is queued now.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        let (item, waiting) = {
            let mut state = locks::lock(&self.shared);
            let item = state.items.pop_front();
            (item, take_waiting(&mut state))
        };
        waiting.into_iter().for_each(Waker::wake);
        item
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let (item, waiting) = {
            let mut state = locks::lock(&self.shared);
            match state.items.pop_front() {
                Some(item) => (Some(item), take_waiting(&mut state)),
                None if state.senders == 0 => return Poll::Ready(None),
                None => {
                    if !state
                        .receiver
                        .as_ref()
                        .is_some_and(|waker| waker.will_wake(cx.waker()))
                    {
                        state.receiver = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            }
        };
        waiting.into_iter().for_each(Waker::wake);
        Poll::Ready(item)
    }
}

/// After an item was taken: the senders waiting for room (all of them: each tries again),
/// and a drained queue's buffer freed if it grew.
fn take_waiting<T>(state: &mut State<T>) -> Vec<Waker> {
    if state.items.is_empty() && state.items.capacity() > KEPT_WHEN_EMPTY {
        state.items = VecDeque::new();
    }
    if state.waiting.is_empty() {
        Vec::new()
    } else {
        std::mem::take(&mut state.waiting)
    }
}

impl<T> Drop for QueueReceiver<T> {
    fn drop(&mut self) {
        let (items, waiting) = {
            let mut state = locks::lock(&self.shared);
            state.receiver_alive = false;
            state.receiver = None;
            (
                std::mem::take(&mut state.items),
                std::mem::take(&mut state.waiting),
            )
        };
        // Dropped outside the lock: an item's drop may do anything.
        drop(items);
        waiting.into_iter().for_each(Waker::wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_come_out_in_order_and_a_full_queue_refuses() {
        let (sender, mut receiver) = queue(2);
        assert_eq!(sender.try_send(1), Ok(()));
        assert_eq!(sender.try_send(2), Ok(()));
        assert_eq!(sender.try_send(3), Err(TrySendError::Full(3)));
        assert_eq!(receiver.try_recv(), Some(1));
        assert_eq!(sender.try_send(3), Ok(()));
        assert_eq!(receiver.try_recv(), Some(2));
        assert_eq!(receiver.try_recv(), Some(3));
        assert_eq!(receiver.try_recv(), None);
    }

    #[test]
    fn a_drained_queue_gives_its_buffer_back() {
        let (sender, mut receiver) = queue(256);
        for item in 0..100 {
            sender.try_send(item).unwrap();
        }
        while receiver.try_recv().is_some() {}
        assert_eq!(locks::lock(&sender.shared).items.capacity(), 0);
    }

    #[actix_rt::test]
    async fn the_receiver_sees_the_end_after_what_was_queued() {
        let (sender, mut receiver) = queue(4);
        let second = sender.clone();
        sender.try_send("a").unwrap();
        drop(sender);
        second.try_send("b").unwrap();
        drop(second);
        assert_eq!(receiver.recv().await, Some("a"));
        assert_eq!(receiver.recv().await, Some("b"));
        assert_eq!(receiver.recv().await, None);
    }

    #[actix_rt::test]
    async fn a_waiting_sender_goes_on_when_room_is_made_or_the_receiver_leaves() {
        let (sender, mut receiver) = queue(1);
        sender.try_send(1).unwrap();
        let waiting = sender.clone();
        let sent = actix_rt::spawn(async move { waiting.send(2).await });
        tokio::task::yield_now().await;
        assert_eq!(receiver.recv().await, Some(1));
        assert_eq!(sent.await.unwrap(), Ok(()));
        assert_eq!(receiver.recv().await, Some(2));

        sender.try_send(3).unwrap();
        let waiting = sender.clone();
        let refused = actix_rt::spawn(async move { waiting.send(4).await });
        tokio::task::yield_now().await;
        drop(receiver);
        assert_eq!(refused.await.unwrap(), Err(4));
        assert_eq!(sender.try_send(5), Err(TrySendError::Closed(5)));
    }
}
