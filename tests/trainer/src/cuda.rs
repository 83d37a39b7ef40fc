//! The CUDA runtime as the trainer uses it: device buffers, one stream, pinned host memory,
//! asynchronous copies, and "kernels" — host functions enqueued with `cudaLaunchHostFunc`.
//!
//! A kernel reaches device memory only through [`sim_device::device_access`] (device pointers
//! are not dereferenceable on the host, as on a GPU), and only while it runs on the stream: the
//! stream orders it after every earlier operation on the same buffers (all the trainer's work,
//! NCCL and GEMMs included, is on one stream).

use core::ffi::{c_int, c_void};

use anyhow::{anyhow, bail, Result};
use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::abi::nccl::*;
use cuda_dyn::cudart::*;
use half::bf16;

/// `cudaGetErrorName` of a status.
pub fn error_name(code: cudaError_t) -> String {
    // SAFETY: returns a static NUL-terminated string for any code.
    let p = unsafe { cudaGetErrorName(code) };
    if p.is_null() {
        return format!("cudaError {code}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    format!("{} ({code})", s.to_string_lossy())
}

/// Fails with the call's text unless it returned `cudaSuccess`.
macro_rules! cuda {
    ($e:expr) => {{
        // SAFETY: a CUDA runtime call with arguments prepared by the trainer (valid handles,
        // pointers to live buffers of the sizes passed).
        let code = unsafe { $e };
        if code != cuda_dyn::abi::cudart::cudaSuccess {
            return Err(anyhow::anyhow!(
                "{} returned {}",
                stringify!($e),
                $crate::cuda::error_name(code)
            ));
        }
    }};
}

/// Element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    BF16,
    /// FP8 E4M3 (`e4m3fn`).
    E4M3,
    /// FP8 E5M2.
    E5M2,
    /// 32-bit integer (token ids).
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 => 2,
            DType::E4M3 | DType::E5M2 => 1,
        }
    }
    /// The `cudaDataType` of the type.
    pub fn cuda(self) -> cudaDataType {
        match self {
            DType::F32 => CUDA_R_32F,
            DType::BF16 => CUDA_R_16BF,
            DType::E4M3 => CUDA_R_8F_E4M3,
            DType::E5M2 => CUDA_R_8F_E5M2,
            DType::I32 => CUDA_R_32I,
        }
    }
    /// The `ncclDataType_t` of the type (FP8 travels as bytes, as Transformer Engine sends it).
    pub fn nccl(self) -> ncclDataType_t {
        match self {
            DType::F32 => ncclFloat32,
            DType::BF16 => ncclBfloat16,
            DType::E4M3 | DType::E5M2 => ncclUint8,
            DType::I32 => ncclInt32,
        }
    }
}

/// A typed range of device memory: an address, a length in elements and a type. `Copy` and
/// `Send`, so kernels capture it by value; the memory is owned by an [`Arena`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    addr: usize,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub dt: DType,
}

impl Buf {
    /// The device pointer.
    pub fn ptr(self) -> *mut c_void {
        self.addr as *mut c_void
    }
    /// Bytes.
    pub fn bytes(self) -> usize {
        self.len * self.dt.size()
    }
    /// Elements `[off, off + len)`.
    pub fn slice(self, off: usize, len: usize) -> Buf {
        assert!(
            off + len <= self.len,
            "slice [{off}, {}) of a buffer of {}",
            off + len,
            self.len
        );
        Buf {
            addr: self.addr + off * self.dt.size(),
            len,
            dt: self.dt,
        }
    }
    /// Elements from `off` to the end.
    pub fn from(self, off: usize) -> Buf {
        self.slice(off, self.len - off)
    }
    /// The same bytes seen as another type of the same size (FP8 bytes as E4M3 or E5M2).
    pub fn cast(self, dt: DType) -> Buf {
        assert_eq!(dt.size(), self.dt.size(), "cast between sizes");
        Buf { dt, ..self }
    }
}

/// Owner of the device allocations of a run.
pub struct Arena {
    allocs: Vec<usize>,
    stream: Stream,
}

impl Arena {
    /// An arena whose buffers are zeroed in order on `stream`.
    pub fn new(stream: Stream) -> Arena {
        Arena {
            allocs: Vec::new(),
            stream,
        }
    }

    /// A device buffer of `len` elements, zeroed on the arena's stream (a plain `cudaMemset`
    /// would run on the legacy stream, which does not order a non-blocking stream).
    pub fn alloc(&mut self, len: usize, dt: DType) -> Result<Buf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        let bytes = (len * dt.size()).max(16);
        cuda!(cudaMalloc(&mut p, bytes));
        cuda!(cudaMemsetAsync(p, 0, bytes, self.stream.raw()));
        self.allocs.push(p as usize);
        Ok(Buf {
            addr: p as usize,
            len,
            dt,
        })
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        for &p in &self.allocs {
            // SAFETY: allocated by `alloc`; cudaFree synchronises the device first.
            unsafe { cudaFree(p as *mut c_void) };
        }
    }
}

/// Pinned (page-locked) host memory, from `cudaMallocHost`.
pub struct Pinned {
    ptr: *mut u8,
    bytes: usize,
}

impl Pinned {
    /// `bytes` of pinned memory, zeroed.
    pub fn new(bytes: usize) -> Result<Pinned> {
        let mut p: *mut c_void = std::ptr::null_mut();
        cuda!(cudaMallocHost(&mut p, bytes.max(16)));
        // SAFETY: a fresh host allocation of at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        Ok(Pinned {
            ptr: p.cast(),
            bytes,
        })
    }
    /// The memory as bytes. The caller must not write it while a copy from it is in flight
    /// (the trainer synchronises its stream before reusing a staging buffer).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `bytes` long and owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
    /// The memory as bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }
    /// The host pointer.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr.cast()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cudaMallocHost in `new`.
        unsafe { cudaFreeHost(self.ptr.cast()) };
    }
}

/// The rank's stream (non-blocking, so the legacy default stream never orders it).
#[derive(Debug, Clone, Copy)]
pub struct Stream(usize);

impl Stream {
    /// Creates a stream.
    pub fn new() -> Result<Stream> {
        let mut s: cudaStream_t = std::ptr::null_mut();
        cuda!(cudaStreamCreateWithFlags(&mut s, cudaStreamNonBlocking));
        Ok(Stream(s as usize))
    }
    /// The raw handle.
    pub fn raw(self) -> cudaStream_t {
        self.0 as cudaStream_t
    }
    /// Waits for everything enqueued so far.
    pub fn sync(self) -> Result<()> {
        cuda!(cudaStreamSynchronize(self.raw()));
        Ok(())
    }
    /// Host to device copy from pinned memory (asynchronous).
    pub fn upload(self, dst: Buf, src: &Pinned, src_off: usize) -> Result<()> {
        if src_off + dst.bytes() > src.bytes {
            bail!("upload of {} bytes past the staging buffer", dst.bytes());
        }
        // SAFETY: address arithmetic inside the pinned allocation (checked above).
        let sp = unsafe { src.ptr.add(src_off) };
        cuda!(cudaMemcpyAsync(
            dst.ptr(),
            sp.cast(),
            dst.bytes(),
            cudaMemcpyHostToDevice,
            self.raw()
        ));
        Ok(())
    }
    /// Device to host copy into pinned memory (asynchronous; read after [`Stream::sync`]).
    pub fn download(self, dst: &mut Pinned, dst_off: usize, src: Buf) -> Result<()> {
        if dst_off + src.bytes() > dst.bytes {
            bail!("download of {} bytes past the staging buffer", src.bytes());
        }
        // SAFETY: address arithmetic inside the pinned allocation (checked above).
        let dp = unsafe { dst.ptr.add(dst_off) };
        cuda!(cudaMemcpyAsync(
            dp.cast(),
            src.ptr(),
            src.bytes(),
            cudaMemcpyDeviceToHost,
            self.raw()
        ));
        Ok(())
    }
    /// Device to device copy (asynchronous).
    pub fn copy(self, dst: Buf, src: Buf) -> Result<()> {
        if dst.bytes() != src.bytes() {
            bail!(
                "device copy of {} bytes into {} bytes",
                src.bytes(),
                dst.bytes()
            );
        }
        cuda!(cudaMemcpyAsync(
            dst.ptr(),
            src.ptr(),
            src.bytes(),
            cudaMemcpyDeviceToDevice,
            self.raw()
        ));
        Ok(())
    }
    /// Zeroes a buffer (asynchronous).
    pub fn zero(self, b: Buf) -> Result<()> {
        cuda!(cudaMemsetAsync(b.ptr(), 0, b.bytes(), self.raw()));
        Ok(())
    }
    /// Enqueues a kernel: `f` runs on the stream's worker when the stream reaches it. Into a
    /// stream capture (`--cuda-graph`), the kernel becomes a host node that runs at every
    /// replay: `f` is then kept for the life of the process.
    pub fn kernel<F: Fn() + Send + 'static>(self, f: F) -> Result<()> {
        type Job = Box<dyn Fn() + Send>;
        fn run(job: &Job) {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                // A panicking kernel is a trainer bug; a GPU would have faulted. Never unwind
                // into the runtime.
                eprintln!("trainer: a kernel panicked; aborting");
                std::process::abort();
            }
        }
        unsafe extern "C" fn once(user: *mut c_void) {
            // SAFETY: `user` is the Box leaked below; an eager host function runs once.
            let job: Box<Job> = unsafe { Box::from_raw(user.cast::<Job>()) };
            run(&job);
        }
        unsafe extern "C" fn replayed(user: *mut c_void) {
            // SAFETY: `user` is the Box leaked below, never freed: a graph may replay it.
            let job: &Job = unsafe { &*user.cast::<Job>() };
            run(job);
        }
        let mut status: cudaStreamCaptureStatus = 0;
        cuda!(cudaStreamIsCapturing(self.raw(), &mut status));
        let captured = status != cudaStreamCaptureStatusNone;
        let job: Box<Job> = Box::new(Box::new(f));
        let user = Box::into_raw(job);
        let tramp = if captured { replayed } else { once };
        // SAFETY: the trampoline borrows or takes ownership of `user` when it runs.
        let code = unsafe { cudaLaunchHostFunc(self.raw(), Some(tramp), user.cast()) };
        if code != cudaSuccess {
            // SAFETY: the runtime refused the launch, so the box is still ours.
            drop(unsafe { Box::from_raw(user) });
            return Err(anyhow!("cudaLaunchHostFunc returned {}", error_name(code)));
        }
        Ok(())
    }
}

/// A CUDA graph made by stream capture (`--cuda-graph`), as `torch.cuda.graph` makes one:
/// global capture mode, instantiated once, launched on the stream it was captured from.
pub struct Graph {
    graph: usize,
    exec: usize,
}

impl Graph {
    /// Captures what `record` enqueues on `s` (nothing runs until [`Graph::launch`]).
    pub fn capture(s: Stream, record: impl FnOnce() -> Result<()>) -> Result<Graph> {
        cuda!(cudaStreamBeginCapture(s.raw(), cudaStreamCaptureModeGlobal));
        let recorded = record();
        let mut g: cudaGraph_t = std::ptr::null_mut();
        // Ends the capture even when recording failed, so the stream stays usable.
        // SAFETY: the stream this function began capturing; an out-pointer to a local.
        let ended = unsafe { cudaStreamEndCapture(s.raw(), &mut g) };
        recorded?;
        if ended != cudaSuccess {
            bail!("cudaStreamEndCapture returned {}", error_name(ended));
        }
        let mut exec: cudaGraphExec_t = std::ptr::null_mut();
        cuda!(cudaGraphInstantiateWithFlags(&mut exec, g, 0));
        Ok(Graph {
            graph: g as usize,
            exec: exec as usize,
        })
    }

    /// Replays the graph on `s`.
    pub fn launch(&self, s: Stream) -> Result<()> {
        cuda!(cudaGraphLaunch(self.exec as cudaGraphExec_t, s.raw()));
        Ok(())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: handles this graph made; launches were synchronised by the caller.
        unsafe {
            cudaGraphExecDestroy(self.exec as cudaGraphExec_t);
            cudaGraphDestroy(self.graph as cudaGraph_t);
        }
    }
}

/// Selects the device from `LOCAL_RANK` (modulo the device count), as torchrun workers do.
pub fn set_device(local_rank: usize) -> Result<()> {
    let mut n: c_int = 0;
    cuda!(cudaGetDeviceCount(&mut n));
    let n = n.max(1) as usize;
    cuda!(cudaSetDevice((local_rank % n) as c_int));
    Ok(())
}

/// Host address of a device range, for a kernel.
fn access(b: Buf) -> *mut u8 {
    match sim_device::device_access(b.ptr(), b.bytes()) {
        Some(p) => p.0,
        None => panic!(
            "kernel touched {:#x}+{} bytes: not device-accessible",
            b.addr,
            b.bytes()
        ),
    }
}

/// A kernel's mutable view of an f32 buffer.
///
/// # Safety
/// Only inside a kernel running on the stream, and no other live view may overlap `b`.
pub unsafe fn f32_mut<'a>(b: Buf) -> &'a mut [f32] {
    assert_eq!(b.dt, DType::F32);
    // SAFETY: per the contract; device_access validated the range and f32 alignment holds
    // (allocations are 256-byte aligned and offsets are whole elements).
    unsafe { std::slice::from_raw_parts_mut(access(b).cast::<f32>(), b.len) }
}

/// A kernel's view of an i32 buffer.
///
/// # Safety
/// As [`f32_mut`], and nothing writes `b` meanwhile.
pub unsafe fn i32s<'a>(b: Buf) -> &'a [i32] {
    assert_eq!(b.dt, DType::I32);
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(access(b).cast::<i32>(), b.len) }
}

/// A kernel's mutable view of a buffer's bytes.
///
/// # Safety
/// As [`f32_mut`].
pub unsafe fn bytes_mut<'a>(b: Buf) -> &'a mut [u8] {
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts_mut(access(b), b.bytes()) }
}

/// A kernel reads a float buffer (f32 or bf16) into f32.
///
/// # Safety
/// As [`i32s`].
pub unsafe fn load(b: Buf) -> Vec<f32> {
    let p = access(b);
    match b.dt {
        // SAFETY: per the contract; the range was validated.
        DType::F32 => unsafe { std::slice::from_raw_parts(p.cast::<f32>(), b.len) }.to_vec(),
        DType::BF16 => {
            // SAFETY: as above; bf16 is a plain u16.
            let s = unsafe { std::slice::from_raw_parts(p.cast::<bf16>(), b.len) };
            s.iter().map(|v| v.to_f32()).collect()
        }
        t => panic!("load of a {t:?} buffer"),
    }
}

/// A kernel writes f32 values into a float buffer (rounding to nearest-even for bf16).
///
/// # Safety
/// As [`f32_mut`].
pub unsafe fn store(b: Buf, v: &[f32]) {
    assert_eq!(v.len(), b.len, "store length");
    let p = access(b);
    match b.dt {
        DType::F32 => {
            // SAFETY: per the contract.
            unsafe { std::slice::from_raw_parts_mut(p.cast::<f32>(), b.len) }.copy_from_slice(v)
        }
        DType::BF16 => {
            // SAFETY: as above.
            let s = unsafe { std::slice::from_raw_parts_mut(p.cast::<bf16>(), b.len) };
            for (d, x) in s.iter_mut().zip(v) {
                *d = bf16::from_f32(*x);
            }
        }
        t => panic!("store into a {t:?} buffer"),
    }
}
