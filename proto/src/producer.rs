//! The producer side of the wire protocol, the one there is: `Hello` with the ring's memfd as
//! `SCM_RIGHTS`, the daemon's answer, then frames (in libttrace.so written by the tracer thread
//! only). The daemon's tests and benchmarks drive it too (`ttraced::test_client`).

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::fdpass::{send_all, send_with_fds};
use crate::wire::{self, ClientMsg, DaemonMsg, Hello};

/// How long the daemon may take to answer `Hello`, at most (the stall budget may allow less).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected, welcomed client.
pub struct Client {
    stream: UnixStream,
    /// Frames queued but not written yet ([`Client::flush`]): one system call for many records.
    out: Vec<u8>,
    /// When the oldest frame in `out` was sent.
    since: Option<Instant>,
}

/// Buffered frames are written once they reach this many bytes...
const BATCH_BYTES: usize = 64 << 10;
/// ... or the oldest of them is this old, at the next send.
const BATCH_AGE: Duration = Duration::from_millis(2);

/// What the daemon said when it took the process.
#[derive(Debug, Clone)]
pub struct Welcome {
    pub run_id: String,
    /// The store the process's records go to.
    pub store: String,
    /// The first process of its job at this daemon.
    pub first: bool,
}

/// Why [`Client::connect`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing listens at the path (no socket file, or a stale one): a collector may be
    /// started there.
    NoListener(String),
    /// The daemon answered `Refused`, for this reason.
    Refused(String),
    /// Anything else: a listener that is not ours, a protocol failure.
    Failed(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::NoListener(s) | ConnectError::Failed(s) => f.write_str(s),
            ConnectError::Refused(reason) => write!(f, "the collector refused: {reason}"),
        }
    }
}

impl Client {
    /// Connects to `path`, checks that the listener runs as this user (or root), sends
    /// `hello` with `ring_fd` (a descriptor the caller keeps open across the call), and waits
    /// for the daemon's answer.
    pub fn connect(
        path: &Path,
        hello: Hello,
        ring_fd: BorrowedFd<'_>,
        answer_within: Duration,
    ) -> Result<(Client, Welcome), ConnectError> {
        Client::connect_with(path, hello, Some(ring_fd), answer_within)
    }

    /// [`Client::connect`]; `ring_fd: None` leaves the ring out of the `Hello` (a daemon must
    /// refuse that: the tests of its robustness send it).
    pub fn connect_with(
        path: &Path,
        hello: Hello,
        ring_fd: Option<BorrowedFd<'_>>,
        answer_within: Duration,
    ) -> Result<(Client, Welcome), ConnectError> {
        let shown = path.display();
        let mut stream = UnixStream::connect(path).map_err(|e| {
            let msg = format!("cannot connect to {shown}: {e}");
            match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    ConnectError::NoListener(msg)
                }
                _ => ConnectError::Failed(msg),
            }
        })?;
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            ConnectError::Failed(format!("{what} {shown}: {e}"))
        };
        // The daemon gets the ring (every tensor): it must be this user's own process.
        let peer = crate::peer::peer_cred(&stream)
            .map_err(|e| failed("cannot identify the listener on", &e))?
            .uid;
        let uid = rustix::process::getuid().as_raw();
        if peer != uid && peer != 0 {
            return Err(ConnectError::Failed(format!(
                "the listener on {shown} runs as uid {peer}, not as this user (uid {uid}): \
                 refusing to hand it the snapshots"
            )));
        }
        let frame = wire::encode(&ClientMsg::Hello(hello)).map_err(|e| failed("hello for", &e))?;
        send_with_fds(&stream, &frame, ring_fd.as_slice())
            .map_err(|e| failed("cannot send hello to", &e))?;
        // A zero timeout means none to the socket layer: wait at least a millisecond.
        let within = answer_within
            .min(HELLO_TIMEOUT)
            .max(Duration::from_millis(1));
        stream
            .set_read_timeout(Some(within))
            .map_err(|e| failed("timeout on", &e))?;
        let answer =
            wire::read_msg::<DaemonMsg>(&mut stream).map_err(|e| failed("no answer from", &e))?;
        match answer {
            Some(DaemonMsg::Welcome {
                run_id,
                store,
                first,
            }) => Ok((
                Client {
                    stream,
                    out: Vec::new(),
                    since: None,
                },
                Welcome {
                    run_id,
                    store,
                    first,
                },
            )),
            Some(DaemonMsg::Refused { reason }) => Err(ConnectError::Refused(reason)),
            None => Err(ConnectError::Failed(format!(
                "{shown} closed the connection"
            ))),
        }
    }

    /// Sends one message now (after the ones [`Client::queue`] holds, in order).
    pub fn send(&mut self, msg: &ClientMsg) -> Result<(), String> {
        self.queue(msg)?;
        self.flush()
    }

    /// Queues one message behind the ones not written yet, written with them when they fill a
    /// batch or the oldest has waited long enough, else at [`Client::flush`]: one system call
    /// for many records (the tracer's hot path). The caller must flush before it waits for the
    /// daemon to act on a queued message.
    pub fn queue(&mut self, msg: &ClientMsg) -> Result<(), String> {
        let first = self.out.is_empty();
        // Encoded in place behind the batch: no buffer per message.
        wire::encode_into(msg, &mut self.out).map_err(|e| e.to_string())?;
        if first {
            self.since = Some(Instant::now());
        }
        if self.out.len() >= BATCH_BYTES || self.since.is_some_and(|t| t.elapsed() >= BATCH_AGE) {
            let r = self.flush();
            if self.out.capacity() > 4 * BATCH_BYTES {
                // One large message must not keep its buffer for the rest of the run.
                self.out = Vec::new();
            }
            return r;
        }
        Ok(())
    }

    /// Writes the frames [`Client::queue`] buffered. The tracer flushes before it waits for
    /// anything (an entry, the device) and at its end, so that a frame is never held while
    /// the daemon could act on it.
    pub fn flush(&mut self) -> Result<(), String> {
        self.since = None;
        if self.out.is_empty() {
            return Ok(());
        }
        let r = send_all(&self.stream, &self.out).map_err(|e| e.to_string());
        self.out.clear();
        r
    }

    /// Writes bytes as they are, framed or not (the daemon's tests send malformed frames).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        send_all(&self.stream, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Client, UnixStream) {
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        let client = Client {
            stream: ours,
            out: Vec::new(),
            since: None,
        };
        (client, theirs)
    }

    /// `send` writes at once (the daemon's tests and loadgen wait for the daemon right after):
    /// what it sends arrives without a flush, after whatever was queued before it.
    #[test]
    fn a_sent_message_arrives_without_a_flush_after_the_queued_ones() {
        let (mut client, mut daemon) = pair();
        client
            .queue(&ClientMsg::StreamAbort { stream: 1 })
            .expect("queued");
        client
            .send(&ClientMsg::StreamAbort { stream: 2 })
            .expect("sent");
        for want in [1u64, 2] {
            match wire::read_msg::<ClientMsg>(&mut daemon).expect("a frame") {
                Some(ClientMsg::StreamAbort { stream }) => assert_eq!(stream, want),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Messages wait in the batch until a flush, then arrive whole and in order.
    #[test]
    fn batched_messages_arrive_in_order_at_the_flush() {
        let (mut client, mut daemon) = pair();
        for stream in 0..3u64 {
            client
                .queue(&ClientMsg::StreamAbort { stream })
                .expect("queued");
        }
        daemon.set_nonblocking(true).expect("nonblocking");
        let mut probe = [0u8; 1];
        let early = std::io::Read::read(&mut daemon, &mut probe);
        assert!(
            matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "nothing is written before the flush: {early:?}"
        );
        client.flush().expect("flushed");
        daemon.set_nonblocking(false).expect("blocking");
        for want in 0..3u64 {
            match wire::read_msg::<ClientMsg>(&mut daemon).expect("a frame") {
                Some(ClientMsg::StreamAbort { stream }) => assert_eq!(stream, want),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// A batch never grows past its bound, and a message older than the age bound goes out
    /// with the next one queued.
    #[test]
    fn a_full_or_old_batch_is_written_at_the_next_send() {
        let (mut client, mut daemon) = pair();
        let bye = ClientMsg::Bye {
            records: 1,
            gaps: 0,
            warnings: Vec::new(),
        };
        let one = wire::encode(&bye).expect("encoded").len();
        let mut sent = 0;
        while client.out.len() + one < BATCH_BYTES {
            client.queue(&bye).expect("queued");
            sent += 1;
        }
        client.queue(&bye).expect("sent");
        sent += 1;
        assert!(client.out.is_empty(), "a full batch is written");
        client.queue(&bye).expect("queued");
        std::thread::sleep(BATCH_AGE);
        client.queue(&bye).expect("sent");
        sent += 2;
        assert!(client.out.is_empty(), "an old batch is written");
        for _ in 0..sent {
            assert!(matches!(
                wire::read_msg::<ClientMsg>(&mut daemon),
                Ok(Some(ClientMsg::Bye { .. }))
            ));
        }
    }
}
