//! `driver_types.h` / `cuda_runtime_api.h`: the CUDA 12 runtime's types and constants.
use core::ffi::{c_char, c_int, c_uint, c_void};

crate::opaque_struct!(
    /// Pointee of `cudaStream_t`.
    CUstream_st
);
crate::opaque_struct!(
    /// Pointee of `cudaEvent_t`.
    CUevent_st
);
crate::opaque_struct!(
    /// Pointee of `cudaGraph_t`.
    CUgraph_st
);
crate::opaque_struct!(
    /// Pointee of `cudaGraphExec_t`.
    CUgraphExec_st
);
crate::opaque_struct!(
    /// Pointee of `cudaGraphNode_t`.
    CUgraphNode_st
);
crate::opaque_struct!(
    /// Pointee of `cudaMemPool_t`.
    CUmemPoolHandle_st
);

crate::opaque_struct!(
    /// `struct cudaFuncAttributes`: filled by `cudaFuncGetAttributes` (which the simulator
    /// refuses: it has no kernel images), so only passed by pointer.
    cudaFuncAttributes
);
crate::opaque_struct!(
    /// `struct cudaLaunchConfig_st` (`cudaLaunchConfig_t`), read by `cudaLaunchKernelExC`.
    cudaLaunchConfig_st
);
crate::opaque_struct!(
    /// `struct cudaMemAccessDesc`, an element of `cudaMemPoolSetAccess`'s list.
    cudaMemAccessDesc
);

crate::opaque_struct!(
    /// `struct cudaGraphEdgeData_st` (`cudaGraphEdgeData`): passed by pointer only.
    cudaGraphEdgeData_st
);
/// `cudaGraphEdgeData`.
pub type cudaGraphEdgeData = cudaGraphEdgeData_st;

crate::opaque_struct!(
    /// Pointee of `cudaKernel_t`.
    CUkern_st
);
crate::opaque_struct!(
    /// Pointee of `cudaLibrary_t`.
    CUlib_st
);
crate::opaque_struct!(
    /// Pointee of `cudaUserObject_t`.
    CUuserObject_st
);
crate::opaque_struct!(
    /// `struct cudaGraphNodeParams`: passed by pointer only.
    cudaGraphNodeParams
);
/// A kernel of a loaded library (`cudaLibraryGetKernel`, `__cudaGetKernel`).
pub type cudaKernel_t = *mut CUkern_st;
/// A loaded device-code library.
pub type cudaLibrary_t = *mut CUlib_st;
/// A user object owned by graphs.
pub type cudaUserObject_t = *mut CUuserObject_st;
/// `cudaGraphConditionalHandle`.
pub type cudaGraphConditionalHandle = core::ffi::c_ulonglong;
/// `enum cudaGraphMemAttributeType`.
pub type cudaGraphMemAttributeType = c_uint;
/// `enum cudaJitOption`.
pub type cudaJitOption = c_uint;
/// `enum cudaLibraryOption`.
pub type cudaLibraryOption = c_uint;

/// `enum cudaFuncAttribute`.
pub type cudaFuncAttribute = c_uint;
/// `enum cudaMemPoolAttr`.
pub type cudaMemPoolAttr = c_uint;
/// `enum cudaDriverEntryPointQueryResult`.
pub type cudaDriverEntryPointQueryResult = c_uint;
/// The symbol was found.
pub const cudaDriverEntryPointSuccess: cudaDriverEntryPointQueryResult = 0;
/// The driver does not export the symbol.
pub const cudaDriverEntryPointSymbolNotFound: cudaDriverEntryPointQueryResult = 1;
/// The symbol needs a newer driver than the requested version.
pub const cudaDriverEntryPointVersionNotSufficent: cudaDriverEntryPointQueryResult = 2;
/// `CUDA_IPC_HANDLE_SIZE`.
pub const CUDA_IPC_HANDLE_SIZE: usize = 64;

/// `struct cudaIpcMemHandle_st`: an opaque handle passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaIpcMemHandle_st {
    pub reserved: [c_char; CUDA_IPC_HANDLE_SIZE],
}
/// `cudaIpcMemHandle_t`.
pub type cudaIpcMemHandle_t = cudaIpcMemHandle_st;

/// `struct cudaIpcEventHandle_st`: an opaque handle passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaIpcEventHandle_st {
    pub reserved: [c_char; CUDA_IPC_HANDLE_SIZE],
}
/// `cudaIpcEventHandle_t`.
pub type cudaIpcEventHandle_t = cudaIpcEventHandle_st;

/// `enum cudaError` (non-negative values: C compatible type `unsigned int`).
pub type cudaError_t = c_uint;
/// A stream handle. `0` is the legacy default stream unless the caller was built per-thread.
pub type cudaStream_t = *mut CUstream_st;
/// An event handle.
pub type cudaEvent_t = *mut CUevent_st;
/// A graph made by stream capture.
pub type cudaGraph_t = *mut CUgraph_st;
/// An instantiated graph.
pub type cudaGraphExec_t = *mut CUgraphExec_st;
/// A node of a graph.
pub type cudaGraphNode_t = *mut CUgraphNode_st;
/// A memory pool.
pub type cudaMemPool_t = *mut CUmemPoolHandle_st;
/// `enum cudaMemcpyKind`.
pub type cudaMemcpyKind = c_uint;
/// `enum cudaStreamCaptureStatus`.
pub type cudaStreamCaptureStatus = c_uint;
/// `enum cudaStreamCaptureMode`.
pub type cudaStreamCaptureMode = c_uint;
/// `enum cudaMemoryType`.
pub type cudaMemoryType = c_uint;
/// `enum cudaGraphNodeType`.
pub type cudaGraphNodeType = c_uint;
/// `enum cudaGraphExecUpdateResult`.
pub type cudaGraphExecUpdateResult = c_uint;
/// `enum cudaDeviceAttr`.
pub type cudaDeviceAttr = c_uint;
/// `enum cudaMemLocationType`.
pub type cudaMemLocationType = c_uint;
/// `enum cudaMemcpySrcAccessOrder`: when a batched copy may read its source.
pub type cudaMemcpySrcAccessOrder = c_uint;
/// `enum cudaMemcpy3DOperandType`: a batched 3-D copy's operand is a pointer or a CUDA array.
pub type cudaMemcpy3DOperandType = c_uint;
/// `cudaHostFn_t`: a host function enqueued with `cudaLaunchHostFunc`.
pub type cudaHostFn_t = Option<unsafe extern "C" fn(userData: *mut c_void)>;
/// `cudaStreamCallback_t` (deprecated `cudaStreamAddCallback`).
pub type cudaStreamCallback_t =
    Option<unsafe extern "C" fn(stream: cudaStream_t, status: cudaError_t, userData: *mut c_void)>;

/// `cudaStreamLegacy`: the legacy default stream, explicitly.
pub const cudaStreamLegacy: cudaStream_t = 0x1 as cudaStream_t;
/// `cudaStreamPerThread`: the calling thread's default stream.
pub const cudaStreamPerThread: cudaStream_t = 0x2 as cudaStream_t;

pub const cudaMemcpyHostToHost: cudaMemcpyKind = 0;
pub const cudaMemcpyHostToDevice: cudaMemcpyKind = 1;
pub const cudaMemcpyDeviceToHost: cudaMemcpyKind = 2;
pub const cudaMemcpyDeviceToDevice: cudaMemcpyKind = 3;
pub const cudaMemcpyDefault: cudaMemcpyKind = 4;

pub const cudaMemcpySrcAccessOrderInvalid: cudaMemcpySrcAccessOrder = 0x0;
pub const cudaMemcpySrcAccessOrderStream: cudaMemcpySrcAccessOrder = 0x1;
pub const cudaMemcpySrcAccessOrderDuringApiCall: cudaMemcpySrcAccessOrder = 0x2;
pub const cudaMemcpySrcAccessOrderAny: cudaMemcpySrcAccessOrder = 0x3;

pub const cudaMemcpyOperandTypePointer: cudaMemcpy3DOperandType = 0x1;
pub const cudaMemcpyOperandTypeArray: cudaMemcpy3DOperandType = 0x2;

pub const cudaMemLocationTypeInvalid: cudaMemLocationType = 0;
pub const cudaMemLocationTypeDevice: cudaMemLocationType = 1;
pub const cudaMemLocationTypeHost: cudaMemLocationType = 2;

pub const cudaStreamDefault: c_uint = 0x0;
pub const cudaStreamNonBlocking: c_uint = 0x1;

pub const cudaEventDefault: c_uint = 0x0;
pub const cudaEventBlockingSync: c_uint = 0x1;
pub const cudaEventDisableTiming: c_uint = 0x2;
pub const cudaEventInterprocess: c_uint = 0x4;

pub const cudaHostAllocDefault: c_uint = 0x0;
pub const cudaHostAllocPortable: c_uint = 0x1;
pub const cudaHostAllocMapped: c_uint = 0x2;
pub const cudaHostAllocWriteCombined: c_uint = 0x4;
pub const cudaHostRegisterDefault: c_uint = 0x0;
pub const cudaHostRegisterPortable: c_uint = 0x1;
pub const cudaHostRegisterMapped: c_uint = 0x2;
pub const cudaHostRegisterIoMemory: c_uint = 0x4;
pub const cudaHostRegisterReadOnly: c_uint = 0x8;

pub const cudaMemoryTypeUnregistered: cudaMemoryType = 0;
pub const cudaMemoryTypeHost: cudaMemoryType = 1;
pub const cudaMemoryTypeDevice: cudaMemoryType = 2;
pub const cudaMemoryTypeManaged: cudaMemoryType = 3;

pub const cudaStreamCaptureStatusNone: cudaStreamCaptureStatus = 0;
pub const cudaStreamCaptureStatusActive: cudaStreamCaptureStatus = 1;
pub const cudaStreamCaptureStatusInvalidated: cudaStreamCaptureStatus = 2;

pub const cudaStreamCaptureModeGlobal: cudaStreamCaptureMode = 0;
pub const cudaStreamCaptureModeThreadLocal: cudaStreamCaptureMode = 1;
pub const cudaStreamCaptureModeRelaxed: cudaStreamCaptureMode = 2;

pub const cudaGraphNodeTypeKernel: cudaGraphNodeType = 0;
pub const cudaGraphNodeTypeMemcpy: cudaGraphNodeType = 1;
pub const cudaGraphNodeTypeMemset: cudaGraphNodeType = 2;
pub const cudaGraphNodeTypeHost: cudaGraphNodeType = 3;
pub const cudaGraphNodeTypeGraph: cudaGraphNodeType = 4;
/// `cudaGraphNodeTypeConditional` (CUDA 12.4+): an if/while/switch node with body graphs.
pub const cudaGraphNodeTypeConditional: cudaGraphNodeType = 13;
/// `cudaGraphCondAssignDefault`: a conditional handle takes its default value at each launch.
pub const cudaGraphCondAssignDefault: c_uint = 1;
/// `cudaGraphCondTypeIf`.
pub const cudaGraphCondTypeIf: c_uint = 0;
pub const cudaGraphNodeTypeEmpty: cudaGraphNodeType = 5;
pub const cudaGraphNodeTypeWaitEvent: cudaGraphNodeType = 6;
pub const cudaGraphNodeTypeEventRecord: cudaGraphNodeType = 7;

pub const cudaGraphExecUpdateSuccess: cudaGraphExecUpdateResult = 0;
pub const cudaGraphExecUpdateErrorTopologyChanged: cudaGraphExecUpdateResult = 2;
pub const cudaGraphExecUpdateErrorNodeTypeChanged: cudaGraphExecUpdateResult = 3;

/// `CUDART_VERSION` of the headers this ABI mirrors.
#[cfg(not(sim_cuda13))]
pub const CUDART_VERSION: c_int = 12080;
/// `CUDART_VERSION` of the CUDA 13.2 headers.
#[cfg(sim_cuda13)]
pub const CUDART_VERSION: c_int = 13020;

pub const cudaSuccess: cudaError_t = 0;
pub const cudaErrorInvalidValue: cudaError_t = 1;
pub const cudaErrorMemoryAllocation: cudaError_t = 2;
pub const cudaErrorInitializationError: cudaError_t = 3;
pub const cudaErrorCudartUnloading: cudaError_t = 4;
pub const cudaErrorInvalidConfiguration: cudaError_t = 9;
pub const cudaErrorInvalidPitchValue: cudaError_t = 12;
pub const cudaErrorInvalidDevicePointer: cudaError_t = 17;
pub const cudaErrorInvalidChannelDescriptor: cudaError_t = 20;
pub const cudaErrorInvalidMemcpyDirection: cudaError_t = 21;
pub const cudaErrorInsufficientDriver: cudaError_t = 35;
pub const cudaErrorNoDevice: cudaError_t = 100;
pub const cudaErrorInvalidDevice: cudaError_t = 101;
pub const cudaErrorNoKernelImageForDevice: cudaError_t = 209;
pub const cudaErrorInvalidDeviceFunction: cudaError_t = 98;
pub const cudaErrorInvalidSymbol: cudaError_t = 13;
pub const cudaErrorPeerAccessAlreadyEnabled: cudaError_t = 704;
pub const cudaErrorProfilerDisabled: cudaError_t = 5;
pub const cudaErrorInvalidResourceHandle: cudaError_t = 400;
pub const cudaErrorIllegalState: cudaError_t = 401;
pub const cudaErrorNotReady: cudaError_t = 600;
pub const cudaErrorIllegalAddress: cudaError_t = 700;
pub const cudaErrorContextIsDestroyed: cudaError_t = 709;
pub const cudaErrorHostMemoryAlreadyRegistered: cudaError_t = 712;
pub const cudaErrorHostMemoryNotRegistered: cudaError_t = 713;
pub const cudaErrorLaunchFailure: cudaError_t = 719;
pub const cudaErrorNotPermitted: cudaError_t = 800;
pub const cudaErrorNotSupported: cudaError_t = 801;
pub const cudaErrorStreamCaptureUnsupported: cudaError_t = 900;
pub const cudaErrorStreamCaptureInvalidated: cudaError_t = 901;
pub const cudaErrorStreamCaptureMerge: cudaError_t = 902;
pub const cudaErrorStreamCaptureUnmatched: cudaError_t = 903;
pub const cudaErrorStreamCaptureUnjoined: cudaError_t = 904;
pub const cudaErrorStreamCaptureIsolation: cudaError_t = 905;
pub const cudaErrorStreamCaptureImplicit: cudaError_t = 906;
pub const cudaErrorCapturedEvent: cudaError_t = 907;
pub const cudaErrorStreamCaptureWrongThread: cudaError_t = 908;
pub const cudaErrorGraphExecUpdateFailure: cudaError_t = 910;
pub const cudaErrorUnknown: cudaError_t = 999;

/// `struct cudaPointerAttributes`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaPointerAttributes {
    pub type_: cudaMemoryType,
    pub device: c_int,
    pub devicePointer: *mut c_void,
    pub hostPointer: *mut c_void,
    /// CUDA 13 appended `long reserved[8]`.
    #[cfg(sim_cuda13)]
    pub reserved: [core::ffi::c_long; 8],
}

/// `enum cudaGraphInstantiateResult`.
pub type cudaGraphInstantiateResult = c_uint;
pub const cudaGraphInstantiateSuccess: cudaGraphInstantiateResult = 0;
pub const cudaGraphInstantiateError: cudaGraphInstantiateResult = 1;
/// `cudaGraphInstantiateFlagUpload`: upload the graph on `uploadStream` after instantiating.
pub const cudaGraphInstantiateFlagUpload: core::ffi::c_ulonglong = 2;

/// `struct cudaGraphInstantiateParams_st`: `cudaGraphInstantiateWithParams`'s in/out block.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaGraphInstantiateParams_st {
    pub flags: core::ffi::c_ulonglong,
    pub uploadStream: cudaStream_t,
    pub errNode_out: cudaGraphNode_t,
    pub result_out: cudaGraphInstantiateResult,
}
/// `cudaGraphInstantiateParams`.
pub type cudaGraphInstantiateParams = cudaGraphInstantiateParams_st;

/// `struct cudaGraphExecUpdateResultInfo_st`: what `cudaGraphExecUpdate` reports.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaGraphExecUpdateResultInfo_st {
    pub result: cudaGraphExecUpdateResult,
    pub errorNode: cudaGraphNode_t,
    pub errorFromNode: cudaGraphNode_t,
}
/// `cudaGraphExecUpdateResultInfo`.
pub type cudaGraphExecUpdateResultInfo = cudaGraphExecUpdateResultInfo_st;

/// `struct cudaPitchedPtr`: a pitched allocation (`cudaMalloc3D`, `cudaMemset3D`): rows of
/// `pitch` bytes, `xsize` of them used, `ysize` rows per slice.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `struct cudaExtent`: a 3-D size (`width` in bytes for linear memory, rows, slices).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

crate::opaque_struct!(
    /// Pointee of `cudaArray_t`.
    cudaArray
);
/// `cudaArray_t`: a CUDA array (texture memory, not linear).
pub type cudaArray_t = *mut cudaArray;
/// `cudaArray_const_t`.
pub type cudaArray_const_t = *const cudaArray;
/// `enum cudaChannelFormatKind`.
pub type cudaChannelFormatKind = c_uint;

/// `struct cudaChannelFormatDesc`: the bits of each channel of a CUDA array's element.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: cudaChannelFormatKind,
}

/// `struct cudaPos`: a 3-D position (`x` in bytes for linear memory, row, slice).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaPos {
    pub x: usize,
    pub y: usize,
    pub z: usize,
}

/// `struct cudaMemcpy3DParms`: a 3-D copy (`cudaMemcpy3D`, `cudaMemcpy3DAsync`) between a CUDA
/// array or pitched linear memory at a position, for an extent.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaMemcpy3DParms {
    pub srcArray: cudaArray_t,
    pub srcPos: cudaPos,
    pub srcPtr: cudaPitchedPtr,
    pub dstArray: cudaArray_t,
    pub dstPos: cudaPos,
    pub dstPtr: cudaPitchedPtr,
    pub extent: cudaExtent,
    pub kind: cudaMemcpyKind,
}

/// `struct cudaMemsetParams`: a memset node (`cudaGraphAddMemsetNode`): `height` rows of
/// `width` elements of `elementSize` bytes (1, 2 or 4) set to `value`, rows `pitch` bytes apart.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaMemsetParams {
    pub dst: *mut c_void,
    pub pitch: usize,
    pub value: c_uint,
    pub elementSize: c_uint,
    pub width: usize,
    pub height: usize,
}

/// `struct cudaMemLocation`: a device or host memory location (a hint of a batched copy).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaMemLocation {
    pub type_: cudaMemLocationType,
    pub id: c_int,
}

/// `struct cudaMemcpyAttributes` (CUDA 12.8+): how the copies of a `cudaMemcpyBatchAsync`
/// that it applies to may read their sources, with location hints and flags.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaMemcpyAttributes {
    pub srcAccessOrder: cudaMemcpySrcAccessOrder,
    pub srcLocHint: cudaMemLocation,
    pub dstLocHint: cudaMemLocation,
    pub flags: c_uint,
}

/// `struct cudaMemcpy3DOperand` (CUDA 12.8+): one end of a batched 3-D copy. C's `op` is a
/// union of two anonymous structs (`ptr`: `void* ptr; size_t rowLength; size_t layerHeight;
/// struct cudaMemLocation locHint;`, `array`: `cudaArray_t array; struct cudaOffset3D
/// offset;`), kept here as its bytes; [`cudaMemcpy3DOperand::pointer`] reads the first.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaMemcpy3DOperand {
    pub type_: cudaMemcpy3DOperandType,
    pub _op: [u64; 4],
}

impl cudaMemcpy3DOperand {
    /// A pointer operand: the pointer, its row length and layer height in elements (0:
    /// packed by the copy's extent).
    pub fn pointer(&self) -> Option<(*mut c_void, usize, usize)> {
        (self.type_ == cudaMemcpyOperandTypePointer).then(|| {
            (
                self._op[0] as *mut c_void,
                self._op[1] as usize,
                self._op[2] as usize,
            )
        })
    }

    /// An operand at `ptr` with rows of `row_length` and layers of `layer_height` elements.
    pub fn of_pointer(ptr: *mut c_void, row_length: usize, layer_height: usize) -> Self {
        cudaMemcpy3DOperand {
            type_: cudaMemcpyOperandTypePointer,
            _op: [ptr as u64, row_length as u64, layer_height as u64, 0],
        }
    }
}

/// `struct cudaMemcpy3DBatchOp` (CUDA 12.8+): one copy of a `cudaMemcpy3DBatchAsync`; its
/// extent counts elements (bytes between pointers).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cudaMemcpy3DBatchOp {
    pub src: cudaMemcpy3DOperand,
    pub dst: cudaMemcpy3DOperand,
    pub extent: cudaExtent,
    pub srcAccessOrder: cudaMemcpySrcAccessOrder,
    pub flags: c_uint,
}

/// `struct cudaMemcpy3DPeerParms`: a 3-D copy between devices (`cudaMemcpy3DPeer`,
/// `cudaMemcpy3DPeerAsync`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct cudaMemcpy3DPeerParms {
    pub srcArray: cudaArray_t,
    pub srcPos: cudaPos,
    pub srcPtr: cudaPitchedPtr,
    pub srcDevice: c_int,
    pub dstArray: cudaArray_t,
    pub dstPos: cudaPos,
    pub dstPtr: cudaPitchedPtr,
    pub dstDevice: c_int,
    pub extent: cudaExtent,
}

/// `dim3` (`vector_types.h`): a kernel launch's grid or block size, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// `uint3` (`vector_types.h`): a thread or block index.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct uint3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// `struct CUuuid_st` (`cudaUUID_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUuuid_st {
    pub bytes: [c_char; 16],
}
/// `cudaUUID_t`.
pub type cudaUUID_t = CUuuid_st;

/// `struct cudaDeviceProp` of CUDA 12 (CUDA 13: eight fields removed, seven added; see
/// docs/cuda13.md) (filled by `cudaGetDeviceProperties_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaDeviceProp {
    pub name: [c_char; 256],
    pub uuid: cudaUUID_t,
    pub luid: [c_char; 8],
    pub luidDeviceNodeMask: c_uint,
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    pub regsPerBlock: c_int,
    pub warpSize: c_int,
    pub memPitch: usize,
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    #[cfg(not(sim_cuda13))]
    pub clockRate: c_int,
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    #[cfg(not(sim_cuda13))]
    pub deviceOverlap: c_int,
    pub multiProcessorCount: c_int,
    #[cfg(not(sim_cuda13))]
    pub kernelExecTimeoutEnabled: c_int,
    pub integrated: c_int,
    pub canMapHostMemory: c_int,
    #[cfg(not(sim_cuda13))]
    pub computeMode: c_int,
    pub maxTexture1D: c_int,
    pub maxTexture1DMipmap: c_int,
    #[cfg(not(sim_cuda13))]
    pub maxTexture1DLinear: c_int,
    pub maxTexture2D: [c_int; 2],
    pub maxTexture2DMipmap: [c_int; 2],
    pub maxTexture2DLinear: [c_int; 3],
    pub maxTexture2DGather: [c_int; 2],
    pub maxTexture3D: [c_int; 3],
    pub maxTexture3DAlt: [c_int; 3],
    pub maxTextureCubemap: c_int,
    pub maxTexture1DLayered: [c_int; 2],
    pub maxTexture2DLayered: [c_int; 3],
    pub maxTextureCubemapLayered: [c_int; 2],
    pub maxSurface1D: c_int,
    pub maxSurface2D: [c_int; 2],
    pub maxSurface3D: [c_int; 3],
    pub maxSurface1DLayered: [c_int; 2],
    pub maxSurface2DLayered: [c_int; 3],
    pub maxSurfaceCubemap: c_int,
    pub maxSurfaceCubemapLayered: [c_int; 2],
    pub surfaceAlignment: usize,
    pub concurrentKernels: c_int,
    pub ECCEnabled: c_int,
    pub pciBusID: c_int,
    pub pciDeviceID: c_int,
    pub pciDomainID: c_int,
    pub tccDriver: c_int,
    pub asyncEngineCount: c_int,
    pub unifiedAddressing: c_int,
    #[cfg(not(sim_cuda13))]
    pub memoryClockRate: c_int,
    pub memoryBusWidth: c_int,
    pub l2CacheSize: c_int,
    pub persistingL2CacheMaxSize: c_int,
    pub maxThreadsPerMultiProcessor: c_int,
    pub streamPrioritiesSupported: c_int,
    pub globalL1CacheSupported: c_int,
    pub localL1CacheSupported: c_int,
    pub sharedMemPerMultiprocessor: usize,
    pub regsPerMultiprocessor: c_int,
    pub managedMemory: c_int,
    pub isMultiGpuBoard: c_int,
    pub multiGpuBoardGroupID: c_int,
    pub hostNativeAtomicSupported: c_int,
    #[cfg(not(sim_cuda13))]
    pub singleToDoublePrecisionPerfRatio: c_int,
    pub pageableMemoryAccess: c_int,
    pub concurrentManagedAccess: c_int,
    pub computePreemptionSupported: c_int,
    pub canUseHostPointerForRegisteredMem: c_int,
    pub cooperativeLaunch: c_int,
    #[cfg(not(sim_cuda13))]
    pub cooperativeMultiDeviceLaunch: c_int,
    pub sharedMemPerBlockOptin: usize,
    pub pageableMemoryAccessUsesHostPageTables: c_int,
    pub directManagedMemAccessFromHost: c_int,
    pub maxBlocksPerMultiProcessor: c_int,
    pub accessPolicyMaxWindowSize: c_int,
    pub reservedSharedMemPerBlock: usize,
    pub hostRegisterSupported: c_int,
    pub sparseCudaArraySupported: c_int,
    pub hostRegisterReadOnlySupported: c_int,
    pub timelineSemaphoreInteropSupported: c_int,
    pub memoryPoolsSupported: c_int,
    pub gpuDirectRDMASupported: c_int,
    pub gpuDirectRDMAFlushWritesOptions: c_uint,
    pub gpuDirectRDMAWritesOrdering: c_int,
    pub memoryPoolSupportedHandleTypes: c_uint,
    pub deferredMappingCudaArraySupported: c_int,
    pub ipcEventSupported: c_int,
    pub clusterLaunch: c_int,
    pub unifiedFunctionPointers: c_int,
    #[cfg(not(sim_cuda13))]
    pub reserved: [c_int; 63],
    #[cfg(sim_cuda13)]
    pub deviceNumaConfig: c_int,
    #[cfg(sim_cuda13)]
    pub deviceNumaId: c_int,
    #[cfg(sim_cuda13)]
    pub mpsEnabled: c_int,
    #[cfg(sim_cuda13)]
    pub hostNumaId: c_int,
    #[cfg(sim_cuda13)]
    pub gpuPciDeviceID: c_uint,
    #[cfg(sim_cuda13)]
    pub gpuPciSubsystemID: c_uint,
    #[cfg(sim_cuda13)]
    pub hostNumaMultinodeIpcSupported: c_int,
    #[cfg(sim_cuda13)]
    pub reserved: [c_int; 56],
}

impl Default for cudaDeviceProp {
    fn default() -> Self {
        // SAFETY: every field is an integer or an array of integers; all-zero is valid.
        unsafe { core::mem::zeroed() }
    }
}
