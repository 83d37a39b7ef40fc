//! What one captured operation is: a [`Record`], self-describing (rank, step, seq, stream, API,
//! the op's parameters, every tensor's shape, dtype, strides, device pointer and checksum, NVTX
//! path, timestamps). Records are encoded as CBOR (RFC 8949) maps with the field names below,
//! so any CBOR reader can decode them; see docs/format.md.
//!
//! Enum-valued C parameters (data types, compute types, operations) are kept as the raw
//! integers the program passed, never mapped to a closed Rust enum: a value from a newer CUDA
//! must survive the round trip (each CUDA release adds values). Helpers such as
//! [`DType::from_cuda`] interpret them where the meaning is known.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// One captured operation, or a gap where capture was skipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Global rank of the process.
    pub rank: u32,
    /// Training step (see `docs/format.md`, "Step numbering").
    pub step: u64,
    /// Host call order of captured ops within (rank, step), from 0.
    pub seq: u64,
    /// The exact C function the program called, e.g. `cublasGemmEx`, `ncclAllReduce`,
    /// `cudaMemcpyAsync_ptsz`.
    pub api: String,
    /// The family and parameters of the op.
    pub op: Op,
    /// Stream handle the op ran on (`0` legacy default; `2` per-thread default), as the program
    /// passed it (cuBLAS: the handle's stream at call time).
    pub stream: u64,
    /// Device current when the op was called.
    pub device: i32,
    /// OS thread id of the calling thread.
    pub thread: u64,
    /// NVTX ranges open on the calling thread at call time, outermost first.
    pub nvtx: Vec<String>,
    /// Kernel launches (names) seen on this thread since the previous captured op, in order
    /// (empty unless kernel names are captured). They are where uncaptured work happened.
    pub kernels_before: Vec<String>,
    /// Tensors read or written by the op, in the order the op's family documents.
    pub tensors: Vec<Tensor>,
    /// Wall-clock nanoseconds since the Unix epoch when the op was called.
    pub t_call_ns: u64,
    /// When the tracer saw the snapshot complete (the op and its copies done on the device).
    pub t_done_ns: u64,
}

/// Families of captured ops and their parameters.
// Deserialize: below, without serde's buffering of internally tagged enums.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum Op {
    /// Host/device copies (`cudaMemcpy*`, `cuMemcpy*`).
    Memcpy(MemcpyOp),
    /// Device memory set to one byte value (`cudaMemset*`): metadata only, the value and the
    /// extent say what was written.
    Memset(MemsetOp),
    /// cuBLAS and cuBLASLt GEMMs.
    Gemm(Box<GemmOp>),
    /// NCCL collectives and point-to-point.
    Collective(CollectiveOp),
    /// Capture was skipped: nothing is lost silently.
    Gap(GapOp),
}

/// The families of [`Op`] as stored.
const OP_FAMILIES: &[&str] = &["memcpy", "memset", "gemm", "collective", "gap"];

impl Op {
    /// The gap record of the entry point `api`, skipped for `reason`: `bytes` it would have
    /// captured (0 when unknown) and `detail` saying why.
    pub fn gap(
        reason: GapReason,
        api: impl Into<String>,
        bytes: u64,
        detail: impl Into<String>,
    ) -> Op {
        Op::Gap(GapOp {
            reason,
            skipped_api: api.into(),
            bytes,
            detail: detail.into(),
        })
    }

    /// The op of family `name` from the other entries of its map.
    fn of_family<'de, B: FamilyBody<'de>>(name: &str, body: B) -> Result<Op, B::Error> {
        Ok(match name {
            "memcpy" => Op::Memcpy(body.parse()?),
            "memset" => Op::Memset(body.parse()?),
            "gemm" => Op::Gemm(body.parse()?),
            "collective" => Op::Collective(body.parse()?),
            "gap" => Op::Gap(body.parse()?),
            other => return Err(serde::de::Error::unknown_variant(other, OP_FAMILIES)),
        })
    }
}

/// The entries of an op's map other than `family`: still in the decoder (the fast path), or
/// gathered into a CBOR tree (a map whose `family` came later).
trait FamilyBody<'de> {
    type Error: serde::de::Error;
    fn parse<T: Deserialize<'de>>(self) -> Result<T, Self::Error>;
}

/// The rest of a map being decoded.
struct Remaining<D>(D);

impl<'de, D: serde::Deserializer<'de>> FamilyBody<'de> for Remaining<D> {
    type Error = D::Error;
    fn parse<T: Deserialize<'de>>(self) -> Result<T, D::Error> {
        T::deserialize(self.0)
    }
}

impl<'de> FamilyBody<'de> for &ciborium::Value {
    type Error = ciborium::value::Error;
    fn parse<T: Deserialize<'de>>(self) -> Result<T, Self::Error> {
        self.deserialized()
    }
}

/// Decodes an [`Op`] in one pass when `family` is its map's first entry (as every writer of
/// this crate puts it): serde's derive for internally tagged enums would copy each record's op
/// into a generic tree first and decode that again. Maps in another order (a JSON object read
/// through `serde_json::Value`, whose keys are sorted) take that slower way, through a
/// `ciborium::Value` tree.
impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        d.deserialize_map(OpVisitor)
    }
}

struct OpVisitor;

impl<'de> serde::de::Visitor<'de> for OpVisitor {
    type Value = Op;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an op (a map with a `family` entry)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Op, A::Error> {
        use serde::de::Error;
        let Some(first) = map.next_key::<String>()? else {
            return Err(A::Error::missing_field("family"));
        };
        if first == "family" {
            let name: String = map.next_value()?;
            return Op::of_family(
                &name,
                Remaining(serde::de::value::MapAccessDeserializer::new(map)),
            );
        }
        // The generic tree is CBOR's (the wire already links ciborium; the preload has no JSON).
        use ciborium::Value;
        let mut rest = vec![(Value::Text(first), map.next_value::<Value>()?)];
        let mut name = None;
        while let Some(k) = map.next_key::<String>()? {
            if k == "family" {
                name = Some(map.next_value::<Value>()?);
            } else {
                rest.push((Value::Text(k), map.next_value()?));
            }
        }
        let name = match name {
            Some(Value::Text(n)) => n,
            Some(_) => return Err(A::Error::custom("`family` is not a string")),
            None => return Err(A::Error::missing_field("family")),
        };
        Op::of_family(&name, &Value::Map(rest)).map_err(A::Error::custom)
    }
}

/// Direction of a copy, as decided by the kind argument or, for `cudaMemcpyDefault`, by the
/// pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyDirection {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// A copy. Its one tensor (role `Dst`, or `Src` for a device-to-host copy whose destination is
/// host memory the tracer does not own) holds the bytes copied, dtype `u8`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemcpyOp {
    pub direction: CopyDirection,
    /// The `cudaMemcpyKind` the program passed.
    pub kind: u32,
    pub dst: u64,
    pub src: u64,
    /// Bytes per row and rows (a 1-D copy is one row).
    pub width: u64,
    pub height: u64,
    pub dpitch: u64,
    pub spitch: u64,
}

/// A memset: `depth` slices of `height` rows of `width` bytes from `dst`, each byte set to
/// `value`. Rows are `pitch` bytes apart, slices `slice_pitch` (a 1-D memset is one row of one
/// slice; a 2-D one, one slice). No tensor: the bytes written follow from these fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemsetOp {
    /// The first byte written.
    pub dst: u64,
    /// The byte written (the low 8 bits of the `int` the program passed, as CUDA uses it).
    pub value: u8,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub pitch: u64,
    pub slice_pitch: u64,
}

impl MemsetOp {
    /// Bytes set (`width * height * depth`).
    pub fn bytes(&self) -> u64 {
        self.width
            .saturating_mul(self.height)
            .saturating_mul(self.depth)
    }

    /// The address range `[dst, end)` the memset spans, pitch padding included.
    pub fn span(&self) -> (u64, u64) {
        if self.bytes() == 0 {
            return (self.dst, self.dst);
        }
        let last_row = (self.depth - 1)
            .saturating_mul(self.slice_pitch)
            .saturating_add((self.height - 1).saturating_mul(self.pitch));
        (
            self.dst,
            self.dst.saturating_add(last_row).saturating_add(self.width),
        )
    }
}

/// A GEMM: `D = alpha * op(A) op(B) + beta * C` (column-major, as cuBLAS defines it), with the
/// cuBLASLt extras (epilogue, bias, FP8 scales, amax) when the API is `cublasLtMatmul`.
///
/// Tensors: `A` and `B` as stored (`rows x cols` of the stored matrix, packed: the tracer copies
/// them without the leading-dimension padding; transposes are in `transa`/`transb`), `C` before
/// the op when `beta != 0` and `C` is read (role `CIn`), `D` after, and any of `Bias`, `Aux`,
/// `ScaleA`, `ScaleB`, `ScaleC`, `ScaleD`, `AmaxD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmOp {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// `cublasOperation_t` (0 N, 1 T, 2 C).
    pub transa: u32,
    pub transb: u32,
    pub lda: u64,
    pub ldb: u64,
    pub ldc: u64,
    pub ldd: u64,
    pub batch: u64,
    /// Element strides between batch entries (0 when not batched).
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub stride_d: i64,
    /// `cudaDataType_t` of each operand, raw.
    pub a_type: u32,
    pub b_type: u32,
    pub c_type: u32,
    pub d_type: u32,
    /// `cublasComputeType_t` (or the legacy `cudaDataType_t` a caller passed), raw.
    pub compute_type: u32,
    /// `cudaDataType_t` of alpha and beta.
    pub scale_type: u32,
    /// alpha and beta when they were host scalars (`None`: device pointers, see tensors).
    pub alpha: Option<f64>,
    pub beta: Option<f64>,
    /// `cublasLtEpilogue_t` (1 = default, no epilogue).
    pub epilogue: u32,
    /// `cublasGemmAlgo_t` for cuBLAS, -1 for cuBLASLt.
    pub algo: i32,
    /// cuBLASLt FAST_ACCUM (FP8 reduced-precision accumulation).
    pub fast_accum: bool,
}

impl GemmOp {
    /// A plain cuBLAS GEMM `D (m x n) = alpha * A (m x k) * B (k x n) + beta * C`: column-major,
    /// no transposes, packed leading dimensions (`lda = ldc = ldd = m`, `ldb = k`), one batch
    /// entry, every operand of `cudaDataType_t` `dtype`, FP32 compute and scalars, `alpha` 1
    /// and `beta` 0 as host scalars, the default algorithm, no epilogue. Change fields with
    /// struct update syntax (`GemmOp { transa: 1, ..GemmOp::plain(..) }`).
    pub fn plain(m: u64, n: u64, k: u64, dtype: u32) -> GemmOp {
        use cuda_abi::cublas::{CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT};
        use cuda_abi::library_types::CUDA_R_32F;
        GemmOp {
            m,
            n,
            k,
            transa: 0,
            transb: 0,
            lda: m,
            ldb: k,
            ldc: m,
            ldd: m,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            stride_d: 0,
            a_type: dtype,
            b_type: dtype,
            c_type: dtype,
            d_type: dtype,
            compute_type: CUBLAS_COMPUTE_32F,
            scale_type: CUDA_R_32F,
            alpha: Some(1.0),
            beta: Some(0.0),
            epilogue: 1,
            algo: CUBLAS_GEMM_DEFAULT,
            fast_accum: false,
        }
    }
}

/// NCCL operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Send,
    Recv,
    /// `ncclAlltoAll` (NCCL 2.28+): block `p` of a member's input goes to member `p`, whose
    /// output block `r` comes from member `r` (`count` elements per block).
    AllToAll,
    /// `ncclGather` (NCCL 2.28+): every member's `count` elements land in block `rank` of
    /// the root's output.
    Gather,
    /// `ncclScatter` (NCCL 2.28+): block `rank` of the root's input lands in each member's
    /// `count`-element output.
    Scatter,
}

/// A collective or point-to-point op. Tensors: `Input` (before, the send buffer) and `Output`
/// (after, the receive buffer); a send has only `Input`, a recv only `Output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveOp {
    pub kind: CollectiveKind,
    /// Elements per rank as the API counts them (AllGather: send count; ReduceScatter: recv
    /// count).
    pub count: u64,
    /// `ncclDataType_t`, raw.
    pub nccl_type: u32,
    /// `ncclRedOp_t`, raw (values >= 5 are dynamic PreMulSum handles).
    pub redop: Option<u32>,
    /// Root (broadcast, reduce) or peer (send, recv), as a rank of the communicator.
    pub root_or_peer: Option<i32>,
    /// The communicator (see [`crate::wire::CommInfo`]).
    pub comm: u64,
    /// This rank's rank in it, and its size.
    pub comm_rank: u32,
    pub comm_size: u32,
    pub sendbuff: u64,
    pub recvbuff: u64,
    /// Ops launched together by one outermost `ncclGroupEnd` share a group number (0: none).
    pub group: u64,
    /// The factor of a PreMulSum reduction (`redop` made by `ncclRedOpCreatePreMulSum`, torch's
    /// `ReduceOp.PREMUL_SUM`); absent for every other op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub premul: Option<PreMulSum>,
}

/// The scalar of `ncclRedOpCreatePreMulSum`: the collective sums its members' inputs, each
/// multiplied by it first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PreMulSum {
    /// `ncclDataType_t` of the scalar, raw.
    pub nccl_type: u32,
    /// `ncclScalarResidence_t`, raw: 0 device memory (read when the collective runs; the
    /// record then carries it as its `Alpha` tensor), 1 host (read at creation).
    pub residence: u32,
    /// The factor when it was a host value (`None`: see the `Alpha` tensor).
    pub factor: Option<f64>,
}

/// Why capture was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GapReason {
    /// An op captured into a CUDA graph whose replay could not be snapshotted (the detail says
    /// why: e.g. the instance was updated, or the graph was launched into another capture).
    GraphCapture,
    /// The ring stayed full past the back-pressure bound.
    RingFull,
    /// A tensor exceeded the size cap (the op is recorded, the tensor is not).
    SizeCap,
    /// A tracer fault disabled capture from here on.
    TracerFault,
    /// A shape could not be read on the host (e.g. grouped GEMM layouts in device memory).
    ShapeUnknown,
    /// The entry point moves tensor data of a kind this ttrace does not capture (complex
    /// GEMMs, matrix-vector products): recorded so that nothing is lost silently.
    Unsupported,
    /// The CUDA runtime refused a snapshot copy of one of the op's tensors (format 1.6): the
    /// op's own record keeps that tensor as metadata only, and this gap, after it (right after
    /// it unless another thread's op came in between), names the tensor and the error.
    CopyRefused,
}

impl GapReason {
    /// Every reason, in declaration order.
    pub const ALL: [GapReason; 7] = [
        GapReason::GraphCapture,
        GapReason::RingFull,
        GapReason::SizeCap,
        GapReason::TracerFault,
        GapReason::ShapeUnknown,
        GapReason::Unsupported,
        GapReason::CopyRefused,
    ];

    /// The reason as the store format names it (`copy_refused`): what summaries and reports
    /// print.
    pub fn name(self) -> &'static str {
        match self {
            GapReason::GraphCapture => "graph_capture",
            GapReason::RingFull => "ring_full",
            GapReason::SizeCap => "size_cap",
            GapReason::TracerFault => "tracer_fault",
            GapReason::ShapeUnknown => "shape_unknown",
            GapReason::Unsupported => "unsupported",
            GapReason::CopyRefused => "copy_refused",
        }
    }
}

/// Gap records counted by reason, and the bytes they would have captured: what `ttrace run`,
/// `ttrace ls` and the reports say of a store's gaps. As JSON: `gap_reasons` (by name) and
/// `gap_bytes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GapTally {
    /// Gaps by [`GapReason::name`].
    #[serde(rename = "gap_reasons")]
    pub by_reason: std::collections::BTreeMap<&'static str, u64>,
    /// Bytes they would have captured, where known.
    #[serde(rename = "gap_bytes")]
    pub bytes: u64,
}

impl GapTally {
    /// Counts one gap.
    pub fn add(&mut self, gap: &GapOp) {
        *self.by_reason.entry(gap.reason.name()).or_default() += 1;
        self.bytes = self.bytes.saturating_add(gap.bytes);
    }

    /// Adds another tally's counts.
    pub fn merge(&mut self, other: &GapTally) {
        for (r, n) in &other.by_reason {
            *self.by_reason.entry(r).or_default() += n;
        }
        self.bytes = self.bytes.saturating_add(other.bytes);
    }

    /// Gaps counted.
    pub fn count(&self) -> u64 {
        self.by_reason.values().sum()
    }

    /// `copy_refused 2, ring_full 1`.
    pub fn reasons(&self) -> String {
        let parts: Vec<String> = self
            .by_reason
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        parts.join(", ")
    }
}

/// A skipped op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GapOp {
    pub reason: GapReason,
    /// The API that was skipped (the record's `api` says the same).
    pub skipped_api: String,
    /// Bytes that would have been captured, when known.
    pub bytes: u64,
    /// Free text for people (what failed).
    pub detail: String,
}

/// The part a tensor plays in its op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    A,
    B,
    /// C as read by the op (before it ran).
    CIn,
    /// The result (cuBLAS writes C in place: its D is C after the op).
    D,
    Bias,
    Aux,
    ScaleA,
    ScaleB,
    ScaleC,
    ScaleD,
    AmaxD,
    /// alpha/beta when they live in device memory (`Alpha` is also the factor of a PreMulSum
    /// collective whose scalar lives in device memory).
    Alpha,
    Beta,
    Input,
    Output,
    Src,
    Dst,
    /// The device array of A's matrix addresses of a pointer-array batch (`U64`, one per
    /// batch entry), as the op read it: the tracer checks it against the addresses it took
    /// A from (docs/capture.md).
    ArrayA,
    /// B's matrix addresses of a pointer-array batch (see `ArrayA`).
    ArrayB,
    /// C's (and D's) matrix addresses of a pointer-array batch (see `ArrayA`).
    ArrayC,
    /// A's block scales (cuBLASLt `A_SCALE_MODE` `VEC32_UE8M0`: MXFP8, one `F8_E8M0` per 32
    /// values along K; `VEC16_UE4M3`: NVFP4, one UE4M3, stored `F8_E4M3`, per 16), in
    /// cuBLASLt's tiled layout ([`crate::blockscale`]); `[bytes]`.
    BlockScaleA,
    /// B's block scales (see `BlockScaleA`).
    BlockScaleB,
    /// The block scales the op wrote for a block-scaled D (`D_OUT_SCALE_MODE`
    /// `VEC16_UE4M3`, an FP4 D), in the same layout.
    BlockScaleD,
}

/// One tensor of a record. Its bytes follow the record in its frame (see docs/format.md) unless
/// `captured` is false (size cap, inputs off): then only the metadata is stored and `crc32` is 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    pub role: Role,
    pub dtype: DType,
    /// Row-major shape of the bytes as stored (after packing).
    pub shape: Vec<u64>,
    /// Element strides of the stored bytes (row-major, packed: the usual C strides) — the
    /// logical view is the shape; a column-major matrix is stored as `[cols, rows]`.
    pub strides: Vec<u64>,
    /// Device (or host) address the op used.
    pub ptr: u64,
    /// Bytes of the packed tensor.
    pub nbytes: u64,
    /// Whether the bytes were captured.
    pub captured: bool,
    /// CRC-32 (IEEE) of the packed bytes; 0 when not captured.
    pub crc32: u32,
}

impl Record {
    /// A captured device-to-host copy of `bytes` (one `U8` tensor with its CRC-32): the
    /// smallest complete record, for tests and tools that need one.
    pub fn d2h_copy(rank: u32, step: u64, seq: u64, bytes: &[u8]) -> Record {
        let n = bytes.len() as u64;
        Record {
            rank,
            step,
            seq,
            api: "cudaMemcpyAsync".into(),
            op: Op::Memcpy(MemcpyOp {
                direction: CopyDirection::DeviceToHost,
                kind: 2,
                dst: 0x2000,
                src: 0x1000,
                width: n,
                height: 1,
                dpitch: n,
                spitch: n,
            }),
            stream: 0,
            device: 0,
            thread: 1,
            nvtx: vec![],
            kernels_before: vec![],
            tensors: vec![Tensor {
                role: Role::Src,
                dtype: DType::U8,
                shape: vec![n],
                strides: vec![1],
                ptr: 0x1000,
                nbytes: n,
                captured: true,
                crc32: crc32fast::hash(bytes),
            }],
            t_call_ns: seq,
            t_done_ns: seq,
        }
    }
}

impl Tensor {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Row-major packed strides of `shape`, in elements.
pub fn packed_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names summaries print are the format's (serde's) names.
    #[test]
    fn gap_reasons_are_named_as_the_format_writes_them() {
        for r in GapReason::ALL {
            assert_eq!(
                serde_json::to_value(r).expect("serialize"),
                serde_json::Value::String(r.name().into())
            );
        }
    }

    #[test]
    fn a_gap_tally_counts_by_reason_and_merges() {
        let gap = |reason, bytes| GapOp {
            reason,
            skipped_api: "cudaMemcpyAsync".into(),
            bytes,
            detail: String::new(),
        };
        let mut a = GapTally::default();
        a.add(&gap(GapReason::RingFull, 10));
        a.add(&gap(GapReason::CopyRefused, 5));
        let mut b = GapTally::default();
        b.add(&gap(GapReason::CopyRefused, 1));
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.bytes, 16);
        assert_eq!(a.reasons(), "copy_refused 2, ring_full 1");
        assert_eq!(GapTally::default().reasons(), "");
    }

    /// Ops read back as written, whether `family` comes first (CBOR as this crate writes it)
    /// or not (JSON through `serde_json::Value`, keys sorted).
    #[test]
    fn ops_of_every_family_read_back_in_any_key_order() {
        let copy = Record::d2h_copy(0, 0, 0, b"abcd").op;
        let gemm = Op::Gemm(Box::new(GemmOp {
            m: 2,
            n: 3,
            k: 4,
            transa: 1,
            transb: 0,
            lda: 4,
            ldb: 4,
            ldc: 2,
            ldd: 2,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            stride_d: 0,
            a_type: 14,
            b_type: 14,
            c_type: 14,
            d_type: 14,
            compute_type: 68,
            scale_type: 0,
            alpha: Some(1.0),
            beta: None,
            epilogue: 1,
            algo: -1,
            fast_accum: false,
        }));
        let gap = Op::Gap(GapOp {
            reason: GapReason::RingFull,
            skipped_api: "cublasGemmEx".into(),
            bytes: 12,
            detail: "why".into(),
        });
        let memset = Op::Memset(MemsetOp {
            dst: 0x1000,
            value: 0xab,
            width: 16,
            height: 2,
            depth: 1,
            pitch: 32,
            slice_pitch: 64,
        });
        for op in [copy, memset, gemm, gap] {
            let mut cbor = Vec::new();
            ciborium::into_writer(&op, &mut cbor).expect("encodes");
            let back: Op = ciborium::from_reader(&cbor[..]).expect("decodes");
            assert_eq!(back, op);
            let sorted = serde_json::to_value(&op).expect("to json");
            let back: Op = serde_json::from_value(sorted).expect("from sorted json");
            assert_eq!(back, op);
            let text = serde_json::to_string(&op).expect("json text");
            assert_eq!(serde_json::from_str::<Op>(&text).expect("from json"), op);
        }
        let nameless = serde_json::json!({ "bytes": 1 });
        assert!(serde_json::from_value::<Op>(nameless).is_err());
    }

    #[test]
    fn a_memset_spans_its_rows_and_slices_without_the_last_padding() {
        let m = MemsetOp {
            dst: 1000,
            value: 0,
            width: 10,
            height: 3,
            depth: 2,
            pitch: 16,
            slice_pitch: 64,
        };
        assert_eq!(m.bytes(), 60);
        // Last row: slice 1 (64) + row 2 (32) + 10 bytes.
        assert_eq!(m.span(), (1000, 1000 + 64 + 32 + 10));
        let empty = MemsetOp { width: 0, ..m };
        assert_eq!(empty.span(), (1000, 1000));
    }

    #[test]
    fn packed_strides_are_row_major() {
        assert_eq!(packed_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(packed_strides(&[5]), vec![1]);
        assert!(packed_strides(&[]).is_empty());
    }
}
