//! The host's thread pool for the work around an NPU matmul: the activation pass (rotation,
//! quantization, the correction's dots) and the output pass (dequantization, second weight term,
//! correction) of `Device::run_mul_mat`.
//!
//! Why a pool of its own rather than rayon's global one:
//! * **Size.** The global pool, left unconfigured, has one thread per online CPU: eight on an
//!   RK3588, the four A55s included. A row-parallel pass is as slow as its slowest thread, and an
//!   A55 does this work at about half an A76's rate, so the little cores hold the pass back
//!   instead of helping (seed 001: workers left on the little cores halved multi-core scaling;
//!   `npu::hostcpu`). This pool has one thread per big core the process may run on
//!   (`hostcpu::big_cores`, cpu4-7 on RK3588; every allowed CPU where all CPUs are alike).
//! * **Placement.** Each worker is restricted to the big cluster (as a set: the scheduler still
//!   balances the workers among the big cores) unless `ORK_NO_AFFINITY`.
//! * **Ownership.** The plugin lives inside someone else's process (llama.cpp, a server, a
//!   Python binding that may use rayon itself): configuring the global pool would be a process-wide
//!   decision that a library should not take, and `build_global` fails once anyone has used it.
//!
//! Small matmuls (decode) run on the calling thread: handing a few microseconds of work to a
//! pool costs as much as the work. Everything the pool computes is row-by-row, so the results are
//! the same bits on whichever thread, in whichever pool, a row runs.

use std::sync::OnceLock;

use crate::config::Config;
use crate::npu::hostcpu;

/// The CPUs the pool's workers run on and may be pinned to: the big cluster, restricted to the
/// CPUs this process may use; empty when the topology is unknown.
fn big_allowed() -> Vec<usize> {
    let big = hostcpu::big_cores();
    match core_affinity::get_core_ids() {
        Some(allowed) if !allowed.is_empty() => big.into_iter().filter(|c| allowed.iter().any(|a| a.id == *c)).collect(),
        _ => big,
    }
}

/// The pool (built on first use, one per process): `cfg.host_threads` threads (`ORK_HOST_THREADS`),
/// else one per big core; pinned to the big cores unless `cfg.no_affinity`.
pub(crate) fn host_pool(cfg: &Config) -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let big = big_allowed();
        let per_core = if big.is_empty() { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { big.len() };
        let threads = cfg.host_threads.unwrap_or(per_core);
        let no_affinity = cfg.no_affinity;
        let pin = if no_affinity { Vec::new() } else { big };
        log::debug!("host pool: {threads} threads, pinned to {pin:?}");
        let b = rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("ork-host-{i}"));
        let b = b.start_handler(move |_| {
            if !pin.is_empty() {
                hostcpu::pin_current_thread_to_set(&pin);
            }
        });
        b.build().unwrap_or_else(|e| {
            // Threads could not be spawned: one thread, on the caller's behalf (still a pool of
            // its own, so the matmul path never waits on the global one).
            log::warn!("host pool: {e}; one thread");
            rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool")
        })
    })
}

/// Runs `f` on the host pool when `elems` (the elements the pass touches) make it worth the
/// hand-off (`quant::PAR_MIN_ELEMS`, the size at which the quant passes split rows), else on the
/// calling thread, where the passes stay serial below that size.
pub(crate) fn on_host<R: Send>(cfg: &Config, elems: usize, f: impl FnOnce() -> R + Send) -> R {
    if elems < crate::quant::PAR_MIN_ELEMS {
        return f();
    }
    let pool = host_pool(cfg);
    if pool.current_thread_index().is_some() {
        return f();
    }
    pool.install(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_sized_to_the_big_cores_and_runs_large_passes() {
        let cfg = Config::from_lookup(|k| (k == "ORK_NO_AFFINITY").then(|| "1".to_string())).0;
        let p = host_pool(&cfg);
        let big = big_allowed();
        if !big.is_empty() {
            assert_eq!(p.current_num_threads(), big.len());
        }
        // Large work runs on the pool's threads, small work on the caller's.
        assert_eq!(on_host(&cfg, crate::quant::PAR_MIN_ELEMS, rayon::current_num_threads), p.current_num_threads());
        assert!(on_host(&cfg, crate::quant::PAR_MIN_ELEMS, || p.current_thread_index().is_some()));
        assert!(on_host(&cfg, 1, || p.current_thread_index().is_none()));
    }
}
