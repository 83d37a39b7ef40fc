//! What every probe needs: status checks that name the failed call, the job a rank belongs to
//! (from simrun/torchrun's environment), the world communicator, streams and device buffers.

use core::ffi::{c_int, c_void};

use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::nccl::*;
use cuda_dyn::cudart::*;
use cuda_dyn::nccl::*;

/// `cudaGetErrorName` of a status, with its number.
pub fn cuda_error(code: cudaError_t) -> String {
    // SAFETY: cudaGetErrorName returns a static NUL-terminated string for any code.
    format!("{} ({code})", cstr(unsafe { cudaGetErrorName(code) }))
}

/// Fails with the call and its CUDA error unless it returned `cudaSuccess`.
macro_rules! ck {
    ($e:expr) => {{
        // SAFETY: a CUDA call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != cuda_dyn::abi::cudart::cudaSuccess {
            return Err(format!(
                "{} returned {}",
                stringify!($e),
                $crate::support::cuda_error(code)
            ));
        }
    }};
}

/// Fails with the call, NCCL's error text and last error unless it returned `ncclSuccess`.
macro_rules! nc {
    ($e:expr) => {{
        // SAFETY: an NCCL call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != cuda_dyn::abi::nccl::ncclSuccess {
            return Err(format!(
                "{} returned {}",
                stringify!($e),
                $crate::support::nccl_error(code)
            ));
        }
    }};
}

pub fn cstr(p: *const core::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns NUL-terminated strings.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

pub fn nccl_error(code: ncclResult_t) -> String {
    // SAFETY: plain queries.
    let (s, last) = unsafe {
        (
            cstr(ncclGetErrorString(code)),
            cstr(ncclGetLastError(std::ptr::null_mut())),
        )
    };
    format!("ncclResult {code} ({s}; last error: {last})")
}

/// The job this process belongs to, from simrun/torchrun's environment.
pub struct Job {
    pub rank: usize,
    pub n: usize,
}

pub fn env_usize(name: &str) -> Result<usize, String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set (run under simrun)"))?
        .parse()
        .map_err(|e| format!("{name}: {e}"))
}

pub fn job() -> Result<Job, String> {
    let rank = env_usize("RANK")?;
    let n = env_usize("WORLD_SIZE")?;
    let local = env_usize("LOCAL_RANK").unwrap_or(rank);
    if std::env::var_os("NCCL_COMM_ID").is_none() {
        let addr = std::env::var("MASTER_ADDR").map_err(|_| "MASTER_ADDR is not set")?;
        let port = std::env::var("MASTER_PORT").map_err(|_| "MASTER_PORT is not set")?;
        // The real NCCL bootstrap variable: every rank derives the same unique id from it.
        std::env::set_var("NCCL_COMM_ID", format!("{addr}:{port}"));
    }
    let mut ndev: c_int = 0;
    ck!(cudaGetDeviceCount(&mut ndev));
    ck!(cudaSetDevice((local % ndev.max(1) as usize) as c_int));
    Ok(Job { rank, n })
}

/// The world communicator from `NCCL_COMM_ID`.
pub fn world(j: &Job) -> Result<ncclComm_t, String> {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    nc!(ncclGetUniqueId(&mut id));
    let mut comm: ncclComm_t = std::ptr::null_mut();
    nc!(ncclCommInitRank(
        &mut comm,
        j.n as c_int,
        id,
        j.rank as c_int
    ));
    Ok(comm)
}

pub fn stream() -> Result<cudaStream_t, String> {
    let mut s: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreateWithFlags(&mut s, cudaStreamNonBlocking));
    Ok(s)
}

/// A device buffer, freed on drop.
pub struct DevBuf {
    pub ptr: *mut c_void,
    pub bytes: usize,
}

impl DevBuf {
    pub fn new(bytes: usize) -> Result<DevBuf, String> {
        let mut ptr = std::ptr::null_mut();
        ck!(cudaMalloc(&mut ptr, bytes.max(1)));
        Ok(DevBuf { ptr, bytes })
    }
    pub fn from_host(data: &[u8]) -> Result<DevBuf, String> {
        let b = DevBuf::new(data.len())?;
        b.write(0, data)?;
        Ok(b)
    }
    /// Element offset `bytes_off` as a device pointer.
    pub fn at(&self, bytes_off: usize) -> *mut c_void {
        // SAFETY: address arithmetic only; the probe stays inside the allocation.
        unsafe { self.ptr.cast::<u8>().add(bytes_off).cast() }
    }
    pub fn write(&self, off: usize, data: &[u8]) -> Result<(), String> {
        ck!(cudaMemcpy(
            self.at(off),
            data.as_ptr().cast(),
            data.len(),
            cudaMemcpyHostToDevice
        ));
        Ok(())
    }
    /// A new buffer filled from `host` by a copy enqueued on `stream`.
    pub fn upload(host: &[u8], stream: cudaStream_t) -> Result<DevBuf, String> {
        let d = DevBuf::new(host.len())?;
        ck!(cudaMemcpyAsync(
            d.ptr,
            host.as_ptr().cast(),
            host.len(),
            cudaMemcpyHostToDevice,
            stream
        ));
        Ok(d)
    }
    /// The contents, copied back after everything on `stream` finished.
    pub fn download(&self, stream: cudaStream_t) -> Result<Vec<u8>, String> {
        let mut host = vec![0u8; self.bytes];
        ck!(cudaMemcpyAsync(
            host.as_mut_ptr().cast(),
            self.ptr,
            self.bytes,
            cudaMemcpyDeviceToHost,
            stream
        ));
        ck!(cudaStreamSynchronize(stream));
        Ok(host)
    }
    pub fn read(&self) -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; self.bytes];
        ck!(cudaMemcpy(
            v.as_mut_ptr().cast(),
            self.ptr,
            self.bytes,
            cudaMemcpyDeviceToHost
        ));
        Ok(v)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: the allocation made in `new`.
        unsafe { cudaFree(self.ptr) };
    }
}

pub(crate) use {ck, nc};
