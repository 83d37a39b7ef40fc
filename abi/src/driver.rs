//! `cuda.h`: the CUDA driver API types the simulated `libcuda.so.1` exports use.
use core::ffi::{c_int, c_uint, c_ulonglong, c_void};

pub use crate::cudart::{CUgraphExec_st, CUgraphNode_st, CUgraph_st, CUstream_st, CUuuid_st};

crate::opaque_struct!(
    /// Pointee of `CUcontext`.
    CUctx_st
);
crate::opaque_struct!(
    /// Pointee of `CUmodule`.
    CUmod_st
);
crate::opaque_struct!(
    /// Pointee of `CUfunction`.
    CUfunc_st
);
crate::opaque_struct!(
    /// Pointee of `CUlinkState`.
    CUlinkState_st
);
crate::opaque_struct!(
    /// `CUtensorMap` (`struct CUtensorMap_st`, 64-byte aligned opaque words): passed by pointer.
    CUtensorMap_st
);

crate::opaque_struct!(
    /// `CUDA_GRAPH_INSTANTIATE_PARAMS` (`struct CUDA_GRAPH_INSTANTIATE_PARAMS_st`): passed by
    /// pointer, the runtime's `cudaGraphInstantiateParams` by another name; not read by the
    /// tracer.
    CUDA_GRAPH_INSTANTIATE_PARAMS_st
);
crate::opaque_struct!(
    /// `CUgraphExecUpdateResultInfo` (`struct CUgraphExecUpdateResultInfo_st`): passed by
    /// pointer, not read by the tracer.
    CUgraphExecUpdateResultInfo_st
);
crate::opaque_struct!(
    /// Pointee of `CUarray`.
    CUarray_st
);
crate::opaque_struct!(
    /// `CUDA_MEMCPY3D` (`struct CUDA_MEMCPY3D_st`): a 3-D copy's parameters, passed by pointer
    /// and not read by the tracer.
    CUDA_MEMCPY3D_st
);
crate::opaque_struct!(
    /// `CUDA_MEMCPY3D_PEER` (`struct CUDA_MEMCPY3D_PEER_st`): a 3-D copy between contexts,
    /// passed by pointer and not read by the tracer.
    CUDA_MEMCPY3D_PEER_st
);
crate::opaque_struct!(
    /// `CUmemcpyAttributes` (`struct CUmemcpyAttributes_st`): a batch copy's attributes,
    /// passed by pointer and not read by the tracer.
    CUmemcpyAttributes_st
);
crate::opaque_struct!(
    /// `CUDA_MEMCPY3D_BATCH_OP` (`struct CUDA_MEMCPY3D_BATCH_OP_st`): one 3-D copy of a batch,
    /// passed by pointer and not read by the tracer.
    CUDA_MEMCPY3D_BATCH_OP_st
);

/// `struct CUDA_MEMCPY2D_st` (`CUDA_MEMCPY2D`): a 2-D copy (`cuMemcpy2D_v2`,
/// `cuMemcpy2DAsync_v2`, `cuMemcpy2DUnaligned_v2`), each end host, device or array memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_MEMCPY2D_st {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcMemoryType: CUmemorytype,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: CUmemorytype,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}

/// `CUDA_MEMCPY2D`.
pub type CUDA_MEMCPY2D = CUDA_MEMCPY2D_st;
/// `CUDA_MEMCPY3D`.
pub type CUDA_MEMCPY3D = CUDA_MEMCPY3D_st;
/// `CUDA_MEMCPY3D_PEER`.
pub type CUDA_MEMCPY3D_PEER = CUDA_MEMCPY3D_PEER_st;
/// `CUmemcpyAttributes`.
pub type CUmemcpyAttributes = CUmemcpyAttributes_st;
/// `CUDA_MEMCPY3D_BATCH_OP`.
pub type CUDA_MEMCPY3D_BATCH_OP = CUDA_MEMCPY3D_BATCH_OP_st;
/// A CUDA array (texture memory, not linear).
pub type CUarray = *mut CUarray_st;
/// `CUmemorytype`.
pub type CUmemorytype = c_uint;

/// `enum cudaError_enum` (non-negative values: `unsigned int`).
pub type CUresult = c_uint;
/// A device ordinal.
pub type CUdevice = c_int;
/// A context.
pub type CUcontext = *mut CUctx_st;
/// A module.
pub type CUmodule = *mut CUmod_st;
/// A kernel of a module.
pub type CUfunction = *mut CUfunc_st;
/// A stream (the runtime's `cudaStream_t` is the same pointer).
pub type CUstream = *mut CUstream_st;
/// A graph (the runtime's `cudaGraph_t` is the same pointer).
pub type CUgraph = *mut CUgraph_st;
/// An instantiated graph (the runtime's `cudaGraphExec_t`).
pub type CUgraphExec = *mut CUgraphExec_st;
/// A node of a graph (the runtime's `cudaGraphNode_t`).
pub type CUgraphNode = *mut CUgraphNode_st;
/// `CUstreamCaptureMode` (numerically the runtime's `cudaStreamCaptureMode`).
pub type CUstreamCaptureMode = c_uint;
/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
pub type CUDA_GRAPH_INSTANTIATE_PARAMS = CUDA_GRAPH_INSTANTIATE_PARAMS_st;
/// `CUgraphExecUpdateResultInfo`.
pub type CUgraphExecUpdateResultInfo = CUgraphExecUpdateResultInfo_st;
/// A JIT link.
pub type CUlinkState = *mut CUlinkState_st;
/// A device address.
pub type CUdeviceptr = c_ulonglong;
/// `cuuint32_t`.
pub type cuuint32_t = u32;
/// `cuuint64_t`.
pub type cuuint64_t = u64;
/// `CUuuid`.
pub type CUuuid = CUuuid_st;
/// `CUdevice_attribute` (numerically the runtime's `cudaDeviceAttr`).
pub type CUdevice_attribute = c_uint;
/// `CUpointer_attribute`.
pub type CUpointer_attribute = c_uint;
/// `CUfunction_attribute`.
pub type CUfunction_attribute = c_uint;
/// `CUfunc_cache`.
pub type CUfunc_cache = c_uint;
/// `CUjit_option`.
pub type CUjit_option = c_uint;
/// `CUjitInputType`.
pub type CUjitInputType = c_uint;
/// `CUtensorMapDataType`.
pub type CUtensorMapDataType = c_uint;
/// `CUtensorMapInterleave`.
pub type CUtensorMapInterleave = c_uint;
/// `CUtensorMapSwizzle`.
pub type CUtensorMapSwizzle = c_uint;
/// `CUtensorMapL2promotion`.
pub type CUtensorMapL2promotion = c_uint;
/// `CUtensorMapFloatOOBfill`.
pub type CUtensorMapFloatOOBfill = c_uint;
/// `CUdriverProcAddressQueryResult`.
pub type CUdriverProcAddressQueryResult = c_uint;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: cuuint64_t = 1 << 1;
/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: CUdriverProcAddressQueryResult = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: CUdriverProcAddressQueryResult = 2;
