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
//! and between the leases of one `graph_compute` call ([`Hold`]). The lock dies with its holder
//! (the kernel drops `flock` locks on exit), so a crashed process never blocks the NPU.
//!
//! *Sticky while nobody waits.* Taking and letting go of a `flock` is two syscalls; decode makes
//! one `graph_compute` call per graph split (about 150 per SmolLM2 token), so letting go at the
//! end of each call cost ≈ 0.25 ms per token here. The lock file's first bytes are also mapped
//! shared ([`crate::os::shared`]) as a *want* counter: a process that finds the lock taken
//! bumps it before it waits. At the point where the lock would be let go (the last lease or hold
//! ends) the holder keeps it unless the counter moved since it took the lock, or it has held it
//! for [`STICKY_MAX`] (a bound for waiters that do not signal); a watcher thread lets go of a
//! kept lock once it has been unused for [`STICKY_IDLE`] or a waiter signals meanwhile. So an
//! uncontended process takes the lock about once per [`STICKY_MAX`]. Under contention the lock
//! changes hands at a release point after a signal, but a waiter blocked in `flock` signals once:
//! when the holder's next call takes the lock again before the woken waiter runs, the holder keeps
//! it until [`STICKY_MAX`]. Measured (two concurrent SmolLM2 decoders, every matmul on the NPU
//! simulator, 40 tokens each): 184-192 waits per process against 2023-2272 with a lock let go
//! after every call, the same total wait (4.5-4.9 s vs 4.2-4.8 s) and decode time — slices of up
//! to 20 ms instead of one graph split, and no process starves for a whole generation.
//!
//! `ORK_NPU_LOCK=wait` (default) blocks until the other process lets go; `cpu` does not wait and
//! runs that matmul's int8 arithmetic on the CPU instead (the same int32 result, slower); `off`
//! skips the lock. Each process logs one line the first time arbitration made it wait or fall
//! back, and the counts appear in the profile summary.

use crate::config::{Config, LockMode};
use super::Phase;
use crate::os::shared::SharedCounter;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long after a decode matmul a prefill still leaves a core free for the decode stream.
pub const DECODE_RECENT: Duration = Duration::from_millis(500);

/// A kept (sticky) cross-process lock is let go at the first release point this long after it was
/// taken, even with no waiter signalling: the bound for a waiter that does not bump the counter.
pub const STICKY_MAX: Duration = Duration::from_millis(20);

/// A kept cross-process lock unused for this long is let go by the watcher thread.
pub const STICKY_IDLE: Duration = Duration::from_millis(10);

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
    /// Times the cross-process lock was taken (a `flock` syscall), and times it was kept at a
    /// release point because nobody waited for it (no syscall).
    pub lock_takes: AtomicU64,
    pub lock_kept: AtomicU64,
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
    /// The lock file's shared *want* counter (None: not mapped; the lock is then never kept).
    want: Option<SharedCounter>,
    /// The counter's value when this process took the lock.
    seen: u32,
    /// When the lock was taken, and when it was last kept at a release point.
    locked_at: Instant,
    last_use: Instant,
    /// The watcher thread runs (it is started the first time a lock is kept), and it sleeps
    /// until woken (no lock kept when it last looked): only then does keeping the lock wake it
    /// (a futex syscall), not at every release point.
    watcher: bool,
    watcher_asleep: bool,
}

/// What the watcher thread shares with the arbiter.
struct Shared {
    state: Mutex<State>,
    /// [`STICKY_IDLE`] (tests set their own).
    sticky_idle: Duration,
    /// Cores were freed (threads waiting in [`Arbiter::acquire`]).
    freed: Condvar,
    /// A lock was kept (wakes the watcher).
    kept: Condvar,
}

/// The process's NPU arbiter.
pub struct Arbiter {
    mode: LockMode,
    path: Option<PathBuf>,
    shared: Arc<Shared>,
    /// [`STICKY_MAX`] (tests set their own).
    sticky_max: Duration,
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
        let mut s = self.arb.state();
        for c in self.first..self.first + self.count {
            s.busy[c as usize] = false;
        }
        s.live -= 1;
        self.arb.release_point(&mut s);
        if s.waiters > 0 {
            self.arb.shared.freed.notify_all();
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

    /// Whether another process signalled that it waits for the lock since this one took it.
    fn contended(&self) -> bool {
        self.want.as_ref().is_none_or(|w| w.get().load(Relaxed) != self.seen)
    }
}

/// The watcher thread: lets go of a kept lock that is unused for [`STICKY_IDLE`] or wanted by
/// another process. Ends with the arbiter.
fn watch(shared: Weak<Shared>) {
    loop {
        let Some(sh) = shared.upgrade() else { return };
        let mut s = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.lock.is_some() && s.live == 0 && s.holds == 0 && (s.contended() || s.last_use.elapsed() >= sh.sticky_idle) {
            s.unlock();
        }
        // While a lock is kept, look again within sticky_idle / 2; otherwise sleep until the next
        // keep (or a second, to notice the arbiter's end).
        let t = if s.lock.is_some() { sh.sticky_idle / 2 } else { Duration::from_secs(1) };
        s.watcher_asleep = s.lock.is_none();
        drop(sh.kept.wait_timeout(s, t));
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
        let mut s = self.arb.state();
        s.holds -= 1;
        self.arb.release_point(&mut s);
    }
}

/// The directory for lock files (see the module docs).
pub fn lock_dir(cfg: &Config) -> PathBuf {
    let run_lock = || nix::unistd::access("/run/lock", nix::unistd::AccessFlags::W_OK).is_ok().then_some("/run/lock");
    cfg.lock_dir.as_deref().or(cfg.xdg_runtime_dir.as_deref()).or_else(run_lock).unwrap_or("/tmp").into()
}

/// Opens the lock file (a missing directory is created, like the cache directory) and maps its
/// want counter into `want` (once per opened file: not retried at every lock take when it fails);
/// None, said once, when it cannot be opened.
fn open_lock(path: &std::path::Path, want: &mut Option<SharedCounter>) -> Option<File> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let open = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path);
    let f = open
        .map_err(|e| {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| log::warn!("cannot open NPU lock file {} ({e}); no cross-process arbitration", path.display()));
        })
        .ok()?;
    *want = SharedCounter::open(&f)
        .map_err(|e| log::debug!("NPU lock file {}: no shared want counter ({e}); the lock is let go after each use", path.display()))
        .ok();
    Some(f)
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
        let now = Instant::now();
        let state = State { busy: vec![false; cores.max(1) as usize], live: 0, lock: None, spare: None, last_decode: None, waiters: 0, holds: 0, want: None, seen: 0, locked_at: now, last_use: now, watcher: false, watcher_asleep: false };
        let shared = Arc::new(Shared { state: Mutex::new(state), sticky_idle: STICKY_IDLE, freed: Condvar::new(), kept: Condvar::new() });
        Arbiter { mode: cfg.npu_lock, path, shared, sticky_max: STICKY_MAX, stats: ArbStats::default() }
    }

    /// The same with other keep bounds (tests: long ones, so a preempted test thread does not see
    /// a lock let go by timing).
    #[cfg(test)]
    fn with_sticky(cfg: &Config, cores: u32, lock_name: &str, max: Duration, idle: Duration) -> Arbiter {
        let mut a = Arbiter::new(cfg, cores, lock_name);
        a.sticky_max = max;
        Arc::get_mut(&mut a.shared).expect("no watcher yet").sticky_idle = idle;
        a
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A lease or hold ended: where it was this process's last, let go of the cross-process lock,
    /// or keep it (no syscall) while nobody waits for it (module docs).
    fn release_point(&self, s: &mut State) {
        if s.lock.is_none() || s.live > 0 || s.holds > 0 {
            return;
        }
        if s.contended() || s.locked_at.elapsed() >= self.sticky_max {
            s.unlock();
            return;
        }
        if !s.watcher {
            let weak = Arc::downgrade(&self.shared);
            match std::thread::Builder::new().name("ork-npu-lock".into()).spawn(move || watch(weak)) {
                Ok(_) => s.watcher = true,
                Err(e) => {
                    log::debug!("no NPU lock watcher thread ({e}); the lock is let go after each use");
                    s.want = None;
                    s.unlock();
                    return;
                }
            }
        }
        s.last_use = Instant::now();
        self.stats.lock_kept.fetch_add(1, Relaxed);
        if s.watcher_asleep {
            s.watcher_asleep = false;
            self.shared.kept.notify_one();
        }
    }

    #[cfg(test)]
    fn lock_path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// Whether the NPU looks busy right now (every core leased here). Advisory: for routing.
    pub fn busy(&self) -> bool {
        let s = self.state();
        s.busy.iter().all(|&b| b)
    }

    /// The cores a new lease would get, if any are free: (first, count).
    fn pick(&self, s: &State, phase: Phase, want: u32) -> Option<(u32, u32)> {
        let n = s.busy.len();
        match phase {
            Phase::Decode => (0..n).rev().find(|&c| !s.busy[c]).map(|c| (c as u32, 1)),
            Phase::Prefill => {
                let decode_live = s.last_decode.is_some_and(|t| t.elapsed() < DECODE_RECENT);
                let limit = if decode_live && n > 1 { n - 1 } else { n };
                // Longest free run within 0..limit, lowest first.
                let run = |c: usize| (c..limit).take_while(|&i| !s.busy[i]).count();
                let (len, first) = (0..limit).map(|c| (run(c), c)).filter(|r| r.0 > 0).min_by_key(|&(len, c)| (std::cmp::Reverse(len), c))?;
                Some((first as u32, (len as u32).min(want.max(1))))
            }
        }
    }

    /// A [`Hold`] on the cross-process lock (taken lazily by the next lease, kept until the hold
    /// is dropped).
    pub fn hold(&self) -> Hold<'_> {
        self.state().holds += 1;
        Hold { arb: self }
    }

    /// Whether this process holds the cross-process lock now.
    #[cfg(test)]
    fn locked(&self) -> bool {
        self.state().lock.is_some()
    }

    /// Takes a lease for one matmul of `phase` wanting up to `want` cores. Waits for free cores;
    /// across processes waits or (ORK_NPU_LOCK=cpu) returns [`ArbError::Busy`].
    pub fn acquire(&self, phase: Phase, want: u32) -> Result<Lease<'_>, ArbError> {
        let mut s = self.state();
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
            s = self.shared.freed.wait_timeout(s, Duration::from_millis(50)).map(|r| r.0).unwrap_or_else(|p| p.into_inner().0);
            s.waiters -= 1;
        };
        if waited {
            self.stats.core_waits.fetch_add(1, Relaxed);
        }
        if phase == Phase::Prefill && count < want.min(s.busy.len() as u32) && s.last_decode.is_some_and(|t| t.elapsed() < DECODE_RECENT) {
            self.stats.narrowed.fetch_add(1, Relaxed);
        }
        if s.live == 0 && s.lock.is_none() {
            if let Some(path) = &self.path {
                s.lock = self.lock_file(path, &mut s)?;
                if s.lock.is_some() {
                    s.seen = s.want.as_ref().map_or(0, |w| w.get().load(Relaxed));
                    s.locked_at = Instant::now();
                    self.stats.lock_takes.fetch_add(1, Relaxed);
                }
            }
        }
        for c in first..first + count {
            s.busy[c as usize] = true;
        }
        s.live += 1;
        Ok(Lease { arb: self, first, count })
    }

    /// Takes the cross-process lock on `s.spare` (the file kept from the last lease) or a freshly
    /// opened file (None if the file cannot be opened: arbitration then is best-effort and says
    /// so once), mapping its want counter the first time. When the lock is not taken
    /// (`ORK_NPU_LOCK=cpu`), the file goes back to `spare`. A process that finds the lock taken
    /// bumps the want counter first, so a holder that keeps the lock lets go of it.
    fn lock_file(&self, path: &std::path::Path, s: &mut State) -> Result<Option<nix::fcntl::Flock<File>>, ArbError> {
        use nix::fcntl::{Flock, FlockArg};
        let Some(file) = s.spare.take().or_else(|| open_lock(path, &mut s.want)) else { return Ok(None) };
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(Some(l)),
            Err((f, _)) => f,
        };
        if let Some(w) = &s.want {
            w.get().fetch_add(1, Relaxed);
        }
        if self.mode == LockMode::Cpu {
            s.spare = Some(file);
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
        Ok(r.map_err(|(_, e)| log::warn!("flock {} failed ({e}); continuing without the cross-process lock", path.display())).ok())
    }

    pub fn summary(&self) -> String {
        let s = &self.stats;
        format!(
            "arbiter: {} waits for cores held by another context, {} prefill leases narrowed for a decode stream, \
             {} waits for another process ({:.1} ms), {} matmuls on the CPU while another process held the NPU; \
             cross-process lock taken {} times, kept {} times with nobody waiting",
            s.core_waits.load(Relaxed),
            s.narrowed.load(Relaxed),
            s.lock_waits.load(Relaxed),
            s.lock_wait_ns.load(Relaxed) as f64 / 1e6,
            s.lock_fallbacks.load(Relaxed),
            s.lock_takes.load(Relaxed),
            s.lock_kept.load(Relaxed)
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

    /// An arbiter whose kept lock goes only when asked (bounds far beyond any test's run).
    fn long_sticky(dir: &std::path::Path, mode: &str) -> Arbiter {
        Arbiter::with_sticky(&cfg(dir, mode), 3, "t", Duration::from_secs(600), Duration::from_secs(600))
    }

    /// A foreign holder that does not signal (another open file description, as an older ork
    /// would be): the lock it frees is taken again with the kept file.
    fn foreign(a: &Arbiter) -> Result<nix::fcntl::Flock<File>, nix::errno::Errno> {
        use nix::fcntl::{Flock, FlockArg};
        Flock::lock(File::open(a.lock_path().unwrap()).unwrap(), FlockArg::LockExclusiveNonblock).map_err(|e| e.1)
    }

    #[test]
    fn an_uncontended_lock_is_kept_between_leases_and_let_go_when_another_process_asks() {
        let dir = tempfile::tempdir().unwrap();
        let a = long_sticky(dir.path(), "cpu");
        // The other process: its own arbiter on the same lock file.
        let b = long_sticky(dir.path(), "cpu");
        for round in 0..3 {
            for _ in 0..5 {
                let l = a.acquire(Phase::Decode, 1).unwrap();
                assert!(foreign(&a).is_err(), "lock not held during a lease");
                drop(l);
                // nobody asked: kept, with no syscall, between leases
                assert!(a.locked());
            }
            // b finds it taken: falls back (cpu mode) and signals; a lets go at its next release
            // point. (a's watcher thread may let go first — it starts on a's first keep and can
            // run late — and a then takes the lock again with the signal already seen; b's next
            // attempt signals again.) So b has the lock within three attempts.
            let mut got = None;
            for _ in 0..3 {
                match b.acquire(Phase::Decode, 1) {
                    Ok(l) => {
                        got = Some(l);
                        break;
                    }
                    Err(ArbError::Busy(_)) => drop(a.acquire(Phase::Decode, 1).unwrap()),
                }
            }
            let l = got.unwrap_or_else(|| panic!("round {round}: b signalled three times and never got the lock"));
            assert!(!a.locked());
            // now a finds it taken
            assert!(matches!(a.acquire(Phase::Decode, 1), Err(ArbError::Busy(_))));
            drop(l);
            assert!(!b.locked(), "a signalled while b held it");
        }
        let takes = a.stats.lock_takes.load(Relaxed);
        assert!((3..=6).contains(&takes), "one flock per round, not per lease: {takes}");
        assert!(a.stats.lock_kept.load(Relaxed) >= 15);
        assert_eq!(a.stats.lock_fallbacks.load(Relaxed), 3);
        assert!((3..=6).contains(&b.stats.lock_fallbacks.load(Relaxed)));
    }

    #[test]
    fn a_kept_lock_is_let_go_when_idle_and_after_sticky_max() {
        let dir = tempfile::tempdir().unwrap();
        let (max, idle) = (Duration::from_millis(400), Duration::from_millis(200));
        let a = Arbiter::with_sticky(&cfg(dir.path(), "cpu"), 3, "t", max, idle);
        drop(a.acquire(Phase::Decode, 1).unwrap());
        assert!(a.locked());
        // the watcher lets an unused kept lock go: a waiter that does not signal gets it
        let t0 = Instant::now();
        while a.locked() {
            assert!(t0.elapsed() < Duration::from_secs(5), "kept lock never let go while idle");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t0.elapsed() >= idle / 2, "{:?}", t0.elapsed());
        drop(foreign(&a).expect("free after the idle release"));
        // in continuous use, a lock taken STICKY_MAX ago goes at the next release point
        let h = a.hold();
        drop(a.acquire(Phase::Decode, 1).unwrap());
        // the lock was taken before this instant
        let t0 = Instant::now();
        while t0.elapsed() < max {
            drop(a.acquire(Phase::Decode, 1).unwrap());
            assert!(a.locked());
        }
        drop(a.acquire(Phase::Decode, 1).unwrap());
        drop(h);
        assert!(!a.locked(), "held past sticky_max");
        assert_eq!(a.stats.lock_takes.load(Relaxed), 2);
    }

    #[test]
    fn a_hold_keeps_the_lock_between_leases_and_a_signal_releases_it_with_the_hold() {
        let dir = tempfile::tempdir().unwrap();
        let a = long_sticky(dir.path(), "cpu");
        let b = long_sticky(dir.path(), "cpu");
        File::create(a.lock_path().unwrap()).unwrap();
        for _ in 0..2 {
            let h = a.hold();
            // a hold alone takes nothing: a graph without NPU matmuls never touches the lock
            assert!(!a.locked());
            drop(foreign(&a).expect("free while only a hold is live"));
            for _ in 0..3 {
                let l = a.acquire(Phase::Decode, 1).unwrap();
                drop(l);
                // between the leases of a hold the lock stays with this process
                assert!(a.locked());
            }
            // another process asks while the hold is live: the lock goes with the hold
            assert!(matches!(b.acquire(Phase::Decode, 1), Err(ArbError::Busy(_))));
            drop(a.acquire(Phase::Decode, 1).unwrap());
            assert!(a.locked(), "never let go inside a hold");
            drop(h);
            assert!(!a.locked());
            let held = foreign(&a).expect("lock released with the hold");
            let h = a.hold();
            assert!(matches!(a.acquire(Phase::Decode, 1), Err(ArbError::Busy(_))));
            drop(h);
            drop(held);
        }
        // two holds (two contexts' graph_compute calls): nothing is let go before the last one
        let (h1, h2) = (a.hold(), a.hold());
        drop(a.acquire(Phase::Decode, 1).unwrap());
        assert!(matches!(b.acquire(Phase::Decode, 1), Err(ArbError::Busy(_))));
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

    #[test]
    fn a_waiting_process_gets_the_lock_from_a_busy_or_idle_holder_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(Arbiter::new(&cfg(dir.path(), "wait"), 3, "t"));
        let b = Arbiter::new(&cfg(dir.path(), "wait"), 3, "t");
        // idle holder: the watcher lets go once b signals
        drop(a.acquire(Phase::Decode, 1).unwrap());
        assert!(a.locked());
        let t0 = Instant::now();
        drop(b.acquire(Phase::Decode, 1).unwrap());
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        // busy holder: decode-like graph_compute calls with gaps for CPU ops in between
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    let h = a.hold();
                    for _ in 0..3 {
                        drop(a.acquire(Phase::Decode, 1).unwrap());
                    }
                    drop(h);
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..5 {
            let t0 = Instant::now();
            let l = b.acquire(Phase::Decode, 1).unwrap();
            assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
            drop(l);
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Relaxed);
        t.join().unwrap();
        assert!(b.stats.lock_waits.load(Relaxed) >= 1);
    }
}
