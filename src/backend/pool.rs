//! The host's team for the work around an NPU matmul: the activation pass (rotation,
//! quantization, the correction's dots) and the output pass (dequantization, second weight term,
//! correction) of `Device::run_mul_mat` (`os::team`).
//!
//! A large MUL_MAT runs on the calling thread as the team's lead; the team's other threads take
//! each pass's rows as it is posted and, with `ORK_KEEP_AWAKE` (the default), wait for the next
//! pass spinning (yielding their CPU) instead of sleeping: woken per pass, a thread comes too late
//! to take its share (a wake-up is 50–100 µs here, a pass a few hundred; the passes then ran at
//! about one thread's rate, `bench-scripts/prefill_host_table.sh`).
//!
//! Which threads: where ggml-cpu runs on OpenMP (llama.cpp's default build), its own team of the
//! calling thread — ggml-cpu's thread count, else `ORK_HOST_THREADS`, else one per big core —
//! so ORK's passes and ggml-cpu's splits take turns on the same threads instead of competing for
//! the cores with OpenMP's waiting threads. Without OpenMP, a pool of ORK's own:
//! * **Size.** One thread per big core the process may run on (`hostcpu::big_cores`, cpu4-7 on
//!   RK3588; every allowed CPU where all CPUs are alike), the lead among them: a row-parallel
//!   pass is as slow as its slowest thread, and an A55 does this work at about half an A76's
//!   rate (seed 001: workers left on the little cores halved multi-core scaling).
//! * **Placement.** Each worker is restricted to the big cluster (as a set) unless
//!   `ORK_NO_AFFINITY`.
//! * **Ownership.** The plugin lives inside someone else's process (llama.cpp, a server, a
//!   Python binding that may use rayon itself): the global rayon pool is not ORK's to configure.
//!
//! Small matmuls (decode) run on the calling thread alone: handing a few microseconds of work to
//! a team costs as much as the work. Everything the team computes is row-by-row, so the results
//! are the same bits on whichever thread a row runs.

use std::sync::OnceLock;

use crate::config::Config;
use crate::os::{hostcpu, team};

/// The CPUs the pool's workers run on and may be pinned to: the big cluster, restricted to the
/// CPUs this process may use; empty when the topology is unknown.
fn big_allowed() -> Vec<usize> {
    let big = hostcpu::big_cores();
    match core_affinity::get_core_ids() {
        Some(allowed) if !allowed.is_empty() => big.into_iter().filter(|c| allowed.iter().any(|a| a.id == *c)).collect(),
        _ => big,
    }
}

/// The team's size where ggml-cpu does not say: `cfg.host_threads` (`ORK_HOST_THREADS`), else one
/// per big core (read once per process: the topology and the process's CPUs, not per MUL_MAT).
fn team_size(cfg: &Config) -> usize {
    static PER_CORE: OnceLock<usize> = OnceLock::new();
    let per_core = *PER_CORE.get_or_init(|| {
        let big = big_allowed();
        if big.is_empty() { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { big.len() }
    });
    cfg.host_threads.unwrap_or(per_core)
}

/// The pool of ORK's own (built on first use, one per process) where there is no OpenMP team:
/// the team's size less the lead, pinned to the big cores unless `cfg.no_affinity`.
pub(crate) fn host_pool(cfg: &Config) -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = team_size(cfg).saturating_sub(1).max(1);
        let pin = if cfg.no_affinity { Vec::new() } else { big_allowed() };
        log::debug!("host pool: {threads} threads and the lead, pinned to {pin:?}");
        let b = rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("ork-host-{i}"));
        let b = b.start_handler(move |_| {
            if !pin.is_empty() {
                hostcpu::pin_current_thread_to_set(&pin);
            }
        });
        b.build().unwrap_or_else(|e| {
            log::warn!("host pool: {e}; one thread");
            rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool")
        })
    })
}

/// Runs `f` on the calling thread as the lead of the host's team when `elems` (the elements the
/// pass touches) make it worth it (`quant::PAR_MIN_ELEMS`, the size at which the quant passes
/// split rows), else plainly; `os::team::for_each` inside `f` (the quant passes) posts to it.
pub(crate) fn on_host<R>(cfg: &Config, elems: usize, f: impl FnOnce() -> R) -> R {
    if elems < crate::quant::PAR_MIN_ELEMS {
        return f();
    }
    let threads = if team::has_openmp() && cfg.host_threads.is_none() {
        team::Threads::OpenMp { fallback: team_size(cfg) }
    } else if team_size(cfg) < 2 {
        return team::alone(f);
    } else {
        team::Threads::Pool(host_pool(cfg))
    };
    team::run(threads, cfg.keep_awake, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large pass runs with the calling thread as the team's lead, its rows spread over the
    /// team, the same bits as on one thread; a small one runs plainly.
    #[test]
    fn a_large_pass_runs_on_the_team_with_the_same_bits() {
        let cfg = Config::from_lookup(|k| match k {
            "ORK_NO_AFFINITY" => Some("1".to_string()),
            "ORK_HOST_THREADS" => Some("3".to_string()),
            _ => None,
        })
        .0;
        let (m, k) = (64, 1024);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0).collect();
        let col = vec![1.5f32; k];
        let pass = |on_team: bool| -> (Vec<i8>, Vec<u32>, Vec<u64>) {
            let (mut q, mut s, mut h) = (vec![0i8; 2 * m * k], vec![0f32; 2 * m], vec![0u64; m]);
            let mut run = || crate::quant::prepare_rows_hashed(&x, m, k, 2, crate::quant::RowPrep::Columns(&col), None, &mut q, &mut s, &mut [], &mut h);
            if on_team {
                let me = std::thread::current().id();
                assert!(on_host(&cfg, m * k, || {
                    run();
                    std::thread::current().id() == me
                }));
            } else {
                rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(run);
            }
            (q, s.iter().map(|v| v.to_bits()).collect(), h)
        };
        assert!(pass(true) == pass(false), "the team's rows are the one thread's bits");
        assert_eq!(on_host(&cfg, 1, team::threads), rayon::current_num_threads(), "a small pass gets no team");
    }
}
