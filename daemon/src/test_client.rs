//! A producer for tests and benchmarks: the one producer client (`ttrace_format::producer`, the
//! one libttrace.so uses) with a real memfd ring it creates and fills itself.
//!
//! `libttrace.so` is the real producer; this one lets tests and benchmarks drive a daemon
//! without CUDA — including the misbehaviour a daemon must survive (raw frames, bogus slots).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use memmap2::MmapMut;
use ttrace_format::producer::{Client, ConnectError};
use ttrace_format::record::Record;
use ttrace_format::ring::{self, Ring, Slot};
use ttrace_format::wire::{ClientMsg, CommInfo, Hello, PROTOCOL_VERSION};
use ttrace_format::FormatError;

/// How long the daemon may take to answer `Hello`.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// Errors of the test client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The daemon answered `Refused`.
    #[error("refused: {0}")]
    Refused(String),
    /// The connection failed before an answer (nobody listens, a protocol failure).
    #[error("{0}")]
    Connect(String),
    /// A message could not be sent.
    #[error("send: {0}")]
    Send(String),
    /// The ring stayed full.
    #[error("no ring space for {0} bytes")]
    RingFull(u64),
}

/// Deterministic bytes that look like BF16 activations (random signs and mantissas, a few
/// exponents), `n` elements from `seed`.
pub fn bf16_pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let exp = 120 + (x >> 61) as u16;
            let v: u16 = ((x & 1) as u16) << 15 | exp << 7 | ((x >> 8) & 0x7f) as u16;
            v.to_le_bytes()
        })
        .collect()
}

/// A `Hello` for a process of `rank` in a world of `world_size`, with this process's pid.
pub fn hello(rank: u32, world_size: u32, ring_capacity: u64) -> Hello {
    Hello {
        protocol: PROTOCOL_VERSION,
        pid: std::process::id(),
        rank,
        world_size,
        local_rank: rank,
        hostname: "localhost".into(),
        exe: "test-client".into(),
        argv: vec!["test-client".into()],
        ring_capacity,
        ..Hello::default()
    }
}

/// A connected producer with its ring.
pub struct TestClient {
    client: Client,
    ring: Ring,
    // Keeps the mapping `ring` points into alive.
    _map: MmapMut,
    /// The run id from the daemon's `Welcome`.
    pub run_id: String,
    /// How long `publish` waits for ring space.
    pub wait: Duration,
}

impl TestClient {
    /// Connects, sends `hello` with a fresh ring of `hello.ring_capacity` bytes, and waits for
    /// `Welcome`.
    pub fn connect(socket: &Path, hello: Hello) -> Result<TestClient, ClientError> {
        Self::connect_with(socket, hello, true)
    }

    /// As [`TestClient::connect`]; `send_fd = false` leaves the ring fd out of the `Hello`.
    pub fn connect_with(
        socket: &Path,
        hello: Hello,
        send_fd: bool,
    ) -> Result<TestClient, ClientError> {
        let capacity = hello.ring_capacity;
        let file = File::from(ring::create_memfd(ring::mapping_bytes(capacity) as u64)?);
        // SAFETY: a shared mapping of our own memfd, sized above.
        let mut map = unsafe { MmapMut::map_mut(&file)? };
        // SAFETY: the mapping is page aligned, large enough, and lives in the returned client.
        let ring = unsafe { Ring::create(map.as_mut_ptr(), capacity)? };
        let fd = send_fd.then(|| file.as_fd());
        match Client::connect_with(socket, hello, fd, HELLO_WITHIN) {
            Ok((client, welcome)) => Ok(TestClient {
                client,
                ring,
                _map: map,
                run_id: welcome.run_id,
                wait: Duration::from_secs(10),
            }),
            Err(ConnectError::Refused(reason)) => Err(ClientError::Refused(reason)),
            Err(ConnectError::NoListener(e) | ConnectError::Failed(e)) => {
                Err(ClientError::Connect(e))
            }
        }
    }

    /// The ring, as the producer sees it.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Reserves a slot for tensors of `sizes` bytes (laid out by `ring::tensor_offsets`).
    pub fn reserve(&self, sizes: &[u64]) -> Result<Slot, ClientError> {
        let (_, total) = ring::tensor_offsets(sizes);
        self.ring
            .reserve(total, self.wait)
            .ok_or(ClientError::RingFull(total))
    }

    /// The bytes of a slot this client reserved and has not published.
    pub fn slot_bytes(&mut self, slot: &Slot) -> &mut [u8] {
        // SAFETY: the producer owns a slot between reserve and publish; `&mut self` keeps the
        // borrow exclusive on this side.
        unsafe { self.ring.slot_bytes(slot) }
    }

    /// Publishes `record` whose captured tensors' bytes are `data` (in order): reserves a slot,
    /// copies the bytes in, and sends `Publish`. The record's `nbytes` and `crc32` are left as
    /// the caller set them (tests lie on purpose).
    pub fn publish(&mut self, record: Record, data: &[&[u8]]) -> Result<Option<Slot>, ClientError> {
        if data.is_empty() {
            self.send(&ClientMsg::Publish {
                record: Box::new(record),
                slot: None,
            })?;
            return Ok(None);
        }
        let sizes: Vec<u64> = data.iter().map(|d| d.len() as u64).collect();
        let (offsets, _) = ring::tensor_offsets(&sizes);
        let slot = self.reserve(&sizes)?;
        let bytes = self.slot_bytes(&slot);
        for (d, off) in data.iter().zip(offsets) {
            bytes[off as usize..off as usize + d.len()].copy_from_slice(d);
        }
        self.send(&ClientMsg::Publish {
            record: Box::new(record),
            slot: Some(slot),
        })?;
        Ok(Some(slot))
    }

    /// Registers a communicator.
    pub fn comm(&mut self, c: CommInfo) -> Result<(), ClientError> {
        self.send(&ClientMsg::Comm(c))
    }

    /// Says goodbye and closes the connection.
    pub fn bye(mut self, records: u64, gaps: u64) -> Result<(), ClientError> {
        self.send(&ClientMsg::Bye {
            records,
            gaps,
            warnings: Vec::new(),
        })
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &ClientMsg) -> Result<(), ClientError> {
        self.client.send(msg).map_err(ClientError::Send)
    }

    /// Sends raw bytes (for protocol-violation tests).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.client.send_raw(bytes).map_err(ClientError::from)
    }

    /// Waits until the daemon has released everything published so far.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.ring.tail() < self.ring.head() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}
