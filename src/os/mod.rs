//! What the crate asks of the operating system that is neither a kernel interface nor a ggml
//! object: a read-only mapping of a published file (the `.orkpack` cache), a counter in a shared
//! file mapping (signals between the processes that share an NPU lock file), the system RAM
//! figures of `/proc/meminfo`, and the host CPU topology (the big cluster, pinning a thread to
//! it). The two mappings each hold one `unsafe` call behind a safe
//! function, with the contract that makes it sound.
#![allow(unsafe_code)]

/// Read-only mappings of files on disk (the `.orkpack` cache).
pub mod filemap;
/// A counter shared between processes through a mapped file (NPU arbitration).
pub mod shared;
/// System RAM from `/proc/meminfo` (no `unsafe`).
#[deny(unsafe_code)]
pub mod meminfo;
/// The threads a MUL_MAT's host passes run on: the process's OpenMP team, or a pool's.
pub mod team;
/// Host CPU topology: the big cluster, and pinning a thread to it (no `unsafe`).
#[deny(unsafe_code)]
pub mod hostcpu;
