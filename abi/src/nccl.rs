//! `nccl.h` (NCCL 2.27.5): types and constants of the NCCL API.
//!
//! The C enums `ncclResult_t`, `ncclRedOp_t`, `ncclDataType_t` and `ncclScalarResidence_t` have
//! only non-negative values, so gcc gives them the compatible type `unsigned int`. Values of
//! `ncclRedOp_t` from `ncclNumOps` (5) up are dynamic handles made by
//! `ncclRedOpCreatePreMulSum`: never table-map them.
use core::ffi::{c_char, c_float, c_int, c_uint};

crate::opaque_struct!(
    /// Pointee of `ncclComm_t` (`struct ncclComm`).
    ncclComm
);

/// A communicator handle.
pub type ncclComm_t = *mut ncclComm;
crate::opaque_struct!(
    /// Pointee of `ncclWindow_t` (NCCL 2.27 symmetric-memory windows).
    ncclWindow
);
crate::opaque_struct!(
    /// Pointee of `ncclWindow_t` from NCCL 2.28 on.
    ncclWindow_vidmem
);
crate::opaque_struct!(
    /// `struct ncclDevComm` (`ncclDevComm_t`, NCCL 2.28+ device API): passed by pointer.
    ncclDevComm
);
crate::opaque_struct!(
    /// `struct ncclDevCommRequirements` (`ncclDevCommRequirements_t`): passed by pointer.
    ncclDevCommRequirements
);
crate::opaque_struct!(
    /// `ncclWaitSignalDesc_t` (NCCL 2.29+; an anonymous struct): passed by pointer.
    ncclWaitSignalDesc_t
);
/// `ncclDevComm_t`.
pub type ncclDevComm_t = ncclDevComm;
/// `ncclDevCommRequirements_t`.
pub type ncclDevCommRequirements_t = ncclDevCommRequirements;
/// `ncclCommMemStat_t` (NCCL 2.29+).
pub type ncclCommMemStat_t = c_uint;

/// `ncclWindow_t`.
#[cfg(not(sim_cuda13))]
pub type ncclWindow_t = *mut ncclWindow;
/// `ncclWindow_t` (NCCL 2.28+: `struct ncclWindow_vidmem*`).
#[cfg(sim_cuda13)]
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// `NCCL_MAJOR`.
pub const NCCL_MAJOR: c_int = 2;
/// `NCCL_MINOR`.
pub const NCCL_MINOR: c_int = 26;
/// `NCCL_PATCH`.
pub const NCCL_PATCH: c_int = 5;
/// `NCCL_VERSION_CODE`: `NCCL_VERSION(2, 27, 5)`, what `ncclGetVersion` reports.
#[cfg(not(sim_cuda13))]
pub const NCCL_VERSION_CODE: c_int = 22705;
/// `NCCL_VERSION(2, 30, 7)`: the NCCL of the CUDA 13 build (torch 2.15's).
#[cfg(sim_cuda13)]
pub const NCCL_VERSION_CODE: c_int = 23007;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: the bootstrap handle every rank of a communicator passes to
/// `ncclCommInitRank` (by value).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `ncclResult_t`.
pub type ncclResult_t = c_uint;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
pub const ncclNumResults: ncclResult_t = 8;

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): a config field left at its default.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`: the rank joins no communicator in `ncclCommSplit`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_DEFAULT`: `ncclCommShrink` shrinks the parent communicator.
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;
/// `NCCL_SHRINK_ABORT`: `ncclCommShrink` first terminates the parent's ongoing operations.
pub const NCCL_SHRINK_ABORT: c_int = 0x01;
/// `NCCL_UNDEF_FLOAT`.
pub const NCCL_UNDEF_FLOAT: c_float = -1.0;

/// `magic` of an `ncclConfig_t` made with `NCCL_CONFIG_INITIALIZER`.
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `magic` of an `ncclSimInfo_t` made with `NCCL_SIM_INFO_INITIALIZER`.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclConfig_t` (`struct ncclConfig_v22700`; `ncclConfig_v23000` in the CUDA 13 build). Versioned: `size`, `magic` and `version` say
/// how much of it the caller's header knew, so a library must read only `size` bytes of it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    #[cfg(sim_cuda13)]
    pub nChannelsPerNetPeer: c_int,
    #[cfg(sim_cuda13)]
    pub nvlinkCentricSched: c_int,
    #[cfg(sim_cuda13)]
    pub graphUsageMode: c_int,
    #[cfg(sim_cuda13)]
    pub numRmaCtx: c_int,
    #[cfg(sim_cuda13)]
    pub maxP2pPeers: c_int,
    #[cfg(sim_cuda13)]
    pub graphStreamOrdering: c_int,
}

impl ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`.
    pub const INITIALIZER: ncclConfig_t = ncclConfig_t {
        size: core::mem::size_of::<ncclConfig_t>(),
        magic: NCCL_CONFIG_MAGIC,
        version: NCCL_VERSION_CODE as c_uint,
        blocking: NCCL_CONFIG_UNDEF_INT,
        cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
        minCTAs: NCCL_CONFIG_UNDEF_INT,
        maxCTAs: NCCL_CONFIG_UNDEF_INT,
        netName: core::ptr::null(),
        splitShare: NCCL_CONFIG_UNDEF_INT,
        trafficClass: NCCL_CONFIG_UNDEF_INT,
        commName: core::ptr::null(),
        collnetEnable: NCCL_CONFIG_UNDEF_INT,
        CTAPolicy: NCCL_CONFIG_UNDEF_INT,
        shrinkShare: NCCL_CONFIG_UNDEF_INT,
        nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
        #[cfg(sim_cuda13)]
        nChannelsPerNetPeer: NCCL_CONFIG_UNDEF_INT,
        #[cfg(sim_cuda13)]
        nvlinkCentricSched: NCCL_CONFIG_UNDEF_INT,
        #[cfg(sim_cuda13)]
        graphUsageMode: NCCL_CONFIG_UNDEF_INT,
        #[cfg(sim_cuda13)]
        numRmaCtx: NCCL_CONFIG_UNDEF_INT,
        #[cfg(sim_cuda13)]
        maxP2pPeers: NCCL_CONFIG_UNDEF_INT,
        #[cfg(sim_cuda13)]
        graphStreamOrdering: NCCL_CONFIG_UNDEF_INT,
    };
}

/// `ncclSimInfo_t` (`struct ncclSimInfo_v22200`), filled by `ncclGroupSimulateEnd`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: c_float,
}

/// `ncclRedOp_t`. Values from `ncclNumOps` up are handles of user-created operators.
pub type ncclRedOp_t = c_uint;
pub const ncclSum: ncclRedOp_t = 0;
pub const ncclProd: ncclRedOp_t = 1;
pub const ncclMax: ncclRedOp_t = 2;
pub const ncclMin: ncclRedOp_t = 3;
pub const ncclAvg: ncclRedOp_t = 4;
pub const ncclNumOps: ncclRedOp_t = 5;
pub const ncclMaxRedOp: ncclRedOp_t = 0x7fff_ffff;

/// `ncclDataType_t`.
pub type ncclDataType_t = c_uint;
pub const ncclInt8: ncclDataType_t = 0;
pub const ncclChar: ncclDataType_t = 0;
pub const ncclUint8: ncclDataType_t = 1;
pub const ncclInt32: ncclDataType_t = 2;
pub const ncclInt: ncclDataType_t = 2;
pub const ncclUint32: ncclDataType_t = 3;
pub const ncclInt64: ncclDataType_t = 4;
pub const ncclUint64: ncclDataType_t = 5;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclHalf: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclFloat: ncclDataType_t = 7;
pub const ncclFloat64: ncclDataType_t = 8;
pub const ncclDouble: ncclDataType_t = 8;
pub const ncclBfloat16: ncclDataType_t = 9;
pub const ncclFloat8e4m3: ncclDataType_t = 10;
pub const ncclFloat8e5m2: ncclDataType_t = 11;
pub const ncclNumTypes: ncclDataType_t = 12;

/// `ncclScalarResidence_t`: where the scalar of `ncclRedOpCreatePreMulSum` lives.
pub type ncclScalarResidence_t = c_uint;
/// Device memory, read while the collective runs.
pub const ncclScalarDevice: ncclScalarResidence_t = 0;
/// Host memory, read before `ncclRedOpCreatePreMulSum` returns.
pub const ncclScalarHostImmediate: ncclScalarResidence_t = 1;
