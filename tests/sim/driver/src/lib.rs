//! Simulated `libcuda.so.1`: the CUDA driver API as PyTorch reaches it.
//!
//! PyTorch opens the driver lazily (`libcaffe2_nvrtc.so` links it; its context checks call
//! `cuDevicePrimaryCtxGetState` for every device, many times per run) and looks driver
//! functions up through the runtime (`cudaGetDriverEntryPoint(ByVersion)`, which the simulated
//! runtime answers with this library's `cuGetProcAddress_v2`, as the real runtime does).
//!
//! Devices, the current device and primary contexts belong to the simulated runtime: this
//! library asks it through its private exports (`__simcudaCurrentDevice`,
//! `__simcudaPrimaryContextActive`, `__simcudaPrimaryContextRetain`) and its public
//! `cudaGetDeviceCount` / `cudaDeviceGetAttribute` / `cudaSetDevice`, looked up in the loaded
//! runtime itself (never interposed). A context handle is the device's primary context; there
//! are no other contexts.
//!
//! Stream capture and graphs (`cuStreamBeginCapture_v2`, `cuGraphInstantiateWithFlags`,
//! `cuGraphLaunch`, ...) are the runtime's, as XLA's command buffers reach them (graph.rs).
//!
//! Device code cannot run: module loading, JIT linking and launches fail with the errors CUDA
//! documents for an image that does not fit the device (`CUDA_ERROR_NO_BINARY_FOR_GPU`) or an
//! unusable handle (`CUDA_ERROR_INVALID_HANDLE`).
#![allow(clippy::missing_safety_doc)]

mod api;
mod graph;
mod memory;

pub use api::*;
pub use graph::*;
pub use memory::*;
