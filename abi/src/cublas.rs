//! (to be filled by the cublas work)
