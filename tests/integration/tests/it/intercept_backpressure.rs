//! Back-pressure: when the daemon does not free ring space, a capturing call waits at most
//! `TTRACE_WAIT_MS` and then records a `RingFull` gap in its place; the program goes on and
//! nothing is lost silently. The daemon here is a stub that welcomes the client and keeps
//! every message but never releases a slot.

use crate::intercept_util;

use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use integration_tests::describe;
use intercept_util::*;
use ttrace_format::record::{GapReason, Op};
use ttrace_format::wire::{self, ClientMsg, DaemonMsg};

/// Accepts one client, welcomes it and returns every message it sent until it hung up.
fn stingy_daemon(listener: UnixListener) -> std::thread::JoinHandle<Vec<ClientMsg>> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("a client connects");
        let mut msgs = Vec::new();
        // The hello's memfd arrives as ancillary data a plain read discards: this daemon never
        // maps the ring, so it never releases anything.
        while let Ok(Some(m)) = wire::read_msg::<ClientMsg>(&mut s) {
            if matches!(m, ClientMsg::Hello(_)) {
                wire::write_msg(
                    &mut s,
                    &DaemonMsg::Welcome {
                        run_id: "stingy".into(),
                        store: String::new(),
                        first: true,
                    },
                )
                .expect("welcome");
            }
            msgs.push(m);
        }
        msgs
    })
}

#[test]
fn a_full_ring_waits_briefly_then_records_gaps() {
    let dir = TempDir::new("backpressure");
    let sock = dir.path().join("d.sock");
    let daemon = stingy_daemon(UnixListener::bind(&sock).expect("bind"));
    let t0 = Instant::now();
    let out = probe_command(1, &["traced", "memcpy"])
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE_SOCKET", &sock)
        .env("TTRACE_RING_BYTES", "8192")
        .env("TTRACE_WAIT_MS", "100")
        .output()
        .expect("probe starts");
    let took = t0.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    let msgs = daemon.join().expect("daemon thread");
    let records: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            ClientMsg::Publish { record, slot } => Some((record, slot)),
            _ => None,
        })
        .collect();
    // The first two 4 KiB copies fill the ring; the four later copies wait and become gaps.
    let kinds: Vec<(&str, Option<GapReason>)> = records
        .iter()
        .map(|(r, _)| {
            let gap = match &r.op {
                Op::Gap(g) => Some(g.reason),
                _ => None,
            };
            (r.api.as_str(), gap)
        })
        .collect();
    let full = Some(GapReason::RingFull);
    assert_eq!(
        kinds,
        vec![
            ("cudaMemcpyAsync", None),
            ("cudaMemcpyAsync", None),
            ("cudaMemcpy", full),
            ("cudaMemcpy2DAsync", full),
            ("cudaMemcpyAsync_ptsz", full),
            ("cudaMemcpyPeer", full),
        ]
    );
    assert!(records[..2].iter().all(|(_, s)| s.is_some()));
    assert!(records[2..].iter().all(|(_, s)| s.is_none()));
    match &records[2].0.op {
        Op::Gap(g) => assert_eq!(g.bytes, 1024, "the bytes the snapshot needed"),
        other => panic!("{other:?}"),
    }
    // Four waits of 100 ms, not more (and the exit drain does not hang on the stub).
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(
        matches!(
            msgs.last(),
            Some(ClientMsg::Bye {
                records: 2,
                gaps: 4,
                ..
            })
        ),
        "{:?}",
        msgs.last()
    );
}
