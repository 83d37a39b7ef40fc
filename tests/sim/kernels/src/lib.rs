//! Numerics of the simulated CUDA stack.
pub mod dtype;
pub mod gemm;
pub mod reduce;
