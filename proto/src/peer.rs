//! The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`): the
//! daemon serves only its own user, and libttrace.so hands its ring only to a listener of its
//! own user (or root).

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// Credentials of the process at the other end of a connected Unix socket.
#[derive(Debug, Clone, Copy)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
}

/// `SO_PEERCRED` of a connected stream.
pub fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a properly sized ucred, and
    // updates `len`; the fd is a live socket owned by `stream`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
    })
}
