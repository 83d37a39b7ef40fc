//! sim nccl
