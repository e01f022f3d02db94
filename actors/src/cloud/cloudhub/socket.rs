//! A session's WebSocket over the connection itself, after the HTTP upgrade: frames are read
//! and written here with actix-http's WebSocket codec, in buffers sized to what is in flight.
//!
//! actix-http's HTTP/1 dispatcher (and actix-ws on top of it) keeps an 8 KiB read buffer and
//! an 8 KiB write buffer, a channel and the connection's task for as long as a WebSocket is
//! open; an idle edge needs none of it. Here the reader's buffer is empty between frames (it
//! grows to hold a frame that arrives in pieces, up to the frame limit, and is let go once
//! the frame is decoded) and the writer's buffer holds one batch of frames at a time.
//!
//! What the session sees is what actix-ws's `aggregate_continuations` stream gave it: the
//! same [`AggregatedMessage`]s and the same [`ProtocolError`]s (oversized frames, reserved
//! bits, bad opcodes and masking, text that is not UTF-8, messages in continuation frames
//! larger than the frame limit), so the session's answers (close codes, counters) are the
//! same.

use std::io;
use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_codec::{Decoder, Encoder};
use actix_http::ws::{Codec, Frame, Item, Message, ProtocolError};
use actix_web::web::{Bytes, BytesMut};
use actix_ws::{AggregatedMessage, CloseReason};
use bytestring::ByteString;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::oneshot;

use super::link::Outgoing;
use super::queue::QueueReceiver;

/// Bytes asked of the connection per read (on the stack, copied into the frame buffer).
const READ_CHUNK: usize = 2048;
/// A buffer larger than this is let go when it empties instead of kept for the next frame.
const KEEP_BUFFER: usize = 1024;
/// RFC 6455 §5.5: control frame payloads are at most 125 bytes, so a close reason at most 123.
const MAX_CONTROL_PAYLOAD: usize = 125;
const MAX_CLOSE_REASON: usize = MAX_CONTROL_PAYLOAD - 2;

/// The two halves of an upgraded connection, for a session.
pub(crate) struct SocketLink {
    pub(crate) reader: SocketReader,
    pub(crate) writer: SocketWriter,
}

impl SocketLink {
    /// Splits `io`; `leftover` is what the client sent after its upgrade request and the
    /// HTTP layer had already read. Frames up to `max_frame_bytes` (a whole message in
    /// continuation frames too) are accepted.
    pub(crate) fn new<T>(io: T, leftover: BytesMut, max_frame_bytes: usize) -> Self
    where
        T: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        let (read, write) = tokio::io::split(io);
        SocketLink {
            reader: SocketReader {
                io: Box::new(read),
                buf: leftover,
                codec: Codec::new().max_size(max_frame_bytes),
                max_size: max_frame_bytes,
                parts: Vec::new(),
                size: 0,
                text: false,
                overflowed: false,
                eof: false,
                done: false,
            },
            writer: SocketWriter {
                io: Box::new(write),
                abort: None,
            },
        }
    }
}

trait ReadIo: AsyncRead + Unpin {}
impl<T: AsyncRead + Unpin> ReadIo for T {}

trait WriteIo: AsyncWrite + Unpin {}
impl<T: AsyncWrite + Unpin> WriteIo for T {}

/// The frames an edge sends, as a stream of messages (see the [module docs](self)).
pub(crate) struct SocketReader {
    io: Box<dyn ReadIo>,
    buf: BytesMut,
    codec: Codec,
    max_size: usize,
    /// The message in continuation frames so far (as actix-ws's `AggregatedMessageStream`).
    parts: Vec<Bytes>,
    size: usize,
    text: bool,
    /// Past the limit: the rest of that message is skipped (the session closes anyway).
    overflowed: bool,
    eof: bool,
    /// An error was given out or the connection ended: nothing more comes.
    done: bool,
}

fn continuation_too_large() -> ProtocolError {
    ProtocolError::Io(io::Error::other("Exceeded maximum continuation size"))
}

fn text(bytes: Bytes) -> Result<AggregatedMessage, ProtocolError> {
    ByteString::try_from(bytes)
        .map(AggregatedMessage::Text)
        .map_err(|err| ProtocolError::Io(io::Error::new(io::ErrorKind::InvalidData, err)))
}

impl SocketReader {
    /// A decoded frame as a message, or `None` while a message in pieces is incomplete.
    fn aggregate(&mut self, frame: Frame) -> Option<Result<AggregatedMessage, ProtocolError>> {
        let item = match frame {
            Frame::Text(bytes) => return Some(text(bytes)),
            Frame::Binary(bytes) => return Some(Ok(AggregatedMessage::Binary(bytes))),
            Frame::Ping(bytes) => return Some(Ok(AggregatedMessage::Ping(bytes))),
            Frame::Pong(bytes) => return Some(Ok(AggregatedMessage::Pong(bytes))),
            Frame::Close(reason) => return Some(Ok(AggregatedMessage::Close(reason))),
            Frame::Continuation(item) => item,
        };
        let (bytes, last) = match item {
            Item::FirstText(bytes) => {
                if !self.overflowed {
                    self.text = true;
                }
                (bytes, false)
            }
            Item::FirstBinary(bytes) => {
                if !self.overflowed {
                    self.text = false;
                }
                (bytes, false)
            }
            Item::Continue(bytes) => (bytes, false),
            Item::Last(bytes) => (bytes, true),
        };
        if self.overflowed {
            if last {
                self.overflowed = false;
                self.parts = Vec::new();
                self.size = 0;
            }
            return None;
        }
        self.size += bytes.len();
        if self.size > self.max_size {
            self.parts = Vec::new();
            self.size = 0;
            // The rest of the message is skipped; a last frame ends it here.
            self.overflowed = !last;
            return Some(Err(continuation_too_large()));
        }
        if !bytes.is_empty() {
            self.parts.push(bytes);
        }
        if !last {
            return None;
        }
        let parts = mem::take(&mut self.parts);
        let mut whole = BytesMut::with_capacity(self.size);
        self.size = 0;
        for part in parts {
            whole.extend_from_slice(&part);
        }
        let whole = whole.freeze();
        Some(if self.text {
            text(whole)
        } else {
            Ok(AggregatedMessage::Binary(whole))
        })
    }

    /// Lets go of a large buffer once it is empty (an idle connection holds no buffer).
    fn shrink(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > KEEP_BUFFER {
            self.buf = BytesMut::new();
        }
    }
}

impl Stream for SocketReader {
    type Item = Result<AggregatedMessage, ProtocolError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            // A frame that announces more than may be sent is refused from its header: its
            // payload is never waited for or buffered.
            if let Some(length) = announced_over(&this.buf, this.max_size) {
                tracing::debug!(
                    length,
                    max = this.max_size,
                    "frame header announces too much"
                );
                this.done = true;
                return Poll::Ready(Some(Err(ProtocolError::Overflow)));
            }
            // Whole frames first: what is buffered, then what the connection has.
            match this.codec.decode(&mut this.buf) {
                Ok(Some(frame)) => {
                    this.shrink();
                    if let Some(message) = this.aggregate(frame) {
                        this.done = message.is_err();
                        return Poll::Ready(Some(message));
                    }
                    continue;
                }
                Ok(None) => {}
                Err(err) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(err)));
                }
            }
            this.shrink();
            if this.eof {
                this.done = true;
                return Poll::Ready(None);
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    let filled = read.filled();
                    if filled.is_empty() {
                        this.eof = true;
                    } else {
                        this.buf.extend_from_slice(filled);
                    }
                }
                // As actix-ws reported a failed connection: not a protocol violation.
                Poll::Ready(Err(err)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(ProtocolError::Io(io::Error::other(err)))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The payload length the frame header at the start of `buf` announces, when it is more than
/// such a frame may carry: `max_size` for data frames, 125 bytes for control frames (RFC
/// 6455 §5.5). `None` while the header is incomplete or the length is allowed.
pub fn announced_over(buf: &[u8], max_size: usize) -> Option<u64> {
    let (first, second) = (*buf.first()?, *buf.get(1)?);
    let length = match second & 0x7f {
        126 => u64::from(u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?])),
        127 => {
            let bytes: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            u64::from_be_bytes(bytes)
        }
        short => u64::from(short),
    };
    let control = first & 0x08 != 0;
    let max = if control {
        MAX_CONTROL_PAYLOAD as u64
    } else {
        max_size as u64
    };
    (length > max).then_some(length)
}

/// What a session's reader makes of `bytes` sent by an edge after its upgrade request,
/// arriving `chunk` bytes per read (at least 1), with frames up to `max_frame_bytes`: every
/// message and the error that ends the stream, in order. For the fuzz targets (`fuzz/`): the
/// reader driven from bytes alone, with no connection or runtime.
#[doc(hidden)]
pub fn read_frames(
    bytes: &[u8],
    chunk: usize,
    max_frame_bytes: usize,
) -> Vec<Result<AggregatedMessage, ProtocolError>> {
    /// Gives out `data` `chunk` bytes at a time, then end of file; takes every write.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }
    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = &mut *self;
            let end = this
                .data
                .len()
                .min(this.at + this.chunk.min(buf.remaining()));
            buf.put_slice(&this.data[this.at..end]);
            this.at = end;
            Poll::Ready(Ok(()))
        }
    }
    impl AsyncWrite for Pieces {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
    let io = Pieces {
        data: bytes.to_vec(),
        at: 0,
        chunk: chunk.max(1),
    };
    let mut reader = SocketLink::new(io, BytesMut::new(), max_frame_bytes).reader;
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut out = Vec::new();
    // The reads never wait, so each poll ends in a message, an error or the end.
    while let Poll::Ready(Some(item)) = Pin::new(&mut reader).poll_next(&mut cx) {
        out.push(item);
    }
    out
}

/// Writes a session's frames to the connection, in order (see the [module docs](self)).
pub(crate) struct SocketWriter {
    io: Box<dyn WriteIo>,
    /// Fired by the session when it ends without room for its close frame (a peer that does
    /// not read): the writer gives up instead of waiting on the peer.
    abort: Option<oneshot::Receiver<()>>,
}

impl SocketWriter {
    /// The session's end of [`SocketWriter::abort`].
    pub(crate) fn abort_handle(&mut self) -> oneshot::Sender<()> {
        let (abort, aborted) = oneshot::channel();
        self.abort = Some(aborted);
        abort
    }

    /// Writes what the session queues until it closes or the connection fails; a close frame
    /// (or, when the session ends without one, an empty close frame) ends the connection.
    pub(crate) async fn write_loop(mut self, queue: QueueReceiver<Outgoing>) {
        let aborted = self.abort.take();
        let writing = self.write_all(queue);
        match aborted {
            Some(aborted) => {
                // A dropped handle (the session ended normally) is no abort.
                tokio::select! {
                    () = writing => {}
                    Ok(()) = aborted => {}
                }
            }
            None => writing.await,
        }
    }

    async fn write_all(&mut self, mut queue: QueueReceiver<Outgoing>) {
        let mut codec = Codec::new();
        let mut buf = BytesMut::new();
        loop {
            let Some(first) = queue.recv().await else {
                // The session is gone without a close of its own (peer closed, error).
                let _ = self.finish(&mut codec, &mut buf, None).await;
                return;
            };
            let mut next = Some(first);
            // What is queued already goes in one write.
            while let Some(outgoing) = next.take() {
                let message = match outgoing {
                    Outgoing::Text(text) => Message::Text(text),
                    Outgoing::Pong(mut bytes) => {
                        if bytes.len() > MAX_CONTROL_PAYLOAD {
                            bytes = bytes.slice(..MAX_CONTROL_PAYLOAD);
                        }
                        Message::Pong(bytes)
                    }
                    Outgoing::Close(reason) => {
                        let _ = self.finish(&mut codec, &mut buf, Some(reason)).await;
                        return;
                    }
                };
                if codec.encode(message, &mut buf).is_err() {
                    return;
                }
                if buf.len() < KEEP_BUFFER {
                    next = queue.try_recv();
                }
            }
            if self.io.write_all(&buf).await.is_err() || self.io.flush().await.is_err() {
                return;
            }
            buf.clear();
            if buf.capacity() > KEEP_BUFFER {
                buf = BytesMut::new();
            }
        }
    }

    /// Writes what is buffered and the close frame, then ends the connection's sending side.
    async fn finish(
        &mut self,
        codec: &mut Codec,
        buf: &mut BytesMut,
        reason: Option<CloseReason>,
    ) -> io::Result<()> {
        let reason = reason.map(|mut reason| {
            if let Some(description) = reason.description.as_mut() {
                if description.len() > MAX_CLOSE_REASON {
                    let mut end = MAX_CLOSE_REASON;
                    while !description.is_char_boundary(end) {
                        end -= 1;
                    }
                    description.truncate(end);
                }
            }
            reason
        });
        codec
            .encode(Message::Close(reason), buf)
            .map_err(|err| io::Error::other(err.to_string()))?;
        self.io.write_all(buf).await?;
        self.io.flush().await?;
        self.io.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_announcing_too_much_is_known_from_its_header() {
        // Text frame, masked, 64-bit length of 20 MiB: refused with the header alone.
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(20u64 << 20).to_be_bytes());
        assert_eq!(announced_over(&header, 16 << 20), Some(20 << 20));
        assert_eq!(
            announced_over(&header[..5], 16 << 20),
            None,
            "incomplete header"
        );
        // 16-bit length within the limit.
        let ok = [0x81, 0x80 | 126, 0x01, 0x00];
        assert_eq!(announced_over(&ok, 16 << 20), None);
        assert_eq!(announced_over(&ok, 100), Some(256));
        // A ping announcing 126 bytes is over the control frame limit whatever max_size is.
        let ping = [0x89, 0x80 | 126, 0x00, 126];
        assert_eq!(announced_over(&ping, 16 << 20), Some(126));
        assert_eq!(announced_over(&[0x89, 0x80 | 125], 16 << 20), None);
    }

    /// A masked client frame (all-zero mask, so the payload reads as is).
    fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![first, 0x80 | payload.len() as u8, 0, 0, 0, 0];
        frame.extend_from_slice(payload);
        frame
    }

    #[test]
    fn read_frames_reads_what_a_session_reads_in_any_pieces() {
        let mut bytes = masked(0x01, b"hel"); // first text fragment
        bytes.extend(masked(0x89, b"p")); // a ping between fragments
        bytes.extend(masked(0x80, b"lo")); // last fragment
        for chunk in [1, 3, 2048] {
            let items = read_frames(&bytes, chunk, 100);
            assert!(
                matches!(&items[..], [Ok(AggregatedMessage::Ping(p)), Ok(AggregatedMessage::Text(t))]
                    if p.as_ref() == b"p" && t == "hello"),
                "{chunk}: {items:?}"
            );
        }
        // Over the limit in pieces: one error, then nothing.
        let items = read_frames(&bytes, 1, 4);
        assert!(
            matches!(&items[..], [Ok(AggregatedMessage::Ping(_)), Err(_)]),
            "{items:?}"
        );
        // An oversized header: refused before its payload.
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(1u64 << 40).to_be_bytes());
        let items = read_frames(&header, 2048, 100);
        assert!(
            matches!(&items[..], [Err(ProtocolError::Overflow)]),
            "{items:?}"
        );
    }
}
