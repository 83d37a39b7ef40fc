//! Passing the ring's memfd with the `Hello` frame (`SCM_RIGHTS`), both ways: the producer
//! sends it ([`send_with_fds`]), the daemon receives it ([`read_exact_with_fds`]) and seals it
//! ([`seal_shrink`]). Every write to the daemon goes through [`send_all`] (`MSG_NOSIGNAL`).
//! The peer's credentials are [`crate::peer`].

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::fs::{fcntl_add_seals, SealFlags};
use rustix::io::Errno;
use rustix::net::{
    recvmsg, send, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Descriptors one message may carry (the control buffer's alignment may leave room for a
/// few more); beyond the room, the message is an error and what arrived is closed (a client
/// sends exactly one).
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
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(buf)];
        let msg = match recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(msg) => msg,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        // Each received descriptor is a fresh one this process now owns (closed on drop,
        // also when the message is refused below).
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more descriptors than expected were sent (control data truncated)",
            ));
        }
        return Ok(msg.bytes);
    }
}

/// Tries to forbid shrinking the memfd, so a client cannot make the daemon's mapping fault
/// (SIGBUS) by truncating it. Works when the client created it with `MFD_ALLOW_SEALING`
/// ([`crate::ring::create_memfd`] does).
pub fn seal_shrink(fd: &OwnedFd) -> io::Result<()> {
    fcntl_add_seals(fd, SealFlags::SHRINK).map_err(io::Error::from)
}

/// Writes all of `buf` with `MSG_NOSIGNAL`: a daemon that went away is an error, never a
/// SIGPIPE that kills the traced program.
pub fn send_all(stream: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send(stream, buf, SendFlags::NOSIGNAL) {
            Ok(n) => buf = &buf[n..],
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends all of `frame`, with `fds` (when any) attached as `SCM_RIGHTS` to its first bytes.
/// At most `MAX_FDS` (4) descriptors, what the receiving side accepts.
pub fn send_with_fds(stream: &UnixStream, frame: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() {
        return send_all(stream, frame);
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors in one message, at most {MAX_FDS}",
                fds.len()
            ),
        ));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let sent = loop {
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other(
                "no room for the descriptors' control message",
            ));
        }
        match sendmsg(
            stream,
            &[IoSlice::new(frame)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // The descriptors went with the first bytes; the rest (if any) is plain data.
    send_all(stream, &frame[sent..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    fn close_on_exec(fd: &OwnedFd) -> bool {
        rustix::io::fcntl_getfd(fd)
            .expect("F_GETFD")
            .contains(rustix::io::FdFlags::CLOEXEC)
    }

    #[test]
    fn a_descriptor_sent_with_a_frame_arrives_with_its_bytes() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (r, mut w) = UnixStream::pair().expect("a descriptor to pass");
        let frame: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let sender = std::thread::spawn(move || send_with_fds(&a, &frame, &[r.as_fd()]));
        let mut got = vec![0u8; 100_000];
        let mut fds = Vec::new();
        assert!(read_exact_with_fds(&b, &mut got, &mut fds).expect("receive"));
        sender.join().expect("sender").expect("send");
        assert!(got.iter().copied().eq((0..=255u8).cycle().take(100_000)));
        assert_eq!(fds.len(), 1, "exactly the one descriptor sent");
        // The received descriptor is the same socket: bytes written to its peer arrive.
        w.write_all(b"ring").expect("write");
        let mut passed = UnixStream::from(fds.pop().expect("fd"));
        let mut four = [0u8; 4];
        passed
            .read_exact(&mut four)
            .expect("read through the passed fd");
        assert_eq!(&four, b"ring");
    }

    /// Every descriptor of a message arrives, in order, each close-on-exec: a received ring
    /// must not leak into a program the daemon or the CLI starts.
    #[test]
    fn several_descriptors_arrive_in_order_each_close_on_exec() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let pairs: Vec<(UnixStream, UnixStream)> = (0..MAX_FDS)
            .map(|_| UnixStream::pair().expect("a descriptor to pass"))
            .collect();
        let sent: Vec<BorrowedFd<'_>> = pairs.iter().map(|(r, _)| r.as_fd()).collect();
        send_with_fds(&a, b"four", &sent).expect("send");
        let mut got = [0u8; 4];
        let mut fds = Vec::new();
        assert!(read_exact_with_fds(&b, &mut got, &mut fds).expect("receive"));
        assert_eq!(&got, b"four");
        assert_eq!(fds.len(), MAX_FDS);
        for (i, (fd, (_, mut w))) in fds.into_iter().zip(pairs).enumerate() {
            assert!(
                close_on_exec(&fd),
                "descriptor {i} is inherited across exec"
            );
            w.write_all(&[i as u8]).expect("write");
            let mut one = [0u8; 1];
            UnixStream::from(fd).read_exact(&mut one).expect("read");
            assert_eq!(one[0], i as u8, "descriptor {i} arrived out of order");
        }
    }

    /// A peer that sends more descriptors than a message may carry gets an error, and what
    /// did arrive is owned (closed), not leaked.
    #[test]
    fn too_many_descriptors_are_refused_on_both_sides() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (r, _w) = UnixStream::pair().expect("a descriptor to pass");
        let many = vec![r.as_fd(); MAX_FDS + 1];
        let e = send_with_fds(&a, b"x", &many).expect_err("over the limit");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // A hand-made message with more than the receiver makes room for.
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let sixteen = vec![r.as_fd(); 16];
        assert!(control.push(SendAncillaryMessage::ScmRights(&sixteen)));
        sendmsg(&a, &[IoSlice::new(b"x")], &mut control, SendFlags::empty()).expect("sendmsg");
        let mut got = [0u8; 1];
        let mut fds = Vec::new();
        let e = read_exact_with_fds(&b, &mut got, &mut fds).expect_err("truncated control data");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // Those that fit the control buffer arrived and are owned here (closed on drop).
        assert!(
            (MAX_FDS..16).contains(&fds.len()),
            "{} descriptors kept",
            fds.len()
        );
    }

    #[test]
    fn a_frame_without_a_descriptor_arrives_alone_and_end_of_stream_is_not_an_error() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        send_with_fds(&a, b"hello", &[]).expect("send");
        drop(a);
        let mut got = [0u8; 5];
        let mut fds = Vec::new();
        assert!(read_exact_with_fds(&b, &mut got, &mut fds).expect("receive"));
        assert_eq!(&got, b"hello");
        assert!(fds.is_empty());
        assert!(!read_exact_with_fds(&b, &mut got, &mut fds).expect("end of stream"));
    }

    /// A sealed ring cannot be shrunk under the daemon's mapping (a SIGBUS in the daemon), and
    /// a memfd made without sealing support says so instead of passing as sealed.
    #[test]
    fn a_sealed_ring_cannot_shrink_and_an_unsealable_one_is_an_error() {
        let ring = crate::ring::create_memfd(1 << 16).expect("ring memfd");
        assert!(
            close_on_exec(&ring),
            "the ring's memfd is inherited across exec"
        );
        seal_shrink(&ring).expect("seal");
        let e = rustix::fs::ftruncate(&ring, 4096).expect_err("shrinking a sealed memfd");
        assert_eq!(e, Errno::PERM);
        rustix::fs::ftruncate(&ring, 1 << 17).expect("growing stays allowed");
        let plain =
            rustix::fs::memfd_create("unsealable", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        assert!(seal_shrink(&plain).is_err());
    }
}
