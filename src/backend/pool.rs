//! The host's thread pool for the work around an NPU matmul: the activation pass (rotation,
//! quantization, the correction's dots) and the output pass (dequantization, second weight term,
//! correction) of `Device::run_mul_mat`.
//!
//! Why a pool of its own rather than rayon's global one:
//! * **Size.** The global pool, left unconfigured, has one thread per online CPU: eight on an
//!   RK3588, the four A55s included. A row-parallel pass is as slow as its slowest thread, and an
//!   A55 does this work at about half an A76's rate, so the little cores hold the pass back
//!   instead of helping (seed 001: workers left on the little cores halved multi-core scaling;
//!   `os::hostcpu`). This pool has one thread per big core the process may run on
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
use crate::os::hostcpu;

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

/// Runs `f` on the calling thread, a thread of the host pool, with the pool's other threads kept
/// awake meanwhile: each runs the pool's work as it comes (a pass's rows that `f` splits, or
/// another caller's) and, between jobs, yields its CPU instead of sleeping. A pipelined MUL_MAT
/// hands the pool one pass after another, each a few hundred microseconds, with the NPU's run of
/// a piece between them: asleep, a thread is woken too late to take its share of a pass (the
/// pool's passes ran at about one thread's rate, `bench-scripts/prefill_host_table.sh`).
///
/// One waiter per thread (a broadcast: a thread's first woken does not take the others' waiters),
/// and one `keep_awake` at a time in the process: a thread checks its broadcast jobs before
/// anything else, so two at once could each leave a thread waiting in the other's waiter above
/// its own work; a second caller meanwhile runs `f` plainly. A waiter on `f`'s own thread returns
/// at once, and the waiters stop when `f` returns or panics. Off the host pool (another
/// rayon pool's thread, or none), on a pool of one thread or with `ORK_KEEP_AWAKE=0`, `f` simply
/// runs.
pub(crate) fn keep_awake<R>(cfg: &Config, f: impl FnOnce() -> R) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    /// Sets its flag when dropped (also while unwinding).
    struct Raise<'a>(&'a AtomicBool, bool);
    impl Drop for Raise<'_> {
        fn drop(&mut self) {
            self.0.store(self.1, Ordering::Release);
        }
    }
    let pool = host_pool(cfg);
    let Some(me) = pool.current_thread_index().filter(|_| cfg.keep_awake) else { return f() };
    if pool.current_num_threads() < 2 || ACTIVE.swap(true, Ordering::AcqRel) {
        return f();
    }
    let _active = Raise(&ACTIVE, false);
    let stop = AtomicBool::new(false);
    rayon::in_place_scope(|s| {
        s.spawn_broadcast(|_, ctx| {
            if ctx.index() == me {
                return;
            }
            while !stop.load(Ordering::Acquire) {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::yield_now();
                }
            }
        });
        let _stop = Raise(&stop, true);
        f()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

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

    /// `keep_awake` returns `f`'s value off the pool and on the pool; when `f` panics, the panic
    /// reaches the caller (the waiters stop) instead of leaving them spinning, and a call after it
    /// works; with every other thread of the pool busy, it returns once they are free (their
    /// waiters run then, and return at once).
    #[test]
    fn keep_awake_returns_and_lets_a_panic_through() {
        let cfg = Config::from_lookup(|k| (k == "ORK_NO_AFFINITY").then(|| "1".to_string())).0;
        let p = host_pool(&cfg);
        assert_eq!(keep_awake(&cfg, || 7), 7);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let cfg = Config::from_lookup(|k| (k == "ORK_NO_AFFINITY").then(|| "1".to_string())).0;
            let p = host_pool(&cfg);
            let sum = |cfg: &Config| p.install(|| keep_awake(cfg, || (0..1000u64).into_par_iter().sum::<u64>()));
            let first = sum(&cfg);
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.install(|| keep_awake(&cfg, || -> u64 { panic!("inside a pass") })))).is_err();
            let _ = done_tx.send((first, panicked, sum(&cfg)));
        });
        let got = done_rx.recv_timeout(std::time::Duration::from_secs(30)).expect("keep_awake returned");
        assert_eq!(got, (499500, true, 499500));
        if p.current_num_threads() >= 2 {
            // Every other thread busy for a while: their waiters run (and return at once) when
            // they are free again, and `keep_awake` returns after that.
            let (started_tx, started_rx) = std::sync::mpsc::channel();
            for _ in 1..p.current_num_threads() {
                let started_tx = started_tx.clone();
                p.spawn(move || {
                    started_tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(200));
                });
            }
            for _ in 1..p.current_num_threads() {
                started_rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a thread started");
            }
            assert_eq!(p.install(|| keep_awake(&cfg, || rayon::join(|| 4, || 5))), (4, 5));
        }
    }
}
