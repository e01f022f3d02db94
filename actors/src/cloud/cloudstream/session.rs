//! The tunnels by node and the streams open in each: what the tunnel server (one reader per
//! connection) and the stream server (one handler per API-server request) share.
//!
//! A tunnel's streams each have a bounded channel towards their HTTP response. The tunnel's
//! reader waits for room in it (so a slow `kubectl logs -f` stops the reading of that
//! node's tunnel, and TCP pushes back on the edge) for at most the slow-reader timeout; then
//! that stream is closed (REMOVE_CONNECT to the edge) and the tunnel reads on. Nothing is
//! buffered beyond the channels.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::web::Bytes;
use edgehive_protocols::tunnel::{encode_tunnel, TunnelType};
use tokio::sync::{mpsc, watch};

use super::metrics::CloudStreamMetrics;
use crate::hive::locks::lock;

/// Frames a tunnel's writer holds for the edge before senders wait.
pub(crate) const TUNNEL_OUT_CAPACITY: usize = 64;
/// Data messages a stream's channel holds before the tunnel's reader waits.
pub(crate) const STREAM_CAPACITY: usize = 8;

/// What a tunnel's writer sends the edge.
#[derive(Debug)]
pub(crate) enum Out {
    /// A tunnel message, in a TEXT frame.
    Message(Bytes),
    /// A pong answering the edge's ping, with its payload.
    Pong(Bytes),
}

/// How a stream ended, as its HTTP response sees it.
#[derive(Debug, Default)]
pub(crate) struct StreamEnd {
    /// The node's tunnel closed under it, or the stream was cut (slow reader): the response
    /// is aborted instead of ended cleanly, so the client sees an error, not a short log.
    pub(crate) aborted: AtomicBool,
}

struct StreamSlot {
    data: mpsc::Sender<Bytes>,
    end: Arc<StreamEnd>,
}

/// One node's tunnel connection.
pub(crate) struct Tunnel {
    pub(crate) node: String,
    pub(crate) internal_ip: Option<IpAddr>,
    generation: u64,
    /// Tunnel messages (encoded) for the edge; the connection's writer drains it.
    out: mpsc::Sender<Out>,
    /// Set to end the connection (replaced, or the server stopping).
    shutdown: watch::Sender<bool>,
    streams: Mutex<HashMap<u64, StreamSlot>>,
    metrics: CloudStreamMetrics,
    /// Stream payload bytes sent towards the API server since this tunnel opened.
    bytes_to_apiserver: AtomicU64,
}

impl Tunnel {
    /// Queues a tunnel message for the edge, waiting for room.
    pub(crate) async fn send(&self, connect_id: u64, kind: TunnelType, data: &[u8]) -> bool {
        self.out
            .send(Out::Message(Bytes::from(encode_tunnel(
                connect_id, kind, data,
            ))))
            .await
            .is_ok()
    }

    /// Queues a tunnel message if there is room now (from a `Drop`, which cannot wait).
    pub(crate) fn try_send(&self, connect_id: u64, kind: TunnelType, data: &[u8]) -> bool {
        self.out
            .try_send(Out::Message(Bytes::from(encode_tunnel(
                connect_id, kind, data,
            ))))
            .is_ok()
    }

    /// Answers a ping if the writer has room (a pong is best effort).
    pub(crate) fn try_pong(&self, payload: Bytes) -> bool {
        self.out.try_send(Out::Pong(payload)).is_ok()
    }

    /// Opens a stream if the node has fewer than `limit`: its ID, channel and end state.
    pub(crate) fn open_stream(
        &self,
        connect_id: u64,
        limit: usize,
    ) -> Option<(mpsc::Receiver<Bytes>, Arc<StreamEnd>)> {
        let mut streams = lock(&self.streams);
        if streams.len() >= limit {
            return None;
        }
        let (data, receiver) = mpsc::channel(STREAM_CAPACITY);
        let end = Arc::new(StreamEnd::default());
        streams.insert(
            connect_id,
            StreamSlot {
                data,
                end: end.clone(),
            },
        );
        self.metrics.open_streams.inc();
        self.metrics.streams_opened.inc();
        Some((receiver, end))
    }

    /// The channel of stream `connect_id`, if it is open.
    pub(crate) fn stream(&self, connect_id: u64) -> Option<mpsc::Sender<Bytes>> {
        lock(&self.streams)
            .get(&connect_id)
            .map(|slot| slot.data.clone())
    }

    /// Closes stream `connect_id` (its response ends once it has sent what it holds;
    /// `aborted` makes it end with an error). False if it was not open (any more).
    pub(crate) fn close_stream(&self, connect_id: u64, reason: &str, aborted: bool) -> bool {
        let Some(slot) = lock(&self.streams).remove(&connect_id) else {
            return false;
        };
        if aborted {
            slot.end.aborted.store(true, Ordering::Release);
        }
        self.metrics.open_streams.dec();
        self.metrics.closed(reason);
        true
    }

    /// Streams open now.
    pub(crate) fn open_streams(&self) -> usize {
        lock(&self.streams).len()
    }

    /// Counts stream payload bytes delivered towards the API server.
    pub(crate) fn add_bytes_to_apiserver(&self, bytes: usize) {
        self.bytes_to_apiserver
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Stream payload bytes delivered towards the API server since this tunnel opened.
    pub(crate) fn bytes_to_apiserver(&self) -> u64 {
        self.bytes_to_apiserver.load(Ordering::Relaxed)
    }

    /// Ends every stream with an error (the tunnel is gone).
    fn abort_all(&self) {
        let slots: Vec<StreamSlot> = lock(&self.streams).drain().map(|(_, slot)| slot).collect();
        for slot in slots {
            slot.end.aborted.store(true, Ordering::Release);
            self.metrics.open_streams.dec();
            self.metrics.closed("tunnel_closed");
        }
    }
}

/// The tunnels of this process, by node, and the one connectID counter (KubeEdge numbers
/// streams over the whole process too).
pub(crate) struct Sessions {
    tunnels: Mutex<Registry>,
    next_connect_id: AtomicU64,
    next_generation: AtomicU64,
    pub(crate) metrics: CloudStreamMetrics,
}

/// The tunnels by node name, and the nodes by the internal IP their edge claimed (so a
/// request by address looks at those nodes only, never at every tunnel).
#[derive(Default)]
struct Registry {
    by_name: HashMap<String, Arc<Tunnel>>,
    by_ip: HashMap<IpAddr, HashSet<String>>,
}

impl Registry {
    fn forget_ip(&mut self, tunnel: &Tunnel) {
        if let Some(ip) = tunnel.internal_ip {
            if let Some(nodes) = self.by_ip.get_mut(&ip) {
                nodes.remove(&tunnel.node);
                if nodes.is_empty() {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }
}

/// What the connection that registered a tunnel keeps: its receivers.
pub(crate) struct Registered {
    pub(crate) tunnel: Arc<Tunnel>,
    pub(crate) out: mpsc::Receiver<Out>,
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl Sessions {
    pub(crate) fn new(metrics: CloudStreamMetrics) -> Self {
        Sessions {
            tunnels: Mutex::new(Registry::default()),
            next_connect_id: AtomicU64::new(1),
            next_generation: AtomicU64::new(1),
            metrics,
        }
    }

    /// Registers a new tunnel for `node`; one it had before is shut down and its streams
    /// end with an error (the newer connection wins, as with cloudcore, whose edge re-dials
    /// after a drop the old connection may not have noticed yet).
    pub(crate) fn register(&self, node: &str, internal_ip: Option<IpAddr>) -> Registered {
        let (out_sender, out) = mpsc::channel(TUNNEL_OUT_CAPACITY);
        let (shutdown_sender, shutdown) = watch::channel(false);
        let tunnel = Arc::new(Tunnel {
            node: node.to_owned(),
            internal_ip,
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            out: out_sender,
            shutdown: shutdown_sender,
            streams: Mutex::new(HashMap::new()),
            metrics: self.metrics.clone(),
            bytes_to_apiserver: AtomicU64::new(0),
        });
        let previous = {
            let mut registry = lock(&self.tunnels);
            let previous = registry.by_name.insert(node.to_owned(), tunnel.clone());
            if let Some(previous) = &previous {
                registry.forget_ip(previous);
            }
            if let Some(ip) = internal_ip {
                registry
                    .by_ip
                    .entry(ip)
                    .or_default()
                    .insert(node.to_owned());
            }
            previous
        };
        match previous {
            Some(previous) => {
                self.metrics.tunnels_replaced.inc();
                previous.shutdown.send_replace(true);
                previous.abort_all();
            }
            None => {
                self.metrics.tunnels.inc();
            }
        }
        Registered {
            tunnel,
            out,
            shutdown,
        }
    }

    /// Forgets `tunnel` (its connection ended) unless a newer one replaced it; its streams
    /// end with an error.
    pub(crate) fn unregister(&self, tunnel: &Tunnel) {
        let mut registry = lock(&self.tunnels);
        if registry
            .by_name
            .get(&tunnel.node)
            .is_some_and(|current| current.generation == tunnel.generation)
        {
            registry.by_name.remove(&tunnel.node);
            registry.forget_ip(tunnel);
            self.metrics.tunnels.dec();
        }
        drop(registry);
        // The writer sends a close frame now, not when the last request lets go of it.
        tunnel.shutdown.send_replace(true);
        tunnel.abort_all();
    }

    /// The tunnel of node `name`.
    pub(crate) fn by_name(&self, name: &str) -> Option<Arc<Tunnel>> {
        lock(&self.tunnels).by_name.get(name).cloned()
    }

    /// The tunnel whose node claimed internal IP `ip`, when exactly one did (the claim is a
    /// header the edge sends; two nodes claiming one address get neither).
    pub(crate) fn by_ip(&self, ip: IpAddr) -> Result<Arc<Tunnel>, usize> {
        let registry = lock(&self.tunnels);
        let nodes = registry.by_ip.get(&ip).map_or(0, HashSet::len);
        if nodes != 1 {
            return Err(nodes);
        }
        registry
            .by_ip
            .get(&ip)
            .and_then(|nodes| nodes.iter().next())
            .and_then(|node| registry.by_name.get(node))
            .cloned()
            .ok_or(0)
    }

    /// Every open tunnel, in no order (a snapshot; the registry's lock is not held after).
    pub(crate) fn tunnels(&self) -> Vec<Arc<Tunnel>> {
        lock(&self.tunnels).by_name.values().cloned().collect()
    }

    /// A fresh connectID.
    pub(crate) fn next_connect_id(&self) -> u64 {
        self.next_connect_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Shuts every tunnel down (the server is stopping).
    pub(crate) fn shutdown_all(&self) {
        let tunnels: Vec<Arc<Tunnel>> = {
            let mut registry = lock(&self.tunnels);
            registry.by_ip.clear();
            registry.by_name.drain().map(|(_, tunnel)| tunnel).collect()
        };
        for tunnel in tunnels {
            self.metrics.tunnels.dec();
            tunnel.shutdown.send_replace(true);
            tunnel.abort_all();
        }
    }
}
