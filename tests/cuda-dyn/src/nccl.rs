//! NCCL entry points (`nccl.h`, NCCL 2.26), from `libnccl.so.2`.
use core::ffi::{c_char, c_int, c_void};

use crate::abi::cudart::cudaStream_t;
use crate::abi::nccl::*;
use crate::dyn_api;

dyn_api! {
    /// Writes `NCCL_VERSION_CODE` of the loaded library.
    fn ncclGetVersion(version: *mut c_int) -> ncclResult_t;
    /// Makes the id every rank passes to `ncclCommInitRank`.
    fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t;
    /// Joins a communicator; blocks until all ranks joined.
    fn ncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t;
    /// `ncclCommInitRank` with a configuration (`blocking = 0`: returns `ncclInProgress`).
    fn ncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t;
    /// `ncclCommInitRankConfig` with several ids.
    fn ncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t;
    /// One communicator per device, in one process.
    fn ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t;
    /// Splits a communicator by colour, ordering ranks by key.
    fn ncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t;
    /// Flushes the communicator's operations.
    fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t;
    /// Frees the communicator.
    fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t;
    /// Aborts the communicator's operations and frees it.
    fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t;
    /// Number of ranks.
    fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t;
    /// This rank.
    fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t;
    /// This rank's CUDA device.
    fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t;
    /// The communicator's asynchronous error (or `ncclInProgress`).
    fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t;
    /// Text of a result code.
    fn ncclGetErrorString(result: ncclResult_t) -> *const c_char;
    /// Text of the last error.
    fn ncclGetLastError(comm: ncclComm_t) -> *const c_char;
    /// Creates a pre-multiplied sum operator.
    fn ncclRedOpCreatePreMulSum(op: *mut ncclRedOp_t, scalar: *mut c_void, datatype: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t) -> ncclResult_t;
    /// Destroys a user operator.
    fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t;
    /// Reduce to `root`.
    fn ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// In-place broadcast (deprecated).
    fn ncclBcast(buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Broadcast from `root`.
    fn ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// All-reduce.
    fn ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Reduce-scatter (`sendbuff` holds `nranks * recvcount` elements).
    fn ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// All-gather (`recvbuff` holds `nranks * sendcount` elements).
    fn ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Point-to-point send.
    fn ncclSend(sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Point-to-point receive.
    fn ncclRecv(recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Opens a group.
    fn ncclGroupStart() -> ncclResult_t;
    /// Closes a group; the outermost one launches the recorded operations.
    fn ncclGroupEnd() -> ncclResult_t;
    /// Closes a group like `ncclGroupEnd`, but the outermost one only estimates the recorded
    /// operations' time: nothing runs.
    fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t;
    /// A communicator of `comm`'s members less `excludeRanksList`, called by the survivors.
    fn ncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) -> ncclResult_t;
}
