//! The link: dial CloudHub (each of several addresses in turn), serve the connection (cloud
//! frames to the edge modules, the heartbeat, the outbox up through the rate limit), and dial
//! again after a jittered, doubling backoff when it ends.

use std::sync::Arc;
use std::time::Duration;

use awc::ws::{Frame, Message as WsMessage};
use edgehive_protocols::{codec, Group, Message};
use futures_util::{SinkExt, StreamExt};

use super::bucket::TokenBucket;
use super::options::{events_url, EdgeHubOptions};
use super::shared::{Shared, HANDSHAKE_TIMEOUT, MIN_RECONNECT, WRITE_TIMEOUT};
use crate::edge::certmanager::ensure_identity;
use crate::edge::contract::{route, ConnectionState};
use crate::edge::contract::{MetaRequest, TwinMessage};
use crate::edge::deliver::send_with_retry;
use crate::edge::deliver::tell_with_retry;
use crate::hive::locks::lock;
use crate::hive::Hive;
use crate::hive::HiveError;

/// Everything the connection task needs.
#[derive(Debug, Clone)]
pub(super) struct Link {
    pub(super) hive: Hive,
    pub(super) options: EdgeHubOptions,
    pub(super) shared: Arc<Shared>,
}

/// A text or binary message arriving in fragments.
pub(super) struct Partial {
    bytes: Vec<u8>,
    too_large: bool,
}

/// A connection that lasted this long resets the reconnect backoff.
const STABLE_CONNECTION: Duration = Duration::from_secs(10);

impl Link {
    /// Dial, serve, back off, repeat; forever (until the actor stops and drops this future).
    ///
    /// With several cloud addresses each round dials them in turn, starting with the one that
    /// worked last (or, once its connection was lost, the others first, from a place derived
    /// from the node's name so a dead cloud's edges spread over the rest), until one answers;
    /// the backoff is waited once per round, so dead addresses are never dialed in a hot loop.
    pub(super) async fn run(self) {
        let min = self.options.reconnect_min.max(MIN_RECONNECT);
        let max = self.options.reconnect_max.max(min);
        let servers = self.options.addresses();
        let mut backoff = min;
        loop {
            // The node's identity is the same whichever cloud answers: got once per round.
            match self.client().await {
                Ok(client) => {
                    if self.round(&client, &servers).await {
                        backoff = min;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "no certificate to dial the cloud with");
                    self.shared.record_error(error);
                }
            }
            tokio::time::sleep(jitter(backoff, min)).await;
            backoff = (backoff * 2).min(max);
        }
    }

    /// One round: dials `servers` in turn (the order [`Shared::round_order`] gives) until one
    /// answers, and serves that connection until it ends. `true` when the connection lasted
    /// (the backoff starts again); a connection the cloud closes at once (node limit, refused
    /// identity) keeps doubling it.
    async fn round(&self, client: &awc::Client, servers: &[String]) -> bool {
        let order = self
            .shared
            .round_order(servers.len(), self.options.spread());
        for index in order {
            let Some(server) = servers.get(index) else {
                continue;
            };
            let url = events_url(&self.options, server);
            let framed = match self.connect(client, &url).await {
                Ok(framed) => framed,
                Err(error) => {
                    tracing::warn!(%url, %error, "cannot connect to the cloud");
                    self.shared.record_error(error);
                    continue;
                }
            };
            let connected_at = tokio::time::Instant::now();
            let connection = self.shared.connected_to(index, server);
            self.shared.set_connected(true, None);
            tracing::info!(%url, "connected to the cloud");
            self.broadcast_connection(ConnectionState::Connected).await;
            let reason = {
                // Fails the requests written on this connection when it ends, also when the
                // actor stops and drops this task mid-serve; before the modules hear of the
                // disconnect, so a module that then starts over finds its request done.
                let _cut = Cut {
                    shared: &self.shared,
                    connection,
                };
                self.serve(framed, connection).await
            };
            tracing::warn!(%url, %reason, "connection to the cloud lost");
            self.shared.lost(index);
            self.shared.set_connected(false, Some(reason));
            self.broadcast_connection(ConnectionState::Disconnected)
                .await;
            return connected_at.elapsed() >= STABLE_CONNECTION;
        }
        false
    }

    /// The WebSocket client: with TLS, presenting the node's certificate (loaded, or
    /// bootstrapped with the join token, once).
    async fn client(&self) -> Result<awc::Client, String> {
        let Some(tls) = &self.options.tls else {
            return Ok(awc::Client::new());
        };
        let cached = lock(&self.shared.identity).clone();
        let identity = match cached {
            Some(identity) => identity,
            None => {
                let identity = ensure_identity(tls, &self.options.node_name)
                    .await
                    .map_err(|error| format!("certificate: {error}"))?;
                *lock(&self.shared.identity) = Some(identity.clone());
                identity
            }
        };
        let config = identity
            .client_config()
            .map_err(|error| format!("certificate: {error}"))?;
        Ok(awc::Client::builder()
            .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
            .finish())
    }

    async fn connect(
        &self,
        client: &awc::Client,
        url: &str,
    ) -> Result<
        impl futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
            + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
            + Unpin,
        String,
    > {
        let mut request = client
            .ws(url)
            .max_frame_size(self.options.max_frame_bytes)
            .header("node_id", self.options.node_name.as_str())
            .header("project_id", self.options.project_id.as_str())
            .header("ConnectionUse", "msg");
        if let Some(store_id) = &self.options.store_id {
            request = request.header(edgehive_protocols::STORE_ID_HEADER, store_id.as_str());
        }
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, request.connect()).await {
            Ok(Ok((_response, framed))) => Ok(framed),
            Ok(Err(error)) => Err(format!("connect to {url}: {error}")),
            Err(_) => Err(format!(
                "connect to {url}: no handshake within {HANDSHAKE_TIMEOUT:?}"
            )),
        }
    }

    /// Serves connection number `connection` until it fails; returns why.
    async fn serve<S>(&self, mut socket: S, connection: u64) -> String
    where
        S: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
            + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
            + Unpin,
    {
        // KubeEdge sends the first keepalive right after connecting, before any queued message.
        if let Err(reason) = write(&mut socket, &Message::keepalive()).await {
            return reason;
        }
        let period = self.options.heartbeat.max(MIN_RECONNECT);
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut partial: Option<Partial> = None;
        let mut bucket = TokenBucket::new(self.options.message_qps, self.options.message_burst);
        loop {
            let send_at = bucket.next_available();
            tokio::select! {
                frame = socket.next() => match frame {
                    None => return "the cloud ended the stream".to_owned(),
                    Some(Err(error)) => {
                        self.shared.metrics.malformed.inc();
                        return format!("read error: {error}");
                    }
                    Some(Ok(frame)) => {
                        if let Some(reason) = self.on_frame(frame, &mut partial, &mut socket).await {
                            return reason;
                        }
                    }
                },
                _ = heartbeat.tick() => {
                    if let Err(reason) = write(&mut socket, &Message::keepalive()).await {
                        return reason;
                    }
                }
                // ACKs and error replies first, and never held by the rate limit.
                reply = self.shared.next_reply() => {
                    if let Err(reason) = write(&mut socket, &reply).await {
                        self.shared.requeue(reply);
                        return reason;
                    }
                    self.shared.written(&reply, connection);
                }
                message = async {
                    tokio::time::sleep_until(send_at).await;
                    self.shared.next_outgoing().await
                } => {
                    bucket.take();
                    if let Err(reason) = write(&mut socket, &message).await {
                        // Not written (as far as we know): sent again on the next connection,
                        // and its request, if it is one, still waits.
                        self.shared.requeue(message);
                        return reason;
                    }
                    self.shared.written(&message, connection);
                }
            }
        }
    }

    /// Handles one frame; `Some(reason)` ends the connection.
    async fn on_frame<S>(
        &self,
        frame: Frame,
        partial: &mut Option<Partial>,
        socket: &mut S,
    ) -> Option<String>
    where
        S: futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError> + Unpin,
    {
        // awc does not re-export the fragment type; actix-ws does.
        use actix_ws::Item;
        match frame {
            Frame::Text(bytes) | Frame::Binary(bytes) => self.on_payload(&bytes).await,
            Frame::Continuation(item) => match item {
                Item::FirstText(bytes) | Item::FirstBinary(bytes) => {
                    let mut started = Partial {
                        bytes: Vec::new(),
                        too_large: false,
                    };
                    self.append(&mut started, &bytes);
                    *partial = Some(started);
                }
                Item::Continue(bytes) => {
                    if let Some(started) = partial.as_mut() {
                        self.append(started, &bytes);
                    }
                }
                Item::Last(bytes) => {
                    if let Some(mut done) = partial.take() {
                        self.append(&mut done, &bytes);
                        if done.too_large {
                            self.shared.metrics.malformed.inc();
                            tracing::warn!(
                                max = self.options.max_frame_bytes,
                                "dropped a fragmented cloud message over the size limit"
                            );
                        } else {
                            self.on_payload(&done.bytes).await;
                        }
                    }
                }
            },
            Frame::Ping(payload) => {
                let pong = socket.send(WsMessage::Pong(payload));
                match tokio::time::timeout(WRITE_TIMEOUT, pong).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => return Some(format!("write error: {error}")),
                    Err(_) => return Some("pong write timed out".to_owned()),
                }
            }
            Frame::Pong(_) => {}
            Frame::Close(reason) => {
                return Some(format!("the cloud closed the connection: {reason:?}"))
            }
        }
        None
    }

    /// Buffers a fragment, keeping at most `max_frame_bytes` (the rest is discarded and the
    /// message dropped when complete).
    fn append(&self, partial: &mut Partial, bytes: &[u8]) {
        if partial.bytes.len() + bytes.len() > self.options.max_frame_bytes {
            partial.too_large = true;
            partial.bytes.clear();
        } else if !partial.too_large {
            partial.bytes.extend_from_slice(bytes);
        }
    }

    async fn on_payload(&self, bytes: &[u8]) {
        match codec::decode_with_limit(bytes, self.options.max_frame_bytes) {
            Ok(message) => self.route_to_edge(message).await,
            Err(error) => {
                self.shared.metrics.malformed.inc();
                tracing::warn!(%error, len = bytes.len(), "dropped a malformed cloud frame");
            }
        }
    }

    /// Routes a cloud message to the edge modules, like KubeEdge's `routeToEdge`.
    ///
    /// A reply to one of our [`CloudRequest`]s goes to its waiter whatever its group.
    /// Delivery waits (bounded) while a target mailbox is full, which also stops reading from
    /// the socket: back-pressure reaches the cloud instead of dropping its messages. After
    /// the wait the message is dropped and counted; the cloud resends unacknowledged objects.
    async fn route_to_edge(&self, message: Message) {
        if let Some(parent) = message.parent_id() {
            let waiter = lock(&self.shared.pending).remove(parent);
            if let Some(waiter) = waiter {
                // The requester may have timed out just now; nothing else wants the reply.
                let _ = waiter.reply.send(Ok(message));
                return;
            }
        }
        let target = match route::group_for(message.group()) {
            Some(target) => target,
            None => {
                self.shared.metrics.unroutable.inc();
                tracing::warn!(
                    group = ?message.group().map(Group::as_str),
                    id = message.id(),
                    resource = message.resource(),
                    "dropped a cloud message for an unknown group"
                );
                return;
            }
        };
        let members = self.hive.group_members(target);
        if members.is_empty() {
            self.shared.metrics.unroutable.inc();
            tracing::warn!(
                group = target,
                id = message.id(),
                "no edge module serves this group"
            );
            return;
        }
        // Typed once, here: the built-in module of the group takes the typed message, an
        // extension in the group the beehive message (as does everyone for what does not type).
        match target {
            route::META_GROUP => {
                let typed = MetaRequest::from_message(message.clone());
                self.deliver_typed(&members, &message, typed).await;
            }
            route::TWIN_GROUP => match TwinMessage::from_message(message.clone()) {
                Some(typed) => self.deliver_typed(&members, &message, typed).await,
                None => self.deliver(&members, &message).await,
            },
            _ => self.deliver(&members, &message).await,
        }
    }

    /// Delivers `typed` to the members that take it, and `message` to the others.
    async fn deliver_typed<M>(&self, members: &[String], message: &Message, typed: M)
    where
        M: actix::Message + Clone + Send + 'static,
        M::Result: Send,
    {
        for member in members {
            let outcome = match tell_with_retry(&self.hive, member, typed.clone()).await {
                Ok(()) => Ok(()),
                Err((HiveError::WrongType(_), _)) => {
                    send_with_retry(&self.hive, member, message).await
                }
                Err((error, _)) => Err(error),
            };
            if let Err(error) = outcome {
                self.undelivered(member, message, &error);
            }
        }
    }

    fn undelivered(&self, member: &str, message: &Message, error: &HiveError) {
        self.shared.metrics.undelivered.inc();
        tracing::warn!(
            module = member,
            id = message.id(),
            resource = message.resource(),
            %error,
            "cloud message not delivered"
        );
    }

    async fn deliver(&self, members: &[String], message: &Message) {
        for member in members {
            if let Err(error) = send_with_retry(&self.hive, member, message).await {
                self.undelivered(member, message, &error);
            }
        }
    }

    async fn broadcast_connection(&self, state: ConnectionState) {
        for group in route::CONNECTION_GROUPS {
            let members = self.hive.group_members(group);
            if members.is_empty() {
                continue;
            }
            self.deliver(&members, &state.message(group)).await;
        }
    }
}

/// Ends a connection's requests: dropped when [`Link::serve`] returns or is dropped, it fails
/// those written on the connection ([`Shared::connection_lost`]).
struct Cut<'a> {
    shared: &'a Shared,
    connection: u64,
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        let cut = self.shared.connection_lost(self.connection);
        if cut > 0 {
            tracing::info!(
                requests = cut,
                "requests written on the lost connection failed; their callers may send them again"
            );
        }
    }
}

/// Writes one message as a TEXT frame within [`WRITE_TIMEOUT`].
async fn write<S>(socket: &mut S, message: &Message) -> Result<(), String>
where
    S: futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError> + Unpin,
{
    let frame = WsMessage::Text(codec::encode(message).into());
    match tokio::time::timeout(WRITE_TIMEOUT, socket.send(frame)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("write error: {error}")),
        Err(_) => Err(format!("write timed out after {WRITE_TIMEOUT:?}")),
    }
}

/// A delay in `[3/4 · backoff, backoff]`, never under `floor`, so many edges cut off together
/// do not dial the cloud in lockstep.
pub(super) fn jitter(backoff: Duration, floor: Duration) -> Duration {
    // uuid's v4 generator is the random source already in our dependencies.
    let random = (uuid::Uuid::new_v4().as_u128() % 1_000) as u32;
    let cut = backoff / 4 * random / 1_000;
    (backoff - cut).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let backoff = Duration::from_secs(8);
        for _ in 0..200 {
            let delay = jitter(backoff, Duration::from_secs(1));
            assert!(
                delay >= Duration::from_secs(6) && delay <= backoff,
                "{delay:?}"
            );
        }
        assert_eq!(
            jitter(Duration::from_millis(1), Duration::from_millis(10)),
            Duration::from_millis(10)
        );
    }
}
