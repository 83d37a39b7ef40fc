//! The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`): the
//! daemon serves only its own user, and libttrace.so hands its ring only to a listener of its
//! own user (or root).
//!
//! Read through nix, not rustix: rustix's `UCred` holds a non-zero `Pid`, and the kernel
//! reports pid 0 for a peer whose pid namespace hides it (a traced process in a container
//! talking to a daemon outside it).

use std::io;
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// Credentials of the process at the other end of a connected Unix socket.
#[derive(Debug, Clone, Copy)]
pub struct PeerCred {
    /// 0 when the peer's pid is not visible from this pid namespace.
    pub pid: i32,
    pub uid: u32,
}

/// `SO_PEERCRED` of a connected stream.
pub fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let cred = getsockopt(stream, PeerCredentials).map_err(io::Error::from)?;
    Ok(PeerCred {
        pid: cred.pid(),
        uid: cred.uid(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_of_a_socketpair_is_this_process_and_user() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        for end in [&a, &b] {
            let cred = peer_cred(end).expect("SO_PEERCRED");
            assert_eq!(cred.pid, std::process::id() as i32);
            assert_eq!(cred.uid, rustix::process::getuid().as_raw());
        }
    }
}
