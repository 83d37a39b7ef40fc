//! cuBLASLt descriptors kept inside their caller-visible opaque storage.
//!
//! A matmul descriptor, matrix layout, preference or matrix transform descriptor lives in the header's semi-opaque struct
//! (`cublasLtMatmulDescOpaque_t` is 256 bytes, the others 64): allocated by `*Create`, or by the
//! caller for `*Init` (the header's inline `cublasLt*Init` passes `sizeof` of the struct to
//! `*Init_internal`). The storage holds a tag identifying the kind, then each attribute at a
//! fixed offset with exactly the size the header documents, so that `Get/SetAttribute` check
//! `sizeInBytes` as the real library does and a matmul reads the descriptor as it is at the
//! time of the call.

use core::ffi::c_void;

use cuda_abi::cublas::*;
use cuda_abi::cublaslt::*;

/// One attribute: its id and its size in bytes.
pub type Attr = (u32, usize);

/// A kind of descriptor: its tag and attribute table.
pub struct Kind {
    /// First four bytes of an initialised descriptor of this kind.
    pub tag: u32,
    /// Attribute ids and sizes, in storage order.
    pub attrs: &'static [Attr],
}

/// Bytes before the first attribute (the tag, padded).
const HEADER: usize = 8;

impl Kind {
    /// Bytes of storage a descriptor of this kind needs.
    pub const fn bytes(&self) -> usize {
        let mut total = HEADER;
        let mut i = 0;
        while i < self.attrs.len() {
            total += self.attrs[i].1;
            i += 1;
        }
        total
    }

    /// `(offset, size)` of `attr`.
    pub fn slot(&self, attr: u32) -> Option<(usize, usize)> {
        let mut off = HEADER;
        for &(a, size) in self.attrs {
            if a == attr {
                return Some((off, size));
            }
            off += size;
        }
        None
    }
}

/// `cublasLtMatmulDescAttributes_t` (cuBLAS 12.8): ids and sizes from the header comments.
pub const MATMUL_DESC: Kind = Kind {
    tag: 0x4d4c_544d, // "MTLM"
    attrs: &[
        (CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, 4),
        (CUBLASLT_MATMUL_DESC_SCALE_TYPE, 4),
        (CUBLASLT_MATMUL_DESC_POINTER_MODE, 4),
        (CUBLASLT_MATMUL_DESC_TRANSA, 4),
        (CUBLASLT_MATMUL_DESC_TRANSB, 4),
        (CUBLASLT_MATMUL_DESC_TRANSC, 4),
        (CUBLASLT_MATMUL_DESC_FILL_MODE, 4),
        (CUBLASLT_MATMUL_DESC_EPILOGUE, 4),
        (CUBLASLT_MATMUL_DESC_BIAS_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 8),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 8),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, 8),
        (CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, 8),
        (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 4),
        (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, 4),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_FAST_ACCUM, 1),
        (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, 4),
        (CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_ROWS, 4),
        (CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_COLS, 4),
        (CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_IN_COUNTERS_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_OUT_COUNTERS_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_A_SCALE_MODE, 4),
        (CUBLASLT_MATMUL_DESC_B_SCALE_MODE, 4),
        (CUBLASLT_MATMUL_DESC_C_SCALE_MODE, 4),
        (CUBLASLT_MATMUL_DESC_D_SCALE_MODE, 4),
        (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, 4),
        (CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, 8),
        (CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, 4),
    ],
};

/// `cublasLtMatrixLayoutAttribute_t`.
pub const MATRIX_LAYOUT: Kind = Kind {
    tag: 0x4c4c_544d, // "MTLL"
    attrs: &[
        (CUBLASLT_MATRIX_LAYOUT_TYPE, 4),
        (CUBLASLT_MATRIX_LAYOUT_ORDER, 4),
        (CUBLASLT_MATRIX_LAYOUT_ROWS, 8),
        (CUBLASLT_MATRIX_LAYOUT_COLS, 8),
        (CUBLASLT_MATRIX_LAYOUT_LD, 8),
        (CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 4),
        (CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 8),
        (CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, 8),
    ],
};

/// `cublasLtMatmulPreferenceAttributes_t`.
pub const PREFERENCE: Kind = Kind {
    tag: 0x504c_544d, // "MTLP"
    attrs: &[
        (CUBLASLT_MATMUL_PREF_SEARCH_MODE, 4),
        (CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 8),
        (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, 4),
        (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 4),
        (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, 4),
        (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, 4),
        (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, 4),
        (CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, 4),
        (CUBLASLT_MATMUL_PREF_IMPL_MASK, 8),
    ],
};

/// `cublasLtMatrixTransformDescAttributes_t` (each an `int32_t`).
pub const TRANSFORM_DESC: Kind = Kind {
    tag: 0x544c_544d, // "MTLT"
    attrs: &[
        (CUBLASLT_MATRIX_TRANSFORM_DESC_SCALE_TYPE, 4),
        (CUBLASLT_MATRIX_TRANSFORM_DESC_POINTER_MODE, 4),
        (CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, 4),
        (CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB, 4),
    ],
};

// Every descriptor fits the storage the header gives callers.
const _: () = assert!(MATMUL_DESC.bytes() <= core::mem::size_of::<cublasLtMatmulDescOpaque_t>());
const _: () =
    assert!(MATRIX_LAYOUT.bytes() <= core::mem::size_of::<cublasLtMatrixLayoutOpaque_t>());
const _: () =
    assert!(PREFERENCE.bytes() <= core::mem::size_of::<cublasLtMatmulPreferenceOpaque_t>());
const _: () =
    assert!(TRANSFORM_DESC.bytes() <= core::mem::size_of::<cublasLtMatrixTransformDescOpaque_t>());

/// A descriptor: a pointer to storage of a [`Kind`].
#[derive(Clone, Copy)]
pub struct Desc {
    ptr: *mut u8,
    kind: &'static Kind,
}

impl Desc {
    /// Initialises `size` bytes at `ptr` as an empty descriptor of `kind` (every attribute 0).
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `size` bytes.
    pub unsafe fn init(
        ptr: *mut c_void,
        size: usize,
        kind: &'static Kind,
    ) -> Result<Desc, cublasStatus_t> {
        if ptr.is_null() {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        if size < kind.bytes() {
            return Err(CUBLAS_STATUS_ALLOC_FAILED);
        }
        let p = ptr.cast::<u8>();
        // SAFETY: per the contract, `size >= kind.bytes()` bytes are writable.
        unsafe {
            std::ptr::write_bytes(p, 0, kind.bytes());
            std::ptr::copy_nonoverlapping(kind.tag.to_ne_bytes().as_ptr(), p, 4);
        }
        Ok(Desc { ptr: p, kind })
    }

    /// The descriptor at `ptr`, if it carries `kind`'s tag.
    ///
    /// # Safety
    /// `ptr` must be null or point to at least `kind.bytes()` readable and writable bytes (a
    /// descriptor handle the caller got from this library).
    pub unsafe fn open(ptr: *mut c_void, kind: &'static Kind) -> Result<Desc, cublasStatus_t> {
        if ptr.is_null() {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        let mut tag = [0u8; 4];
        // SAFETY: per the contract, the first 4 bytes are readable.
        unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), tag.as_mut_ptr(), 4) };
        if u32::from_ne_bytes(tag) != kind.tag {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        Ok(Desc {
            ptr: ptr.cast(),
            kind,
        })
    }

    /// The storage address (the descriptor handle).
    pub fn raw(&self) -> *mut u8 {
        self.ptr
    }

    /// Marks the storage as no longer a descriptor.
    pub fn invalidate(self) {
        // SAFETY: `open`/`init` checked the storage; the tag is its first 4 bytes.
        unsafe { std::ptr::write_bytes(self.ptr, 0, 4) };
    }

    /// `SetAttribute`: `sizeInBytes` must equal the attribute's size.
    ///
    /// # Safety
    /// `buf` must be null or readable for `size` bytes.
    pub unsafe fn set(&self, attr: u32, buf: *const c_void, size: usize) -> cublasStatus_t {
        let Some((off, need)) = self.kind.slot(attr) else {
            return CUBLAS_STATUS_INVALID_VALUE;
        };
        if buf.is_null() || size != need {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: the slot lies inside the descriptor's storage; `buf` holds `need` bytes.
        unsafe { std::ptr::copy_nonoverlapping(buf.cast::<u8>(), self.ptr.add(off), need) };
        CUBLAS_STATUS_SUCCESS
    }

    /// `GetAttribute`: with `sizeInBytes == 0` reports the size in `sizeWritten`; otherwise
    /// `sizeInBytes` must equal it.
    ///
    /// # Safety
    /// `buf` must be null or writable for `size` bytes; `written` null or writable.
    pub unsafe fn get(
        &self,
        attr: u32,
        buf: *mut c_void,
        size: usize,
        written: *mut usize,
    ) -> cublasStatus_t {
        let Some((off, need)) = self.kind.slot(attr) else {
            return CUBLAS_STATUS_INVALID_VALUE;
        };
        if size == 0 {
            if written.is_null() {
                return CUBLAS_STATUS_INVALID_VALUE;
            }
            // SAFETY: non-null, writable per the contract.
            unsafe { *written = need };
            return CUBLAS_STATUS_SUCCESS;
        }
        if buf.is_null() || size != need {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: the slot lies inside the storage; `buf` has room for `need` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.cast::<u8>(), need) };
        if !written.is_null() {
            // SAFETY: non-null, writable per the contract.
            unsafe { *written = need };
        }
        CUBLAS_STATUS_SUCCESS
    }

    /// Stores `v` (its low bytes, native order) in `attr`.
    pub fn put(&self, attr: u32, v: u64) {
        if let Some((off, size)) = self.kind.slot(attr) {
            // SAFETY: the slot lies inside the storage.
            unsafe {
                std::ptr::copy_nonoverlapping(v.to_ne_bytes().as_ptr(), self.ptr.add(off), size)
            };
        }
    }

    /// The raw bytes of `attr`, zero-extended.
    pub fn u64(&self, attr: u32) -> u64 {
        let Some((off, size)) = self.kind.slot(attr) else {
            return 0;
        };
        let mut b = [0u8; 8];
        // SAFETY: the slot lies inside the storage.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), b.as_mut_ptr(), size) };
        u64::from_ne_bytes(b)
    }

    /// `attr` as a signed value of its size.
    pub fn i64(&self, attr: u32) -> i64 {
        let v = self.u64(attr);
        match self.kind.slot(attr).map(|s| s.1) {
            Some(1) => v as u8 as i8 as i64,
            Some(4) => v as u32 as i32 as i64,
            _ => v as i64,
        }
    }

    /// `attr` as a pointer.
    pub fn ptr(&self, attr: u32) -> *mut c_void {
        self.u64(attr) as usize as *mut c_void
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_and_reported() {
        let mut store = cublasLtMatmulDescOpaque_t::default();
        let p: *mut c_void = (&mut store as *mut cublasLtMatmulDescOpaque_t).cast();
        // SAFETY: `store` is 256 writable bytes.
        let d = unsafe { Desc::init(p, 256, &MATMUL_DESC) }.expect("fits");
        d.put(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, 68);
        let mut v: i32 = 0;
        let mut written = 0usize;
        let vp: *mut c_void = (&mut v as *mut i32).cast();
        // SAFETY: valid buffers of the stated sizes.
        unsafe {
            assert_eq!(
                d.get(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, vp, 4, &mut written),
                CUBLAS_STATUS_SUCCESS
            );
            assert_eq!((v, written), (68, 4));
            assert_eq!(
                d.get(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, vp, 8, &mut written),
                CUBLAS_STATUS_INVALID_VALUE
            );
            assert_eq!(
                d.get(CUBLASLT_MATMUL_DESC_BIAS_POINTER, vp, 0, &mut written),
                CUBLAS_STATUS_SUCCESS
            );
            assert_eq!(written, 8);
            assert_eq!(
                d.get(
                    CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    vp,
                    0,
                    std::ptr::null_mut()
                ),
                CUBLAS_STATUS_INVALID_VALUE
            );
            assert_eq!(
                d.get(9, vp, 4, &mut written),
                CUBLAS_STATUS_INVALID_VALUE,
                "9 is not an attribute"
            );
            let flag: i8 = 1;
            let fp: *const c_void = (&flag as *const i8).cast();
            assert_eq!(
                d.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fp, 4),
                CUBLAS_STATUS_INVALID_VALUE
            );
            assert_eq!(
                d.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fp, 1),
                CUBLAS_STATUS_SUCCESS
            );
            let minus_one: i32 = -1;
            d.set(
                CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                (&minus_one as *const i32).cast(),
                4,
            );
            assert!(
                Desc::open(p, &MATRIX_LAYOUT).is_err(),
                "the tag tells kinds apart"
            );
            // SAFETY: as above.
            let again = Desc::open(p, &MATMUL_DESC).expect("same kind");
            assert_eq!(again.i64(CUBLASLT_MATMUL_DESC_FAST_ACCUM), 1);
            assert_eq!(again.i64(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), -1);
            assert_eq!(again.u64(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), 68);
        }
        // Too little storage for an Init.
        let mut small = [0u64; 4];
        // SAFETY: 32 writable bytes.
        let r = unsafe { Desc::init(small.as_mut_ptr().cast(), 32, &MATMUL_DESC) };
        assert_eq!(r.err(), Some(CUBLAS_STATUS_ALLOC_FAILED));
    }
}
