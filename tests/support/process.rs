//! The `edgehive` binary as a child process: started, its banner read, stopped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_edgehive");

/// A running `edgehive`; killed (SIGKILL) when dropped, so a failing test leaves nothing behind.
pub struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// A child started elsewhere, killed when dropped.
    pub fn from_child(child: Child) -> Process {
        Process(child)
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Sends SIGTERM and waits (10 s at most) for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let pid = self.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "process ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `edgehive ARGS` and returns it with its banner (the first stdout line, which says
/// where it listens).
pub fn spawn(args: &[&str]) -> (Process, String) {
    spawn_to(args, Stdio::null(), String::new)
}

/// [`spawn`], with the process's log (standard error) written to the file `log`.
pub fn spawn_logged(args: &[&str], log: &std::path::Path) -> (Process, String) {
    spawn_to(args, std::fs::File::create(log).unwrap().into(), || {
        format!(
            "; its log: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    })
}

/// [`spawn`] with standard error to `stderr`; `why_silent` adds to the failure when the
/// process prints no banner.
fn spawn_to(
    args: &[&str],
    stderr: Stdio,
    why_silent: impl FnOnce() -> String,
) -> (Process, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let process = Process(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(
        !line.is_empty(),
        "edgehive {args:?} exited without a banner{}",
        why_silent()
    );
    (process, line)
}

/// The text in `banner` between `marker` and the next `end`, e.g. the WebSocket address in
/// "edgehive cloud: WebSocket on 127.0.0.1:PORT, admin on …".
pub fn banner_field<'a>(banner: &'a str, marker: &str, end: char) -> &'a str {
    banner
        .split(marker)
        .nth(1)
        .and_then(|rest| rest.split(end).next())
        .unwrap_or_else(|| panic!("no {marker:?} in banner {banner:?}"))
        .trim()
}

/// `cloud.yaml` for a cloud on loopback over plain `ws://` (explicitly insecure), WebSocket on
/// `port` (0: a free one), the admin endpoint on a free port, and the embedded cluster in
/// `database` (`None`: in memory).
pub fn plain_cloud_yaml(port: u16, database: Option<&std::path::Path>) -> String {
    let database = database
        .map(|path| path.display().to_string())
        .unwrap_or_default();
    format!(
        "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
         embeddedCluster:\n  database: \"{database}\"\n\
         modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: {port}\n      insecurePlaintext: true\n"
    )
}

/// `edge.yaml` for edge `node` of the plain-`ws://` cloud at `websocket`, storing in `db`,
/// sending a keepalive every `heartbeat` seconds, admin endpoint on a free port requiring
/// [`super::ADMIN_TOKEN`] (its file written beside `db`).
pub fn plain_edge_yaml(
    node: &str,
    websocket: &str,
    db: &std::path::Path,
    heartbeat: u64,
) -> String {
    let token = super::admin_token_file(db.parent().unwrap());
    format!(
        "database:\n  dataSource: {}\nadmin:\n  bindAddress: 127.0.0.1:0\n  tokenFile: {}\n\
         modules:\n  edged:\n    hostnameOverride: {node}\n  edgeHub:\n    heartbeat: {heartbeat}\n    websocket:\n      server: {websocket}\n      insecurePlaintext: true\n",
        db.display(),
        token.display()
    )
}

/// A plain-`ws://` cloud process and where it listens.
pub struct PlainCloud {
    /// The process (killed when dropped).
    pub process: Process,
    /// `host:port` edges connect to.
    pub websocket: String,
    /// `host:port` of its admin endpoint.
    pub admin: String,
}

/// Starts a plain-`ws://` cloud process (config written to `dir/cloud.yaml`, WebSocket on
/// `port`, 0 for a free one, its cluster kept in `dir/cluster.db`) seeded from the manifests
/// in `manifests`.
pub fn start_plain_cloud(
    dir: &std::path::Path,
    manifests: &std::path::Path,
    port: u16,
) -> PlainCloud {
    let config = dir.join("cloud.yaml");
    std::fs::write(
        &config,
        plain_cloud_yaml(port, Some(&dir.join("cluster.db"))),
    )
    .unwrap();
    let (process, banner) = spawn(&[
        "cloud",
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
    ]);
    PlainCloud {
        process,
        websocket: banner_field(&banner, "WebSocket on ", ',').to_owned(),
        admin: banner_field(&banner, "admin on http://", ' ').to_owned(),
    }
}

/// [`start_plain_cloud`], returning the process and the `host:port` edges connect to.
pub fn spawn_plain_cloud(
    dir: &std::path::Path,
    manifests: &std::path::Path,
    port: u16,
) -> (Process, String) {
    let cloud = start_plain_cloud(dir, manifests, port);
    (cloud.process, cloud.websocket)
}

/// One HTTP/1.0 request on loopback (blocking, with [`super::ADMIN_TOKEN`]): status and body,
/// `None` if unreachable.
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        super::ADMIN_TOKEN,
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// Polls `check` every 50 ms until it holds, failing the test after `within`.
pub fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
