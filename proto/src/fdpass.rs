//! Passing the ring's memfd with the `Hello` frame (`SCM_RIGHTS`), both ways: the producer
//! sends it ([`send_with_fd`]), the daemon receives it ([`read_exact_with_fds`]) and seals it
//! ([`seal_shrink`]). Every write to the daemon goes through [`send_all`] (`MSG_NOSIGNAL`).
//! The peer's credentials are [`crate::peer`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Most descriptors accepted in one message; more are closed and reported as an error by the
/// caller (a client sends exactly one).
const MAX_FDS: usize = 4;

/// Fills `buf` completely with `recvmsg`, collecting every descriptor that arrives with the
/// bytes. Returns `Ok(false)` on end of stream before the first byte.
pub fn read_exact_with_fds(
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
pub fn seal_shrink(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_ADD_SEALS takes an int argument.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes all of `buf` with `MSG_NOSIGNAL`: a daemon that went away is an error, never a
/// SIGPIPE that kills the traced program.
pub fn send_all(stream: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a live slice; send reads at most its length.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Sends all of `frame`, with `fd` (when given) attached as `SCM_RIGHTS` to its first bytes.
pub fn send_with_fd(stream: &UnixStream, frame: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let Some(fd) = fd else {
        return send_all(stream, frame);
    };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: frame.as_ptr() as *mut libc::c_void,
        iov_len: frame.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let sent = loop {
        // SAFETY: msg_control points to `space` bytes, enough for one cmsg carrying one fd;
        // CMSG_FIRSTHDR/CMSG_DATA stay inside it; sendmsg only reads the live buffers.
        let n = unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            libc::CMSG_DATA(c).cast::<RawFd>().write_unaligned(fd);
            libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break n as usize;
    };
    // The descriptor went with the first bytes; the rest (if any) is plain data.
    send_all(stream, &frame[sent..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_descriptor_sent_with_a_frame_arrives_with_its_bytes() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (r, mut w) = UnixStream::pair().expect("a descriptor to pass");
        let frame: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let sender = std::thread::spawn(move || send_with_fd(&a, &frame, Some(r.as_raw_fd())));
        let mut got = vec![0u8; 100_000];
        let mut fds = Vec::new();
        assert!(read_exact_with_fds(&b, &mut got, &mut fds).expect("receive"));
        sender.join().expect("sender").expect("send");
        assert!(got.iter().copied().eq((0..=255u8).cycle().take(100_000)));
        assert_eq!(fds.len(), 1, "exactly the one descriptor sent");
        // The received descriptor is the same socket: bytes written to its peer arrive.
        std::io::Write::write_all(&mut w, b"ring").expect("write");
        let mut passed = UnixStream::from(fds.pop().expect("fd"));
        let mut four = [0u8; 4];
        passed
            .read_exact(&mut four)
            .expect("read through the passed fd");
        assert_eq!(&four, b"ring");
    }

    #[test]
    fn a_frame_without_a_descriptor_arrives_alone_and_end_of_stream_is_not_an_error() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        send_with_fd(&a, b"hello", None).expect("send");
        drop(a);
        let mut got = [0u8; 5];
        let mut fds = Vec::new();
        assert!(read_exact_with_fds(&b, &mut got, &mut fds).expect("receive"));
        assert_eq!(&got, b"hello");
        assert!(fds.is_empty());
        assert!(!read_exact_with_fds(&b, &mut got, &mut fds).expect("end of stream"));
    }
}
