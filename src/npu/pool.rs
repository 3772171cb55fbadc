//! The worker pool: one host thread per NPU core beyond core 0.
//!
//! ork runs one host thread per NPU core, each submitting single-core jobs concurrently; core 0's
//! share runs on the calling thread (rknpu-facts §5). The workers are a rayon pool of their own,
//! spawned once, and a run hands them its other cores' shares in a scope
//! ([`Pool::run_cores`]), so the shares borrow the caller's activation and write the caller's
//! result rows directly (no copy of either crosses a thread). The workers are pinned to the CPUs
//! of the list the pool is built with (big cores: seed 001 measured 2× slower workers on little
//! cores); the big-core detection itself lives elsewhere (`hostcpu`), so the list is a plain
//! parameter (empty = no pinning; `ORK_NO_AFFINITY=1` leaves it empty).

/// Persistent workers for NPU cores 1..n.
pub struct Pool {
    workers: Option<rayon::ThreadPool>,
    count: usize,
}

impl Pool {
    /// Spawns workers for NPU cores `1..cores`; worker i (0-based) is pinned to
    /// `pin_cpus[i % len]` unless the list is empty.
    pub fn new(cores: u32, pin_cpus: &[usize]) -> Pool {
        let count = cores.saturating_sub(1) as usize;
        if count == 0 {
            return Pool { workers: None, count };
        }
        let pin = pin_cpus.to_vec();
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(count)
            .thread_name(|i| format!("ork-npu{}", i + 1))
            .start_handler(move |i| {
                if let Some(&cpu) = (!pin.is_empty()).then(|| &pin[i % pin.len()]) {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                        log::warn!("ork-npu{}: could not pin to CPU {cpu}", i + 1);
                    }
                }
            })
            .build()
            .expect("spawn NPU worker threads");
        Pool { workers: Some(workers), count }
    }

    /// Runs `first` on the calling thread and every job of `rest` on the workers, all at once;
    /// returns when all are done. The jobs may borrow from the caller.
    pub fn run_cores<'a>(&self, first: impl FnOnce() + Send + 'a, rest: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        match &self.workers {
            Some(p) if !rest.is_empty() => p.in_place_scope(|s| {
                for job in rest {
                    s.spawn(move |_| job());
                }
                first();
            }),
            _ => {
                first();
                rest.into_iter().for_each(|job| job());
            }
        }
    }

    pub fn workers(&self) -> usize {
        self.count
    }
}
