//! The threads a MUL_MAT's host passes (the activation pass, the output pass) run on, as a team:
//! the calling thread leads, the others take a pass's tasks as it is posted and, between passes,
//! wait for the next one spinning (yielding their CPU), so a pass starts on every thread at once.
//!
//! Where the host application runs ggml-cpu on an OpenMP runtime (llama.cpp's default build links
//! libgomp), the team is that runtime's team of the calling thread: the threads that run
//! ggml-cpu's splits. ORK's passes and ggml-cpu's splits then take turns on the same threads
//! instead of competing for the cores: under OpenMP's default wait policy a team's threads spin
//! after each split (libgomp: 300,000 spins, "about 3 ms", when `OMP_WAIT_POLICY` is unset), on
//! the cores a pool of ORK's own would need. Without an OpenMP runtime in the process the team is
//! the calling thread and a rayon pool's threads.
//!
//! A task is a block of rows computed from its own inputs, so the bits are the same whichever
//! thread runs it. Outside a team, [`for_each`] runs on the current rayon pool.
#![allow(unsafe_code)]

use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

/// A task body: `job(i)` for task i.
pub type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// libgomp's entry of `#pragma omp parallel num_threads(n)` (also exported by LLVM's libomp):
/// every thread of the team calls `fn(data)`, the caller as thread 0; returns when all have.
type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, u32, u32);

struct OpenMp {
    parallel: GompParallel,
    _lib: libloading::os::unix::Library,
}

/// The OpenMP runtime already loaded in the process, if any (never loaded here; looked for again
/// until found: ggml-cpu may be loaded after ORK).
fn openmp() -> Option<&'static OpenMp> {
    static OMP: OnceLock<OpenMp> = OnceLock::new();
    if let Some(omp) = OMP.get() {
        return Some(omp);
    }
    let found = ["libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so"].iter().find_map(|name| {
        // SAFETY: RTLD_NOLOAD only returns a library already loaded (no initialiser runs); the
        // symbol is the OpenMP runtime's ABI entry with this signature.
        unsafe {
            let lib = libloading::os::unix::Library::open(Some(name), libc::RTLD_NOW | libc::RTLD_NOLOAD).ok()?;
            let parallel = *lib.get::<GompParallel>(b"GOMP_parallel\0").ok()?;
            Some(OpenMp { parallel, _lib: lib })
        }
    })?;
    Some(OMP.get_or_init(|| found))
}

/// Whether the process has an OpenMP runtime ORK's team can use.
pub fn has_openmp() -> bool {
    openmp().is_some()
}

/// The size of ggml-cpu's last team (set by the skin before each CPU split); 0 before any.
static OPENMP_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Records the thread count ggml-cpu's splits run with (`ggml_backend_cpu_set_n_threads`).
pub fn set_openmp_threads(n: usize) {
    OPENMP_THREADS.store(n, Relaxed);
}

/// Where a team's other threads come from.
pub enum Threads<'p> {
    /// The OpenMP team of the calling thread: ggml-cpu's size where known, else `fallback`.
    OpenMp { fallback: usize },
    /// A rayon pool's threads (the calling thread leads).
    Pool(&'p rayon::ThreadPool),
}

/// What a standing team's threads share.
struct Shared {
    lead: ThreadId,
    /// The team's size as asked (threads may join late; the lead takes what is left).
    want: usize,
    done: AtomicBool,
    /// Bumped at each post; `slot` holds the posted job and its task count.
    posted: AtomicUsize,
    slot: Mutex<Option<(Job<'static>, usize)>>,
    next: AtomicUsize,
    left: AtomicUsize,
    /// Threads between reading a post and leaving its job.
    inside: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// The current thread's team while it leads one.
#[derive(Clone, Copy)]
enum Current {
    None,
    /// A [`for_each`] here runs on this thread alone: inside a task of a team's post (the
    /// team's threads are all in that post), or in a team of one.
    Alone,
    /// Threads that wait for each post (`Shared`, alive while the lead runs `f`).
    Standing(*const Shared),
    /// Each post starts the team anew (`ORK_KEEP_AWAKE=0`): OpenMP's threads of this count, or
    /// the pool's.
    PerJob(usize, Option<*const rayon::ThreadPool>),
}

thread_local! {
    static CURRENT: Cell<Current> = const { Cell::new(Current::None) };
}

/// Makes `c` the current thread's team until dropped (also while unwinding), then puts back
/// the one before.
struct Set(Current);

impl Set {
    fn new(c: Current) -> Self {
        Set(CURRENT.with(|x| x.replace(c)))
    }
}

impl Drop for Set {
    fn drop(&mut self) {
        CURRENT.with(|x| x.set(self.0));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Takes tasks of `job` until none is left, each one's panic kept for the lead.
    fn take(&self, job: Job<'_>, tasks: usize) {
        loop {
            let i = self.next.fetch_add(1, AcqRel);
            if i >= tasks {
                return;
            }
            let alone = Set::new(Current::Alone);
            let r = catch_unwind(AssertUnwindSafe(|| job(i)));
            drop(alone);
            if let Err(e) = r {
                lock(&self.panic).get_or_insert(e);
            }
            self.left.fetch_sub(1, AcqRel);
        }
    }

    /// A non-leading thread: the posts' tasks until the lead is done.
    fn serve(&self) {
        let mut seen = 0;
        while !self.done.load(Acquire) {
            let p = self.posted.load(Acquire);
            if p == seen {
                pause();
                continue;
            }
            seen = p;
            self.inside.fetch_add(1, SeqCst);
            let posted = *lock(&self.slot);
            if let Some((job, tasks)) = posted {
                self.take(job, tasks);
            }
            self.inside.fetch_sub(1, SeqCst);
        }
    }

    /// The lead's post: every task of `job` done (some by the lead) when it returns.
    fn post(&self, tasks: usize, job: Job<'_>) {
        {
            let mut slot = lock(&self.slot);
            self.next.store(0, Relaxed);
            self.left.store(tasks, Relaxed);
            // SAFETY: the job is read from the slot only by threads counted in `inside`; the
            // slot is emptied and `inside` waited down to 0 before this function returns, so no
            // thread holds the job past its lifetime.
            *slot = Some((unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(job) }, tasks));
        }
        self.posted.fetch_add(1, Release);
        self.take(job, tasks);
        while self.left.load(Acquire) > 0 {
            pause();
        }
        *lock(&self.slot) = None;
        while self.inside.load(SeqCst) > 0 {
            pause();
        }
        if let Some(e) = lock(&self.panic).take() {
            resume_unwind(e);
        }
    }
}

/// A short spin, then the CPU to whoever else wants it.
fn pause() {
    for _ in 0..32 {
        std::hint::spin_loop();
    }
    std::thread::yield_now();
}

/// The lead's part of an OpenMP region: `f` and its result, the team's state.
struct Region<F, R> {
    shared: Shared,
    f: Cell<Option<F>>,
    out: Cell<Option<std::thread::Result<R>>>,
}

impl<F: FnOnce() -> R, R> Region<F, R> {
    fn lead(&self) {
        let standing = Set::new(Current::Standing(&self.shared));
        let f = self.f.take().expect("one lead");
        self.out.set(Some(catch_unwind(AssertUnwindSafe(f))));
        drop(standing);
        self.shared.done.store(true, Release);
    }
}

extern "C" fn region_thread<F: FnOnce() -> R, R>(data: *mut c_void) {
    let r = data as *const Region<F, R>;
    // SAFETY: `data` is the `Region` `run` passes to GOMP_parallel, alive until it returns;
    // `shared` is Sync.
    let shared = unsafe { &*std::ptr::addr_of!((*r).shared) };
    if std::thread::current().id() == shared.lead {
        // SAFETY: as above; the lead (the calling thread, which made the region) alone touches
        // its cells.
        unsafe { &*r }.lead();
    } else {
        shared.serve();
    }
}

/// Runs `f` on the calling thread as the lead of a team (`standing`: its other threads wait
/// between posts, else each post starts them anew); [`for_each`] inside `f` posts to it.
pub fn run<R, F: FnOnce() -> R>(threads: Threads<'_>, standing: bool, f: F) -> R {
    let n = match threads {
        Threads::OpenMp { fallback } => match OPENMP_THREADS.load(Relaxed) {
            0 => fallback,
            n => n,
        },
        Threads::Pool(p) => p.current_num_threads() + 1,
    };
    if !matches!(CURRENT.with(Cell::get), Current::None) {
        return f();
    }
    let omp = matches!(threads, Threads::OpenMp { .. }).then(openmp).flatten();
    if n < 2 || (omp.is_none() && matches!(threads, Threads::OpenMp { .. })) {
        return alone(f);
    }
    if !standing {
        let pool = match threads {
            Threads::Pool(p) => Some(p as *const rayon::ThreadPool),
            Threads::OpenMp { .. } => None,
        };
        let _per_job = Set::new(Current::PerJob(n, pool));
        return f();
    }
    let shared = Shared {
        lead: std::thread::current().id(),
        want: n,
        done: AtomicBool::new(false),
        posted: AtomicUsize::new(0),
        slot: Mutex::new(None),
        next: AtomicUsize::new(0),
        left: AtomicUsize::new(0),
        inside: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    let region = Region { shared, f: Cell::new(Some(f)), out: Cell::new(None) };
    match (omp, threads) {
        (Some(omp), _) => {
            // SAFETY: GOMP_parallel runs `region_thread` on n threads (the caller among them)
            // and returns when every one has; `region` outlives the call.
            unsafe { (omp.parallel)(region_thread::<F, R>, &region as *const _ as *mut c_void, n as u32, 0) };
        }
        (None, Threads::Pool(pool)) => {
            // One standing team per pool at a time: its threads serve one lead until it is done.
            static BUSY: Mutex<Vec<usize>> = Mutex::new(Vec::new());
            let key = pool as *const rayon::ThreadPool as usize;
            let free = { let mut b = lock(&BUSY); !b.contains(&key) && { b.push(key); true } };
            if free {
                pool.in_place_scope(|s| {
                    s.spawn_broadcast(|_, _| region.shared.serve());
                    region.lead();
                });
                lock(&BUSY).retain(|&k| k != key);
            } else {
                // Another lead has the pool: this one runs alone.
                region.lead();
            }
        }
        (None, Threads::OpenMp { .. }) => unreachable!("checked above"),
    }
    match region.out.take() {
        Some(Ok(r)) => r,
        Some(Err(e)) => resume_unwind(e),
        None => unreachable!("the lead ran"),
    }
}

/// Runs `f` with the calling thread as a team of one: [`for_each`] inside it runs on this thread.
pub fn alone<R>(f: impl FnOnce() -> R) -> R {
    let _alone = Set::new(Current::Alone);
    f()
}

/// Runs `job(i)` for every `i < tasks`: on the team the calling thread leads, else on the current
/// rayon pool (or the global one).
pub fn for_each(tasks: usize, job: Job<'_>) {
    match CURRENT.with(Cell::get) {
        _ if tasks < 2 => (0..tasks).for_each(job),
        Current::Alone => (0..tasks).for_each(job),
        // SAFETY: set by `Region::lead` for as long as `f` runs on this thread, and `f` is what
        // calls this; the lead's own tasks run `Alone` (`Shared::take`), so this post is not
        // entered again from one of them.
        Current::Standing(s) => unsafe { &*s }.post(tasks, job),
        Current::PerJob(n, pool) => {
            // A team started for this job alone: `run` must see no team on this thread.
            let _none = Set::new(Current::None);
            match pool {
                // SAFETY: a pool `run` borrowed for as long as `f` runs.
                Some(p) => unsafe { &*p }.install(|| par(tasks, job)),
                None => run(Threads::OpenMp { fallback: n }, true, || for_each(tasks, job)),
            }
        }
        Current::None => par(tasks, job),
    }
}

fn par(tasks: usize, job: Job<'_>) {
    use rayon::prelude::*;
    (0..tasks).into_par_iter().for_each(job);
}

/// The threads a [`for_each`] from here runs on: its team's, else the current rayon pool's.
pub fn threads() -> usize {
    match CURRENT.with(Cell::get) {
        Current::Alone => 1,
        // SAFETY: as in `for_each`.
        Current::Standing(s) => unsafe { &*s }.want,
        Current::PerJob(n, _) => n,
        Current::None => rayon::current_num_threads(),
    }
}

/// [`for_each`] over owned blocks (each task takes one block).
pub fn for_each_block<B: Send>(blocks: Vec<B>, run: impl Fn(B) + Sync) {
    if blocks.len() < 2 {
        return blocks.into_iter().for_each(run);
    }
    let cells: Vec<Mutex<Option<B>>> = blocks.into_iter().map(|b| Mutex::new(Some(b))).collect();
    for_each(cells.len(), &|i| {
        if let Some(b) = lock(&cells[i]).take() {
            run(b);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Every task runs exactly once, on more than one thread of the team, for one post after
    /// another; a task's panic reaches the lead and the team is usable after it.
    fn check(make: impl Fn() -> Threads<'static>, standing: bool) {
        let hits: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
        let ids = Mutex::new(std::collections::HashSet::new());
        // Posts until another thread has taken a task (threads join as the machine lets them).
        let t0 = std::time::Instant::now();
        let (n, posts) = run(make(), standing, || {
            let mut posts = 0;
            while posts < 20 || (lock(&ids).len() < 2 && t0.elapsed().as_secs() < 20) {
                for_each(hits.len(), &|i| {
                    hits[i].fetch_add(1, Relaxed);
                    lock(&ids).insert(std::thread::current().id());
                    (0..20_000u64).for_each(|v| { std::hint::black_box(v); });
                });
                posts += 1;
            }
            (threads(), posts)
        });
        assert!(hits.iter().all(|h| h.load(Relaxed) == posts), "each task once per post");
        assert!(n >= 2);
        assert!(lock(&ids).len() >= 2, "the team's other threads took tasks (standing {standing}, {posts} posts)");
        let panicked = catch_unwind(AssertUnwindSafe(|| run(make(), standing, || for_each(8, &|i| assert!(i != 5, "task 5")))));
        assert!(panicked.is_err());
        assert_eq!(run(make(), standing, || { let s = AtomicU64::new(0); for_each(100, &|i| { s.fetch_add(i as u64, Relaxed); }); s.load(Relaxed) }), 4950);
    }

    fn pool() -> &'static rayon::ThreadPool {
        static P: OnceLock<rayon::ThreadPool> = OnceLock::new();
        P.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap())
    }

    #[test]
    fn a_pool_team_runs_every_task_once() {
        check(|| Threads::Pool(pool()), true);
        check(|| Threads::Pool(pool()), false);
    }

    /// The same on the process's OpenMP runtime (loaded here as llama.cpp's ggml-cpu loads it).
    #[test]
    fn an_openmp_team_runs_every_task_once() {
        // SAFETY: loading the system's OpenMP runtime runs its initialisers, as any program that links it.
        let lib = ["libgomp.so.1", "libomp.so"].iter().find_map(|n| unsafe { libloading::Library::new(n) }.ok());
        let Some(_lib) = lib else {
            eprintln!("no OpenMP runtime on this machine: the OpenMP team is not exercised");
            return;
        };
        assert!(has_openmp());
        check(|| Threads::OpenMp { fallback: 3 }, true);
        check(|| Threads::OpenMp { fallback: 3 }, false);
    }
}

#[cfg(test)]
mod edges {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn pool() -> &'static rayon::ThreadPool {
        static P: OnceLock<rayon::ThreadPool> = OnceLock::new();
        P.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap())
    }

    fn gomp() -> Option<libloading::Library> {
        // SAFETY: test only.
        ["libgomp.so.1"].iter().find_map(|n| unsafe { libloading::Library::new(n) }.ok())
    }

    /// A task on the lead that itself calls for_each (nested post on the same Shared).
    fn nested(make: impl Fn() -> Threads<'static>) -> Vec<u64> {
        let outer: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
        let inner: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
        let me = std::thread::current().id();
        run(make(), true, || {
            for_each(outer.len(), &|i| {
                outer[i].fetch_add(1, Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(2));
                if std::thread::current().id() == me {
                    for_each(inner.len(), &|j| {
                        inner[j].fetch_add(1, Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    });
                }
            });
        });
        outer.iter().chain(&inner).map(|h| h.load(Relaxed)).collect()
    }

    #[test]
    fn nested_for_each_pool() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || { let _ = tx.send(nested(|| Threads::Pool(pool()))); });
        let got = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("nested for_each on a pool team hung");
        assert!(got.iter().all(|&h| h == 1), "each outer and inner task once: {got:?}");
    }

    #[test]
    fn nested_for_each_openmp() {
        let Some(_l) = gomp() else { return };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || { let _ = tx.send(nested(|| Threads::OpenMp { fallback: 3 })); });
        let got = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("nested for_each on an OpenMP team hung");
        assert!(got.iter().all(|&h| h == 1), "each outer and inner task once: {got:?}");
    }

    /// ORK_HOST_THREADS=1 / -t 1: no team; where do the passes run?
    #[test]
    fn one_thread_team_uses_one_thread() {
        let ids = Mutex::new(std::collections::HashSet::new());
        let n = run(Threads::OpenMp { fallback: 1 }, true, || {
            for _ in 0..50 {
                for_each(64, &|_| {
                    lock(&ids).insert(std::thread::current().id());
                    (0..20_000u64).for_each(|v| { std::hint::black_box(v); });
                });
            }
            threads()
        });
        let used = lock(&ids).len();
        assert!(n == 1 && used == 1, "a team of one asked: threads() = {n}, {used} threads ran the tasks");
    }

    /// Two threads leading at once (pool: BUSY; OpenMP: a team per thread), many times.
    fn two_leads(make: fn() -> Threads<'static>) {
        let total = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let sum = run(make(), true, || {
                            let s = AtomicU64::new(0);
                            for _ in 0..3 {
                                for_each(100, &|i| { s.fetch_add(i as u64, Relaxed); });
                            }
                            s.load(Relaxed)
                        });
                        assert_eq!(sum, 3 * 4950);
                        total.fetch_add(1, Relaxed);
                    }
                });
            }
        });
        assert_eq!(total.load(Relaxed), 400);
    }

    #[test]
    fn two_leads_pool() {
        two_leads(|| Threads::Pool(pool()));
    }

    #[test]
    fn two_leads_openmp() {
        let Some(_l) = gomp() else { return };
        assert!(has_openmp());
        two_leads(|| Threads::OpenMp { fallback: 3 });
    }

    /// A lead that is itself a thread of an OpenMP region (the caller inside `#pragma omp parallel`).
    #[test]
    fn lead_inside_openmp_region() {
        let Some(_l) = gomp() else { return };
        let omp = openmp().expect("loaded");
        static SUMS: Mutex<Vec<u64>> = Mutex::new(Vec::new());
        extern "C" fn body(_: *mut c_void) {
            let r = catch_unwind(|| {
                run(Threads::OpenMp { fallback: 3 }, true, || {
                    let s = AtomicU64::new(0);
                    for _ in 0..5 {
                        for_each(100, &|i| { s.fetch_add(i as u64, Relaxed); });
                    }
                    s.load(Relaxed)
                })
            });
            lock(&SUMS).push(r.unwrap_or(0));
        }
        // SAFETY: test only: an outer region of 3 threads, each leading an ORK team.
        unsafe { (omp.parallel)(body, std::ptr::null_mut(), 3, 0) };
        let sums = lock(&SUMS).clone();
        assert_eq!(sums, vec![5 * 4950; 3]);
    }

    /// PerJob (ORK_KEEP_AWAKE=0) on OpenMP, a task panics on a pass, f catches it and posts again.
    #[test]
    fn perjob_after_caught_panic() {
        let Some(_l) = gomp() else { return };
        let (n1, n2) = run(Threads::OpenMp { fallback: 3 }, false, || {
            let n1 = threads();
            let _ = catch_unwind(AssertUnwindSafe(|| for_each(8, &|i| assert!(i != 5))));
            (n1, threads())
        });
        assert_eq!((n1, n2), (3, 3), "the team after a caught panic");
    }
}
