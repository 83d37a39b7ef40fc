//! C types and constants of the CUDA 12 runtime, cuBLAS, cuBLASLt, NCCL 2.2x and NVTX.
//!
//! Names are spelled exactly as in NVIDIA's headers so that a reader can grep both. Foreign
//! enums are plain integer aliases plus constants, never Rust `enum`s: a value outside the set
//! compiled here (a newer CUDA adds some every release) must stay representable. Opaque handles are pointers to zero-sized
//! `#[repr(C)]` structs named after the C struct tags, so that `cudaStream_t` and
//! `cublasHandle_t` cannot be mixed up in Rust.
//!
//! The ABI test in `tests/integration` parses these aliases and the simulated libraries'
//! exports and checks them against NVIDIA's own headers with a C compiler.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

pub mod cublas;
pub mod cublaslt;
pub mod cudart;
pub mod driver;
pub mod library_types;
pub mod nccl;
pub mod nvtx;

/// Declares an opaque C struct (a handle's pointee), as bindgen does.
#[macro_export]
macro_rules! opaque_struct {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    };
}
