//! The product binary, `edgehive cloud`, as the tool's target: found beside the tool, started,
//! its banner read, stopped.
//!
//! Cargo gives a test the path of its own package's binaries only, so the cloud's is taken from
//! the same folder as the tool's. `cargo test --workspace` (CI, the README) and
//! `cargo build --workspace` build it there; a missing or stale one fails the test with the
//! command that builds it, rather than testing an old cloud.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The tool under test.
pub const TOOL: &str = env!("CARGO_BIN_EXE_edgehive-loadtest");

/// The `edgehive` binary beside [`TOOL`], checked to be newer than every source file it was
/// built from when cargo's dep-info file beside it lists them.
pub fn cloud_binary() -> PathBuf {
    let binary = Path::new(TOOL).with_file_name("edgehive");
    let rebuild = "build it with `cargo build -p edgehive` (`cargo test --workspace` does)";
    let built = std::fs::metadata(&binary)
        .and_then(|meta| meta.modified())
        .unwrap_or_else(|_| panic!("no cloud binary at {}: {rebuild}", binary.display()));
    // `cargo build` writes the dep-info beside the binary; `cargo test` builds the binary
    // fresh for the test run and may not: then there is nothing stale to check.
    let Ok(dep_info) = std::fs::read_to_string(binary.with_file_name("edgehive.d")) else {
        return binary;
    };
    let sources = dep_info
        .lines()
        .next()
        .and_then(|line| line.split_once(": "))
        .map_or("", |(_, sources)| sources);
    for source in sources.split_whitespace() {
        let changed = std::fs::metadata(source).and_then(|meta| meta.modified());
        assert!(
            changed.is_ok_and(|changed| changed <= built),
            "{} is older than {source}: {rebuild}",
            binary.display()
        );
    }
    binary
}

/// A running process; killed (SIGKILL) when dropped, so a failing test leaves nothing behind.
pub struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
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

/// The text in `banner` between `marker` and the next `end`, e.g. the WebSocket address in
/// "edgehive cloud: WebSocket on 127.0.0.1:PORT, admin on …".
fn banner_field<'a>(banner: &'a str, marker: &str, end: char) -> &'a str {
    banner
        .split(marker)
        .nth(1)
        .and_then(|rest| rest.split(end).next())
        .unwrap_or_else(|| panic!("no {marker:?} in banner {banner:?}"))
        .trim()
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

/// Runs `edgehive cloud ARGS` and reads its banner, the first line it prints.
fn spawn_cloud(args: &[&std::ffi::OsStr]) -> (Process, String) {
    let mut child = Command::new(cloud_binary())
        .arg("cloud")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let process = Process(child);
    let mut banner = String::new();
    BufReader::new(stdout).read_line(&mut banner).unwrap();
    assert!(!banner.is_empty(), "edgehive cloud exited without a banner");
    (process, banner)
}

/// Starts `edgehive cloud` on loopback over plain `ws://` (explicitly insecure), WebSocket and
/// admin endpoint on free ports, its config in `dir/cloud.yaml` and its cluster in
/// `dir/cluster.db`, seeded from the manifests in `manifests`.
pub fn start_plain_cloud(dir: &Path, manifests: &Path) -> PlainCloud {
    let config = dir.join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             embeddedCluster:\n  database: \"{}\"\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n      insecurePlaintext: true\n",
            dir.join("cluster.db").display()
        ),
    )
    .unwrap();
    let (process, banner) = spawn_cloud(&[
        "--config".as_ref(),
        config.as_os_str(),
        "--manifests".as_ref(),
        manifests.as_os_str(),
    ]);
    PlainCloud {
        process,
        websocket: banner_field(&banner, "WebSocket on ", ',').to_owned(),
        admin: banner_field(&banner, "admin on http://", ' ').to_owned(),
    }
}

/// `GET path` from the admin endpoint at `addr` (blocking HTTP/1.0 on loopback): its JSON body,
/// after checking the status is 200.
pub fn http_json(addr: &str, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "GET {path}: {response}"
    );
    serde_json::from_str(body).unwrap()
}

/// A cloud process with mutual TLS and CloudStream, and where it listens.
pub struct StreamCloud {
    /// The process (killed when dropped).
    pub process: Process,
    /// The cloud CA's certificate and key files (written by the cloud at its start).
    pub ca: (PathBuf, PathBuf),
    /// `host:port` of the tunnel server.
    pub tunnel: String,
    /// `host:port` of the stream server.
    pub stream: String,
}

/// Starts `edgehive cloud` on loopback with mutual TLS and CloudStream on free ports, its files
/// under `dir`; the API server's client CA is `stream_ca` (a PEM certificate file).
pub fn start_stream_cloud(dir: &Path, stream_ca: &Path) -> StreamCloud {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("cloud.yaml");
    let ca = (dir.join("ca/rootCA.crt"), dir.join("ca/rootCA.key"));
    std::fs::write(
        &config,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             embeddedCluster:\n  database: \"{db}\"\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n\
             \x20   https:\n      address: 127.0.0.1\n      port: 0\n\
             \x20   tlsCAFile: \"{ca}\"\n    tlsCAKeyFile: \"{key}\"\n\
             \x20   tlsCertFile: \"{dir}/certs/server.crt\"\n    tlsPrivateKeyFile: \"{dir}/certs/server.key\"\n\
             \x20 cloudStream:\n    enable: true\n    address: 127.0.0.1\n    streamPort: 0\n    tunnelPort: 0\n\
             \x20   tlsStreamCAFile: \"{stream_ca}\"\n",
            db = dir.join("cluster.db").display(),
            ca = ca.0.display(),
            key = ca.1.display(),
            dir = dir.display(),
            stream_ca = stream_ca.display(),
        ),
    )
    .unwrap();
    let (process, banner) = spawn_cloud(&["--config".as_ref(), config.as_os_str()]);
    StreamCloud {
        process,
        ca,
        tunnel: banner_field(&banner, "stream tunnels on ", ',').to_owned(),
        stream: banner_field(&banner, "streams on https://", '\n').to_owned(),
    }
}

/// Runs `edgehive ARGS` (its standard error to `log`) and reads its banner, the first line it
/// prints.
pub fn spawn_edgehive(args: &[&str], log: &Path) -> (Process, String) {
    let mut child = Command::new(cloud_binary())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let process = Process(child);
    let mut banner = String::new();
    BufReader::new(stdout).read_line(&mut banner).unwrap();
    assert!(
        !banner.is_empty(),
        "edgehive {args:?} exited without a banner; its log: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    (process, banner)
}

/// The stand-in API server (`edgehive cluster`) on a free port, its data under `dir`; returns
/// the process and the kubeconfig it wrote.
pub fn start_standin(dir: &Path) -> (Process, PathBuf) {
    let kubeconfig = dir.join("kubeconfig");
    let (process, _) = spawn_edgehive(
        &[
            "cluster",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("standin").to_str().unwrap(),
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
        ],
        &dir.join("standin.log"),
    );
    (process, kubeconfig)
}

/// `edgehive cloud` on the API server of `kubeconfig` (`kubeAPIConfig`), mutual TLS on a free
/// port with a CA it makes (files under `dir/pki`, none at the start) and publishes to
/// `kubeedge/casecret` as cloudcore does; returns the process and where edges connect.
pub fn start_cluster_cloud(dir: &Path, kubeconfig: &Path) -> (Process, String) {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "kubeAPIConfig:\n  kubeConfig: {kubeconfig}\n\
             commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n\
             \x20   https:\n      address: 127.0.0.1\n      port: 0\n\
             \x20   tlsCAFile: {pki}/ca.crt\n    tlsCAKeyFile: {pki}/ca.key\n\
             \x20   tlsCertFile: {pki}/server.crt\n    tlsPrivateKeyFile: {pki}/server.key\n",
            kubeconfig = kubeconfig.display(),
            pki = dir.join("pki").display(),
        ),
    )
    .unwrap();
    let (process, banner) = spawn_edgehive(
        &["cloud", "--config", config.to_str().unwrap()],
        &dir.join("cloud.log"),
    );
    (
        process,
        banner_field(&banner, "WebSocket on ", ',').to_owned(),
    )
}
