//! Receiving file descriptors (`SCM_RIGHTS`) with the `Hello` frame (the peer's credentials
//! are `ttrace_format::peer`, shared with the library).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most descriptors accepted in one message; more are closed and reported as an error by the
/// caller (a client sends exactly one).
const MAX_FDS: usize = 4;

/// Fills `buf` completely with `recvmsg`, collecting every descriptor that arrives with the
/// bytes. Returns `Ok(false)` on end of stream before the first byte.
pub(crate) fn read_exact_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = recv_with_fds(stream, &mut buf[filled..], fds)?;
        if n == 0 {
            if filled == 0 {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a frame",
            ));
        }
        filled += n;
    }
    Ok(true)
}

/// One `recvmsg` into `buf`; received descriptors (close-on-exec) are appended to `fds`.
fn recv_with_fds(stream: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; zeroed is a valid empty header, filled in below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points to a live iovec over `buf` and to `control` (at least `space`
        // bytes); recvmsg writes only inside them.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: walking the control messages recvmsg just wrote, with the libc macros that
        // bound every step by msg_controllen; each SCM_RIGHTS payload is an array of ints, and
        // each received descriptor is a fresh one this process now owns.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                    let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                        let fd = data.add(i).read_unaligned();
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more descriptors than expected were sent (control data truncated)",
            ));
        }
        return Ok(n as usize);
    }
}

/// Tries to forbid shrinking the memfd, so a client cannot make the daemon's mapping fault
/// (SIGBUS) by truncating it. Works when the client created it with `MFD_ALLOW_SEALING`.
pub(crate) fn seal_shrink(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_ADD_SEALS takes an int argument.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
