//! NVTX ranges named after Megatron modules, as Megatron pushes them with profiling on.
//!
//! Ranges are pushed and popped on the host thread that enqueues the work, so a tool that
//! intercepts the CUDA calls sees each call inside the ranges open at that moment.

use std::ffi::CString;

/// Pushes ranges when enabled (`--no-nvtx` disables them).
#[derive(Debug, Clone, Copy)]
pub struct Nvtx {
    on: bool,
}

/// An open range, popped on drop.
#[must_use = "the range closes when this guard drops"]
pub struct Range {
    on: bool,
}

impl Nvtx {
    /// Ranges on or off.
    pub fn new(on: bool) -> Nvtx {
        Nvtx { on }
    }

    /// Opens a range named `name`.
    pub fn range(&self, name: &str) -> Range {
        if self.on {
            // Names are built by the trainer and never contain NUL.
            let c = CString::new(name).unwrap_or_default();
            // SAFETY: a NUL-terminated string that outlives the call (NVTX copies it).
            unsafe { cuda_dyn::nvtx::nvtxRangePushA(c.as_ptr()) };
        }
        Range { on: self.on }
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if self.on {
            // SAFETY: pops the range this guard pushed, on the same thread.
            unsafe { cuda_dyn::nvtx::nvtxRangePop() };
        }
    }
}
