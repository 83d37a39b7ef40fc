//! The protocol between a traced process (`libttrace.so`) and `ttraced`, over the daemon's Unix
//! stream socket.
//!
//! Every message is a frame: a little-endian `u32` length, then that many bytes of CBOR (a
//! [`ClientMsg`] or [`DaemonMsg`]: a map whose first entry, `msg`, names the message). A frame longer than [`MAX_FRAME`] or that does not decode
//! is a protocol error: the daemon drops that client (after keeping what it had published)
//! and keeps serving the others. The client's `Hello` carries its ring's memfd as `SCM_RIGHTS`
//! ancillary data.
//!
//! Order of a session: `Hello` (+fd) → `Welcome` | `Refused`; then any number of `Comm` and
//! `Publish` in the client's order; finally `Bye` (absent when the process died: the daemon
//! sees EOF and finalises what it has).

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::config::CaptureConfig;
use crate::record::Record;
use crate::ring::Slot;
use crate::FormatError;

/// Protocol version a client announces; the daemon refuses others.
pub const PROTOCOL_VERSION: u32 = 2;
/// Largest frame either side accepts (a record's metadata is a few KiB).
pub const MAX_FRAME: usize = 16 << 20;

/// Identity of a traced process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub pid: u32,
    /// Global rank (from RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID or PMI_RANK; else 0 until the
    /// world communicator says otherwise).
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub hostname: String,
    pub exe: String,
    pub argv: Vec<String>,
    /// Data bytes of the ring whose memfd rides along.
    pub ring_capacity: u64,
    /// The job this process belongs to (from its launcher's environment): a collector keeps
    /// every job in a store of its own. Empty from clients that predate jobs.
    #[serde(default)]
    pub job: JobInfo,
    /// Where the job wants its store (`TTRACE_OUT`, made absolute against `cwd`); `None`: the
    /// collector's default, `CWD/ttrace-runs/<UTC time>-<job label>`.
    #[serde(default)]
    pub out: Option<String>,
    /// The process's working directory.
    #[serde(default)]
    pub cwd: String,
    /// The job's command line as this process sees it (its launcher's, when it has one).
    #[serde(default)]
    pub command: Vec<String>,
    /// The process's environment, for the manifest.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The capture settings the process runs with (its `TTRACE_*` variables), for the manifest.
    #[serde(default)]
    pub capture: Option<CaptureConfig>,
    /// zstd level it asks its store to be written with (`TTRACE_LEVEL`); `None`: the
    /// collector's.
    #[serde(default)]
    pub level: Option<i32>,
}

/// Which job a traced process belongs to, derived from its launcher's environment
/// (`TTRACE_JOB`, Slurm, MPI, torchrun, else the launching process).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// Identical for every process of one job, different for two jobs (e.g.
    /// `slurm:1234.0`, `torchrun:<run id>:<restart>`, `proc:<pid>@<start time>`).
    pub id: String,
    /// A short file-name-safe form for the store's directory name (e.g. `slurm-1234.0`).
    pub label: String,
    /// Which rule named the job (`TTRACE_JOB`, `slurm`, `mpi`, `torchrun`, `launcher`,
    /// `process`).
    pub source: String,
}

/// A communicator this process joined (`ncclCommInitRank*`, `ncclCommInitAll`, `ncclCommSplit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommInfo {
    /// Identical on every member: a hash of the `ncclUniqueId`, or for a split of the parent's
    /// key, the split's sequence number on the parent and the color.
    pub key: u64,
    pub size: u32,
    /// This process's rank in the communicator.
    pub rank: u32,
    /// This process's global rank.
    pub global_rank: u32,
    pub parent: Option<u64>,
    pub color: Option<i32>,
    /// The API that created it.
    pub api: String,
}

/// Client to daemon.
// One Hello per connection, decoded straight into its variant: boxing it would buy nothing.
#[allow(clippy::large_enum_variant)]
// Deserialize: below, without serde's buffering of internally tagged enums.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ClientMsg {
    Hello(Hello),
    Comm(CommInfo),
    /// A record is complete: its metadata, and its captured tensors' bytes in `slot` at
    /// [`crate::ring::tensor_offsets`] of the captured tensors' `nbytes` (no slot for a record
    /// without captured bytes, e.g. a gap).
    Publish {
        record: Box<Record>,
        slot: Option<Slot>,
    },
    /// One chunk of a streamed tensor (protocol 2): a tensor too large for one slot goes
    /// through the ring in chunks, each published as soon as its copy completed.
    Chunk(Chunk),
    /// The producer gave a stream up before its last chunk (no ring space within the stall
    /// bound, a failed copy, a record filtered out): the daemon drops what it received.
    StreamAbort {
        stream: u64,
    },
    /// A record whose captured tensors were all streamed (protocol 2): `streams` names the
    /// stream of each captured tensor, all complete before this message.
    PublishStreamed {
        record: Box<Record>,
        streams: Vec<StreamRef>,
    },
    /// The process is exiting normally.
    Bye {
        records: u64,
        gaps: u64,
        /// What the process warned about its capture at exit that the store should keep (a
        /// step rule that numbered the whole run step 0); absent from older producers.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
    },
}

/// The variants of [`ClientMsg`] as the wire names them.
const CLIENT_MSGS: &[&str] = &[
    "hello",
    "comm",
    "publish",
    "chunk",
    "stream_abort",
    "publish_streamed",
    "bye",
];

/// The fields of the struct variants of [`ClientMsg`], decoded from the rest of its map.
mod bodies {
    use super::*;

    #[derive(Deserialize)]
    pub(super) struct Publish {
        pub record: Box<Record>,
        pub slot: Option<Slot>,
    }

    #[derive(Deserialize)]
    pub(super) struct StreamAbort {
        pub stream: u64,
    }

    #[derive(Deserialize)]
    pub(super) struct PublishStreamed {
        pub record: Box<Record>,
        pub streams: Vec<StreamRef>,
    }

    #[derive(Deserialize)]
    pub(super) struct Bye {
        pub records: u64,
        pub gaps: u64,
        #[serde(default)]
        pub warnings: Vec<String>,
    }
}

/// Decodes a [`ClientMsg`] from its map in one pass: the `msg` entry comes first (the encoder
/// writes it first), so the variant is known before its fields. serde's derive for internally
/// tagged enums would first copy the whole message (the record, its tensors and strings) into
/// a generic tree and decode that again: most of the collector's CPU per small record.
impl<'de> Deserialize<'de> for ClientMsg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ClientMsg, D::Error> {
        d.deserialize_map(ClientMsgVisitor)
    }
}

struct ClientMsgVisitor;

impl<'de> serde::de::Visitor<'de> for ClientMsgVisitor {
    type Value = ClientMsg;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a client message (a map whose first entry is `msg`)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ClientMsg, A::Error> {
        use serde::de::{value::MapAccessDeserializer, Error};
        let key: Option<std::borrow::Cow<'de, str>> = map.next_key()?;
        if key.as_deref() != Some("msg") {
            return Err(A::Error::custom("a client message must begin with `msg`"));
        }
        let kind: std::borrow::Cow<'de, str> = map.next_value()?;
        let rest = MapAccessDeserializer::new(map);
        Ok(match kind.as_ref() {
            "hello" => ClientMsg::Hello(Hello::deserialize(rest)?),
            "comm" => ClientMsg::Comm(CommInfo::deserialize(rest)?),
            "publish" => {
                let b = bodies::Publish::deserialize(rest)?;
                ClientMsg::Publish {
                    record: b.record,
                    slot: b.slot,
                }
            }
            "chunk" => ClientMsg::Chunk(Chunk::deserialize(rest)?),
            "stream_abort" => ClientMsg::StreamAbort {
                stream: bodies::StreamAbort::deserialize(rest)?.stream,
            },
            "publish_streamed" => {
                let b = bodies::PublishStreamed::deserialize(rest)?;
                ClientMsg::PublishStreamed {
                    record: b.record,
                    streams: b.streams,
                }
            }
            "bye" => {
                let b = bodies::Bye::deserialize(rest)?;
                ClientMsg::Bye {
                    records: b.records,
                    gaps: b.gaps,
                    warnings: b.warnings,
                }
            }
            other => return Err(A::Error::unknown_variant(other, CLIENT_MSGS)),
        })
    }
}

/// One chunk of a streamed tensor: `len` bytes of the tensor at `offset`, in `slot` at
/// offset 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The stream, unique in the process.
    pub stream: u64,
    /// 0, 1, ... in order.
    pub index: u32,
    pub offset: u64,
    pub len: u64,
    /// Bytes of the whole tensor.
    pub total: u64,
    /// Element size (the shuffle stride).
    pub elem: u8,
    /// CRC-32 of the chunk's bytes.
    pub crc32: u32,
    pub slot: Slot,
}

/// Which stream holds a captured tensor of a [`ClientMsg::PublishStreamed`] record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamRef {
    /// Index in the record's tensors.
    pub tensor: u32,
    pub stream: u64,
}

/// Daemon to client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum DaemonMsg {
    Welcome {
        run_id: String,
        /// The store the process's records go to.
        #[serde(default)]
        store: String,
        /// Whether it is the first process of its job on this collector (it announces the
        /// capture on stderr).
        #[serde(default)]
        first: bool,
    },
    Refused {
        reason: String,
    },
}

/// Encodes `msg` as one frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FormatError> {
    let mut buf = Vec::new();
    encode_into(msg, &mut buf)?;
    Ok(buf)
}

/// Appends the frame of `msg` (as [`encode`] makes it) to `out`, which is left as it was when
/// the message cannot be encoded: a batch of frames is built without a buffer per message.
pub fn encode_into<T: Serialize>(msg: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    let len = match ciborium::into_writer(msg, &mut *out) {
        Ok(()) => out.len() - start - 4,
        Err(e) => {
            out.truncate(start);
            return Err(FormatError::Invalid(format!("encode: {e}")));
        }
    };
    if len > MAX_FRAME {
        out.truncate(start);
        return Err(FormatError::Invalid(format!(
            "message of {len} bytes exceeds {MAX_FRAME}"
        )));
    }
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// Decodes a frame body (without its length prefix).
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FormatError> {
    ciborium::from_reader(body).map_err(|e| FormatError::Invalid(format!("malformed message: {e}")))
}

/// Writes one frame.
pub fn write_msg<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FormatError> {
    w.write_all(&encode(msg)?).map_err(FormatError::Io)
}

/// Reads one frame; `Ok(None)` at a clean end of stream (between frames).
pub fn read_msg<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<Option<T>, FormatError> {
    read_msg_limited(r, MAX_FRAME)
}

/// [`read_msg`] with a smaller frame limit (`max` at most [`MAX_FRAME`]): the length is checked
/// before anything is allocated for the body.
pub fn read_msg_limited<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    max: usize,
) -> Result<Option<T>, FormatError> {
    FrameReader::default().read_limited(r, max)
}

/// Reads frames into buffers it keeps (the body, ciborium's scratch space), so that a stream
/// of messages costs no allocation or clearing per frame (the collector reads one per record).
pub struct FrameReader {
    body: Vec<u8>,
    scratch: Box<[u8; 4096]>,
}

impl Default for FrameReader {
    fn default() -> FrameReader {
        FrameReader {
            body: Vec::new(),
            scratch: Box::new([0; 4096]),
        }
    }
}

impl FrameReader {
    /// [`read_msg_limited`] into the kept buffers.
    pub fn read_limited<T: for<'de> Deserialize<'de>>(
        &mut self,
        r: &mut impl Read,
        max: usize,
    ) -> Result<Option<T>, FormatError> {
        let max = max.min(MAX_FRAME);
        let mut len = [0u8; 4];
        match r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(FormatError::Io(e)),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > max {
            return Err(FormatError::Invalid(format!(
                "frame of {len} bytes exceeds {max}"
            )));
        }
        // Grown to the largest frame seen (at most `max`), never shrunk or cleared again.
        if self.body.len() < len {
            self.body.resize(len, 0);
        }
        let body = &mut self.body[..len];
        r.read_exact(body).map_err(FormatError::Io)?;
        ciborium::de::from_reader_with_buffer(&body[..], &mut self.scratch[..])
            .map(Some)
            .map_err(|e| FormatError::Invalid(format!("malformed message: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_encoded_into_a_batch_read_back_and_an_oversized_one_leaves_it_as_it_was() {
        let msgs = [
            ClientMsg::Bye {
                records: 1,
                gaps: 2,
                warnings: vec!["the whole run is step 0".into()],
            },
            ClientMsg::StreamAbort { stream: 9 },
        ];
        let mut batch = Vec::new();
        for m in &msgs {
            encode_into(m, &mut batch).expect("encodes");
        }
        let whole: Vec<u8> = msgs
            .iter()
            .flat_map(|m| encode(m).expect("encodes"))
            .collect();
        assert_eq!(batch, whole, "the same frames as encode makes one by one");
        let huge = DaemonMsg::Refused {
            reason: "x".repeat(MAX_FRAME + 1),
        };
        assert!(encode_into(&huge, &mut batch).is_err());
        assert_eq!(batch, whole, "a message that cannot be framed adds nothing");
        let mut r = &batch[..];
        for m in &msgs {
            assert_eq!(
                read_msg::<ClientMsg>(&mut r).expect("reads").as_ref(),
                Some(m)
            );
        }
        assert!(read_msg::<ClientMsg>(&mut r).expect("clean end").is_none());
    }

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let msgs = vec![
            ClientMsg::Comm(CommInfo {
                key: 7,
                size: 2,
                rank: 1,
                global_rank: 3,
                parent: Some(1),
                color: Some(0),
                api: "ncclCommSplit".into(),
            }),
            ClientMsg::Bye {
                records: 10,
                gaps: 0,
                warnings: Vec::new(),
            },
            ClientMsg::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                pid: 9,
                hostname: "node".into(),
                level: Some(3),
                ..Hello::default()
            }),
            ClientMsg::Publish {
                record: Box::new(Record::d2h_copy(1, 2, 3, b"abc")),
                slot: Some(Slot {
                    pos: 64,
                    len: 64,
                    end: 128,
                }),
            },
            ClientMsg::Publish {
                record: Box::new(Record::d2h_copy(1, 2, 4, b"")),
                slot: None,
            },
            ClientMsg::Chunk(Chunk {
                stream: 5,
                index: 1,
                offset: 4096,
                len: 4096,
                total: 10000,
                elem: 2,
                crc32: 77,
                slot: Slot {
                    pos: 0,
                    len: 4096,
                    end: 4096,
                },
            }),
            ClientMsg::StreamAbort { stream: 5 },
            ClientMsg::PublishStreamed {
                record: Box::new(Record::d2h_copy(0, 0, 0, b"x")),
                streams: vec![StreamRef {
                    tensor: 0,
                    stream: 5,
                }],
            },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_msg(&mut buf, m).expect("writes");
        }
        let mut r = &buf[..];
        for m in &msgs {
            assert_eq!(
                read_msg::<ClientMsg>(&mut r).expect("reads").as_ref(),
                Some(m)
            );
        }
        assert_eq!(read_msg::<ClientMsg>(&mut r).expect("clean end"), None);
    }

    /// The decoder reads the message type first and the fields straight into their variant: a
    /// message whose `msg` entry is not first, or names no message, is a protocol error.
    #[test]
    fn a_message_must_say_what_it_is_first() {
        let map = |entries: Vec<(&str, ciborium::Value)>| {
            let v = ciborium::Value::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| (ciborium::Value::Text(k.into()), v))
                    .collect(),
            );
            let mut body = Vec::new();
            ciborium::into_writer(&v, &mut body).expect("encodes");
            body
        };
        let int = |n: u64| ciborium::Value::Integer(n.into());
        let text = |s: &str| ciborium::Value::Text(s.into());
        let bye = map(vec![
            ("msg", text("bye")),
            ("records", int(1)),
            ("gaps", int(2)),
        ]);
        assert_eq!(
            decode::<ClientMsg>(&bye).expect("decodes"),
            ClientMsg::Bye {
                records: 1,
                gaps: 2,
                warnings: Vec::new(),
            }
        );
        let late = map(vec![
            ("records", int(1)),
            ("msg", text("bye")),
            ("gaps", int(2)),
        ]);
        assert!(decode::<ClientMsg>(&late).is_err());
        let unknown = map(vec![("msg", text("hug"))]);
        assert!(decode::<ClientMsg>(&unknown).is_err());
        let missing = map(vec![("msg", text("bye")), ("records", int(1))]);
        assert!(decode::<ClientMsg>(&missing).is_err());
    }

    /// A reader that keeps its buffers reads frames of any sizes in turn as they were sent: a
    /// short frame after a long one is not read with the long one's leftover bytes, and a
    /// frame over the limit is refused before its body is read.
    #[test]
    fn a_frame_reader_reuses_its_buffers_without_mixing_frames() {
        let msgs = [
            ClientMsg::PublishStreamed {
                record: Box::new(Record::d2h_copy(1, 2, 3, &[7u8; 100])),
                streams: (0..50)
                    .map(|i| StreamRef {
                        tensor: i,
                        stream: u64::from(i) << 40,
                    })
                    .collect(),
            },
            ClientMsg::StreamAbort { stream: 1 },
            ClientMsg::Bye {
                records: 3,
                gaps: 0,
                warnings: Vec::new(),
            },
            ClientMsg::Publish {
                record: Box::new(Record::d2h_copy(0, 9, 4, b"abc")),
                slot: None,
            },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            encode_into(m, &mut buf).expect("encodes");
        }
        let mut frames = FrameReader::default();
        let mut r = &buf[..];
        for m in &msgs {
            assert_eq!(
                frames
                    .read_limited::<ClientMsg>(&mut r, MAX_FRAME)
                    .expect("reads")
                    .as_ref(),
                Some(m)
            );
        }
        assert!(frames
            .read_limited::<ClientMsg>(&mut r, MAX_FRAME)
            .expect("clean end")
            .is_none());
        let big = encode(&msgs[0]).expect("encodes");
        let small = big.len() - 4 - 1;
        assert!(frames
            .read_limited::<ClientMsg>(&mut &big[..], small)
            .is_err());
    }

    #[test]
    fn garbage_and_oversized_frames_are_errors() {
        let mut huge = (MAX_FRAME as u32 + 1).to_le_bytes().to_vec();
        huge.extend([0u8; 8]);
        assert!(read_msg::<ClientMsg>(&mut &huge[..]).is_err());
        let mut junk = 3u32.to_le_bytes().to_vec();
        junk.extend([0xff, 0x00, 0x13]);
        assert!(read_msg::<ClientMsg>(&mut &junk[..]).is_err());
        let truncated = [10u8, 0, 0, 0, 1, 2];
        assert!(read_msg::<ClientMsg>(&mut &truncated[..]).is_err());
    }
}
