//! The producer side of the wire protocol, the one there is: `Hello` with the ring's memfd as
//! `SCM_RIGHTS`, the daemon's answer, then frames (in libttrace.so written by the tracer thread
//! only). The daemon's tests and benchmarks drive it too (`ttraced::test_client`).

use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::fdpass::{send_all, send_with_fd};
use crate::wire::{self, ClientMsg, DaemonMsg, Hello};

/// How long the daemon may take to answer `Hello`, at most (the stall budget may allow less).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected, welcomed client.
pub struct Client {
    stream: UnixStream,
}

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
    /// `hello` with `ring_fd`, and waits for the daemon's answer.
    pub fn connect(
        path: &Path,
        hello: Hello,
        ring_fd: RawFd,
        answer_within: Duration,
    ) -> Result<(Client, Welcome), ConnectError> {
        Client::connect_with(path, hello, Some(ring_fd), answer_within)
    }

    /// [`Client::connect`]; `ring_fd: None` leaves the ring out of the `Hello` (a daemon must
    /// refuse that: the tests of its robustness send it).
    pub fn connect_with(
        path: &Path,
        hello: Hello,
        ring_fd: Option<RawFd>,
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
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        if peer != uid && peer != 0 {
            return Err(ConnectError::Failed(format!(
                "the listener on {shown} runs as uid {peer}, not as this user (uid {uid}): \
                 refusing to hand it the snapshots"
            )));
        }
        let frame = wire::encode(&ClientMsg::Hello(hello)).map_err(|e| failed("hello for", &e))?;
        send_with_fd(&stream, &frame, ring_fd).map_err(|e| failed("cannot send hello to", &e))?;
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
                Client { stream },
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

    /// Writes one message.
    pub fn send(&mut self, msg: &ClientMsg) -> Result<(), String> {
        let frame = wire::encode(msg).map_err(|e| e.to_string())?;
        send_all(&self.stream, &frame).map_err(|e| e.to_string())
    }

    /// Writes bytes as they are, framed or not (the daemon's tests send malformed frames).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        send_all(&self.stream, bytes)
    }
}
