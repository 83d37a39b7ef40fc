//! (to be filled by the nccl work)
