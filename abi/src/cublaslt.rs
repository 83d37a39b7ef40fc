//! (to be filled by the cublaslt work)
