//! One arbiter for the NPU per process, and an advisory lock between processes.
//!
//! **Inside a process** several llama.cpp contexts (two models in one llama-server, or several
//! contexts of one model) call `graph_compute` from their own threads and share the three NPU
//! cores. Per-core locks in `crate::npu` already make concurrent `mm_run` calls safe, but two
//! matmuls planned on the same cores 0.. would simply queue behind each other. The arbiter hands
//! out *leases*: a contiguous range of cores per matmul, disjoint from every other live lease, and
//! `Npu::mm_run_at` plans on exactly that range. Policy (seed 000, "spatial partitioning"):
//! * a decode matmul (the phase is read from M, [`crate::route::Phase`]) takes one core, the
//!   highest free one, so it never waits behind a prefill for longer than one matmul's share;
//! * a prefill matmul takes the longest free run from core 0, up to its budget (`ORK_NPU_MC`),
//!   but leaves the last core free while a decode stream was seen in the last
//!   [`DECODE_RECENT`] — so a prefill runs on 2 cores while a decode stream keeps 1;
//! * with no core free, the caller waits (bounded by the matmul in flight, which always ends:
//!   the kernel interface times out).
//!
//! **Between processes** the NPU is single-stream (rknpu-facts §5: concurrent direct processes
//! wedge the IOMMU; ork shares it through a daemon). We take the simplest sound option: an
//! advisory `flock` on one lock file per NPU (`ork-npu-<soc>-<interface>.lock` in `ORK_LOCK_DIR`,
//! else `$XDG_RUNTIME_DIR`, `/run/lock`, `/tmp`), held while any lease of this process is live,
//! and between the leases of one `graph_compute` call ([`Hold`]: one flock + unlock per call, not
//! per matmul) — so two processes interleave at the granularity of one graph_compute's run of
//! matmuls (a graph split: 1-3 matmuls in decode) instead of one starving the other for a whole
//! generation. `ORK_NPU_LOCK=wait` (default) blocks until the other process
//! lets go; `cpu` does not wait and runs that matmul's int8 arithmetic on the CPU instead (the
//! same int32 result, slower); `off` skips the lock. Each process logs one line the first time
//! arbitration made it wait or fall back, and the counts appear in the profile summary. The lock
//! dies with its holder (the kernel drops `flock` locks on exit), so a crashed process never
//! blocks the NPU.

use crate::config::{Config, LockMode};
use crate::route::Phase;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long after a decode matmul a prefill still leaves a core free for the decode stream.
pub const DECODE_RECENT: Duration = Duration::from_millis(500);

/// Counters (in the profile summary).
#[derive(Default, Debug)]
pub struct ArbStats {
    /// Leases that had to wait for cores held by another context of this process.
    pub core_waits: AtomicU64,
    /// Times another process held the NPU lock and this one waited; total wait time.
    pub lock_waits: AtomicU64,
    pub lock_wait_ns: AtomicU64,
    /// Matmuls run on the CPU because another process held the NPU (`ORK_NPU_LOCK=cpu`).
    pub lock_fallbacks: AtomicU64,
    /// Prefill leases narrowed to leave a core to a decode stream.
    pub narrowed: AtomicU64,
}

struct State {
    busy: Vec<bool>,
    live: usize,
    lock: Option<nix::fcntl::Flock<File>>,
    /// The lock file, kept open while unlocked, so a lease costs flock + unlock instead of
    /// open + flock + close (about 12 µs per decode matmul measured here).
    spare: Option<File>,
    last_decode: Option<Instant>,
    /// Threads blocked in [`Arbiter::acquire`] waiting for cores (a release wakes them only
    /// then: an unconditional notify is a futex syscall per matmul).
    waiters: usize,
    /// Live [`Hold`]s: while any is live the cross-process lock stays taken between leases.
    holds: usize,
}

/// The process's NPU arbiter.
pub struct Arbiter {
    cores: u32,
    mode: LockMode,
    path: Option<PathBuf>,
    state: Mutex<State>,
    freed: Condvar,
    pub stats: ArbStats,
}

/// A live lease: cores `first..first + count`. Released on drop.
pub struct Lease<'a> {
    arb: &'a Arbiter,
    pub first: u32,
    pub count: u32,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut s = self.arb.state.lock().unwrap_or_else(|p| p.into_inner());
        for c in self.first..self.first + self.count {
            s.busy[c as usize] = false;
        }
        s.live -= 1;
        if s.live == 0 && s.holds == 0 {
            s.unlock();
        }
        if s.waiters > 0 {
            self.arb.freed.notify_all();
        }
    }
}

impl State {
    /// Unlocks the cross-process lock and keeps the file for the next lease (dropping the Flock
    /// on an unlock error closes the file, which releases the lock too).
    fn unlock(&mut self) {
        if let Some(l) = self.lock.take() {
            self.spare = l.unlock().ok();
        }
    }
}

/// Keeps the cross-process lock, once a lease took it, until this is dropped, so a run of
/// consecutive matmuls (one `graph_compute` call) costs one flock + unlock instead of one per
/// matmul. Cores are still leased per matmul. The caller drops it before doing anything other
/// than NPU matmuls (ggml-cpu runs, returning to llama.cpp), so another process waits at most
/// for the rest of one such run.
pub struct Hold<'a> {
    arb: &'a Arbiter,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let mut s = self.arb.state.lock().unwrap_or_else(|p| p.into_inner());
        s.holds -= 1;
        if s.holds == 0 && s.live == 0 {
            s.unlock();
        }
    }
}

/// The directory for lock files (see the module docs).
pub fn lock_dir(cfg: &Config) -> PathBuf {
    if let Some(d) = &cfg.lock_dir {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let run_lock = PathBuf::from("/run/lock");
    if nix::unistd::access(&run_lock, nix::unistd::AccessFlags::W_OK).is_ok() {
        return run_lock;
    }
    PathBuf::from("/tmp")
}

/// Why a lease could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ArbError {
    #[error("another process holds the NPU ({0}); ORK_NPU_LOCK=cpu")]
    Busy(String),
}

impl Arbiter {
    /// An arbiter for `cores` NPU cores; `lock_name` names the NPU (e.g. "rk3588-sim").
    pub fn new(cfg: &Config, cores: u32, lock_name: &str) -> Arbiter {
        let path = (cfg.npu_lock != LockMode::Off).then(|| lock_dir(cfg).join(format!("ork-npu-{lock_name}.lock")));
        Arbiter {
            cores: cores.max(1),
            mode: cfg.npu_lock,
            path,
            state: Mutex::new(State { busy: vec![false; cores.max(1) as usize], live: 0, lock: None, spare: None, last_decode: None, waiters: 0, holds: 0 }),
            freed: Condvar::new(),
            stats: ArbStats::default(),
        }
    }

    pub fn lock_path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// Whether the NPU looks busy right now (every core leased here). Advisory: for routing.
    pub fn busy(&self) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.busy.iter().all(|&b| b)
    }

    /// The cores a new lease would get, if any are free: (first, count).
    fn pick(&self, s: &State, phase: Phase, want: u32) -> Option<(u32, u32)> {
        let n = self.cores as usize;
        match phase {
            Phase::Decode => (0..n).rev().find(|&c| !s.busy[c]).map(|c| (c as u32, 1)),
            Phase::Prefill => {
                let decode_live = s.last_decode.is_some_and(|t| t.elapsed() < DECODE_RECENT);
                let limit = if decode_live && n > 1 { n - 1 } else { n };
                // Longest free run within 0..limit, lowest first.
                let (mut best, mut cur_start, mut best_len) = (None, 0, 0);
                for c in 0..=limit {
                    if c == limit || s.busy[c] {
                        let len = c - cur_start;
                        if len > best_len {
                            best = Some(cur_start);
                            best_len = len;
                        }
                        cur_start = c + 1;
                    }
                }
                best.map(|b| (b as u32, (best_len as u32).min(want.max(1))))
            }
        }
    }

    /// A [`Hold`] on the cross-process lock (taken lazily by the next lease, kept until the hold
    /// is dropped).
    pub fn hold(&self) -> Hold<'_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).holds += 1;
        Hold { arb: self }
    }

    /// Whether this process holds the cross-process lock now.
    pub fn locked(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).lock.is_some()
    }

    /// Takes a lease for one matmul of `phase` wanting up to `want` cores. Waits for free cores;
    /// across processes waits or (ORK_NPU_LOCK=cpu) returns [`ArbError::Busy`].
    pub fn acquire(&self, phase: Phase, want: u32) -> Result<Lease<'_>, ArbError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if phase == Phase::Decode {
            s.last_decode = Some(Instant::now());
        }
        let mut waited = false;
        let (first, count) = loop {
            if let Some(p) = self.pick(&s, phase, want) {
                break p;
            }
            waited = true;
            s.waiters += 1;
            s = self.freed.wait_timeout(s, Duration::from_millis(50)).map(|r| r.0).unwrap_or_else(|p| p.into_inner().0);
            s.waiters -= 1;
        };
        if waited {
            self.stats.core_waits.fetch_add(1, Relaxed);
        }
        if phase == Phase::Prefill && count < want.min(self.cores) && s.last_decode.is_some_and(|t| t.elapsed() < DECODE_RECENT) {
            self.stats.narrowed.fetch_add(1, Relaxed);
        }
        if s.live == 0 && s.lock.is_none() {
            if let Some(path) = &self.path {
                s.lock = self.lock_file(path, &mut s.spare)?;
            }
        }
        for c in first..first + count {
            s.busy[c as usize] = true;
        }
        s.live += 1;
        Ok(Lease { arb: self, first, count })
    }

    /// Takes the cross-process lock on `spare` (the file kept from the last lease) or a freshly
    /// opened file (None if the file cannot be opened: arbitration then is best-effort and says
    /// so once). When the lock is not taken (`ORK_NPU_LOCK=cpu`), the file goes back to `spare`.
    fn lock_file(&self, path: &std::path::Path, spare: &mut Option<File>) -> Result<Option<nix::fcntl::Flock<File>>, ArbError> {
        use nix::fcntl::{Flock, FlockArg};
        let file = match spare.take() {
            Some(f) => f,
            None => {
                if let Some(dir) = path.parent() {
                    // A missing lock directory is created (like the cache directory); failure is reported below.
                    let _ = std::fs::create_dir_all(dir);
                }
                match std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path) {
                    Ok(f) => f,
                    Err(e) => {
                        static ONCE: std::sync::Once = std::sync::Once::new();
                        ONCE.call_once(|| log::warn!("cannot open NPU lock file {} ({e}); no cross-process arbitration", path.display()));
                        return Ok(None);
                    }
                }
            }
        };
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(Some(l)),
            Err((f, _)) => f,
        };
        if self.mode == LockMode::Cpu {
            *spare = Some(file);
            if self.stats.lock_fallbacks.fetch_add(1, Relaxed) == 0 {
                log::info!("NPU arbitration: another process holds {}; running matmuls on the CPU while it does (ORK_NPU_LOCK=cpu)", path.display());
            }
            return Err(ArbError::Busy(path.display().to_string()));
        }
        let t0 = Instant::now();
        let r = Flock::lock(file, FlockArg::LockExclusive);
        let dt = t0.elapsed();
        self.stats.lock_wait_ns.fetch_add(dt.as_nanos() as u64, Relaxed);
        if self.stats.lock_waits.fetch_add(1, Relaxed) == 0 {
            log::info!("NPU arbitration: another process held {}; waited {:.1} ms for it (ORK_NPU_LOCK=wait)", path.display(), dt.as_secs_f64() * 1e3);
        }
        match r {
            Ok(l) => Ok(Some(l)),
            Err((_, e)) => {
                log::warn!("flock {} failed ({e}); continuing without the cross-process lock", path.display());
                Ok(None)
            }
        }
    }

    pub fn summary(&self) -> String {
        let s = &self.stats;
        format!(
            "arbiter: {} waits for cores held by another context, {} prefill leases narrowed for a decode stream, \
             {} waits for another process ({:.1} ms), {} matmuls on the CPU while another process held the NPU",
            s.core_waits.load(Relaxed),
            s.narrowed.load(Relaxed),
            s.lock_waits.load(Relaxed),
            s.lock_wait_ns.load(Relaxed) as f64 / 1e6,
            s.lock_fallbacks.load(Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn cfg(dir: &std::path::Path, mode: &str) -> Config {
        let d = dir.to_string_lossy().into_owned();
        let mode = mode.to_string();
        Config::from_lookup(move |k| match k {
            "ORK_LOCK_DIR" => Some(d.clone()),
            "ORK_NPU_LOCK" => Some(mode.clone()),
            _ => None,
        })
        .0
    }

    #[test]
    fn prefill_takes_two_cores_while_decode_keeps_one() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arbiter::new(&cfg(dir.path(), "off"), 3, "t");
        {
            // Alone, a prefill takes all three cores.
            let l = a.acquire(Phase::Prefill, 3).unwrap();
            assert_eq!((l.first, l.count), (0, 3));
        }
        let d = a.acquire(Phase::Decode, 1).unwrap();
        assert_eq!((d.first, d.count), (2, 1));
        let p = a.acquire(Phase::Prefill, 3).unwrap();
        assert_eq!((p.first, p.count), (0, 2), "prefill leaves the decode core");
        drop(d);
        // The decode stream is still "recent": the next prefill still leaves it a core.
        drop(p);
        let p = a.acquire(Phase::Prefill, 3).unwrap();
        assert_eq!((p.first, p.count), (0, 2));
        assert_eq!(a.stats.narrowed.load(Relaxed), 2);
    }

    #[test]
    fn leases_are_disjoint_under_contention() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(Arbiter::new(&cfg(dir.path(), "wait"), 3, "t"));
        let owners: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
        let hs: Vec<_> = (0..6)
            .map(|t| {
                let (a, owners) = (a.clone(), owners.clone());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let ph = if (t + i) % 2 == 0 { Phase::Decode } else { Phase::Prefill };
                        let l = a.acquire(ph, 3).unwrap();
                        for c in l.first..l.first + l.count {
                            assert_eq!(owners[c as usize].swap(t + 1, Relaxed), 0, "core {c} double-leased");
                        }
                        std::thread::sleep(Duration::from_micros(200));
                        for c in l.first..l.first + l.count {
                            owners[c as usize].store(0, Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(a.stats.core_waits.load(Relaxed) > 0, "6 threads on 3 cores must have waited");
    }

    #[test]
    fn another_process_holding_the_lock_makes_cpu_mode_fall_back() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let a = Arbiter::new(&cfg(dir.path(), "cpu"), 3, "t");
        // Another open file description = another holder, as a second process would be.
        let f = File::create(a.lock_path().unwrap()).unwrap();
        let held = Flock::lock(f, FlockArg::LockExclusive).map_err(|e| e.1).unwrap();
        assert!(matches!(a.acquire(Phase::Prefill, 3), Err(ArbError::Busy(_))));
        assert_eq!(a.stats.lock_fallbacks.load(Relaxed), 1);
        drop(held);
        let l = a.acquire(Phase::Prefill, 3).unwrap();
        assert_eq!(l.count, 3);
    }

    #[test]
    fn lock_is_released_between_leases_and_taken_again_with_the_kept_file() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let a = Arbiter::new(&cfg(dir.path(), "cpu"), 3, "t");
        let other = || File::open(a.lock_path().unwrap()).unwrap();
        for _ in 0..3 {
            let l = a.acquire(Phase::Decode, 1).unwrap();
            // held: another open file description cannot take it
            let f = match Flock::lock(other(), FlockArg::LockExclusiveNonblock) {
                Ok(_) => panic!("lock not held during a lease"),
                Err((f, _)) => f,
            };
            drop(f);
            drop(l);
            // released: another holder takes it, and this arbiter then falls back
            let held = Flock::lock(other(), FlockArg::LockExclusiveNonblock).map_err(|e| e.1).expect("lock released after the lease");
            assert!(matches!(a.acquire(Phase::Decode, 1), Err(ArbError::Busy(_))));
            drop(held);
        }
        assert_eq!(a.stats.lock_fallbacks.load(Relaxed), 3);
    }

    #[test]
    fn a_hold_keeps_the_lock_between_leases_and_releases_it_when_dropped() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let a = Arbiter::new(&cfg(dir.path(), "cpu"), 3, "t");
        let other = || Flock::lock(File::open(a.lock_path().unwrap()).unwrap(), FlockArg::LockExclusiveNonblock).map_err(|e| e.1);
        File::create(a.lock_path().unwrap()).unwrap();
        for _ in 0..2 {
            let h = a.hold();
            // a hold alone takes nothing: a graph without NPU matmuls never touches the lock
            assert!(!a.locked());
            drop(other().expect("free while only a hold is live"));
            for _ in 0..3 {
                let l = a.acquire(Phase::Decode, 1).unwrap();
                assert!(other().is_err(), "lock not held during a lease");
                drop(l);
                // between the leases of a hold the lock stays with this process
                assert!(a.locked());
                assert!(other().is_err(), "lock released between leases of a hold");
            }
            drop(h);
            assert!(!a.locked());
            // released with the hold: another holder takes it, and this arbiter then falls back
            let held = other().expect("lock released with the hold");
            let h = a.hold();
            assert!(matches!(a.acquire(Phase::Decode, 1), Err(ArbError::Busy(_))));
            drop(h);
            drop(held);
        }
        // two holds (two contexts' graph_compute calls): the lock goes with the last one
        let (h1, h2) = (a.hold(), a.hold());
        drop(a.acquire(Phase::Decode, 1).unwrap());
        drop(h1);
        assert!(a.locked());
        drop(h2);
        assert!(!a.locked());
        assert_eq!(a.stats.lock_fallbacks.load(Relaxed), 2);
    }

    #[test]
    fn wait_mode_waits_for_the_other_holder() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let a = Arbiter::new(&cfg(dir.path(), "wait"), 3, "t");
        let f = File::create(a.lock_path().unwrap()).unwrap();
        let held = Flock::lock(f, FlockArg::LockExclusive).map_err(|e| e.1).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(held);
        });
        let t0 = Instant::now();
        let l = a.acquire(Phase::Decode, 1).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(80), "{:?}", t0.elapsed());
        assert_eq!(a.stats.lock_waits.load(Relaxed), 1);
        drop(l);
        t.join().unwrap();
    }
}
