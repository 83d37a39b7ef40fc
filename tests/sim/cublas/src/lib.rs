//! sim cublas
