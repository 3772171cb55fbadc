//! The worker pool: one host thread per NPU core.
//!
//! ork runs one host thread per NPU core, each submitting single-core jobs concurrently
//! (rknpu-facts §5); a run of one piece runs core 0's share on the calling thread, a run of
//! pieces (`Npu::mm_run_pieces`) every core's on its worker. Workers are spawned once and fed boxed
//! jobs over a channel. Each worker is pinned to a CPU from the list the pool is built with
//! (big cores: seed 001 measured 2× slower workers on little cores); the big-core detection
//! itself lives elsewhere (`os::hostcpu`), so the list is a plain parameter (empty = no pinning;
//! `ORK_NO_AFFINITY=1` leaves it empty).

use std::sync::mpsc;
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

/// Persistent workers for NPU cores 0..n.
pub struct Pool {
    workers: Vec<Worker>,
}

impl Pool {
    /// Spawns workers for NPU cores `0..cores`; worker for core i is pinned to
    /// `pin_cpus[i % len]` unless the list is empty.
    pub fn new(cores: u32, pin_cpus: &[usize]) -> Pool {
        let mut workers = Vec::new();
        for core in 0..cores as usize {
            let (tx, rx) = mpsc::channel::<Job>();
            let cpu = (!pin_cpus.is_empty()).then(|| pin_cpus[core % pin_cpus.len()]);
            let handle = std::thread::Builder::new()
                .name(format!("ork-npu{core}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                            log::warn!("ork-npu{core}: could not pin to CPU {cpu}");
                        }
                    }
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .expect("spawn NPU worker thread");
            workers.push(Worker { tx: Some(tx), handle: Some(handle) });
        }
        Pool { workers }
    }

    /// Runs `job` on the worker of NPU core `core`.
    pub fn run_on(&self, core: u32, job: Job) {
        let w = &self.workers[core as usize];
        w.tx.as_ref().expect("pool alive").send(job).expect("NPU worker alive");
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.tx.take();
        }
        for w in &mut self.workers {
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}
