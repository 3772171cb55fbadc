//! The NPU matmul pipeline: one MUL_MAT of a packed weight, from the f32 activation to the f32
//! result. Everything the host does around the NPU runs lives here: the activation pass
//! (rotation, int8 terms, the reuse of an activation several weights read, the correction's
//! dots), the cut into pieces that overlap the NPU (`Npu::pipeline_bounds`, `Npu::mm_run_pieces`),
//! the output pass (every term's dequantization, the second weight term, the correction), the
//! one CPU fallback of a failed NPU run, and the run's booking into the device's counters.
//!
//! The precision of each weight (its int8 terms, rotation, calibrated direction) was decided when
//! it was packed and travels with it (`PackedWeight`); nothing here decides it again.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::pool;
use super::{Device, PackedWeight, WeightSource};
use crate::npu::{Budget, NpuError};
use crate::quant;
use crate::route::activation::{Again, Link, Seen};
use crate::route::precision::LO_ACT_TERMS;

/// Per-thread buffers of [`Device::run_mul_mat`], reused from one matmul to the next so a decode
/// matmul allocates nothing: int8 activation terms and their scales, the rows' dots with the
/// calibrated direction and their coefficients, the int32 results of both weight terms.
#[derive(Default)]
struct Scratch {
    a: Vec<i8>,
    a_scale: Vec<f32>,
    dots: Vec<f32>,
    coef: Vec<Option<f32>>,
    c: Vec<i32>,
    cl: Vec<i32>,
    /// What `a` / `a_scale` hold: the rotated activation they were quantized from.
    act: Option<ActKey>,
    /// What the weight that quantized `act` learns of its activation (read again or not).
    act_seen: Option<Arc<Seen>>,
    /// The direction `dots` were taken with (of the activation `act`); empty: none.
    dot_dir: Vec<f32>,
}

/// A rotated activation's identity: its address and length, its rows, the int8 terms it was
/// quantized to, and a hash of its values (ggml reuses tensor memory within a graph, so the
/// address alone does not say the values are the same; a hash of a sample of the values would
/// not either: a row that changed only where the sample does not look would reuse stale terms).
/// Rotated weights of one K share one rotation and have no per-weight column scales, so the int8
/// terms of an activation read by several weights in a row (Q/K/V, gate/up) are the same for
/// all of them.
#[derive(Clone, Copy, PartialEq, Eq)]
struct ActKey {
    addr: usize,
    len: usize,
    rows: usize,
    terms: usize,
    hash: u64,
}

impl ActKey {
    /// The key of `x` (`m` rows quantized to `terms` int8 terms) with hash `hash`.
    fn of(x: &[f32], m: usize, terms: usize, hash: u64) -> ActKey {
        ActKey { addr: x.as_ptr() as usize, len: x.len(), rows: m, terms, hash }
    }
}

/// The hash of [`ActKey`]: XXH3-64 of the rows' [`quant::row_hash`]es (`x: [M, K]`, rows on
/// the current pool). The activation pass takes the same row hashes while it reads the rows
/// ([`quant::prepare_rows_hashed`], combined by [`rows_hash`]), so only an activation that may be
/// the previous one (same address and size) is read for its hash alone.
fn act_hash(x: &[f32], k: usize) -> u64 {
    let mut rows = vec![0u64; x.len() / k];
    quant::map_rows(x, k, &mut rows, quant::row_hash);
    rows_hash(&rows)
}

/// [`act_hash`] from its rows' hashes.
fn rows_hash(rows: &[u64]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytemuck::cast_slice(rows))
}

/// Buffers above this size are not kept between calls (a ubatch of thousands of rows would
/// otherwise pin hundreds of MB per thread). A prefill ubatch's buffers stay below it (M = 512:
/// the int32 results of N = 12288 are 24 MiB) and are reused from one MUL_MAT to the next:
/// freed and allocated again, every large MUL_MAT faulted in fresh zeroed pages (the kernel's
/// page clearing was 4 % of the process's CPU time in `llama-bench -p 512` on the Qwen3-1.7B
/// shape with the timed NPU, `perf record`).
const SCRATCH_KEEP_BYTES: usize = 32 << 20;

impl Scratch {
    fn kept(mut self) -> Scratch {
        fn cap<T>(v: &mut Vec<T>) {
            if v.capacity() * std::mem::size_of::<T>() > SCRATCH_KEEP_BYTES {
                *v = Vec::new();
            }
        }
        cap(&mut self.a);
        cap(&mut self.a_scale);
        cap(&mut self.dots);
        if self.a.is_empty() || self.a_scale.is_empty() {
            self.act = None;
            self.act_seen = None;
        }
        if self.dots.is_empty() {
            self.dot_dir.clear();
        }
        cap(&mut self.coef);
        cap(&mut self.c);
        cap(&mut self.cl);
        self
    }
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// The first `len` elements of `v`, grown (never shrunk) to hold them; old contents stay.
fn scratch<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// `buf` cut at the pieces' rows `bounds` (`(start, end)`, ascending, non-overlapping), `len`
/// elements a row.
fn cut<'a, T>(mut buf: &'a mut [T], bounds: &[(usize, usize)], len: usize) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(bounds.len());
    let mut at = 0;
    for &(s, e) in bounds {
        let (_, rest) = std::mem::take(&mut buf).split_at_mut((s - at) * len);
        let (p, rest) = rest.split_at_mut((e - s) * len);
        out.push(p);
        buf = rest;
        at = e;
    }
    out
}

/// The scratch buffer `v` grown to hold the pieces' rows (`len` elements a row) and [`cut`] at them.
fn pieces<'a, T: Copy + Default>(v: &'a mut Vec<T>, bounds: &[(usize, usize)], len: usize) -> Vec<&'a mut [T]> {
    let rows = bounds.last().map_or(0, |b| b.1);
    cut(scratch(v, rows * len), bounds, len)
}

/// Where one weight term's int32 result of an NPU MUL_MAT is: in the NPU cores' buffers, or
/// (computed on the CPU after an NPU error) in the caller's dense buffer.
enum TermOut {
    Shares(crate::npu::Shares),
    Dense,
}

impl TermOut {
    /// The cores' column segments, for [`TermOut::rows`] (empty for a dense result).
    fn parts(&self) -> Vec<quant::CPart<'_>> {
        match self {
            TermOut::Shares(sh) => sh.parts(),
            TermOut::Dense => Vec::new(),
        }
    }

    /// The result as the output pass reads it: `parts` ([`TermOut::parts`]) or `dense`.
    fn rows<'a>(&self, dense: &'a [i32], parts: &'a [quant::CPart<'a>]) -> quant::CRows<'a> {
        match self {
            TermOut::Shares(_) => quant::CRows::Parts(parts),
            TermOut::Dense => quant::CRows::Dense(dense),
        }
    }
}

/// What the NPU runs of one MUL_MAT did.
#[derive(Default)]
struct PieceRun {
    submits: u64,
    /// Rows sent to the NPU by the runs that succeeded.
    sent: u64,
    /// The runs' longest core's host work and time past the hardware time (`npu::RunStats`).
    core_host_ns: u64,
    late_ns: u64,
    /// The runs' device time: each run's busiest core's (`npu::RunStats::device_max_ns`).
    device_max_ns: u64,
    /// NPU runs that failed (computed on the CPU instead, `cpu_ns`).
    failed: u64,
    cpu_ns: u64,
    /// Wall time of the NPU runs, the CPU's instead included.
    wall_ns: u64,
    synced_bytes: u64,
    io_bytes: u64,
}

impl PieceRun {
    /// Books one NPU run of `rows` rows; on an error (`leased`: the NPU was held, so the error is
    /// the NPU's, counted and logged) `cpu` computes the same result on the CPU.
    fn book(&mut self, run: Result<crate::npu::RunStats, NpuError>, rows: usize, leased: bool, dev: &Device, cpu: impl FnOnce(&mut PieceRun)) {
        match run {
            Ok(rs) => {
                self.synced_bytes += rs.synced_bytes;
                self.io_bytes += rs.io_bytes;
                self.submits += u64::from(rs.submits);
                self.sent += rows as u64;
                self.core_host_ns += rs.core_host_ns;
                self.late_ns += rs.late_ns;
                self.device_max_ns += rs.device_max_ns;
            }
            Err(e) => {
                if leased {
                    dev.note_npu_error(&e);
                    self.failed += 1;
                }
                cpu(self);
            }
        }
    }
}

/// The one CPU fallback of a MUL_MAT's NPU runs: the int8 arithmetic the NPU does, exact (the
/// same int32 results, so a row's bits do not depend on which engine computed it), against the
/// weight's int8 terms quantized again from its source — once per MUL_MAT, and only when a run
/// failed (the NPU's copy lives in device memory, tiled; the host keeps none).
struct CpuFallback<'a> {
    w: &'a PackedWeight,
    /// None: the weight's bytes are ggml-cpu's repacked layout (`CPU_REPACK`), which ORK never
    /// reads; then a failed run leaves its rows unset and [`CpuFallback::missed`] tells the
    /// caller to have ggml-cpu run the whole MUL_MAT.
    src: Option<&'a WeightSource<'a>>,
    /// The weight's int8 terms (the second when it has one), made at the first failure.
    terms: std::sync::OnceLock<(Vec<i8>, Option<Vec<i8>>)>,
    missed: std::sync::atomic::AtomicBool,
}

impl CpuFallback<'_> {
    /// `out = a · Wᵀ` in int32 for `rows` rows of int8 activation terms `a` against the first
    /// weight term (`second`: the second), its time booked into `r`.
    fn run(&self, r: &mut PieceRun, a: &[i8], rows: usize, second: bool, out: &mut [i32]) {
        let t = Instant::now();
        let (w, (n, k)) = (self.w, (self.w.n, self.w.k));
        let Some(src) = self.src else {
            self.missed.store(true, Relaxed);
            out.fill(0);
            return;
        };
        let (hi, lo) = self.terms.get_or_init(|| {
            let rot = w.rot.as_deref();
            let (q, s, col) = crate::pack::quantize_source(src, n, k, rot);
            let ql = w.lo.as_ref().map(|_| crate::pack::quantize_residual(src, n, k, rot, &col, &q, &s).0);
            (q, ql)
        });
        let q = if second { lo.as_deref().expect("a second run has a second term") } else { hi.as_slice() };
        out.copy_from_slice(&crate::npu::reference_mm(a, q, rows, k, n));
        r.cpu_ns += t.elapsed().as_nanos() as u64;
    }
}

impl Device {
    /// Runs `dst = x · Wᵀ` for `x: [M, K] f32` and `dst: [M, N] f32` with a packed weight.
    /// On an NPU error the same int8 arithmetic runs on the CPU (exact same result) and the error
    /// is logged once per kind. With the rotation and `ORK_MEAN_CORRECT` (the default), each row
    /// is corrected along its weight's calibrated direction from its own values (`quant::mean`:
    /// the dot in the activation pass, `c_m·e` in the output pass), so a row's result does not
    /// depend on the other rows of the ubatch; with `ORK_CALIBRATE=1` the rows are recorded into
    /// the calibration file instead.
    /// Outside a graph nobody can tell whether a later MUL_MAT reads `x` again: its key is
    /// always taken.
    pub fn run_mul_mat(&self, w: &PackedWeight, src: &WeightSource<'_>, x: &[f32], m: usize, dst: &mut [f32]) {
        self.run_mul_mat_linked(w, Some(src), x, m, dst, Link { held: false, read_again: Again::Yes });
    }

    /// [`Device::run_mul_mat`] with what the graph walk knows of the activation (`link`): `held`,
    /// `x` is the activation of this thread's previous MUL_MAT, unchanged since (the same tensor,
    /// and nothing ran in between that could write it — within one graph call, between two of
    /// ORK's own MUL_MATs): then the int8 terms that MUL_MAT left are reused without hashing `x`
    /// to prove it; and whether a later MUL_MAT reads it again.
    ///
    /// `src` None: the weight's bytes are ggml-cpu's repacked layout (its calibrated direction was
    /// computed when it was packed, `backend::buffer`); where a run failed and its rows could not
    /// be computed again without them, it returns true (redo) and `dst` must be computed by
    /// ggml-cpu.
    pub(super) fn run_mul_mat_linked(&self, w: &PackedWeight, src: Option<&WeightSource<'_>>, x: &[f32], m: usize, dst: &mut [f32], link: Link) -> bool {
        if m == 0 {
            return false;
        }
        // A key exists only for a rotated weight on a device with a calibration store, and the
        // store only with the rotation and ORK_MEAN_CORRECT on (`Store::from_config`).
        let fix = match (&self.calib, w.calib_key) {
            (Some(store), Some(key)) if store.recording() => {
                let redo = self.run_mul_mat_npu(w, src, x, m, dst, None, link);
                store.record(key, x, m, w.k);
                return redo;
            }
            (Some(store), Some(key)) => match src {
                Some(src) => w.fix.get_or_init(|| self.fixed_direction(w, src, store, key)).as_ref(),
                None => w.fix.get().and_then(Option::as_ref),
            },
            _ => None,
        };
        let r = self.run_mul_mat_npu(w, src, x, m, dst, fix, link);
        if fix.is_some() {
            self.stats.mean_corrected.fetch_add(1, Relaxed);
        }
        r
    }

    /// Weight `w`'s calibrated direction `d` and the NPU's error on it, `e = d·Wᵀ − d·Q(W)ᵀ`:
    /// the exact product from the GGUF weight minus the product with the int8 terms the NPU
    /// holds, without rounding `d` (rounding it as an activation would add its own error to
    /// every row). Once per weight and process; the time counts as weight preparation.
    pub(super) fn fixed_direction(&self, w: &PackedWeight, src: &WeightSource<'_>, store: &crate::cache::calib::Store, key: u64) -> Option<quant::mean::Direction> {
        let d = self.calibrated_direction(src, w.n, w.k, w.rot.as_deref(), w.lo.is_some(), store, key);
        if let Some(d) = &d {
            w.held.add_scales(4 * (d.dir.len() + d.err.len()) as u64);
        }
        d
    }

    /// The calibrated direction of the `[N, K]` weight `src` under key `key` in `store`, and the
    /// error on it of its int8 terms (rotated by `rot`, a second term where `two_terms`): what
    /// [`Device::fixed_direction`] computes, for any copy of the weight in those terms (the
    /// NPU's, the GPU's). Time counts as weight preparation.
    #[allow(clippy::too_many_arguments)] // the weight, its terms, and where its direction is
    pub(super) fn calibrated_direction(&self, src: &WeightSource<'_>, n: usize, k: usize, rot: Option<&quant::rotate::Rotation>, two_terms: bool, store: &crate::cache::calib::Store, key: u64) -> Option<quant::mean::Direction> {
        let t = Instant::now();
        let dir = store.direction(key, k)?;
        let exact: Vec<f64> = crate::pack::source_matvec(src, n, k, &dir).into_iter().map(f64::from).collect();
        let held = crate::pack::held_matvec(src, n, k, rot, two_terms, &dir);
        let d = quant::mean::Direction::new(dir, &exact, &held);
        if let Some(d) = &d {
            log::debug!("{}: calibrated direction, int8 terms' relative error on it {:.2e}", src.name, d.relative_error(&exact));
        }
        self.stats.pack_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        d
    }

    /// [`Device::run_mul_mat`]'s NPU runs of the plan's terms, with the host's two passes around
    /// them on the host pool (`pool`), rows in parallel: the activation pass (rotation, int8
    /// terms, and with a calibrated direction `fix` each row's dot with it) and the output pass
    /// (dequantization of every term, the second weight term, `fix`'s correction), each row from
    /// its own values only.
    ///
    /// [`Device::plan_matmul`] decides everything first (the held activation, the NPU lease, the
    /// pieces); [`Passes::run`] carries it out; [`Device::book_matmul`] folds what happened into
    /// the counters.
    /// Every row goes through the same arithmetic whatever the cut (rows are independent, the
    /// NPU's int32 results exact), so the bits do not depend on it.
    #[allow(clippy::too_many_arguments)] // the MUL_MAT's operands, its correction, the graph's link
    fn run_mul_mat_npu(&self, w: &PackedWeight, src: Option<&WeightSource<'_>>, x: &[f32], m: usize, dst: &mut [f32], fix: Option<&quant::mean::Direction>, link: Link) -> bool {
        let (k, n) = (w.k, w.n);
        assert_eq!(x.len(), m * k, "x is not [M, K]");
        assert_eq!(dst.len(), m * n, "dst is not [M, N]");
        let t0 = Instant::now();
        // The per-thread buffers of the last call (taken out, so a re-entered call on this thread
        // simply allocates its own); none of them needs zeroing: each is fully written below.
        let mut sc = SCRATCH.with(|c| c.take());
        let mut plan = self.plan_matmul(w, x, m, link, &mut sc);
        let dir = fix.map(|d| d.dir.as_slice());
        let mut hashes = vec![0u64; if plan.hashed { m } else { 0 }];
        let mut rep = Report::default();
        // The MUL_MAT — reuse decision, activation pass, NPU runs, output pass; cut into pieces
        // or not — runs on this thread as the lead of the host's team (`pool::on_host`), whose
        // other threads take each pass's rows as it comes and wait for the next in between.
        let missed = pool::on_host(self.cfg, plan.terms * m * k, || {
            // Cut: the cores run the pieces one after the other as their rows come
            // (`Npu::mm_run_pieces`), each core without waiting for the others between
            // pieces. Where that run cannot be had (its activation image), it runs uncut.
            let cores = if plan.bounds.len() > 1 { self.npu.mm_run_pieces(&w.resident, &plan.bounds, plan.budget, plan.first).ok() } else { None };
            if cores.is_none() {
                plan.bounds = vec![(0, m)];
            }
            let passes = Passes {
                dev: self,
                w,
                x,
                plan: &plan,
                // Rotated weights have no column equalisation: the activation rows are rotated by
                // the same R instead.
                prep: w.rot.as_ref().map_or(quant::RowPrep::Columns(&w.col_scale), |rot| quant::RowPrep::Rotate(rot)),
                dir,
                fix,
                cpu: CpuFallback { w, src, terms: std::sync::OnceLock::new(), missed: Default::default() },
            };
            passes.run(&mut sc, &mut hashes, dst, cores, &mut rep);
            passes.cpu.missed.load(Relaxed)
        });
        // The key of an activation not hashed before its pass: from the row hashes it took.
        let (key, reused, redot) = rep.decided;
        let key = if hashes.is_empty() { key } else { Some(ActKey::of(x, m, plan.terms, rows_hash(&hashes))) };
        // What the weight whose terms were held learns: its activation was read again, or not.
        if let Some(seen) = &sc.act_seen {
            if reused {
                seen.read_again();
            } else {
                seen.read_once();
            }
        }
        sc.dot_dir = std::mem::take(&mut plan.held_dir);
        if !reused || redot {
            sc.act = key;
            sc.act_seen = key.map(|_| w.act_seen.clone());
            sc.dot_dir.clear();
            sc.dot_dir.extend_from_slice(dir.unwrap_or_default());
        }
        self.book_matmul(plan, &rep, m, t0);
        SCRATCH.with(|cell| cell.set(sc.kept()));
        missed
    }

    /// How one NPU MUL_MAT of `m` rows of `x` runs, decided before anything runs: whether the
    /// int8 terms `sc` holds are its activation's (the graph walk vouches, `link.held`, or its
    /// address and size say it may be: then its hash decides), whether its pass takes the row
    /// hashes a later MUL_MAT may ask for, the NPU lease, and the pieces its rows are cut into —
    /// the one place the cut is decided (the cost model's ends for this shape, memoised).
    fn plan_matmul(&self, w: &PackedWeight, x: &[f32], m: usize, link: Link, sc: &mut Scratch) -> Plan<'_> {
        let (k, n) = (w.k, w.n);
        let terms = w.precision.terms.act;
        let phase = crate::route::Phase::of(self.cfg, m);
        let want = self.cfg.max_cores.unwrap_or(self.npu.soc().cores);
        // The activation's identity and whether its int8 terms are still in `sc.a`: the caller
        // vouches for an unchanged activation (`link.held`), else its hash says so (taken in the
        // same hand-off to the host pool as the activation pass where the MUL_MAT is not cut).
        let (held_act, held_dir) = (sc.act, std::mem::take(&mut sc.dot_dir));
        let here = |a: &ActKey| (a.addr, a.len, a.rows, a.terms) == (x.as_ptr() as usize, x.len(), m, terms);
        let candidate = held_act.is_some_and(|a| here(&a));
        let vouched = link.held && candidate;
        // The rows' hashes (the key of the int8 terms this pass makes) where a later MUL_MAT may
        // read the same activation: the graph shows one, or the graph ends first and the
        // activations this weight read were read again before (or it has not run yet).
        let again = match link.read_again {
            Again::Yes => true,
            Again::No => false,
            Again::Unknown => w.act_seen.may_be_read_again(),
        };
        let hashed = w.rot.is_some() && !candidate && again;
        let t_ask = Instant::now();
        let lease = self.arbiter().acquire(phase, want);
        let t_got = Instant::now();
        let (budget, first) = match &lease {
            Ok(l) => (Budget { max_cores: l.count }, l.first),
            Err(_) => (Budget { max_cores: want }, 0),
        };
        // Which ends are cut short: the cost model's choice for this shape (`route::pipeline_ends`;
        // never the first where the activation may be the held one: no pass to hide), remembered
        // per shape (it plans the MUL_MAT several times: 50–240 µs for the Qwen3-1.7B shapes).
        let bounds = if terms == 1 && w.lo.is_none() && lease.is_ok() && m >= 2 {
            type Key = (usize, usize, usize, usize, usize, u32, bool);
            thread_local! {
                static ENDS: std::cell::RefCell<std::collections::HashMap<Key, crate::npu::plan::Ends>> = Default::default();
            }
            let t = w.precision.terms;
            let key = (m, k, n, t.weight, t.act, budget.max_cores, candidate);
            let ends = super::remembered(&ENDS, key, || crate::route::pipeline_ends(self.npu.soc(), m, k, n, t, budget.max_cores, crate::route::activation::Chain { held: candidate }));
            self.npu.pipeline_bounds(&w.resident, m, budget, ends)
        } else {
            vec![(0, m)]
        };
        Plan { terms, lt: LO_ACT_TERMS.min(terms), held_act, held_dir, vouched, candidate, hashed, lease, budget, first, bounds, t_ask, t_got }
    }

    /// Folds one NPU MUL_MAT's report into the counters, once: its runs (or why it fell back),
    /// the reuse of its activation, and where its wall time since `t0` went.
    fn book_matmul(&self, plan: Plan<'_>, rep: &Report, m: usize, t0: Instant) {
        let decode = crate::route::Phase::of(self.cfg, m) == crate::route::Phase::Decode;
        let (ps, runs) = (&self.stats.phase[decode as usize], &rep.runs);
        let (_, reused, _) = rep.decided;
        if reused {
            self.stats.act_reused.fetch_add(1, Relaxed);
            if plan.vouched {
                self.stats.act_vouched.fetch_add(1, Relaxed);
            }
        }
        let t3 = Instant::now();
        // Releasing the lease (and, for the last one, the cross-process flock) is arbiter time.
        let busy = plan.lease.is_err();
        drop(plan.lease);
        let lease_ns = (plan.t_got - plan.t_ask).as_nanos() as u64;
        ps.arb_ns.fetch_add(lease_ns, Relaxed);
        self.stats.arb_ns.fetch_add(lease_ns + t3.elapsed().as_nanos() as u64, Relaxed);
        // Time the NPU path took, without what was computed on the CPU instead; the NPU's device
        // time (each run's busiest core's); and what of the MUL_MAT's wall time the NPU did not
        // cover.
        let npu_ns = runs.wall_ns.saturating_sub(runs.cpu_ns);
        let wait = runs.device_max_ns.min(npu_ns);
        let wall = (t3 - t0).as_nanos() as u64;
        if busy {
            ps.fallback.fetch_add(1, Relaxed);
        } else if runs.failed > 0 {
            ps.npu_failed.fetch_add(1, Relaxed);
            self.stats.npu_fallbacks.fetch_add(1, Relaxed);
            self.stats.npu_errors.fetch_add(runs.failed, Relaxed);
        } else {
            ps.runs.fetch_add(1, Relaxed);
            ps.rows.fetch_add(m as u64, Relaxed);
            ps.rows_sent.fetch_add(runs.sent, Relaxed);
            ps.critical_ns.fetch_add(wall.saturating_sub(wait + lease_ns), Relaxed);
            ps.pieces.fetch_add(plan.bounds.len() as u64, Relaxed);
            self.stats.npu_matmuls.fetch_add(1, Relaxed);
            self.stats.npu_rows.fetch_add(m as u64, Relaxed);
            self.stats.npu_rows_sent.fetch_add(runs.sent, Relaxed);
            self.stats.submits.fetch_add(runs.submits, Relaxed);
        }
        ps.synced_bytes.fetch_add(runs.synced_bytes, Relaxed);
        ps.io_bytes.fetch_add(runs.io_bytes, Relaxed);
        self.stats.fallback_ns.fetch_add(runs.cpu_ns, Relaxed);
        let quant_ns = (plan.t_ask - t0).as_nanos() as u64 + rep.act_ns;
        ps.quant_ns.fetch_add(quant_ns, Relaxed);
        self.stats.mean_ns.fetch_add(rep.dot_ns, Relaxed);
        ps.check_ns.fetch_add(rep.check_ns, Relaxed);
        ps.submit_ns.fetch_add(npu_ns - wait, Relaxed);
        ps.core_host_ns.fetch_add(runs.core_host_ns, Relaxed);
        ps.late_ns.fetch_add(runs.late_ns, Relaxed);
        ps.wait_ns.fetch_add(wait, Relaxed);
        ps.dequant_ns.fetch_add(rep.out_ns, Relaxed);
        self.stats.quant_ns.fetch_add(quant_ns, Relaxed);
        self.stats.npu_ns.fetch_add(npu_ns, Relaxed);
        self.stats.dequant_ns.fetch_add(rep.out_ns, Relaxed);
        self.stats.npu_run_ns.fetch_add(runs.wall_ns, Relaxed);
    }
}


/// One NPU MUL_MAT as [`Device::plan_matmul`] decided it.
struct Plan<'d> {
    /// Int8 terms of the activation, and of those the ones the second weight term meets.
    terms: usize,
    lt: usize,
    /// What the scratch held (its activation and the direction its dots were taken with), and
    /// whether that may be this activation (`candidate`: same address and size) and is on the
    /// walk's word (`vouched`).
    held_act: Option<ActKey>,
    held_dir: Vec<f32>,
    candidate: bool,
    vouched: bool,
    /// The activation pass takes the rows' hashes (the key a later MUL_MAT may ask for).
    hashed: bool,
    lease: Result<crate::route::arbiter::Lease<'d>, crate::route::arbiter::ArbError>,
    budget: Budget,
    first: u32,
    /// The pieces: row ranges, one for an uncut MUL_MAT.
    bounds: Vec<(usize, usize)>,
    /// When the lease was asked for and when it came.
    t_ask: Instant,
    t_got: Instant,
}

/// What one NPU MUL_MAT's run did, for [`Device::book_matmul`].
#[derive(Default)]
struct Report {
    act_ns: u64,
    dot_ns: u64,
    out_ns: u64,
    check_ns: u64,
    runs: PieceRun,
    /// [`Passes::decide`]'s answer.
    decided: (Option<ActKey>, bool, bool),
}

/// The host's passes and the NPU runs of one MUL_MAT as its plan says, a piece of its rows at a
/// time.
struct Passes<'a> {
    dev: &'a Device,
    w: &'a PackedWeight,
    x: &'a [f32],
    plan: &'a Plan<'a>,
    prep: quant::RowPrep<'a>,
    dir: Option<&'a [f32]>,
    fix: Option<&'a quant::mean::Direction>,
    /// The runs' one CPU fallback.
    cpu: CpuFallback<'a>,
}

impl<'a> Passes<'a> {
    /// Whether the held int8 terms are this activation's, and with it the key of its terms:
    /// (key, reused, redot). The dots are taken again when the int8 terms are reused but this
    /// weight's direction is not the one they were taken with (Q/K/V and gate/up share it). An
    /// activation that cannot be the held one (another address or size) is not hashed here: its
    /// activation pass takes the row hashes, and its key after it.
    fn decide(&self, m: usize) -> (Option<ActKey>, bool, bool) {
        let p = self.plan;
        let vouched = p.held_act.filter(|_| p.vouched);
        let key = self.w.rot.as_ref().and_then(|_| vouched.or_else(|| p.candidate.then(|| ActKey::of(self.x, m, p.terms, act_hash(self.x, self.w.k)))));
        let reused = key.is_some() && key == p.held_act;
        (key, reused, reused && self.dir.is_some_and(|d| d != p.held_dir.as_slice()))
    }

    /// The activation pass of rows [r0, r1) (all of M when uncut: then the slices hold every
    /// term, term-major). Returns its time and the time of dots taken again.
    #[allow(clippy::too_many_arguments)] // a piece of each scratch buffer
    fn act(&self, (r0, r1): (usize, usize), (reused, redot): (bool, bool), a: &mut [i8], a_scale: &mut [f32], dots: &mut [f32], coef: &mut [Option<f32>], hashes: &mut [u64]) -> (u64, u64) {
        let (k, terms, dir) = (self.w.k, self.plan.terms, self.dir);
        let t = Instant::now();
        let mut dot_ns = 0;
        let xr = &self.x[r0 * k..r1 * k];
        pool::on_host(self.dev.cfg, terms * (r1 - r0) * k, || {
            if !reused {
                quant::prepare_rows_hashed(xr, r1 - r0, k, terms, self.prep, dir, a, a_scale, dots, hashes);
            } else if let Some(d) = dir.filter(|_| redot) {
                let td = Instant::now();
                quant::map_rows(xr, k, dots, |r| quant::mean::dot16(r, d));
                dot_ns = td.elapsed().as_nanos() as u64;
            }
        });
        if let Some(d) = self.fix {
            for (c, &dot) in coef.iter_mut().zip(dots.iter()) {
                *c = d.coefficient(dot);
            }
        }
        (t.elapsed().as_nanos() as u64, dot_ns)
    }

    /// One weight term's NPU run of `rows` activation rows (`a`: their int8 terms, term-major),
    /// booked into `r`: its result left in the NPU cores' buffers (`TermOut::Shares`), or on an
    /// error (or where the NPU was not leased: another context or process holds it) the same
    /// int8 arithmetic on the CPU into `out` (`second`: the second weight term).
    fn term(&self, r: &mut PieceRun, rw: &crate::npu::ResidentWeight, second: bool, a: &[i8], rows: usize, out: &mut [i32]) -> TermOut {
        let p = self.plan;
        let mut held_by = TermOut::Dense;
        let run = match &p.lease {
            Ok(_) => self.dev.npu.mm_run_shares(rw, a, rows, p.budget, p.first).map(|(sh, rs)| {
                held_by = TermOut::Shares(sh);
                rs
            }),
            Err(e) => Err(NpuError::NoDevice(e.to_string())),
        };
        r.book(run, rows, p.lease.is_ok(), self.dev, |r| self.cpu.run(r, a, rows, second, out));
        held_by
    }

    /// The NPU runs of `mr` rows (`a`: their int8 terms, term-major), booked into `runs`, each
    /// weight term's result into `c` / `cl` where it fell back to the CPU.
    fn npu(&self, a: &[i8], mr: usize, c: &mut [i32], cl: &mut [i32], runs: &mut PieceRun) -> (TermOut, TermOut) {
        let (k, terms, lt) = (self.w.k, self.plan.terms, self.plan.lt);
        let t = Instant::now();
        let hc = self.term(runs, &self.w.resident, false, a, terms * mr, c);
        // The second weight term against the first activation term only: the cross terms
        // with later activation terms sit below both terms' resolution (SmolLM2: NMSE ≤ 3e-8
        // with them, ≤ 1.2e-6 without, against 1e-4 for one weight term) and would cost T·M
        // more NPU rows.
        let mut hl = TermOut::Dense;
        if let Some((lo, _)) = &self.w.lo {
            hl = self.term(runs, lo, true, &a[..lt * mr * k], lt * mr, cl);
            // The output pass walks the first term's segments: a dense first term (computed
            // on the CPU) takes a dense second one.
            if let (TermOut::Dense, TermOut::Shares(_)) = (&hc, &hl) {
                if let TermOut::Shares(sh) = std::mem::replace(&mut hl, TermOut::Dense) {
                    sh.copy_to(cl);
                    self.dev.npu.give_back(sh);
                }
            }
        }
        runs.wall_ns += t.elapsed().as_nanos() as u64;
        (hc, hl)
    }

    /// Piece `i` of rows `a` back from the NPU's cores (`cores`), or computed on the CPU into `c`
    /// after an error, booked into `runs`.
    fn land(&self, i: usize, cores: &mut crate::npu::PieceRun<'_>, a: &[i8], c: &mut [i32], runs: &mut PieceRun) -> TermOut {
        let (r0, r1) = self.plan.bounds[i];
        let mut hc = TermOut::Dense;
        let got = cores.take(i).map(|(sh, rs)| {
            hc = TermOut::Shares(sh);
            rs
        });
        let host_ns = got.as_ref().map_or(0, |rs| rs.host_ns);
        let cpu_before = runs.cpu_ns;
        runs.book(got, r1 - r0, true, self.dev, |r| self.cpu.run(r, a, r1 - r0, false, c));
        // The NPU part of the piece: its longest core run (or the CPU's instead).
        runs.wall_ns += host_ns + runs.cpu_ns - cpu_before;
        hc
    }

    /// The output pass of rows [r0, r1): every term, the second weight term, the correction,
    /// reading the NPU cores' buffers in place; then hands them back to the NPU.
    fn out(&self, (r0, r1): (usize, usize), c: (&[i32], TermOut), a_scale: &[f32], cl: (&[i32], TermOut), coef: &[Option<f32>], dst: &mut [f32]) -> u64 {
        let (w, terms) = (self.w, self.plan.terms);
        let t = Instant::now();
        let (pc, pcl) = (c.1.parts(), cl.1.parts());
        let o = quant::Output {
            c: c.1.rows(c.0, &pc),
            a_scale,
            terms,
            w_scale: &w.scales,
            lo: w.lo.as_ref().map(|(_, ls)| (cl.1.rows(cl.0, &pcl), ls.as_slice())),
            corr: self.fix.map(|d| (coef, d.err.as_slice())),
        };
        pool::on_host(self.dev.cfg, (terms + self.plan.lt + 1) * (r1 - r0) * w.n, || quant::dequantize_fused(&o, dst));
        drop((pc, pcl));
        for h in [c.1, cl.1] {
            if let TermOut::Shares(sh) = h {
                self.dev.npu.give_back(sh);
            }
        }
        t.elapsed().as_nanos() as u64
    }

    /// The MUL_MAT: the reuse decision, then its pieces, each buffer cut at their rows (row r
    /// at r times its row length; one piece when uncut, whose buffers hold every term,
    /// term-major; a cut MUL_MAT has one int8 activation term and one weight term). Each
    /// piece's activation pass hands its rows to the NPU's cores (`cores`: they run the pieces
    /// one after the other as their rows come; None: one run of the whole, [`Passes::npu`]);
    /// the output pass of each piece runs beside the next one's NPU run.
    fn run(&self, sc: &mut Scratch, hashes: &mut [u64], dst: &mut [f32], mut cores: Option<crate::npu::PieceRun<'_>>, rep: &mut Report) {
        let (k, n, p) = (self.w.k, self.w.n, self.plan);
        let (m, t, bounds) = (dst.len() / n, p.terms, &p.bounds);
        let mut a = pieces(&mut sc.a, bounds, t * k);
        let mut a_scale = pieces(&mut sc.a_scale, bounds, t);
        let mut dots = pieces(&mut sc.dots, bounds, usize::from(self.dir.is_some()));
        let mut coef = pieces(&mut sc.coef, bounds, usize::from(self.fix.is_some()));
        let mut c = pieces(&mut sc.c, bounds, t * n);
        let cl = scratch(&mut sc.cl, if self.w.lo.is_some() { p.lt * m * n } else { 0 });
        let hashed = usize::from(!hashes.is_empty());
        let mut hashes = cut(hashes, bounds, hashed);
        let mut dst = cut(dst, bounds, n);
        let tc = Instant::now();
        rep.decided = self.decide(m);
        rep.check_ns = tc.elapsed().as_nanos() as u64;
        rep.act_ns = rep.check_ns;
        let (_, reused, redot) = rep.decided;
        for i in 0..=bounds.len() {
            if i < bounds.len() {
                let (t, d) = self.act(bounds[i], (reused, redot), a[i], a_scale[i], dots[i], coef[i], hashes[i]);
                rep.act_ns += t;
                rep.dot_ns += d;
                if let Some(cores) = &mut cores {
                    // A piece whose rows could not be written fails its take (booked there).
                    let _ = cores.fill(i, a[i]);
                }
            }
            let Some(j) = i.checked_sub(1) else { continue };
            let (hc, hl) = match &mut cores {
                Some(cores) => (self.land(j, cores, a[j], c[j], &mut rep.runs), TermOut::Dense),
                None => self.npu(a[j], m, c[j], cl, &mut rep.runs),
            };
            rep.out_ns += self.out(bounds[j], (c[j], hc), a_scale[j], (cl, hl), coef[j], dst[j]);
        }
    }
}
