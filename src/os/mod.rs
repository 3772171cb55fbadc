//! The operating system's shared and file mappings that are neither a kernel interface nor a
//! ggml object: a read-only mapping of a published file (the `.orkpack` cache) and a counter in a
//! shared file mapping (signals between the processes that share an NPU lock file). Each holds
//! one `unsafe` call behind a safe function, with the contract that makes it sound.
#![allow(unsafe_code)]

/// Read-only mappings of files on disk (the `.orkpack` cache).
pub mod filemap;
/// A counter shared between processes through a mapped file (NPU arbitration).
pub mod shared;
