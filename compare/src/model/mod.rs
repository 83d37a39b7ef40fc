//! The analysis model compare and check share: how a store is opened ([`store`]), what its
//! communicators are ([`comms`]), and how each element type rounds ([`dtypes`]). NCCL's
//! operation and type codes come from the `cuda_abi` crate (`cuda_abi::nccl`) and
//! [`ttrace_format::dtype::DType::from_nccl`], never re-numbered here.

pub mod comms;
pub mod dtypes;
pub mod store;
