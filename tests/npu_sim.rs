//! The simulator decodes what it is handed: hand-built submits exercise the row stride, PC
//! chaining semantics (links, early termination, task_number), address checks, and the loud
//! refusal of everything it does not model.
mod common;

use common::{rk3588, sim_npu, Rng};
use ggml_ork::npu::Budget;
use ggml_ork::npu::kif::sim::{SimFaults, SimKif};
use ggml_ork::npu::kif::{job_flags, mem_flags, Bo, DomainId, Iova, KernelInterface, KifError, RknpuTask, SubmitJob};
use ggml_ork::npu::layout::{self, WeightGeometry};
use ggml_ork::npu::regcmd::{self, MatmulProgram, Schedule};
use ggml_ork::npu::regs::{self, RegCmd};
use ggml_ork::npu::reference_mm;

struct Rig {
    sim: SimKif,
    a: Bo,
    b: Bo,
    c: Bo,
    rc: Bo,
    task: Bo,
}

const D: DomainId = DomainId(0);

fn rig() -> Rig {
    let sim = SimKif::with_faults(rk3588(), SimFaults::default());
    let a = sim.mem_create(1 << 16, mem_flags::DATA, D).unwrap();
    let b = sim.mem_create(1 << 16, mem_flags::DATA, D).unwrap();
    let c = sim.mem_create(1 << 16, mem_flags::DATA, D).unwrap();
    let rc = sim.mem_create(1 << 16, mem_flags::DATA, D).unwrap();
    let task = sim.mem_create(4096, mem_flags::TASK, D).unwrap();
    Rig { sim, a, b, c, rc, task }
}

impl Rig {
    /// Fills A `[mc][k]` and W `[n][k]` (tiled into B) with random data.
    fn data(&mut self, rng: &mut Rng, mc: usize, k: usize, n: usize) -> (Vec<i8>, Vec<i8>) {
        let a = rng.i8s(mc * k);
        let w = rng.i8s(n * k);
        self.a.bytes_mut()[..mc * k].copy_from_slice(bytemuck::cast_slice(&a));
        let g = WeightGeometry::new(&rk3588(), n, k);
        let blob = common::tile_weight_ref(&g, &w);
        self.b.bytes_mut()[..blob.len()].copy_from_slice(&blob);
        (a, w)
    }

    fn prog(&self, mc: u32, k: u32, n: u32, s: u32) -> MatmulProgram {
        MatmulProgram { mc, k, n, dst_stride: s, a: self.a.iova, b: self.b.iova, c: self.c.iova, sched: Schedule::template(mc) }
    }

    fn submit(&mut self, entries: &[RegCmd], tasks: usize) -> Result<(), KifError> {
        self.submit_done(entries, tasks).map(|_| ())
    }

    fn submit_done(&mut self, entries: &[RegCmd], tasks: usize) -> Result<ggml_ork::npu::kif::SubmitDone, KifError> {
        let bytes = regcmd::to_bytes(entries);
        self.rc.bytes_mut()[..bytes.len()].copy_from_slice(&bytes);
        for i in 0..tasks {
            let t = RknpuTask {
                enable_mask: 0x0d,
                int_mask: 0x300,
                int_clear: 0x1ffff,
                regcfg_amount: 108,
                regcmd_addr: u64::from(self.rc.iova.0) + (i * regcmd::PROGRAM_BYTES) as u64,
                ..Default::default()
            };
            self.task.bytes_mut()[i * 40..(i + 1) * 40].copy_from_slice(bytemuck::bytes_of(&t));
        }
        let job = SubmitJob {
            task_bo: &self.task,
            task_start: 0,
            task_number: tasks as u32,
            core_mask: 1,
            domain: D,
            flags: job_flags::PC | job_flags::PINGPONG,
            timeout_ms: 1000,
        };
        self.sim.submit(&job)
    }

    fn c_i32(&self, count: usize) -> Vec<i32> {
        self.c.bytes()[..count * 4].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
    }
}

#[test]
fn row_stride_is_honoured() {
    let mut r = rig();
    let mut rng = Rng::new(1);
    let (mc, k, n, s) = (5, 64, 32, 48);
    let (a, w) = r.data(&mut rng, mc, k, n);
    r.c.bytes_mut().fill(0xee);
    let e = r.prog(mc as u32, k as u32, n as u32, s as u32).program(None, 2).unwrap();
    r.submit(&e, 1).unwrap();
    let got = r.c_i32(mc * s);
    let want = reference_mm(&a, &w, mc, k, n);
    for row in 0..mc {
        assert_eq!(&got[row * s..row * s + n], &want[row * n..(row + 1) * n]);
        if row + 1 < mc {
            assert!(got[row * s + n..(row + 1) * s].iter().all(|&x| x == i32::from_le_bytes([0xee; 4])), "gap untouched");
        }
    }
}

/// Replaces the value of the first entry writing `reg`.
fn patch(e: &mut [RegCmd], reg: &regs::RegDef, value: u32) {
    let i = e.iter().position(|x| x.reg().map(|r| r.name) == Some(reg.name)).unwrap();
    e[i] = RegCmd::write(reg, value);
}

/// Replaces every entry writing `reg` (the capture writes CONV_CON1 and CBUF_CON0 twice).
fn patch_all(e: &mut [RegCmd], reg: &regs::RegDef, value: u32) {
    for x in e.iter_mut().filter(|x| x.reg().map(|r| r.name) == Some(reg.name)) {
        *x = RegCmd::write(reg, value);
    }
}

fn refused(mutate: impl Fn(&mut Vec<RegCmd>), needle: &str) {
    let mut r = rig();
    let mut rng = Rng::new(2);
    r.data(&mut rng, 4, 64, 32);
    let mut e = r.prog(4, 64, 32, 32).program(None, 2).unwrap();
    mutate(&mut e);
    match r.submit(&e, 1) {
        Err(KifError::Invalid(msg)) => assert!(msg.contains(needle), "`{msg}` lacks `{needle}`"),
        other => panic!("expected a refusal mentioning `{needle}`, got {other:?}"),
    }
}

#[test]
fn unmodelled_programming_is_refused_loudly() {
    use regs::*;
    // fp16 input precision (CONV_CON1 IN_PRECISION=2, PROC_PRECISION=2).
    refused(|e| patch_all(e, &CNA_CONV_CON1::REG, 0x2000_0000 | (2 << 4) | (2 << 7)), "IN_PRECISION");
    // Duplicates: the later copy of CONV_CON1 wins, so patching only the first is harmless…
    // …but patching only the second (entry 5) is seen.
    refused(|e| e[5] = RegCmd::write(&CNA_CONV_CON1::REG, 0x2000_0000 | (2 << 4)), "IN_PRECISION");
    // int8 output (DATA_FORMAT OUT_PRECISION=0).
    refused(|e| patch(e, &DPU_DATA_FORMAT::REG, 0), "OUT_PRECISION");
    // BS stage enabled.
    refused(|e| patch(e, &DPU_BS_CFG::REG, 0x52), "BS_BYPASS");
    // Non-identity output conversion.
    refused(|e| patch(e, &DPU_OUT_CVT_SHIFT::REG, 3), "OUT_CVT_SHIFT");
    // Another layout triple.
    refused(|e| patch(e, &CNA_DMA_CON1::REG, 5), "LINE_STRIDE");
    // A CBUF split whose data banks cannot hold the rows (0 data banks).
    refused(|e| patch_all(e, &CNA_CBUF_CON0::REG, 0xb0), "CBUF");
    // Inconsistent dimensions between CNA and DPU.
    refused(|e| patch(e, &DPU_DATA_CUBE_HEIGHT::REG, 7), "HEIGHT");
    // A register outside the table.
    refused(|e| e[57] = RegCmd::raw(0x0801, 0x3034, 0), "outside the table");
    // A kick enabling DPU_RDMA too.
    refused(|e| { let n = e.len(); e[n - 1] = RegCmd::write(&PC_OPERATION_ENABLE::REG, 0x1d) }, "0x0d");
    // Missing 0x0041 word before the kick.
    refused(|e| { let n = e.len(); e[n - 2] = RegCmd::NOP }, "0x0041");
    // Feature address outside every BO.
    refused(|e| patch(e, &CNA_FEATURE_DATA_ADDR::REG, 0x10_0000), "outside every live BO");
    // Fields the model does not compute with, whose other values change the result on hardware.
    refused(|e| patch(e, &CNA_FC_CON1::REG, 16), "DATA_OFFSET");
    refused(|e| patch(e, &CNA_FC_CON2::REG, 32), "WEIGHT_OFFSET");
    refused(|e| patch(e, &CNA_CVT_CON5::REG, 1), "PER_CHANNEL_CVT_EN");
    let cbuf = |e: &Vec<RegCmd>| e.iter().find(|x| x.writes(&CNA_CBUF_CON0::REG)).unwrap().value();
    refused(|e| { let v = cbuf(e) | CNA_CBUF_CON0::DATA_REUSE.mask(); patch_all(e, &CNA_CBUF_CON0::REG, v) }, "DATA_REUSE");
    refused(|e| { let v = cbuf(e) | CNA_CBUF_CON0::WEIGHT_REUSE.mask(); patch_all(e, &CNA_CBUF_CON0::REG, v) }, "WEIGHT_REUSE");
    let with = |e: &Vec<RegCmd>, reg: &RegDef, f: Field| e.iter().find(|x| x.writes(reg)).unwrap().value() | f.mask();
    refused(|e| { let v = with(e, &DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::TP_EN); patch(e, &DPU_FEATURE_MODE_CFG::REG, v) }, "TP_EN");
    refused(|e| { let v = with(e, &DPU_BS_OW_CFG::REG, DPU_BS_OW_CFG::OD_BYPASS); patch(e, &DPU_BS_OW_CFG::REG, v) }, "OD_BYPASS");
    refused(|e| patch(e, &DPU_OUT_CVT_SHIFT::REG, DPU_OUT_CVT_SHIFT::CVT_TYPE.mask()), "CVT_TYPE");
    refused(|e| patch(e, &DPU_OUT_CVT_SHIFT::REG, 1 << 12), "MINUS_EXP");
    refused(|e| patch(e, &CORE_UNK_3030::REG, 1), "CORE_UNK_3030");
    // A reserved bit, in a checked register and in an ignored one.
    refused(|e| { let v = with(e, &CNA_DATA_SIZE0::REG, DATAIN_HEIGHT_PLUS_ONE); patch(e, &CNA_DATA_SIZE0::REG, v) }, "reserved bits 0x800");
    refused(|e| patch(e, &DPU_LUT_CFG::REG, 1 << 8), "DPU_LUT_CFG: reserved bits 0x100");
}

/// Bit 11 of CNA_DATA_SIZE0: above DATAIN_HEIGHT[10:0], below DATAIN_WIDTH[26:16] — reserved.
const DATAIN_HEIGHT_PLUS_ONE: regs::Field = regs::Field { name: "bit11", hi: 11, lo: 11, enc: regs::Enc::Plain };

#[test]
fn ignored_registers_do_not_change_the_result() {
    // Every ignored register written with a value (reserved bits clear): the result is the same.
    let mut r = rig();
    let mut rng = Rng::new(4);
    let (a, w) = r.data(&mut rng, 4, 64, 32);
    let mut e = r.prog(4, 64, 32, 32).program(None, 2).unwrap();
    for (reg, _) in ggml_ork::npu::kif::sim::IGNORED {
        patch_all(&mut e, reg, 0x5555_5555 & !reg.reserved_mask());
    }
    r.submit(&e, 1).unwrap();
    assert_eq!(r.c_i32(4 * 32), reference_mm(&a, &w, 4, 64, 32));
}

#[test]
fn chain_follows_links_and_task_number() {
    let mut r = rig();
    let mut rng = Rng::new(3);
    let (mc, k, n) = (2usize, 32usize, 32usize);
    let (a, w) = r.data(&mut rng, mc, k, n);
    let want = reference_mm(&a, &w, mc, k, n);
    // Two programs writing two different C regions.
    let mut p1 = r.prog(mc as u32, k as u32, n as u32, n as u32);
    let p0 = p1;
    p1.c = Iova(r.c.iova.0 + 4096);
    let chained = regcmd::chain(&[p0, p1], r.rc.iova, 2).unwrap();
    let second = |r: &Rig| -> Vec<i32> {
        r.c.bytes()[4096..4096 + mc * n * 4].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    // task_number = 2: both run.
    r.submit(&chained, 2).unwrap();
    assert_eq!(r.c_i32(mc * n), want);
    assert_eq!(second(&r), want);
    // task_number = 1: only the first runs even though it links on.
    r.c.bytes_mut().fill(0);
    r.submit(&chained, 1).unwrap();
    assert_eq!(r.c_i32(mc * n), want);
    assert!(second(&r).iter().all(|&x| x == 0));
    // Two unlinked programs with task_number = 2: the chain stops after the first → timeout.
    let mut unlinked = p0.program(None, 2).unwrap();
    unlinked.extend(p1.program(None, 2).unwrap());
    assert!(matches!(r.submit(&unlinked, 2), Err(KifError::Timeout { .. })));
}

#[test]
fn task_bo_needs_kernel_mapping() {
    let mut r = rig();
    let plain = r.sim.mem_create(4096, mem_flags::DATA, D).unwrap();
    let old = std::mem::replace(&mut r.task, plain);
    let mut rng = Rng::new(4);
    r.data(&mut rng, 1, 32, 32);
    let e = r.prog(1, 32, 32, 32).program(None, 2).unwrap();
    assert!(matches!(r.submit(&e, 1), Err(KifError::Invalid(m)) if m.contains("KERNEL_MAPPING")));
    r.sim.mem_destroy(old).unwrap();
}

#[test]
fn iovas_are_top_down_page_aligned_and_reused() {
    let sim = SimKif::with_faults(rk3588(), SimFaults::default());
    let x = sim.mem_create(5000, mem_flags::DATA, D).unwrap();
    let y = sim.mem_create(4096, mem_flags::DATA, D).unwrap();
    assert_eq!(x.size_bytes, 8192);
    assert_eq!(x.iova.0 as u64 + 8192, 1 << 32);
    assert_eq!(y.iova.0 + 4096, x.iova.0);
    let xi = x.iova;
    sim.mem_destroy(x).unwrap();
    let z = sim.mem_create(8192, mem_flags::DATA, D).unwrap();
    assert_eq!(z.iova, xi, "freed range reused");
    // Domains have separate windows.
    let d1 = sim.mem_create(4096, mem_flags::DATA, DomainId(1)).unwrap();
    assert_eq!(d1.iova.0 as u64 + 4096, 1 << 32);
    assert!(sim.mem_create(4096, mem_flags::DATA, DomainId(16)).is_err());
    for bo in [y, z, d1] {
        sim.mem_destroy(bo).unwrap();
    }
    assert_eq!(sim.live_bos(), 0);
}

#[test]
fn later_duplicate_wins() {
    let mut r = rig();
    let mut rng = Rng::new(5);
    let (a, w) = r.data(&mut rng, 3, 64, 32);
    let mut e = r.prog(3, 64, 32, 32).program(None, 2).unwrap();
    // Only the first CONV_CON1 copy (entry 3) says fp16; entry 5 restores int8 before the kick.
    e[3] = RegCmd::write(&regs::CNA_CONV_CON1::REG, 0x2000_0000 | (2 << 4) | (2 << 7));
    r.submit(&e, 1).unwrap();
    assert_eq!(r.c_i32(3 * 32), reference_mm(&a, &w, 3, 64, 32));
}

/// `ORK_SIM_TIMING=board`: programs are decoded and land (each program's last output word
/// written, so the sentinels are overwritten; task counter right: no never-ran detection),
/// nothing is computed (fresh scratch keeps reading zero), and each submit reports and takes
/// the hardware time `NpuTiming` models: the floor for a tiny matmul, at least the MAC time of the
/// cores for a large one, the same figure on every run.
#[test]
fn the_board_timing_completes_each_submit_at_its_modelled_time() {
    let (sim, npu) = sim_npu(rk3588(), SimFaults::default());
    sim.set_board_timing(true);
    let t = npu.soc().timing;
    let mut rng = Rng::new(21);
    let run = |m: usize, k: usize, n: usize, rng: &mut Rng| {
        let w = rng.i8s(n * k);
        let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
        let a = rng.i8s(m * k);
        let mut c = vec![7; m * n];
        let t0 = std::time::Instant::now();
        let st = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 3 }).unwrap();
        (st, c, t0.elapsed())
    };
    let (tiny, c, wall) = run(32, 64, 64, &mut rng);
    assert!(c.iter().all(|&v| v == 0), "nothing computed: the fresh output scratch still reads zero");
    assert_eq!(tiny.never_ran, 0, "every program landed");
    assert_eq!(tiny.device_ns, tiny.submits as u64 * t.submit_floor_ns, "a tiny matmul costs the floor per submit");
    assert!(wall.as_nanos() as u64 >= t.submit_floor_ns, "the submit took its modelled time: {wall:?}");
    let (m, k, n) = (512, 2048, 2048);
    let (big, _, big_wall) = run(m, k, n, &mut rng);
    assert!(big_wall.as_nanos() as u64 >= big.device_ns / u64::from(big.cores), "no core's submits ended before their modelled time: {big_wall:?}, {big:?}");
    let macs_ns = 2.0 * (m * k * n) as f64 / t.core_ops as f64 * 1e9;
    assert!(big.device_ns as f64 >= macs_ns && big.device_ns as f64 <= 1.5 * macs_ns + 1e6 * big.submits as f64, "{big:?} vs MAC time {macs_ns:.0} ns");
    let (again, _, _) = run(m, k, n, &mut rng);
    assert_eq!((again.device_ns, again.submits), (big.device_ns, big.submits), "the model gives the same time on every run");
    sim.set_board_timing(false);
    let w = rng.i8s(64 * 64);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, 64, 64).unwrap()).unwrap();
    let a = rng.i8s(32 * 64);
    let mut c = vec![0; 32 * 64];
    npu.mm_run(&rw, &a, 32, &mut c, Budget { max_cores: 3 }).unwrap();
    assert_eq!(c, ggml_ork::npu::reference_mm(&a, &w, 32, 64, 64), "computed again, bit-exact, once it is off");
}

/// A run's wall time splits into the cores' host work, their submits' hardware time and the
/// submits' time past it (`RunStats::core_host_ns`, `device_ns`, `late_ns`): on one core the
/// three add up to no more than the run's wall time, and the host work is there (register
/// commands, syncs) but is not the submits' time.
#[test]
fn a_run_splits_into_host_work_hardware_time_and_lateness() {
    let (sim, npu) = sim_npu(rk3588(), SimFaults::default());
    sim.set_board_timing(true);
    let mut rng = Rng::new(22);
    let (m, k, n) = (256, 2048, 1024);
    let w = rng.i8s(n * k);
    let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
    let a = rng.i8s(m * k);
    let mut c = vec![0; m * n];
    for _ in 0..3 {
        let st = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 1 }).unwrap();
        assert_eq!(st.cores, 1);
        assert!(st.core_host_ns > 0, "the core's thread did host work: {st:?}");
        assert!(st.core_host_ns + st.device_ns + st.late_ns <= st.host_ns, "the parts exceed the run's wall time: {st:?}");
        assert!(st.device_ns >= npu.soc().timing.submit_floor_ns * u64::from(st.submits), "{st:?}");
    }
    sim.set_board_timing(false);
}

/// A timed submit returns no earlier than its modelled hardware time (the simulator sleeps to
/// shortly before it, then polls the clock; how late it ends is measured by
/// `cargo run --release --example sleep_lateness`, not here).
#[test]
fn a_timed_submit_never_ends_before_its_modelled_time() {
    let mut r = rig();
    r.sim.set_board_timing(true);
    let mut rng = Rng::new(8);
    r.data(&mut rng, 32, 256, 128);
    let e = r.prog(32, 256, 128, 128).program(None, 2).unwrap();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        let done = r.submit_done(&e, 1).unwrap();
        let wall = t.elapsed().as_nanos() as u64;
        assert!(wall >= done.hw_elapse_ns, "ended {} ns before its modelled {} ns", done.hw_elapse_ns - wall, done.hw_elapse_ns);
    }
}

/// Matmuls computed by the simulator (its kernel runs on rayon) from two caller threads at once,
/// on every core, with shapes that grow the scratch buffers as they go: every run finishes, exact.
/// (An NPU worker pool on rayon deadlocked here: a core's thread, waiting inside the simulator's
/// parallel kernel while it held the simulator's state lock, took another core's share and blocked
/// on that lock.)
#[test]
fn concurrent_callers_on_every_core_finish_and_are_exact() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let npu = std::sync::Arc::new(npu);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for t in 0..2u64 {
        let (npu, done_tx) = (npu.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(70 + t);
            for (i, (k, n)) in [(1088usize, 256usize), (512, 384), (2080, 192)].into_iter().cycle().take(36).enumerate() {
                let m = 8 + 24 * (i % 12);
                let w = rng.i8s(n * k);
                let rw = npu.upload(&layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
                let a = rng.i8s(m * k);
                let mut c = vec![0; m * n];
                npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 3 }).unwrap();
                assert_eq!(c, reference_mm(&a, &w, m, k, n), "thread {t} run {i}");
            }
            let _ = done_tx.send(t);
        });
    }
    for _ in 0..2 {
        done_rx.recv_timeout(std::time::Duration::from_secs(120)).expect("both callers finish (no deadlock)");
    }
}
