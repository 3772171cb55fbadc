//! IOMMU domains and fault injection: weights spread over several domains (proactive cap and
//! EFAULT safety net) stay bit-exact; a timeout or reset is an error to the caller, never a
//! panic or a wrong result, and the Npu keeps working afterwards.
mod common;

use common::{rk3588, sim_npu, Rng};
use ggml_ork::npu::kif::sim::{InjectedCounts, SimFaults};
use ggml_ork::npu::kif::sim::SimKif;
use ggml_ork::npu::kif::{Bo, DomainId, KernelInterface, KifError, SubmitDone, SubmitJob, SyncDir};
use ggml_ork::npu::layout::TileSets;
use ggml_ork::npu::soc::SocDesc;
use ggml_ork::npu::{reference_mm, Budget, Npu, NpuConfig, NpuError};

const MIB: u64 = 1 << 20;

/// RK3588 with a small IOVA window and per-domain cap so a few MiB of weights need domains.
fn small_soc(cap: u64, window: u64) -> SocDesc {
    SocDesc { domain_cap_bytes: cap, iova_window_bytes: window, ..rk3588() }
}

struct W {
    w: Vec<i8>,
    rw: std::sync::Arc<ggml_ork::npu::ResidentWeight>,
}

fn fill(npu: &Npu, rng: &mut Rng, count: usize, n: usize, k: usize) -> Vec<W> {
    (0..count)
        .map(|_| {
            let w = rng.i8s(n * k);
            let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
            W { w, rw }
        })
        .collect()
}

fn run_all(npu: &Npu, rng: &mut Rng, ws: &[W]) {
    for (i, x) in ws.iter().enumerate() {
        for m in [1, 4, 37] {
            let (k, n) = (x.rw.k(), x.rw.n());
            let a = rng.i8s(m * k);
            let mut c = vec![0; m * n];
            npu.mm_run(&x.rw, &a, m, &mut c, Budget { max_cores: 3 }).unwrap();
            assert_eq!(c, reference_mm(&a, &x.w, m, k, n), "weight {i} (domain {}) M={m}", x.rw.domain());
        }
    }
}

#[test]
fn proactive_cap_spreads_weights_over_domains() {
    // Weights of N=256, K=2048: 512 KiB K-slice tiles + 512 KiB full-K companion = 1 MiB each.
    let (sim, npu) = sim_npu(small_soc(2 * MIB, 32 * MIB), SimFaults::default());
    let mut rng = Rng::new(1);
    let ws = fill(&npu, &mut rng, 7, 256, 2048);
    assert_eq!(npu.domain_usage(), vec![2 * MIB, 2 * MIB, 2 * MIB, MIB]);
    let doms: Vec<u32> = ws.iter().map(|x| x.rw.domain()).collect();
    assert_eq!(doms, vec![0, 0, 1, 1, 2, 2, 3]);
    run_all(&npu, &mut rng, &ws);
    // Only as many domains as needed were touched.
    assert_eq!(sim.domain_used_bytes(DomainId(4)), 0);
    drop(ws);
    assert_eq!(npu.domain_usage().iter().sum::<u64>(), 0, "freed weights release their domain bytes");
}

#[test]
fn efault_while_filling_advances_and_loses_nothing() {
    // The proactive cap (64 MiB) would never trigger; the simulated window EFAULTs at 4 MiB
    // (scratch of 3 cores and the activation image ≈ 0.8 MiB + 1 MiB weights), so the safety net
    // must advance.
    let faults = SimFaults { efault_after_bytes: Some(4 * MIB), ..SimFaults::default() };
    let (_sim, npu) = sim_npu(small_soc(64 * MIB, 64 * MIB), faults);
    let mut rng = Rng::new(2);
    let ws = fill(&npu, &mut rng, 9, 256, 2048);
    let doms: Vec<u32> = ws.iter().map(|x| x.rw.domain()).collect();
    assert!(doms.windows(2).all(|p| p[0] <= p[1]), "domains fill in order: {doms:?}");
    assert!(*doms.last().unwrap() >= 2, "EFAULT must have advanced the cursor: {doms:?}");
    run_all(&npu, &mut rng, &ws);
}

#[test]
fn residency_budget_refuses_with_no_room() {
    let soc = rk3588();
    let sim = std::sync::Arc::new(ggml_ork::npu::kif::sim::SimKif::with_faults(soc.clone(), SimFaults::default()));
    let cfg = NpuConfig { wcache_budget_bytes: Some(3 * MIB / 2), ..NpuConfig::default() };
    let npu = Npu::with_kif(sim, soc, &cfg).unwrap();
    let mut rng = Rng::new(3);
    let _a = fill(&npu, &mut rng, 1, 256, 2048);
    let w = rng.i8s(256 * 2048);
    let err = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, 256, 2048).unwrap()).err().expect("over budget");
    assert!(matches!(err, NpuError::NoRoom { .. }), "{err}");
}

#[test]
fn more_than_16_domains_is_no_room() {
    let (_sim, npu) = sim_npu(small_soc(MIB, 16 * MIB), SimFaults::default());
    let mut rng = Rng::new(4);
    let _ws = fill(&npu, &mut rng, 16, 256, 2048);
    let w = rng.i8s(256 * 2048);
    let err = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, 256, 2048).unwrap()).err().expect("17th domain");
    assert!(matches!(err, NpuError::NoRoom { .. }), "{err}");
}

#[test]
fn a_failed_sync_frees_the_new_buffer_on_both_upload_paths() {
    let soc = rk3588();
    let sim = std::sync::Arc::new(ggml_ork::npu::kif::sim::SimKif::with_faults(soc.clone(), SimFaults::default()));
    let npu = Npu::with_kif(sim.clone(), soc, &NpuConfig::default()).unwrap();
    let mut rng = Rng::new(6);
    let (k, n) = (256, 64);
    let w = rng.i8s(n * k);
    let tw = ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap();
    // The first upload also makes the per-core scratch buffers: count from after it.
    let first = npu.upload(&tw).unwrap();
    let live = sim.live_bos();
    sim.set_faults(SimFaults { sync_fail_every: Some(1), ..SimFaults::default() });
    for _ in 0..3 {
        assert!(npu.upload(&tw).is_err(), "upload must fail when its sync fails");
        assert!(npu.upload_bytes_observed(n, k, TileSets::Both, &tw.bytes, &mut |_, _| {}).is_err(), "import must fail when its sync fails");
        assert_eq!(sim.live_bos(), live, "a failed upload left a buffer behind");
    }
    sim.set_faults(SimFaults::default());
    let again = npu.upload(&tw).unwrap();
    let a = rng.i8s(3 * k);
    let mut c = vec![0; 3 * n];
    npu.mm_run(&again, &a, 3, &mut c, Budget { max_cores: 3 }).unwrap();
    assert_eq!(c, reference_mm(&a, &w, 3, k, n));
    drop((first, again));
}

fn faulty_runs(faults: SimFaults, expect: fn(&KifError) -> bool) {
    let (sim, npu) = sim_npu(rk3588(), faults);
    let mut rng = Rng::new(5);
    let (k, n) = (2080, 256); // K-split: several submits per core
    let w = rng.i8s(n * k);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
    let (mut ok, mut failed) = (0, 0);
    for i in 0..30 {
        let m = 1 + i % 9;
        let a = rng.i8s(m * k);
        let sentinel = vec![0x5a5a_5a5a; m * n];
        let mut c = sentinel.clone();
        match npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 3 }) {
            Ok(_) => {
                assert_eq!(c, reference_mm(&a, &w, m, k, n));
                ok += 1;
            }
            Err(NpuError::Submit { source, .. }) => {
                assert!(expect(&source), "unexpected error {source}");
                assert_eq!(c, sentinel, "C must be untouched after a failed run");
                failed += 1;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(ok > 0 && failed > 0, "ok={ok} failed={failed}");
    // Faults off: the same Npu keeps working.
    sim.set_faults(SimFaults::default());
    let a = rng.i8s(7 * k);
    let mut c = vec![0; 7 * n];
    npu.mm_run(&rw, &a, 7, &mut c, Budget { max_cores: 3 }).unwrap();
    assert_eq!(c, reference_mm(&a, &w, 7, k, n));
}

#[test]
fn timeout_is_an_error_and_recovers() {
    faulty_runs(SimFaults { timeout_every: Some(5), ..SimFaults::default() }, |e| matches!(e, KifError::Timeout { .. }));
}

#[test]
fn reset_is_an_error_and_recovers() {
    faulty_runs(SimFaults { reset_every: Some(4), ..SimFaults::default() }, |e| matches!(e, KifError::Reset));
}

/// Runs that meet jobs reporting done without (fully) running: with one core (sequential
/// submits, so a resubmit never lands on the next faulty submit number) every one is detected,
/// resubmitted once and the result is exact; the detections equal what the simulator injected.
fn lying_jobs_are_caught(faults: SimFaults, injected: fn(&InjectedCounts) -> u64) {
    let (sim, npu) = sim_npu(rk3588(), faults);
    let mut rng = Rng::new(7);
    // K-split with a full-K companion: M > 1 chains K-slices (several programs per submit).
    let (k, n) = (2080, 256);
    let w = rng.i8s(n * k);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
    let mut never_ran = 0;
    for i in 0..12 {
        let m = 1 + i % 5;
        let a = rng.i8s(m * k);
        let mut c = vec![0; m * n];
        let st = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 1 }).unwrap();
        assert_eq!(c, reference_mm(&a, &w, m, k, n), "run {i} M={m}: a job that never ran was read as done");
        assert_eq!(st.retries, st.never_ran);
        never_ran += st.never_ran;
    }
    let h = npu.health();
    assert!(injected(&sim.injected()) > 0, "the fault was injected");
    assert_eq!(h.never_ran, injected(&sim.injected()), "every injected fault detected, nothing else");
    assert_eq!((h.retries, h.gave_up, u64::from(never_ran)), (h.never_ran, 0, h.never_ran));
}

#[test]
fn a_job_that_never_ran_is_detected_and_resubmitted() {
    lying_jobs_are_caught(SimFaults { never_run_every: Some(3), ..SimFaults::default() }, |c| c.never_run);
}

#[test]
fn a_hole_in_a_chain_is_detected_and_resubmitted() {
    lying_jobs_are_caught(SimFaults { hole_every: Some(2), ..SimFaults::default() }, |c| c.holes);
}

#[test]
fn a_short_task_count_is_detected_and_resubmitted() {
    lying_jobs_are_caught(SimFaults { short_count_every: Some(2), ..SimFaults::default() }, |c| c.short_counts);
}

#[test]
fn a_job_that_never_runs_twice_fails_the_run_and_leaves_c_untouched() {
    let (sim, npu) = sim_npu(rk3588(), SimFaults { never_run_every: Some(1), ..SimFaults::default() });
    let mut rng = Rng::new(8);
    let (k, n) = (512, 256);
    let w = rng.i8s(n * k);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
    let a = rng.i8s(4 * k);
    let sentinel = vec![0x5a5a_5a5a; 4 * n];
    let mut c = sentinel.clone();
    let err = npu.mm_run(&rw, &a, 4, &mut c, Budget { max_cores: 3 }).expect_err("nothing ever runs");
    assert!(matches!(err, NpuError::NeverRan { .. }), "{err}");
    assert!(err.to_string().contains("left their output unwritten"), "{err}");
    assert_eq!(c, sentinel, "C must be untouched after a failed run");
    // Each core detected its job twice (first try, resubmit) and gave up.
    let h = npu.health();
    assert_eq!(h.never_ran, sim.injected().never_run);
    assert_eq!(h.never_ran, 2 * h.gave_up);
    assert!(h.gave_up >= 1);
    // Faults off: the same Npu computes exactly again.
    sim.set_faults(SimFaults::default());
    npu.mm_run(&rw, &a, 4, &mut c, Budget { max_cores: 3 }).unwrap();
    assert_eq!(c, reference_mm(&a, &w, 4, k, n));
}

#[test]
fn short_task_counts_every_time_fail_the_run() {
    let (sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(9);
    let (k, n) = (2080, 64);
    let w = rng.i8s(n * k);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
    let a = rng.i8s(3 * k);
    let mut c = vec![0; 3 * n];
    let st = npu.mm_run(&rw, &a, 3, &mut c, Budget { max_cores: 1 }).unwrap();
    assert_eq!(u64::from(st.programs), sim.programs_run(), "a clean run executes every program it submits");
    // With a short count every submit, nothing can complete: the run fails, nothing is read.
    sim.set_faults(SimFaults { short_count_every: Some(1), ..SimFaults::default() });
    let before = sim.programs_run();
    assert!(matches!(npu.mm_run(&rw, &a, 3, &mut c, Budget { max_cores: 1 }), Err(NpuError::NeverRan { .. })));
    assert!(sim.programs_run() - before < 2 * u64::from(st.programs), "the short submits ran only part of their programs");
}

/// The simulator behind a kernel whose task counter comes back one short on every `every`-th
/// submit although the job ran completely: only the counter check can see it.
struct ShortCounter {
    sim: std::sync::Arc<SimKif>,
    every: u64,
    submits: std::sync::atomic::AtomicU64,
}

impl KernelInterface for ShortCounter {
    fn name(&self) -> &'static str {
        "short-counter"
    }
    fn describe(&self) -> String {
        self.sim.describe()
    }
    fn mem_create(&self, size_bytes: usize, flags: u32, domain: DomainId) -> Result<Bo, KifError> {
        self.sim.mem_create(size_bytes, flags, domain)
    }
    fn mem_sync(&self, bo: &Bo, dir: SyncDir, offset: usize, len: usize) -> Result<usize, KifError> {
        self.sim.mem_sync(bo, dir, offset, len)
    }
    fn mem_destroy(&self, bo: Bo) -> Result<(), KifError> {
        self.sim.mem_destroy(bo)
    }
    fn submit(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError> {
        let mut done = self.sim.submit(job)?;
        if (self.submits.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1) % self.every == 0 {
            done.task_counter -= 1;
        }
        Ok(done)
    }
    fn reset(&self) -> Result<(), KifError> {
        self.sim.reset()
    }
}

#[test]
fn a_task_counter_short_of_the_tasks_submitted_is_resubmitted() {
    let soc = rk3588();
    let sim = std::sync::Arc::new(SimKif::with_faults(soc.clone(), SimFaults::default()));
    let kif = std::sync::Arc::new(ShortCounter { sim: sim.clone(), every: 2, submits: Default::default() });
    let cfg = NpuConfig { wcache_budget_bytes: Some(u64::MAX), ..NpuConfig::default() };
    let npu = Npu::with_kif(kif.clone(), soc, &cfg).unwrap();
    let mut rng = Rng::new(10);
    let (k, n) = (512, 128);
    let w = rng.i8s(n * k);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
    for m in [1, 3, 8, 2] {
        let a = rng.i8s(m * k);
        let mut c = vec![0; m * n];
        npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 1 }).unwrap();
        assert_eq!(c, reference_mm(&a, &w, m, k, n));
    }
    // One submit per run (K = 512: one full-K program): submit 1 ran, 2 came back short and
    // was resubmitted as 3, 4 short → 5, 6 short → 7.
    let h = npu.health();
    assert_eq!((h.never_ran, h.retries, h.gave_up), (3, 3, 0), "{h:?}");
    assert_eq!(sim.submits(), 7);
}

#[test]
fn fault_spec_parses() {
    let f = SimFaults::parse("efault_after_mb:64|timeout_every:7,reset_every:11, sync_fail_every:3").unwrap();
    assert_eq!(
        f,
        SimFaults {
            efault_after_bytes: Some(64 * MIB),
            timeout_every: Some(7),
            reset_every: Some(11),
            sync_fail_every: Some(3),
            ..SimFaults::default()
        }
    );
    let f = SimFaults::parse("never_run_every:50,hole_every:13|short_count_every:4").unwrap();
    assert_eq!(
        f,
        SimFaults { never_run_every: Some(50), hole_every: Some(13), short_count_every: Some(4), ..SimFaults::default() }
    );
    assert!(SimFaults::parse("bogus:1").is_err());
    assert!(SimFaults::parse("timeout_every").is_err());
}

/// A run of pieces (`Npu::mm_run_pieces`): every piece's result equals the reference, whatever
/// the cut and the shape (full-K and K-split, several M-tiles, several submits per core); a
/// piece whose submit fails gives an error on its own take and the later pieces still run; a
/// run dropped before its last pieces are written returns without hanging, and the NPU runs the
/// next matmul exactly.
#[test]
fn a_run_of_pieces_equals_the_reference_and_a_failed_piece_fails_alone() {
    use ggml_ork::npu::layout::tile_weight;
    for (faults, k, n, cuts) in [
        (SimFaults::default(), 2048, 1024, vec![0, 163, 326, 512]),
        (SimFaults::default(), 6144, 512, vec![0, 64, 200]),
        (SimFaults::default(), 2080, 256, vec![0, 1, 2, 9, 40]),
        (SimFaults { timeout_every: Some(4), ..SimFaults::default() }, 2080, 256, vec![0, 8, 16, 24, 32, 40, 48]),
    ] {
        let injecting = faults.timeout_every.is_some();
        let (_sim, npu) = sim_npu(rk3588(), faults);
        let mut rng = Rng::new(k as u64 + n as u64);
        let w = rng.i8s(n * k);
        let rw = npu.upload(&tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
        let m = *cuts.last().unwrap();
        let a = rng.i8s(m * k);
        let bounds: Vec<(usize, usize)> = cuts.windows(2).map(|c| (c[0], c[1])).collect();
        let (mut ok, mut failed) = (0, 0);
        {
            // Every piece written before any is taken: each piece's rows have a place of their
            // own while the cores run the ones before.
            let mut run = npu.mm_run_pieces(&rw, &bounds, Budget { max_cores: 3 }, 0).unwrap();
            for (i, &(r0, r1)) in bounds.iter().enumerate() {
                run.fill(i, &a[r0 * k..r1 * k]).unwrap();
            }
            for (i, &(r0, r1)) in bounds.iter().enumerate() {
                match run.take(i) {
                    Ok((sh, st)) => {
                        let mut c = vec![0i32; (r1 - r0) * n];
                        sh.copy_to(&mut c);
                        let want = reference_mm(&a[r0 * k..r1 * k], &w, r1 - r0, k, n);
                        let wrong = c.iter().zip(&want).filter(|(g, w)| g != w).count();
                        assert_eq!(wrong, 0, "K {k} N {n} piece {i} rows {r0}..{r1}: {wrong} of {} words differ", want.len());
                        assert!(st.submits >= 3 && st.device_ns > 0 && st.host_ns > 0, "{st:?}");
                        ok += 1;
                    }
                    Err(NpuError::Submit { source: KifError::Timeout { .. }, .. }) if injecting => failed += 1,
                    Err(e) => panic!("K {k} N {n} piece {i}: {e}"),
                }
            }
        }
        assert!(ok > 0 && (failed > 0) == injecting, "K {k} N {n}: ok {ok} failed {failed}");
        // Out of order: an error, never a hang. Dropped after one of three pieces: returns, and
        // the cores are free for the next run.
        let run = {
            let mut run = npu.mm_run_pieces(&rw, &[(0, 4), (4, 8), (8, 12)], Budget { max_cores: 3 }, 0).unwrap();
            assert!(run.take(0).is_err(), "a piece taken before its fill fails");
            assert!(run.fill(1, &a[4 * k..8 * k]).is_err(), "piece 1 cannot be filled before piece 0");
            run.fill(0, &a[..4 * k]).unwrap();
            assert!(run.fill(0, &a[..4 * k]).is_err(), "a piece is filled once");
            run
        };
        drop(run);
        if !injecting {
            let mut c = vec![0i32; 5 * n];
            npu.mm_run(&rw, &a[..5 * k], 5, &mut c, Budget { max_cores: 3 }).unwrap();
            assert_eq!(c, reference_mm(&a[..5 * k], &w, 5, k, n));
        }
    }
}
