//! What the simulated cuBLAS and cuBLASLt share, as the two real libraries share their kernels:
//! launching a [`sim_kernels::gemm`] GEMM on a stream of the simulated runtime, faults, status
//! names and the library version properties.
//!
//! Device pointers are translated with `sim_device::device_access` when the call is made (the
//! launch) and only dereferenced inside the kernel, on the stream's worker thread.
//!
//! # Faults
//! Real cuBLAS does not validate data pointers: a kernel that touches memory the device cannot
//! access faults asynchronously, the call itself having returned `CUBLAS_STATUS_SUCCESS`, and
//! the fault surfaces as the sticky `cudaErrorIllegalAddress` at the next synchronisation. The
//! simulation does the same: a pointer range that is not device-accessible (pageable host
//! memory, an unknown pointer, a range leaving its allocation) makes the enqueued kernel fail
//! with `cudaErrorIllegalAddress`. A launch the runtime refuses (bad stream, broken capture)
//! makes the call return `CUBLAS_STATUS_EXECUTION_FAILED`, as cuBLAS does when a launch fails.

use core::ffi::c_void;

use cuda_abi::cublas::*;
use cuda_abi::cudart::*;
use sim_device::DevicePtr;
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{gemm, Buffers, CInput, Gemm};

/// Runs `f`, turning a panic into `CUBLAS_STATUS_INTERNAL_ERROR`: no panic may cross the C ABI.
pub fn guard(f: impl FnOnce() -> cublasStatus_t) -> cublasStatus_t {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or(CUBLAS_STATUS_INTERNAL_ERROR)
}

/// A device range the device cannot access (a GPU kernel touching it would fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inaccessible;

/// A scalar (alpha, beta, a scale factor): a value read on the host at call time, or a device
/// pointer read by the kernel.
#[derive(Debug, Clone, Copy)]
pub enum Scalar {
    /// Already read.
    Value(f64),
    /// A device address holding one element of `DType`.
    Device(DevicePtr, DType),
}

impl Scalar {
    /// Reads a host-pointer-mode scalar of type `t` now.
    ///
    /// # Safety
    /// `p` must be a readable host pointer to one element of `t` (as in real cuBLAS, a device
    /// pointer here crashes the caller).
    pub unsafe fn host(p: *const c_void, t: DType) -> Scalar {
        let mut buf = [0u8; 8];
        // SAFETY: per the contract, `p` points to `t.size()` readable bytes.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), buf.as_mut_ptr(), t.size()) };
        Scalar::Value(t.load(&buf, 0))
    }

    /// A device-pointer-mode scalar of type `t`: `None` when `p` is not device-accessible.
    pub fn device(p: *const c_void, t: DType) -> Option<Scalar> {
        sim_device::device_access(p, t.size()).map(|d| Scalar::Device(d, t))
    }

    /// The value: read now, or (device) from device memory; call it inside a kernel.
    pub fn read(self) -> f64 {
        match self {
            Scalar::Value(v) => v,
            // SAFETY: validated by `device_access` for one element at launch.
            Scalar::Device(p, t) => t.load(unsafe { p.slice(t.size()) }, 0),
        }
    }
}

/// A device range translated at launch: `None` for an empty range.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    ptr: Option<DevicePtr>,
    len: usize,
}

impl Range {
    /// The empty range.
    pub const EMPTY: Range = Range { ptr: None, len: 0 };

    /// Translates `[p, p + len)`; [`Inaccessible`] when the device could not access it.
    pub fn new(p: *const c_void, len: usize) -> Result<Range, Inaccessible> {
        if len == 0 {
            return Ok(Range::EMPTY);
        }
        sim_device::device_access(p, len)
            .map(|d| Range { ptr: Some(d), len })
            .ok_or(Inaccessible)
    }

    fn host_range(&self) -> std::ops::Range<usize> {
        match self.ptr {
            Some(p) => p.0 as usize..p.0 as usize + self.len,
            None => 0..0,
        }
    }

    fn overlaps(&self, o: &Range) -> bool {
        let (a, b) = (self.host_range(), o.host_range());
        !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
    }

    /// # Safety
    /// Inside a kernel; no live mutable slice of the range.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        match self.ptr {
            // SAFETY: validated for `len` bytes at launch; per the caller's contract.
            Some(p) => unsafe { p.slice(self.len) },
            None => &[],
        }
    }

    /// # Safety
    /// Inside a kernel; no other live slice of the range.
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        match self.ptr {
            // SAFETY: validated for `len` bytes at launch; per the caller's contract.
            Some(p) => unsafe { p.slice_mut(self.len) },
            None => &mut [],
        }
    }
}

/// Everything one GEMM kernel needs, translated at launch.
#[derive(Debug, Clone, Copy)]
pub struct GemmKernel {
    /// The problem; `alpha`/`beta` and the epilogue scales are filled in by the kernel.
    pub g: Gemm,
    /// alpha.
    pub alpha: Scalar,
    /// beta.
    pub beta: Scalar,
    /// A.
    pub a: Range,
    /// B.
    pub b: Range,
    /// C (may equal D).
    pub c: Range,
    /// D.
    pub d: Range,
    /// The bias vector.
    pub bias: Range,
    /// The aux matrix (output, or DGELU's input).
    pub aux: Range,
    /// The bias gradient output.
    pub bgrad: Range,
    /// Scale factors of A, B, C, D (`None`: 1).
    pub scales: [Option<Scalar>; 4],
    /// MXFP8 block scales of A and B (UE8M0, cuBLASLt's tiled layout; empty: none): the
    /// operands are dequantized to F32 before the product.
    pub block_scales: [Range; 2],
    /// Where `amax_D` goes (f32), if requested.
    pub amax: Option<DevicePtr>,
}

impl GemmKernel {
    /// A kernel with no epilogue buffers; the ranges are filled in by the caller.
    pub fn new(g: Gemm, alpha: Scalar, beta: Scalar) -> GemmKernel {
        GemmKernel {
            g,
            alpha,
            beta,
            a: Range::EMPTY,
            b: Range::EMPTY,
            c: Range::EMPTY,
            d: Range::EMPTY,
            bias: Range::EMPTY,
            aux: Range::EMPTY,
            bgrad: Range::EMPTY,
            scales: [None; 4],
            block_scales: [Range::EMPTY; 2],
            amax: None,
        }
    }

    /// Translates the data pointers of a GEMM with `g`'s layouts (C only when it may be read).
    /// `Err` when one of them is not device-accessible.
    pub fn bind(
        &mut self,
        a: *const c_void,
        b: *const c_void,
        c: *const c_void,
        d: *mut c_void,
        c_read: bool,
    ) -> Result<(), Inaccessible> {
        let g = &self.g;
        let empty = g.m == 0 || g.n == 0 || g.batch == 0;
        let (a_len, b_len) = if empty || g.k == 0 {
            (0, 0)
        } else {
            (g.a_bytes(), g.b_bytes())
        };
        self.a = Range::new(a, a_len)?;
        self.b = Range::new(b, b_len)?;
        self.c = if c_read {
            Range::new(c, g.c_bytes())?
        } else {
            Range::EMPTY
        };
        self.d = Range::new(d, g.d_bytes())?;
        Ok(())
    }

    /// Runs the GEMM (the kernel body).
    pub fn run(&self) -> Result<(), cudaError_t> {
        let mut g = self.g;
        g.alpha = self.alpha.read();
        g.beta = self.beta.read();
        let [sa, sb, sc, sd] = self.scales.map(|s| s.map_or(1.0, Scalar::read));
        g.epilogue.scale_a = sa;
        g.epilogue.scale_b = sb;
        g.epilogue.scale_c = sc;
        g.epilogue.scale_d = sd;
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        if g.beta != 0.0 && self.c.ptr.is_none() {
            // A nonzero beta read on the device with no C bound: the kernel reads address 0.
            return Err(cudaErrorIllegalAddress);
        }
        // Operands that overlap D are copied first (a GEMM reads them all before writing).
        let copy_if = |r: &Range| {
            r.overlaps(&self.d).then(|| {
                // SAFETY: inside the kernel, before the mutable view of D exists.
                unsafe { r.bytes() }.to_vec()
            })
        };
        let (a_copy, b_copy) = (copy_if(&self.a), copy_if(&self.b));
        let bias_copy = copy_if(&self.bias);
        let same_c = self.c.ptr.is_some() && self.c.ptr == self.d.ptr && g.c == g.d;
        let c_copy = if same_c { None } else { copy_if(&self.c) };
        // SAFETY: the ranges were validated at launch; D is the only mutable view, and every
        // shared view of memory overlapping it was replaced by a copy above.
        let (a, b, bias, cbuf, d, aux) = unsafe {
            (
                a_copy.as_deref().unwrap_or_else(|| self.a.bytes()),
                b_copy.as_deref().unwrap_or_else(|| self.b.bytes()),
                bias_copy.as_deref().unwrap_or_else(|| self.bias.bytes()),
                c_copy.as_deref().unwrap_or_else(|| self.c.bytes()),
                self.d.bytes_mut(),
                self.aux.bytes_mut(),
            )
        };
        // MXFP8: both operands dequantized by their block scales (K contiguous: A^T, B).
        let mut mx = None;
        if let [Range { ptr: Some(_), .. }, Range { ptr: Some(_), .. }] = self.block_scales {
            // SAFETY: validated at launch; read-only views.
            let (sa, sb) = unsafe { (self.block_scales[0].bytes(), self.block_scales[1].bytes()) };
            let (k, ld_a, ld_b) = (g.k, g.a.ld, g.b.ld);
            let da = dequantize_mx(a, g.a.dtype, ld_a, k, g.m, sa);
            let db = dequantize_mx(b, g.b.dtype, ld_b, k, g.n, sb);
            g.a.dtype = DType::F32;
            g.b.dtype = DType::F32;
            mx = Some((da, db));
        }
        let (a, b) = match &mx {
            Some((da, db)) => (da.as_slice(), db.as_slice()),
            None => (a, b),
        };
        let c = if g.beta == 0.0 {
            CInput::None
        } else if same_c {
            CInput::InD
        } else {
            CInput::Buffer(cbuf)
        };
        // The bias gradient is computed aside and copied out last (it may alias nothing else).
        let mut bgrad = g.epilogue.bgrad.map(|_| vec![0u8; self.bgrad.len]);
        let bufs = Buffers {
            a,
            b,
            c,
            d,
            bias: g.epilogue.bias.map(|_| bias),
            aux: g.epilogue.aux.map(|_| aux),
            bgrad: bgrad.as_deref_mut(),
        };
        let out = gemm(&g, bufs).map_err(|_| cudaErrorIllegalAddress)?;
        if let Some(v) = bgrad {
            // SAFETY: validated at launch; the GEMM's views of device memory are no longer used.
            unsafe { self.bgrad.bytes_mut() }.copy_from_slice(&v);
        }
        if let Some(p) = self.amax {
            // SAFETY: validated for 4 bytes at launch.
            let dst = unsafe { p.slice_mut(4) };
            DType::F32.store(dst, 0, out.amax_d);
        }
        Ok(())
    }
}

/// Where the block scale of row `row` (of the outer dimension), K-block `kb` lies in
/// cuBLASLt's tiled layout (128x4 tiles of 512 bytes, row-major; inside a tile, row `r`
/// column `c` at `(r % 32) * 16 + (r % 128 / 32) * 4 + c`), with `k_blocks` scale columns.
pub fn mx_offset(row: usize, kb: usize, k_blocks: usize) -> usize {
    let tile = (row / 128) * k_blocks.div_ceil(4) + kb / 4;
    tile * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + kb % 4
}

/// Bytes of the MXFP8 block scales of an operand with `outer` rows of `k` values.
pub fn mx_scale_bytes(outer: usize, k: usize) -> usize {
    outer.div_ceil(128) * 128 * k.div_ceil(32).div_ceil(4) * 4
}

/// An MXFP8 operand (`outer` columns of `k` values, K contiguous, leading dimension `ld`) as
/// F32 at the same element positions, each value times its UE8M0 scale `2^(s - 127)`.
fn dequantize_mx(
    bytes: &[u8],
    dtype: DType,
    ld: usize,
    k: usize,
    outer: usize,
    scales: &[u8],
) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len() / dtype.size() * 4];
    let kb = k.div_ceil(32);
    for col in 0..outer {
        for row in 0..k {
            let s = scales
                .get(mx_offset(col, row / 32, kb))
                .copied()
                .unwrap_or(255);
            let scale = if s == 255 {
                f64::NAN
            } else {
                2f64.powi(s as i32 - 127)
            };
            let i = col * ld + row;
            DType::F32.store(&mut out, i, dtype.load(bytes, i) * scale);
        }
    }
    out
}

/// Enqueues `work` on `stream`: the cuBLAS status of the launch.
pub fn enqueue<F>(stream: cudaStream_t, work: F) -> cublasStatus_t
where
    F: FnMut() -> Result<(), cudaError_t> + Send + 'static,
{
    match sim_device::launch(stream, work) {
        cudaSuccess => CUBLAS_STATUS_SUCCESS,
        _ => CUBLAS_STATUS_EXECUTION_FAILED,
    }
}

/// Enqueues a kernel that faults like a GPU touching an inaccessible address.
pub fn enqueue_fault(stream: cudaStream_t) -> cublasStatus_t {
    enqueue(stream, || Err(cudaErrorIllegalAddress))
}

/// Enqueues `k` (or a fault when binding failed).
pub fn enqueue_gemm(stream: cudaStream_t, k: Result<GemmKernel, Inaccessible>) -> cublasStatus_t {
    match k {
        Ok(k) => enqueue(stream, move || k.run()),
        Err(Inaccessible) => enqueue_fault(stream),
    }
}

/// The enumerator name of a status.
pub fn status_name(s: cublasStatus_t) -> &'static core::ffi::CStr {
    match s {
        CUBLAS_STATUS_SUCCESS => c"CUBLAS_STATUS_SUCCESS",
        CUBLAS_STATUS_NOT_INITIALIZED => c"CUBLAS_STATUS_NOT_INITIALIZED",
        CUBLAS_STATUS_ALLOC_FAILED => c"CUBLAS_STATUS_ALLOC_FAILED",
        CUBLAS_STATUS_INVALID_VALUE => c"CUBLAS_STATUS_INVALID_VALUE",
        CUBLAS_STATUS_ARCH_MISMATCH => c"CUBLAS_STATUS_ARCH_MISMATCH",
        CUBLAS_STATUS_MAPPING_ERROR => c"CUBLAS_STATUS_MAPPING_ERROR",
        CUBLAS_STATUS_EXECUTION_FAILED => c"CUBLAS_STATUS_EXECUTION_FAILED",
        CUBLAS_STATUS_INTERNAL_ERROR => c"CUBLAS_STATUS_INTERNAL_ERROR",
        CUBLAS_STATUS_NOT_SUPPORTED => c"CUBLAS_STATUS_NOT_SUPPORTED",
        CUBLAS_STATUS_LICENSE_ERROR => c"CUBLAS_STATUS_LICENSE_ERROR",
        _ => c"CUBLAS_STATUS_UNKNOWN",
    }
}

/// A description of a status.
pub fn status_string(s: cublasStatus_t) -> &'static core::ffi::CStr {
    match s {
        CUBLAS_STATUS_SUCCESS => c"success",
        CUBLAS_STATUS_NOT_INITIALIZED => c"the library was not initialized",
        CUBLAS_STATUS_ALLOC_FAILED => c"the resource allocation failed",
        CUBLAS_STATUS_INVALID_VALUE => c"an invalid numeric value was used as an argument",
        CUBLAS_STATUS_ARCH_MISMATCH => c"an absent device architectural feature is required",
        CUBLAS_STATUS_MAPPING_ERROR => c"an access to GPU memory space failed",
        CUBLAS_STATUS_EXECUTION_FAILED => c"the GPU program failed to execute",
        CUBLAS_STATUS_INTERNAL_ERROR => c"an internal operation failed",
        CUBLAS_STATUS_NOT_SUPPORTED => c"the functionality requested is not supported",
        CUBLAS_STATUS_LICENSE_ERROR => c"error detected trying to check the license",
        _ => c"unknown error",
    }
}

/// Version of the simulated cuBLAS and cuBLASLt (12.8.4, as the headers they mirror).
pub const VERSION: (core::ffi::c_int, core::ffi::c_int, core::ffi::c_int) = (12, 8, 4);

/// `cublasGetProperty` / `cublasLtGetProperty`: a version component.
///
/// # Safety
/// `value` is null or points to writable memory for one `int`.
pub unsafe fn get_property(
    type_: cuda_abi::library_types::libraryPropertyType,
    value: *mut core::ffi::c_int,
) -> cublasStatus_t {
    use cuda_abi::library_types::{MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL};
    guard(|| {
        let v = match type_ {
            MAJOR_VERSION => VERSION.0,
            MINOR_VERSION => VERSION.1,
            PATCH_LEVEL => VERSION.2,
            _ => return CUBLAS_STATUS_INVALID_VALUE,
        };
        if value.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot, per the caller's contract.
        unsafe { *value = v };
        CUBLAS_STATUS_SUCCESS
    })
}
