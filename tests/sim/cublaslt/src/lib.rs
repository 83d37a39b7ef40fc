//! sim cublasLt
