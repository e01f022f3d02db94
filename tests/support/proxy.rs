//! A TCP proxy between an edge and the cloud that stages network faults for real: it cuts
//! every connection, drops or delays what the edge sends, or refuses connections.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What happens to the bytes the edge sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// Forwarded at once.
    Pass,
    /// Read and thrown away (the cloud hears nothing: lost ACKs and keepalives).
    Drop,
    /// Forwarded this much later (a slow link).
    Delay(Duration),
}

struct Shared {
    upstream: SocketAddr,
    mode: Mutex<Upstream>,
    live: Mutex<Vec<TcpStream>>,
    refuse: AtomicBool,
    accepted: AtomicU64,
}

/// The proxy; it runs until the test process ends.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream: upstream.parse().unwrap(),
            mode: Mutex::new(Upstream::Pass),
            live: Mutex::new(Vec::new()),
            refuse: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
        });
        let accept = shared.clone();
        thread::spawn(move || {
            for edge in listener.incoming().flatten() {
                if accept.refuse.load(Ordering::Acquire) {
                    let _ = edge.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(cloud) = TcpStream::connect(accept.upstream) else {
                    let _ = edge.shutdown(Shutdown::Both);
                    continue;
                };
                accept.accepted.fetch_add(1, Ordering::AcqRel);
                let _ = edge.set_nodelay(true);
                let _ = cloud.set_nodelay(true);
                {
                    let mut live = accept.live.lock().unwrap();
                    live.retain(|s| s.peer_addr().is_ok());
                    live.extend([edge.try_clone().unwrap(), cloud.try_clone().unwrap()]);
                }
                pump_up(
                    edge.try_clone().unwrap(),
                    cloud.try_clone().unwrap(),
                    accept.clone(),
                );
                pump(cloud, edge);
            }
        });
        Proxy { addr, shared }
    }

    /// Where edges dial (`host:port`).
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Sets what happens to the edge's bytes from now on.
    pub fn set_upstream(&self, mode: Upstream) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Refuses (closes at once) new connections while `on`.
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::Release);
    }

    /// Cuts every open connection (both sides see the TCP connection end, no close frame).
    pub fn cut(&self) {
        for stream in self.shared.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Connections forwarded so far.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Acquire)
    }
}

/// cloud -> edge, as it comes.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// edge -> cloud, through the fault in force when each chunk is read.
fn pump_up(mut from: TcpStream, to: TcpStream, shared: Arc<Shared>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut writer = to.try_clone().unwrap();
    thread::spawn(move || {
        for (due, bytes) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            if writer.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = writer.shutdown(Shutdown::Both);
    });
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mode = *shared.mode.lock().unwrap();
            let due = match mode {
                Upstream::Pass => Instant::now(),
                Upstream::Drop => continue,
                Upstream::Delay(delay) => Instant::now() + delay,
            };
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
