//! The raw HTTP/1.1 EdgeStream speaks to a kubelet API for `kubectl exec` and `attach`: the
//! request head it writes on a plain TCP connection, the checks a connect's request passes
//! first (so nothing the cloud sends can add a line to that head), and the reading of the
//! kubelet API's answer: its head (`101 Switching Protocols`, after which the socket carries
//! the stream's bytes both ways), or a non-101 answer whose body's end is found from its
//! `Content-Length` or chunked framing, so the stream ends with the answer even when the
//! kubelet API keeps the connection open.

/// The longest response head accepted from the kubelet API.
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Where a raw connection to the kubelet API goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `host:port` to dial.
    pub address: String,
    /// The `Host` header: the endpoint's authority as configured.
    pub host: String,
    /// A path prefix of the endpoint (without its trailing `/`; usually empty).
    pub prefix: String,
}

impl Endpoint {
    /// Parses `http://HOST[:PORT][/PREFIX]`; any other scheme is refused with a message
    /// naming the setting.
    pub(crate) fn parse(endpoint: &str) -> Result<Endpoint, String> {
        let Some(rest) = endpoint.strip_prefix("http://") else {
            return Err(format!(
                "the kubelet API endpoint {endpoint:?} is not http://HOST:PORT (modules.edgeStream.kubeletEndpoint; only plain HTTP is supported)"
            ));
        };
        let (authority, prefix) = match rest.find('/') {
            Some(slash) => (&rest[..slash], rest[slash..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(format!(
                "the kubelet API endpoint {endpoint:?} has no usable HOST:PORT (modules.edgeStream.kubeletEndpoint)"
            ));
        }
        let has_port = authority
            .rsplit_once(':')
            .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
            && !authority.ends_with(']');
        let address = if has_port {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok(Endpoint {
            address,
            host: authority.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

/// Whether a connect's path may be replayed: `/`-rooted, only the characters of Kubernetes
/// names and paths (`A-Z a-z 0-9 - . _ ~ / :`), no `..` segment.
pub(crate) fn valid_path(path: &str) -> bool {
    path.starts_with('/')
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~/:".contains(&b))
        && !path.split('/').any(|segment| segment == "..")
}

/// Whether a connect's (already escaped) query may be replayed: visible ASCII, no `#`.
pub(crate) fn valid_query(query: &str) -> bool {
    query.bytes().all(|b| b.is_ascii_graphic() && b != b'#')
}

/// Whether a header may be replayed: a token name and a value without CR, LF or NUL.
pub(crate) fn valid_header(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
}

/// The request head written to the kubelet API: the method, path and query, `Host`, then the
/// API server's headers as the cloud sent them (its own `Host` left out).
pub(crate) fn request_head<'a>(
    method: &str,
    target: &str,
    host: &str,
    headers: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<u8> {
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n");
    for (name, value) in headers {
        if !name.eq_ignore_ascii_case("host") {
            head.push_str(name);
            head.push_str(": ");
            head.push_str(value);
            head.push_str("\r\n");
        }
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Why the kubelet API's answer cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    /// The head is longer than [`MAX_RESPONSE_HEAD`].
    #[error("the kubelet API's response head is over {MAX_RESPONSE_HEAD} bytes")]
    TooLong,
    /// The first line is not `HTTP/1.x NNN ...`.
    #[error("the kubelet API did not answer HTTP/1.1: {0:?}")]
    NotHttp(String),
}

/// A response head read from the kubelet API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponseHead {
    /// Its length in bytes (up to and including the empty line).
    pub len: usize,
    /// The status code.
    pub status: u16,
    /// How the body that follows ends.
    pub body: Body,
}

/// Parses the response head at the start of `buf`; `Ok(None)`: not complete yet.
pub(crate) fn parse_head(buf: &[u8]) -> Result<Option<ResponseHead>, HeadError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() > MAX_RESPONSE_HEAD {
            Err(HeadError::TooLong)
        } else {
            Ok(None)
        };
    };
    if end > MAX_RESPONSE_HEAD {
        return Err(HeadError::TooLong);
    }
    let text = String::from_utf8_lossy(&buf[..end]);
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let status = first
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .filter(|code| (100..600).contains(code))
        .ok_or_else(|| HeadError::NotHttp(first.chars().take(80).collect()))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<u64>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    let body = match status {
        101 => Body::Upgraded,
        100..=199 | 204 | 304 => Body::Length(0),
        _ if chunked => Body::Chunked(Chunked::default()),
        _ => length.map_or(Body::UntilClose, Body::Length),
    };
    Ok(Some(ResponseHead {
        len: end + 4,
        status,
        body,
    }))
}

/// How a response's body ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body {
    /// `101 Switching Protocols`: no HTTP body; the socket carries the stream from here.
    Upgraded,
    /// This many bytes are left.
    Length(u64),
    /// Chunked framing.
    Chunked(Chunked),
    /// Until the kubelet API closes the connection.
    UntilClose,
}

impl Body {
    /// Feeds the next bytes of the body; `Some(n)`: the body ended after `n` of them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        match self {
            Body::Upgraded => Some(0),
            Body::Length(left) => {
                let len = bytes.len() as u64;
                if len >= *left {
                    let end = usize::try_from(*left).unwrap_or(bytes.len());
                    *left = 0;
                    Some(end)
                } else {
                    *left -= len;
                    None
                }
            }
            Body::Chunked(chunked) => chunked.feed(bytes),
            Body::UntilClose => None,
        }
    }

    /// Whether the body is complete before any byte of it is read (an empty one).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Body::Length(0) | Body::Upgraded)
    }
}

/// Where a chunked body's reader stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Chunked {
    /// In a chunk-size line: the size so far, and whether an extension (`;...`) started.
    Size(u64, bool),
    /// This many bytes of chunk data are left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk; `true`: the current line is empty so far.
    Trailer(bool),
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked::Size(0, false)
    }
}

impl Chunked {
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut index = 0;
        while index < bytes.len() {
            let byte = bytes[index];
            match self {
                Chunked::Data(left) => {
                    let take =
                        (bytes.len() - index).min(usize::try_from(*left).unwrap_or(usize::MAX));
                    index += take;
                    *left -= take as u64;
                    if *left == 0 {
                        *self = Chunked::DataEnd;
                    }
                    continue;
                }
                Chunked::Size(size, extension) => match byte {
                    b'\n' if *size == 0 => *self = Chunked::Trailer(true),
                    b'\n' => *self = Chunked::Data(*size),
                    b'\r' => {}
                    b';' => *extension = true,
                    _ if *extension => {}
                    _ => {
                        let next = (byte as char)
                            .to_digit(16)
                            .and_then(|digit| size.checked_mul(16)?.checked_add(u64::from(digit)));
                        match next {
                            Some(next) => *size = next,
                            // Not chunked framing: the body ends here.
                            None => return Some(index),
                        }
                    }
                },
                Chunked::DataEnd => {
                    if byte == b'\n' {
                        *self = Chunked::default();
                    }
                }
                Chunked::Trailer(empty) => match byte {
                    b'\n' if *empty => return Some(index + 1),
                    b'\n' => *self = Chunked::Trailer(true),
                    b'\r' => {}
                    _ => *self = Chunked::Trailer(false),
                },
            }
            index += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_plain_http_host_and_port() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:10350").unwrap(),
            Endpoint {
                address: "127.0.0.1:10350".into(),
                host: "127.0.0.1:10350".into(),
                prefix: String::new()
            }
        );
        let bare = Endpoint::parse("http://runtime/kubelet/").unwrap();
        assert_eq!(
            (bare.address.as_str(), bare.prefix.as_str()),
            ("runtime:80", "/kubelet")
        );
        assert_eq!(Endpoint::parse("http://[::1]").unwrap().address, "[::1]:80");
        assert_eq!(
            Endpoint::parse("http://[::1]:7").unwrap().address,
            "[::1]:7"
        );
        let error = Endpoint::parse("https://127.0.0.1:10250").unwrap_err();
        assert!(
            error.contains("modules.edgeStream.kubeletEndpoint"),
            "{error}"
        );
        assert!(Endpoint::parse("http://user@host:1").is_err());
    }

    #[test]
    fn nothing_the_cloud_sends_can_add_a_line_to_the_request_head() {
        assert!(valid_path("/exec/default/printer/main"));
        assert!(valid_path("/metrics/cadvisor"));
        for path in [
            "/exec/../x",
            "/exec/a b/c",
            "/exec/a\r\nX: y",
            "exec/a",
            "/exec/%2e%2e",
            "/exec/a?b",
        ] {
            assert!(!valid_path(path), "{path:?}");
        }
        assert!(valid_query(
            "command=sh&command=-c&command=echo+out%3B+exit+3&error=1&output=1"
        ));
        assert!(!valid_query("a=b c"));
        assert!(!valid_query("a=b\r\nX: y"));
        assert!(!valid_query("a#b"));
        assert!(valid_header(
            "X-Stream-Protocol-Version",
            "v4.channel.k8s.io"
        ));
        assert!(!valid_header("X-A", "v\r\nInjected: 1"));
        assert!(!valid_header("X A", "v"));
        assert!(!valid_header("", "v"));
    }

    #[test]
    fn the_request_head_is_the_api_servers_request_with_our_host() {
        let head = request_head(
            "POST",
            "/exec/default/p/c?command=cat&input=1",
            "127.0.0.1:10350",
            [
                ("Connection", "Upgrade"),
                ("Host", "vm:10351"),
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v5.channel.k8s.io"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
            ]
            .into_iter(),
        );
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /exec/default/p/c?command=cat&input=1 HTTP/1.1\r\nHost: 127.0.0.1:10350\r\n\
             Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v5.channel.k8s.io\r\n\
             X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
        );
    }

    #[test]
    fn response_heads_tell_an_upgrade_from_an_answer_with_a_body() {
        let upgrade = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n\x80\x03";
        let head = parse_head(upgrade).unwrap().unwrap();
        assert_eq!((head.status, head.len), (101, upgrade.len() - 2));
        assert_eq!(head.body, Body::Upgraded);
        assert_eq!(parse_head(&upgrade[..20]).unwrap(), None);
        let missing = parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 19\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((missing.status, missing.body), (404, Body::Length(19)));
        let chunked = parse_head(b"HTTP/1.1 500 x\r\ntransfer-encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(chunked.body, Body::Chunked(Chunked::default()));
        let close = parse_head(b"HTTP/1.0 400 Bad\r\n\r\n").unwrap().unwrap();
        assert_eq!(close.body, Body::UntilClose);
        assert!(matches!(
            parse_head(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Err(HeadError::NotHttp(_))
        ));
        assert_eq!(
            parse_head(&vec![b'a'; MAX_RESPONSE_HEAD + 1]),
            Err(HeadError::TooLong)
        );
    }

    #[test]
    fn a_body_ends_where_its_framing_says() {
        let mut body = Body::Length(5);
        assert_eq!(body.feed(b"abc"), None);
        assert_eq!(body.feed(b"defgh"), Some(2));
        let wire = b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        // Fed whole, and fed a byte at a time.
        let mut body = Body::Chunked(Chunked::default());
        assert_eq!(body.feed(wire), Some(wire.len() - 4));
        let mut body = Body::Chunked(Chunked::default());
        let mut end = None;
        for (index, byte) in wire.iter().enumerate() {
            if let Some(n) = body.feed(std::slice::from_ref(byte)) {
                end = Some(index + n);
                break;
            }
        }
        assert_eq!(end, Some(wire.len() - 4));
        let mut body = Body::Chunked(Chunked::default());
        assert_eq!(body.feed(b"zz\r\n"), Some(0));
        assert_eq!(Body::UntilClose.feed(b"anything"), None);
    }
}
