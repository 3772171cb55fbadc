//! The simulator: an in-process, bit-exact model of the NPU behind the same [`KernelInterface`].
//!
//! What it owns: an arena of buffer objects, a 4 GiB IOVA window per IOMMU domain (IOVAs are
//! handed out top-down and page-aligned, like the Linux IOVA allocator the vendor driver uses;
//! rknpu-facts §1.6), and the execution of a submit:
//!
//! 1. the task array is read from the task BO at `task_start .. task_start + task_number`
//!    (the task BO must carry `KERNEL_MAPPING`, as the kernel reads it through one; §1.4);
//! 2. like the vendor kernel (§1.5) only the first task of each sub-submit of at most
//!    `max_submit_tasks` tasks is used to start the PC: its `regcmd_addr` and the fetch amount
//!    `ceil((regcfg_amount + 4) / scale) - 1`; later programs are reached only through the
//!    in-stream chain link (PC_BASE_ADDRESS / PC_REGISTER_AMOUNTS in the trailer, §2.4), and a
//!    chain that ends before `task_number` programs ran is a timeout (the counter stays short);
//! 3. each fetched entry is decoded through [`crate::npu::regs`] into a register file (writes
//!    to registers outside the table are refused); the 0x0081 kick executes what the register
//!    file describes — addresses, dimensions, precision, output conversion, row stride.
//!
//! It models exactly one operation: the int8 × int8 → int32 matmul of rknpu-facts §2.2 with the
//! flat layouts of §3 (A `[mc][K]` row-major, W tiled `[N/32][K/32][32][32]`, C `[mc][N]` int32
//! with row stride s). Anything else it meets — fp16/int4 precision, int8/int16 output
//! conversion, non-bypassed BS/BN/EW stages, a layout triple other than ork's verified one, CBUF
//! splits that cannot hold the data, K over the SoC's single-program ceiling, N over 8192 — is a
//! loud [`KifError::Invalid`], never a guess. Every address a program uses must lie inside a
//! live BO of the job's domain. Every register of the table is either read ([`CHECKED`]: its
//! fields checked against what the program means, and the fields the model does not compute
//! with pinned to the one value modelled, [`PINNED`] — data/weight offsets, per-channel
//! conversion, CBUF reuse, transposed output, OUT_CVT type/exponent, …) or listed with the
//! reason the hardware ignores it for this operation ([`IGNORED`]); a set reserved bit in any
//! register is refused.
//!
//! Fault injection ([`SimFaults`], set from tests or from `ORK_SIM_FAULT`, e.g.
//! `efault_after_mb:64,timeout_every:7,reset_every:11`): EFAULT once a domain holds more than
//! a given number of bytes (a smaller window), a timeout on every n-th submit, a soft reset on
//! every n-th submit, a failed cache sync on every n-th sync (`sync_fail_every:N`). A faulted
//! submit runs only part of its programs first, so a caller that ignored the error would read
//! wrong results. Three faults report success while the output is not what the job describes
//! (peer-facts §4): `never_run_every:N` (nothing ran, the counter says all did), `hole_every:N`
//! (one program skipped, the counter says all ran) and `short_count_every:N` (half ran, the
//! counter says so); only the caller's checks — the output sentinel and the task counter in
//! `npu::mm` — can catch them. Otherwise the task counter reports the programs that ran.
//! [`SimKif::injected`] counts what was injected, and the interface's `fault_report` says it
//! in the exit log.
//!
//! Unsafe: the arena hands out raw mappings like a device would; the only unsafe blocks turn
//! arena pointers into slices (each with a `// SAFETY:` line).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use rayon::prelude::*;

use super::{
    mem_flags, page_round, Bo, DomainId, Iova, KernelInterface, KifError, RknpuTask, SubmitDone, SubmitJob, SyncDir,
    MAX_DOMAINS, PAGE_BYTES,
};
use crate::npu::regcmd;
use crate::npu::regs::{self, Block, RegCmd, RegFile};
use crate::npu::soc::SocDesc;

/// Lowest IOVA handed out (address 0 stays unmapped so a NULL register faults).
const IOVA_FLOOR: u64 = PAGE_BYTES as u64;
/// Top of the 32-bit IOVA space.
const IOVA_TOP: u64 = 1 << 32;
/// `obj_addr` cookies are handle | this tag, so they never look like IOVAs.
const OBJ_ADDR_TAG: u64 = 0x5153_0000_0000_0000;

/// Injected faults. `None` = off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimFaults {
    /// EFAULT when a domain would hold more than this many bytes (a smaller window).
    pub efault_after_bytes: Option<u64>,
    /// Every n-th submit times out (the device is reset, partial work is left behind).
    pub timeout_every: Option<u32>,
    /// Every n-th submit is hit by a soft reset.
    pub reset_every: Option<u32>,
    /// Every n-th cache sync fails (EIO, as a kernel whose SYNC ioctl fails would report).
    pub sync_fail_every: Option<u32>,
    /// Every n-th submit returns success without running any program (peer-facts §4: the
    /// hardware never started). The task counter reports `task_number`, as the vendor kernel
    /// writes on a successful wait (rknpu-facts §1.3), so only the output can tell.
    pub never_run_every: Option<u32>,
    /// Every n-th submit skips one program (the middle one of its chain; the only one of a
    /// one-program job) and reports every task done (peer-facts §4: bookkeeping that reported
    /// the highest landed index, so a hole read as success).
    pub hole_every: Option<u32>,
    /// Every n-th submit stops after half its programs and returns success with the honest
    /// task counter (what a kernel that copies the PC's task count reports).
    pub short_count_every: Option<u32>,
}

impl SimFaults {
    /// Parses `efault_after_mb:N`, `timeout_every:N`, `reset_every:N`, `sync_fail_every:N`,
    /// `never_run_every:N`, `hole_every:N`, `short_count_every:N`, separated by `,` or `|`.
    pub fn parse(s: &str) -> Result<SimFaults, KifError> {
        let mut f = SimFaults::default();
        for item in s.split([',', '|']).map(str::trim).filter(|x| !x.is_empty()) {
            let (key, val) = item
                .split_once(':')
                .ok_or_else(|| KifError::Invalid(format!("ORK_SIM_FAULT: `{item}` is not key:N")))?;
            let n: u64 = val
                .trim()
                .parse()
                .map_err(|_| KifError::Invalid(format!("ORK_SIM_FAULT: `{val}` is not a number")))?;
            match key.trim() {
                "efault_after_mb" => f.efault_after_bytes = Some(n << 20),
                "timeout_every" => f.timeout_every = Some(n.max(1) as u32),
                "reset_every" => f.reset_every = Some(n.max(1) as u32),
                "sync_fail_every" => f.sync_fail_every = Some(n.max(1) as u32),
                "never_run_every" => f.never_run_every = Some(n.max(1) as u32),
                "hole_every" => f.hole_every = Some(n.max(1) as u32),
                "short_count_every" => f.short_count_every = Some(n.max(1) as u32),
                other => return Err(KifError::Invalid(format!("ORK_SIM_FAULT: unknown key `{other}`"))),
            }
        }
        Ok(f)
    }
}

/// Device memory of one BO: an anonymous mapping of its own (page-aligned, zeroed by the kernel),
/// freed when the last owner (the BO's mapping or the simulator's IOVA map) lets go.
///
/// The pages are allocated when the BO is created, as the vendor driver's MEM_CREATE allocates
/// the backing pages in the ioctl: `MADV_POPULATE_WRITE` (Linux ≥ 5.14) faults the whole range in
/// with one call instead of one page fault per 4 KiB page at the first CPU write (measured in
/// this workplace, C microbenchmark, 300 MB in 768 KiB buffers: fresh mapping + copy 220–280 ms
/// with lazy faults, 130–170 ms populated; the copy alone into memory already faulted in takes
/// ~32 ms, so page allocation is most of an import). It is advice; a kernel without it leaves
/// lazily faulted pages, which behave the same. Transparent huge pages (`MADV_HUGEPAGE`) were
/// tried and dropped: with the common `defrag=madvise` setting the fault path compacts memory
/// synchronously and a warm load took over a second in 3 of 3 runs.
struct SimMem {
    ptr: *mut u8,
    _map: memmap2::MmapMut,
}

// SAFETY: the block is a private anonymous mapping; access discipline is the device-buffer
// contract (the owner of a `Bo` writes through `&mut Bo`, the simulator during a submit).
unsafe impl Send for SimMem {}
// SAFETY: as above; shared references only read the pointer value.
unsafe impl Sync for SimMem {}

impl SimMem {
    fn new(size: usize) -> Result<SimMem, KifError> {
        let mut map = memmap2::MmapMut::map_anon(size)
            .map_err(|e| KifError::Invalid(format!("sim: host out of memory for a {size}-byte BO ({e})")))?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::PopulateWrite);
        let ptr = map.as_mut_ptr();
        Ok(SimMem { ptr, _map: map })
    }
}

struct SimBo {
    size: u64,
    flags: u32,
    mem: Arc<SimMem>,
}

#[derive(Default)]
struct DomainMap {
    /// Live BOs by IOVA start.
    bos: BTreeMap<u64, SimBo>,
    used_bytes: u64,
}

impl DomainMap {
    /// Highest page-aligned gap of `size` bytes below `top` (top-down allocation).
    fn find_gap(&self, size: u64, top: u64) -> Option<u64> {
        let mut ceiling = top;
        for (&start, bo) in self.bos.iter().rev() {
            let end = start + bo.size;
            if end <= ceiling && ceiling - end >= size {
                return Some(ceiling - size);
            }
            ceiling = ceiling.min(start);
        }
        (ceiling >= IOVA_FLOOR + size).then(|| ceiling - size)
    }

}

impl DeviceMemory for DomainMap {
    fn resolve(&self, iova: u64, len: u64) -> Option<*mut u8> {
        let (&start, bo) = self.bos.range(..=iova).next_back()?;
        let off = iova - start;
        // SAFETY: `off + len ≤ bo.size` (checked first), so the pointer stays inside the block.
        (off + len <= bo.size).then(|| unsafe { bo.mem.ptr.add(off as usize) })
    }
}

#[derive(Default)]
struct State {
    domains: HashMap<u32, DomainMap>,
    /// handle → (domain, IOVA start).
    handles: HashMap<u32, (u32, u64)>,
}

/// The simulator.
pub struct SimKif {
    soc: SocDesc,
    window_bytes: u64,
    state: RwLock<State>,
    faults: Mutex<SimFaults>,
    next_handle: AtomicU32,
    submits: AtomicU64,
    syncs: AtomicU64,
    programs_run: AtomicU64,
    injected: Mutex<InjectedCounts>,
    /// `ORK_SIM_TIMING=board`: programs are not computed (only each program's last output word
    /// is written) and each submit completes at the hardware time [`crate::npu::soc::NpuTiming`]
    /// models for it, reported as its `hw_elapse_ns`.
    board_timing: AtomicBool,
}

impl SimKif {
    /// A simulator of `soc` with the SoC's IOVA window per domain; faults from `fault_spec` (the
    /// value of `ORK_SIM_FAULT`, [`SimFaults::parse`]; None or blank = none).
    pub fn new(soc: SocDesc, fault_spec: Option<&str>) -> Result<SimKif, KifError> {
        let faults = match fault_spec {
            Some(s) if !s.trim().is_empty() => SimFaults::parse(s)?,
            _ => SimFaults::default(),
        };
        Ok(SimKif::with_faults(soc, faults))
    }

    pub fn with_faults(soc: SocDesc, faults: SimFaults) -> SimKif {
        let window_bytes = soc.iova_window_bytes.min(IOVA_TOP);
        SimKif {
            soc,
            window_bytes,
            state: RwLock::new(State::default()),
            faults: Mutex::new(faults),
            next_handle: AtomicU32::new(1),
            submits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            programs_run: AtomicU64::new(0),
            injected: Mutex::new(InjectedCounts::default()),
            board_timing: AtomicBool::new(false),
        }
    }

    /// Turns the board timing on or off (`ORK_SIM_TIMING`).
    pub fn set_board_timing(&self, on: bool) {
        self.board_timing.store(on, Ordering::Relaxed);
    }

    /// Replaces the injected faults (tests).
    pub fn set_faults(&self, f: SimFaults) {
        *self.faults.lock().unwrap() = f;
    }

    /// Bytes currently mapped in `domain`.
    pub fn domain_used_bytes(&self, domain: DomainId) -> u64 {
        self.state.read().unwrap().domains.get(&domain.0).map_or(0, |d| d.used_bytes)
    }

    /// Number of live BOs (all domains).
    pub fn live_bos(&self) -> usize {
        self.state.read().unwrap().handles.len()
    }

    /// Submits seen so far.
    pub fn submits(&self) -> u64 {
        self.submits.load(Ordering::Relaxed)
    }

    /// Programs executed so far.
    pub fn programs_run(&self) -> u64 {
        self.programs_run.load(Ordering::Relaxed)
    }

    /// Faults injected so far, by kind.
    pub fn injected(&self) -> InjectedCounts {
        *self.injected.lock().unwrap()
    }
}

/// An error of the model: something the registers describe that the simulator does not model
/// or that the hardware would not do correctly.
fn unmodelled(what: String) -> KifError {
    KifError::Invalid(format!("sim: {what}"))
}

/// A submit-time fault to inject.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Injected {
    /// Half the programs run, then a timeout error.
    Timeout,
    /// Half the programs run, then a reset error.
    Reset,
    /// Success reported, nothing ran, counter = task_number.
    NeverRun,
    /// Success reported, one program skipped, counter = task_number.
    Hole,
    /// Success reported after half the programs, counter = what ran.
    Short,
}

/// How many faults of each kind the simulator injected (see [`SimKif::injected`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InjectedCounts {
    pub timeouts: u64,
    pub resets: u64,
    pub never_run: u64,
    pub holes: u64,
    pub short_counts: u64,
    pub sync_fails: u64,
}

impl KernelInterface for SimKif {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn describe(&self) -> String {
        format!("sim ({}, {} cores, {} MiB IOVA window per domain)", self.soc.id.name(), self.soc.cores, self.window_bytes >> 20)
    }

    fn mem_create(&self, size_bytes: usize, flags: u32, domain: DomainId) -> Result<Bo, KifError> {
        if domain.0 >= MAX_DOMAINS {
            return Err(KifError::Invalid(format!("sim mem_create: domain {} ≥ {MAX_DOMAINS}", domain.0)));
        }
        if size_bytes == 0 {
            return Err(KifError::Invalid("sim mem_create: size 0".into()));
        }
        let size = page_round(size_bytes) as u64;
        let limit = self.faults.lock().unwrap().efault_after_bytes;
        // Pages first, outside the state lock (submits on other cores keep running meanwhile).
        let mem = Arc::new(SimMem::new(size as usize)?);
        let mut st = self.state.write().unwrap();
        let dm = st.domains.entry(domain.0).or_default();
        if limit.is_some_and(|l| dm.used_bytes + size > l) {
            return Err(KifError::Fault { op: "mem_create", domain: domain.0 });
        }
        let iova = dm.find_gap(size, self.window_bytes).ok_or(KifError::Fault { op: "mem_create", domain: domain.0 })?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        dm.bos.insert(iova, SimBo { size, flags, mem: mem.clone() });
        dm.used_bytes += size;
        st.handles.insert(handle, (domain.0, iova));
        let ptr = mem.ptr;
        // SAFETY: `ptr` points to `size` zeroed bytes owned by `mem`, which the Bo keeps alive
        // (and the IOVA map keeps alive until mem_destroy).
        let bo = unsafe {
            Bo::from_raw(handle, OBJ_ADDR_TAG | u64::from(handle), Iova(iova as u32), size as usize, domain, ptr, Box::new(mem))
        };
        log::trace!("sim mem_create {bo:?} flags={flags:#x}");
        Ok(bo)
    }

    fn mem_sync(&self, bo: &Bo, _dir: SyncDir, offset: usize, len: usize) -> Result<usize, KifError> {
        super::check_sync_range("sim mem_sync", bo, offset, len)?;
        let st = self.state.read().unwrap();
        let &(d, iova) = st
            .handles
            .get(&bo.handle)
            .ok_or_else(|| KifError::Invalid(format!("sim mem_sync: handle {} is not live", bo.handle)))?;
        let sb = &st.domains[&d].bos[&iova];
        if sb.flags & mem_flags::CACHEABLE == 0 {
            // The vendor kernel refuses SYNC on objects created without CACHEABLE (S4).
            return Err(KifError::Invalid(format!("sim mem_sync: handle {} is not CACHEABLE (EINVAL)", bo.handle)));
        }
        let nth = self.syncs.fetch_add(1, Ordering::Relaxed) + 1;
        if self.faults.lock().unwrap().sync_fail_every.is_some_and(|e| nth % e as u64 == 0) {
            self.injected.lock().unwrap().sync_fails += 1;
            return Err(KifError::Sys { op: "sim mem_sync (injected)", source: nix::Error::EIO });
        }
        // The arena is coherent (the fake kernel models the caches); the bytes are what a
        // board's CPU would maintain: whole lines.
        let (start, end) = super::line_span(offset, len, bo.size_bytes);
        Ok(end - start)
    }

    fn mem_destroy(&self, bo: Bo) -> Result<(), KifError> {
        let mut st = self.state.write().unwrap();
        let (d, iova) = st
            .handles
            .remove(&bo.handle)
            .ok_or_else(|| KifError::Invalid(format!("sim mem_destroy: handle {} is not live", bo.handle)))?;
        let dm = st.domains.get_mut(&d).expect("domain of a live handle");
        let sb = dm.bos.remove(&iova).expect("BO of a live handle");
        dm.used_bytes -= sb.size;
        Ok(())
    }

    fn submit(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError> {
        let t0 = Instant::now();
        let n = self.submits.fetch_add(1, Ordering::Relaxed) + 1;
        let injected = {
            let f = self.faults.lock().unwrap();
            let hit = |every: Option<u32>| every.is_some_and(|t| n % u64::from(t) == 0);
            [
                (f.timeout_every, Injected::Timeout),
                (f.reset_every, Injected::Reset),
                (f.never_run_every, Injected::NeverRun),
                (f.hole_every, Injected::Hole),
                (f.short_count_every, Injected::Short),
            ]
            .into_iter()
            .find(|(every, _)| hit(*every))
            .map(|(_, kind)| kind)
        };
        let st = self.state.read().unwrap();
        let dm = st
            .domains
            .get(&job.domain.0)
            .ok_or_else(|| KifError::Invalid(format!("sim submit: domain {} has no buffers", job.domain.0)))?;
        let all_cores = (1u32 << self.soc.cores) - 1;
        if job.core_mask & !all_cores != 0 || job.core_mask.count_ones() > 1 {
            return Err(KifError::Invalid(format!("sim submit: core_mask {:#x} (one core of {all_cores:#x} expected)", job.core_mask)));
        }
        if job.task_number == 0 {
            return Err(KifError::Invalid("sim submit: task_number 0 (EINVAL)".into()));
        }
        // The task array, through the task BO's kernel mapping.
        let (&(td, tiova), task_bo) = st
            .handles
            .get(&job.task_bo.handle)
            .map(|h| (h, job.task_bo))
            .ok_or_else(|| KifError::Invalid("sim submit: task BO is not live".into()))?;
        if td != job.domain.0 {
            return Err(KifError::Invalid(format!("sim submit: task BO in domain {td}, job in {}", job.domain.0)));
        }
        let tsb = &dm.bos[&tiova];
        if tsb.flags & mem_flags::KERNEL_MAPPING == 0 {
            return Err(KifError::Invalid("sim submit: task BO lacks KERNEL_MAPPING (the kernel cannot read it)".into()));
        }
        let tasks = super::read_tasks(task_bo.bytes(), job.task_start, job.task_number)?;

        if let Some(kind) = injected {
            let mut c = self.injected.lock().unwrap();
            match kind {
                Injected::Timeout => c.timeouts += 1,
                Injected::Reset => c.resets += 1,
                Injected::NeverRun => c.never_run += 1,
                Injected::Hole => c.holes += 1,
                Injected::Short => c.short_counts += 1,
            }
        }
        if injected == Some(Injected::NeverRun) {
            // The ioctl returns success; the hardware never started.
            return Ok(SubmitDone { hw_elapse_ns: 0, task_counter: job.task_number, synced_bytes: 0 });
        }
        // Injected faults run only part of the job (a hole: all but one program).
        let budget = match injected {
            Some(Injected::Timeout | Injected::Reset | Injected::Short) => (job.task_number / 2) as usize,
            _ => usize::MAX,
        };
        let skip = (injected == Some(Injected::Hole)).then_some(job.task_number as usize / 2);
        let (mut index, mut skipped) = (0usize, 0usize);
        let timed = self.board_timing.load(Ordering::Relaxed);
        let (timing, cores) = (self.soc.timing, self.soc.cores);
        let mut modelled = 0f64;
        let fetched = execute_tasks(&self.soc, dm, &tasks, budget, job.timeout_ms, &mut |t| {
            let run = skip != Some(index);
            index += 1;
            if !run {
                skipped += 1;
                return Exec::Skip;
            }
            if timed {
                modelled += timing.program_ns(t.mc, t.k, t.n, cores);
                Exec::Land
            } else {
                Exec::Run
            }
        })?;
        let ran = fetched - skipped;
        self.programs_run.fetch_add(ran as u64, Ordering::Relaxed);
        match injected {
            Some(Injected::Timeout) => return Err(KifError::Timeout { timeout_ms: job.timeout_ms }),
            Some(Injected::Reset) => return Err(KifError::Reset),
            _ => {}
        }
        // The counter says what ran, except where the modelled kernel's bookkeeping lies (a hole).
        let task_counter = if injected == Some(Injected::Hole) { job.task_number } else { ran as u32 };
        if timed {
            // Complete at the modelled time: the caller waits as long as a board's core would.
            drop(st);
            let hw = timing.submit_ns(modelled);
            let end = t0 + std::time::Duration::from_nanos(hw);
            tight_timer();
            std::thread::sleep(end.saturating_duration_since(Instant::now()).saturating_sub(POLL_BEFORE_END));
            while Instant::now() < end {
                std::thread::yield_now();
            }
            return Ok(SubmitDone { hw_elapse_ns: hw, task_counter, synced_bytes: 0 });
        }
        Ok(SubmitDone { hw_elapse_ns: t0.elapsed().as_nanos() as u64, task_counter, synced_bytes: 0 })
    }

    fn reset(&self) -> Result<(), KifError> {
        Ok(())
    }

    fn fault_report(&self) -> Option<String> {
        if *self.faults.lock().unwrap() == SimFaults::default() {
            return None;
        }
        let c = self.injected();
        Some(format!(
            "sim fault injection (ORK_SIM_FAULT): {} submits never ran, {} holes, {} short task counts, {} timeouts, {} resets, {} failed syncs injected",
            c.never_run, c.holes, c.short_counts, c.timeouts, c.resets, c.sync_fails
        ))
    }
}

/// Fields the model does not compute with but whose other values would change the result on
/// hardware (or whose meaning is unknown): each must hold the one value modelled — what ork's
/// int8 template writes (rknpu-facts §2.2) — or the program is refused. Unwritten reads as 0.
pub const PINNED: &[(&regs::RegDef, regs::Field, u64, &str)] = {
    use regs::*;
    &[
        (&CNA_FC_CON1::REG, CNA_FC_CON1::DATA_OFFSET, 0, "no feature data offset"),
        (&CNA_FC_CON2::REG, CNA_FC_CON2::WEIGHT_OFFSET, 0, "no weight offset"),
        (&CNA_CVT_CON5::REG, CNA_CVT_CON5::PER_CHANNEL_CVT_EN, 0, "no per-channel input conversion"),
        (&CNA_CBUF_CON0::REG, CNA_CBUF_CON0::DATA_REUSE, 0, "no CBUF data reuse from the previous program"),
        (&CNA_CBUF_CON0::REG, CNA_CBUF_CON0::WEIGHT_REUSE, 0, "no CBUF weight reuse from the previous program"),
        (&CNA_CBUF_CON0::REG, CNA_CBUF_CON0::FC_DATA_BANK, 0, "no FC data bank"),
        (&CNA_DATA_SIZE3::REG, CNA_DATA_SIZE3::SURF_MODE, 0, "ork's flat layout"),
        (&CNA_CONV_CON2::REG, CNA_CONV_CON2::KERNEL_GROUP, 0, "one kernel group"),
        (&CORE_MISC_CFG::REG, CORE_MISC_CFG::DW_EN, 0, "no depthwise convolution"),
        (&DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::TP_EN, 0, "no transposed output"),
        (&DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::COMB_USE, 0, "no combined use"),
        (&DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::NONALIGN, 0, "aligned output"),
        (&DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::RGP_TYPE, 0, "no regroup"),
        (&DPU_DATA_FORMAT::REG, DPU_DATA_FORMAT::MC_SURF_OUT, 0, "one output surface"),
        (&DPU_BS_OW_CFG::REG, DPU_BS_OW_CFG::OD_BYPASS, 0, "ork's int32 write-out"),
        (&DPU_BS_OW_CFG::REG, DPU_BS_OW_CFG::OW_SRC, 0, "ork's int32 write-out"),
        (&DPU_BS_OW_CFG::REG, DPU_BS_OW_CFG::TP_ORG_EN, 0, "no transposed output"),
        (&DPU_BS_OW_CFG::REG, DPU_BS_OW_CFG::RGP_CNTER, 0, "no regroup"),
        (&DPU_BS_OW_OP::REG, DPU_BS_OW_OP::OW_OP, 0, "no write-out operation"),
        (&DPU_WDMA_SIZE_0::REG, DPU_WDMA_SIZE_0::TP_PRECISION, 0, "no transposed output"),
        (&DPU_WDMA_SIZE_0::REG, DPU_WDMA_SIZE_0::SIZE_C_WDMA, 0, "ork's flat output"),
        (&DPU_DATA_CUBE_HEIGHT::REG, DPU_DATA_CUBE_HEIGHT::MINMAX_CTL, 0, "no min/max"),
        (&DPU_OUT_CVT_SHIFT::REG, DPU_OUT_CVT_SHIFT::CVT_TYPE, 0, "identity OUT_CVT"),
        (&DPU_OUT_CVT_SHIFT::REG, DPU_OUT_CVT_SHIFT::CVT_ROUND, 0, "identity OUT_CVT"),
        (&DPU_OUT_CVT_SHIFT::REG, DPU_OUT_CVT_SHIFT::MINUS_EXP, 0, "identity OUT_CVT"),
        (&DPU_OFFSET_PEND::REG, DPU_OFFSET_PEND::OFFSET_PEND, 0, "meaning unknown; ork writes 0"),
        (&CORE_UNK_3030::REG, CORE_UNK_3030::VALUE, 0, "undocumented; Mesa and mtx512 write 0"),
        (&DPU_UNK_40C4::REG, DPU_UNK_40C4::VALUE, 0, "undocumented; Mesa and mtx512 write 0"),
    ]
};

/// Registers of the table whose values the model reads through [`SimKif::decode_matmul`]
/// (whole or in part, with [`PINNED`] for the rest of their result-changing fields), or
/// through the PC fetch (chain link, kick).
pub const CHECKED: &[&regs::RegDef] = {
    use regs::*;
    &[
        &PC_BASE_ADDRESS::REG, &PC_REGISTER_AMOUNTS::REG, &PC_OPERATION_ENABLE::REG, &OP41_UNK_0000::REG,
        &CNA_CONV_CON1::REG, &CNA_CONV_CON2::REG, &CNA_CONV_CON3::REG, &CNA_DATA_SIZE0::REG, &CNA_DATA_SIZE1::REG,
        &CNA_DATA_SIZE2::REG, &CNA_DATA_SIZE3::REG, &CNA_WEIGHT_SIZE0::REG, &CNA_WEIGHT_SIZE1::REG,
        &CNA_WEIGHT_SIZE2::REG, &CNA_CBUF_CON0::REG, &CNA_CVT_CON0::REG, &CNA_FC_CON0::REG, &CNA_FC_CON1::REG,
        &CNA_PAD_CON0::REG, &CNA_FEATURE_DATA_ADDR::REG, &CNA_FC_CON2::REG, &CNA_DMA_CON1::REG, &CNA_DMA_CON2::REG,
        &CNA_FC_DATA_SIZE0::REG, &CNA_FC_DATA_SIZE1::REG, &CNA_DCOMP_CTRL::REG, &CNA_DCOMP_ADDR0::REG,
        &CNA_CVT_CON5::REG, &CORE_MISC_CFG::REG, &CORE_DATAOUT_SIZE_0::REG, &CORE_DATAOUT_SIZE_1::REG,
        &CORE_CLIP_TRUNCATE::REG, &CORE_UNK_3030::REG, &DPU_FEATURE_MODE_CFG::REG, &DPU_DATA_FORMAT::REG,
        &DPU_OFFSET_PEND::REG, &DPU_DST_BASE_ADDR::REG, &DPU_DST_SURF_STRIDE::REG, &DPU_DATA_CUBE_WIDTH::REG,
        &DPU_DATA_CUBE_HEIGHT::REG, &DPU_DATA_CUBE_NOTCH_ADDR::REG, &DPU_DATA_CUBE_CHANNEL::REG, &DPU_BS_CFG::REG,
        &DPU_BS_OW_CFG::REG, &DPU_BS_OW_OP::REG, &DPU_WDMA_SIZE_0::REG, &DPU_WDMA_SIZE_1::REG, &DPU_BN_CFG::REG,
        &DPU_EW_CFG::REG, &DPU_OUT_CVT_OFFSET::REG, &DPU_OUT_CVT_SCALE::REG, &DPU_OUT_CVT_SHIFT::REG,
        &DPU_SURFACE_ADD::REG, &DPU_UNK_40C4::REG, &DPU_RDMA_RDMA_S_POINTER::REG,
    ]
};

/// Registers of the table whose values the model does not read, each with why the hardware
/// ignores it for this operation (an int8 matmul with every DPU stage bypassed) or why it
/// cannot change the result. Reserved bits are refused in these too.
pub const IGNORED: &[(&regs::RegDef, &str)] = {
    use regs::*;
    const CVT: &str = "input converter bypassed (CNA_CVT_CON0.CVT_BYPASS = 1 is checked)";
    const DCOMP: &str = "weight decompression off (CNA_DCOMP_CTRL.DECOMP_CONTROL = 0 is checked)";
    const BS: &str = "BS stage bypassed (DPU_BS_CFG.BS_BYPASS = 1 is checked)";
    const BN: &str = "BN stage bypassed (DPU_BN_CFG.BN_BYPASS = 1 is checked)";
    const EW: &str = "EW stage, its LUT included, bypassed (DPU_EW_CFG.EW_BYPASS = 1 is checked)";
    &[
        (&CNA_CBUF_CON1::REG, "CBUF data entries: scheduling (rknpu-facts §2.3); the CBUF capacity is checked from CNA_CBUF_CON0"),
        (&CNA_CVT_CON1::REG, CVT), (&CNA_CVT_CON2::REG, CVT), (&CNA_CVT_CON3::REG, CVT), (&CNA_CVT_CON4::REG, CVT),
        (&CNA_DMA_CON0::REG, "DMA burst lengths and the 4K-crossing bypass: bus efficiency, not data"),
        (&CNA_DCOMP_REGNUM::REG, DCOMP),
        (&CNA_DCOMP_AMOUNT0::REG, DCOMP), (&CNA_DCOMP_AMOUNT1::REG, DCOMP), (&CNA_DCOMP_AMOUNT2::REG, DCOMP),
        (&CNA_DCOMP_AMOUNT3::REG, DCOMP), (&CNA_DCOMP_AMOUNT4::REG, DCOMP), (&CNA_DCOMP_AMOUNT5::REG, DCOMP),
        (&CNA_DCOMP_AMOUNT6::REG, DCOMP), (&CNA_DCOMP_AMOUNT7::REG, DCOMP), (&CNA_DCOMP_AMOUNT8::REG, DCOMP),
        (&CNA_DCOMP_AMOUNT9::REG, DCOMP), (&CNA_DCOMP_AMOUNT10::REG, DCOMP), (&CNA_DCOMP_AMOUNT11::REG, DCOMP),
        (&CNA_DCOMP_AMOUNT12::REG, DCOMP), (&CNA_DCOMP_AMOUNT13::REG, DCOMP), (&CNA_DCOMP_AMOUNT14::REG, DCOMP),
        (&CNA_DCOMP_AMOUNT15::REG, DCOMP),
        (&CNA_PAD_CON1::REG, "pad value: no padding (CNA_PAD_CON0 PAD_TOP = PAD_LEFT = 0 is checked)"),
        (&DPU_S_POINTER::REG, "DPU ping-pong register-set pointer: which copy of the registers, not their values"),
        (&DPU_BS_ALU_CFG::REG, BS), (&DPU_BS_MUL_CFG::REG, BS), (&DPU_BS_RELUX_CMP_VALUE::REG, BS),
        (&DPU_BN_ALU_CFG::REG, BN), (&DPU_BN_MUL_CFG::REG, BN), (&DPU_BN_RELUX_CMP_VALUE::REG, BN),
        (&DPU_EW_CVT_OFFSET_VALUE::REG, EW), (&DPU_EW_CVT_SCALE_VALUE::REG, EW), (&DPU_EW_RELUX_CMP_VALUE::REG, EW),
        (&DPU_EW_OP_VALUE_0::REG, EW), (&DPU_EW_OP_VALUE_1::REG, EW), (&DPU_EW_OP_VALUE_2::REG, EW),
        (&DPU_EW_OP_VALUE_3::REG, EW), (&DPU_EW_OP_VALUE_4::REG, EW), (&DPU_EW_OP_VALUE_5::REG, EW),
        (&DPU_EW_OP_VALUE_6::REG, EW), (&DPU_EW_OP_VALUE_7::REG, EW),
        (&DPU_LUT_ACCESS_CFG::REG, EW), (&DPU_LUT_ACCESS_DATA::REG, EW), (&DPU_LUT_CFG::REG, EW), (&DPU_LUT_INFO::REG, EW),
        (&DPU_LUT_LE_START::REG, EW), (&DPU_LUT_LE_END::REG, EW), (&DPU_LUT_LO_START::REG, EW), (&DPU_LUT_LO_END::REG, EW),
        (&DPU_LUT_LE_SLOPE_SCALE::REG, EW), (&DPU_LUT_LE_SLOPE_SHIFT::REG, EW), (&DPU_LUT_LO_SLOPE_SCALE::REG, EW),
        (&DPU_LUT_LO_SLOPE_SHIFT::REG, EW),
    ]
};

/// Reads a register that the operation depends on; unwritten is an error.
fn req(rf: &RegFile, reg: &regs::RegDef) -> Result<u32, KifError> {
    rf.get(reg).ok_or_else(|| unmodelled(format!("{} read by the operation but never written", reg.name)))
}

/// Checks `field` of `reg` equals `want` (natural units).
fn expect(rf: &RegFile, reg: &regs::RegDef, field: regs::Field, want: u64, what: &str) -> Result<(), KifError> {
    let got = field.decode(req(rf, reg)?);
    if got != want {
        return Err(unmodelled(format!("{}.{} = {got}, only {want} is modelled ({what})", reg.name, field.name)));
    }
    Ok(())
}

/// The decoded matmul a kick describes.
#[derive(Debug)]
struct MatmulOp {
    mc: u64,
    k: u64,
    n: u64,
    s: u64,
    a: u64,
    b: u64,
    c: u64,
}

impl MatmulOp {
    /// Bytes written from C: `mc` rows of `n` int32 at a row stride of `s` elements.
    fn c_len(&self) -> u64 {
        ((self.mc - 1) * self.s + self.n) * 4
    }
}

/// Device memory of one address space, as the datapath reads and writes it: the simulator's
/// domain maps, or the fake kernel's buffer objects (`fake-kernel/`).
pub trait DeviceMemory {
    /// CPU address of `[iova, iova + len)` when the whole range lies inside one live buffer.
    /// The pointer must stay valid (and the buffer alive) while the caller holds `&self`.
    fn resolve(&self, iova: u64, len: u64) -> Option<*mut u8>;
}

/// One decoded program, shown to the hook of [`execute_tasks`] before it runs.
#[derive(Clone, Copy, Debug)]
pub struct ProgramTrace {
    /// Output (DPU DST_BASE_ADDR) IOVA and the bytes the program writes from there.
    pub c_iova: u64,
    pub c_len: u64,
    /// The program's matmul: rows, K, N.
    pub mc: u64,
    pub k: u64,
    pub n: u64,
}

/// What the hook of [`execute_tasks`] decides for a decoded program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exec {
    /// Compute and write the output.
    Run,
    /// Decode, count, but write nothing (a board quirk: the output keeps stale bytes).
    Skip,
    /// Decode, count and write only the program's last output word (zero) instead of computing
    /// (the timed simulator, `ORK_SIM_TIMING=board`): the word the matmul writes last (rknpu-facts
    /// §2.5), so the host's never-ran check sees every program land, and nothing of the output
    /// costs this machine's CPU what a board's NPU would write for free. The other output bytes
    /// keep whatever they held.
    Land,
}

/// The PC of one core running a job: `tasks` as the vendor kernel programs them (§1.5: only the
/// first task of each sub-submit of at most `soc.max_submit_tasks` starts the PC; later programs
/// are reached through the in-stream chain links), at most `budget` programs. Returns the number
/// of programs executed (the PC task counter). A chain that ends early is a timeout.
pub fn execute_tasks(soc: &SocDesc, mem: &dyn DeviceMemory, tasks: &[RknpuTask], budget: usize, timeout_ms: u32, hook: &mut dyn FnMut(&ProgramTrace) -> Exec) -> Result<usize, KifError> {
    let mut ran = 0usize;
    let mut rf = RegFile::default();
    let max_sub = soc.max_submit_tasks.max(1) as usize;
    'outer: for chunk in tasks.chunks(max_sub) {
        let t = chunk[0];
        let regcfg_amount = t.regcfg_amount;
        let mut amount = regcmd::register_amounts(regcfg_amount, soc.pc_data_amount_scale);
        let mut addr = t.regcmd_addr;
        if addr > u64::from(u32::MAX) || addr % 16 != 0 {
            return Err(unmodelled(format!("task regcmd_addr {addr:#x} is not a 16-byte aligned 32-bit IOVA")));
        }
        for i in 0..chunk.len() {
            if ran >= budget {
                break 'outer;
            }
            let link = run_program(soc, mem, &mut rf, addr, amount, hook)?;
            ran += 1;
            if i + 1 < chunk.len() {
                match link {
                    Some((next, next_amount)) => {
                        addr = u64::from(next);
                        amount = next_amount;
                    }
                    None => {
                        log::warn!("sim: chain ended after {ran} of {} programs", tasks.len());
                        return Err(KifError::Timeout { timeout_ms });
                    }
                }
            }
        }
    }
    Ok(ran)
}

/// Fetches and executes one program; returns the chain link it programmed, if any. The
/// hook sees each decoded program first; with [`Exec::Skip`] it is decoded and checked but
/// its matmul is not computed (an injected hole, a cold output buffer).
fn run_program(soc: &SocDesc, mem: &dyn DeviceMemory, rf: &mut RegFile, addr: u64, amount: u32, hook: &mut dyn FnMut(&ProgramTrace) -> Exec) -> Result<Option<(u32, u32)>, KifError> {
    let entries = (u64::from(amount) + 1) * u64::from(soc.pc_data_amount_scale);
    let ptr = mem
        .resolve(addr, entries * 8)
        .ok_or_else(|| unmodelled(format!("regcmd fetch {addr:#x}+{} is outside every live BO", entries * 8)))?;
    // SAFETY: `resolve` checked that `entries*8` bytes from `ptr` lie inside one live buffer.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, (entries * 8) as usize) };
    let stream = regcmd::from_bytes(bytes);
    rf.clear(&regs::PC_BASE_ADDRESS::REG);
    rf.clear(&regs::PC_REGISTER_AMOUNTS::REG);
    let mut prev: Option<RegCmd> = None;
    let mut kicked = false;
    for e in stream {
        if e.is_nop() {
            continue;
        }
        let Some(reg) = rf.apply(e) else {
            return Err(unmodelled(format!("write to a register outside the table: {e}")));
        };
        let reserved = e.value() & reg.reserved_mask();
        if reserved != 0 {
            return Err(unmodelled(format!("{}: reserved bits {reserved:#x} set in {:#010x} (not modelled)", reg.name, e.value())));
        }
        match reg.block {
            Block::OpEnable => {
                if prev.map(|p| p.target_op()) != Some(regs::TARGET_OP_41) {
                    return Err(unmodelled("kick without the preceding 0x0041 word".into()));
                }
                if e.value() != regcmd::OP_ENABLE_MATMUL {
                    return Err(unmodelled(format!("operation enable {:#x}: only CNA+CORE+DPU (0x0d) is modelled", e.value())));
                }
                let op = decode_matmul(soc, rf)?;
                let trace = ProgramTrace { c_iova: op.c, c_len: op.c_len(), mc: op.mc, k: op.k, n: op.n };
                match hook(&trace) {
                    Exec::Run => execute(mem, &op)?,
                    Exec::Land => land_output(mem, &op)?,
                    Exec::Skip => {}
                }
                kicked = true;
            }
            Block::Op41 if e.value() != 0 => return Err(unmodelled(format!("0x0041 word with value {:#x}", e.value()))),
            Block::DpuRdma => return Err(unmodelled(format!("DPU_RDMA programming ({e}) is not modelled"))),
            _ => {}
        }
        prev = Some(e);
    }
    if !kicked {
        return Err(unmodelled(format!("program at {addr:#x} has no operation-enable kick")));
    }
    let amount = rf.get(&regs::PC_REGISTER_AMOUNTS::REG).map(|v| regs::PC_REGISTER_AMOUNTS::PC_DATA_AMOUNT.decode(v));
    let base = rf.get(&regs::PC_BASE_ADDRESS::REG).map(|v| regs::PC_BASE_ADDRESS::PC_SOURCE_ADDR.decode(v));
    Ok(match (base, amount) {
        (Some(b), Some(a)) if a != 0 => Some((b as u32, a as u32)),
        _ => None,
    })
}

/// Decodes the register file into the one operation the simulator models, refusing
/// everything else.
fn decode_matmul(soc: &SocDesc, rf: &RegFile) -> Result<MatmulOp, KifError> {
    use regs::*;
    // Input side (CNA).
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::CONV_MODE, 0, "direct convolution")?;
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::IN_PRECISION, 0, "int8 input; fp16/int4 not modelled")?;
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::PROC_PRECISION, 0, "int8 processing")?;
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::DECONV, 0, "no deconvolution")?;
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::ARGB_IN, 0, "no image input")?;
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::NONALIGN_DMA, 0, "aligned DMA")?;
    expect(rf, &CNA_CONV_CON1::REG, CNA_CONV_CON1::GROUP_LINE_OFF, 1, "ork's flat-layout triple")?;
    let con3 = req(rf, &CNA_CONV_CON3::REG)?;
    if con3 != CNA_CONV_CON3::REG.pack(&[(CNA_CONV_CON3::CONV_X_STRIDE, 1), (CNA_CONV_CON3::CONV_Y_STRIDE, 1)]).unwrap() {
        return Err(unmodelled(format!("CNA_CONV_CON3 {con3:#x}: only stride 1×1, no dilation is modelled")));
    }
    expect(rf, &CNA_DATA_SIZE0::REG, CNA_DATA_SIZE0::DATAIN_WIDTH, 1, "matmul as a 1-wide cube")?;
    let mc = rf.field(&CNA_DATA_SIZE0::REG, CNA_DATA_SIZE0::DATAIN_HEIGHT);
    let k = rf.field(&CNA_DATA_SIZE1::REG, CNA_DATA_SIZE1::DATAIN_CHANNEL);
    expect(rf, &CNA_DATA_SIZE1::REG, CNA_DATA_SIZE1::DATAIN_CHANNEL_REAL, k, "real channels = channels")?;
    expect(rf, &CNA_DATA_SIZE2::REG, CNA_DATA_SIZE2::DATAOUT_WIDTH, 1, "1-wide output")?;
    expect(rf, &CNA_DATA_SIZE3::REG, CNA_DATA_SIZE3::DATAOUT_ATOMICS, mc, "atomics = height")?;
    expect(rf, &CNA_WEIGHT_SIZE2::REG, CNA_WEIGHT_SIZE2::WEIGHT_WIDTH, 1, "1×1 kernels")?;
    expect(rf, &CNA_WEIGHT_SIZE2::REG, CNA_WEIGHT_SIZE2::WEIGHT_HEIGHT, 1, "1×1 kernels")?;
    let n = rf.field(&CNA_WEIGHT_SIZE2::REG, CNA_WEIGHT_SIZE2::WEIGHT_KERNELS);
    expect(rf, &CNA_WEIGHT_SIZE1::REG, CNA_WEIGHT_SIZE1::WEIGHT_BYTES_PER_KERNEL, k, "int8 kernels of K bytes")?;
    expect(rf, &CNA_WEIGHT_SIZE0::REG, CNA_WEIGHT_SIZE0::WEIGHT_BYTES, k * n, "K·N weight bytes")?;
    if mc == 0 || k == 0 || n == 0 || k % 32 != 0 || n % 32 != 0 {
        return Err(unmodelled(format!("matmul mc={mc} K={k} N={n}: the tiled layout needs K%32 = N%32 = 0")));
    }
    expect(rf, &CNA_CVT_CON0::REG, CNA_CVT_CON0::CVT_BYPASS, 1, "input converter bypassed")?;
    expect(rf, &CNA_CVT_CON0::REG, CNA_CVT_CON0::DATA_SIGN, 1, "signed int8 input")?;
    expect(rf, &CNA_DCOMP_CTRL::REG, CNA_DCOMP_CTRL::DECOMP_CONTROL, 0, "no weight decompression")?;
    expect(rf, &CNA_PAD_CON0::REG, CNA_PAD_CON0::PAD_TOP, 0, "no padding")?;
    expect(rf, &CNA_PAD_CON0::REG, CNA_PAD_CON0::PAD_LEFT, 0, "no padding")?;
    expect(rf, &CNA_FC_CON0::REG, CNA_FC_CON0::FC_SKIP_EN, 0, "no FC skipping")?;
    expect(rf, &CNA_DMA_CON1::REG, CNA_DMA_CON1::LINE_STRIDE, k / 16, "ork's flat-layout triple (LINE_STRIDE = K/16)")?;
    expect(rf, &CNA_DMA_CON2::REG, CNA_DMA_CON2::SURF_STRIDE, 0, "ork's flat-layout triple")?;
    expect(rf, &CNA_FC_DATA_SIZE0::REG, CNA_FC_DATA_SIZE0::DMA_WIDTH, 1, "1-wide DMA")?;
    expect(rf, &CNA_FC_DATA_SIZE0::REG, CNA_FC_DATA_SIZE0::DMA_HEIGHT, mc, "DMA height = cube height")?;
    expect(rf, &CNA_FC_DATA_SIZE1::REG, CNA_FC_DATA_SIZE1::DMA_CHANNEL, k, "DMA channels = K")?;
    // CBUF: the feature rows and one 32-kernel weight group must fit their banks.
    let data_banks = rf.field(&CNA_CBUF_CON0::REG, CNA_CBUF_CON0::DATA_BANK);
    let weight_banks = rf.field(&CNA_CBUF_CON0::REG, CNA_CBUF_CON0::WEIGHT_BANK);
    let bank = u64::from(soc.cbuf_bank_bytes);
    if data_banks == 0 || weight_banks == 0 || data_banks + weight_banks > u64::from(soc.cbuf_banks) {
        return Err(unmodelled(format!("CBUF split {data_banks} data + {weight_banks} weight banks of {}", soc.cbuf_banks)));
    }
    if mc * k > data_banks * bank {
        return Err(unmodelled(format!("feature cube {mc}×{k} B exceeds {data_banks} CBUF data banks")));
    }
    if 32 * k > weight_banks * bank {
        return Err(unmodelled(format!("a 32-kernel weight group of {} B exceeds {weight_banks} CBUF weight banks", 32 * k)));
    }
    if k > u64::from(soc.fullk_ceiling) {
        return Err(unmodelled(format!("K={k} exceeds the single-program ceiling {} (the hardware wedges)", soc.fullk_ceiling)));
    }
    if n > u64::from(soc.n_max_per_program) {
        return Err(unmodelled(format!("N={n} exceeds {} per program (silently wrong on hardware)", soc.n_max_per_program)));
    }
    // CORE.
    expect(rf, &CORE_MISC_CFG::REG, CORE_MISC_CFG::PROC_PRECISION, 0, "int8 MACs")?;
    expect(rf, &CORE_DATAOUT_SIZE_0::REG, CORE_DATAOUT_SIZE_0::DATAOUT_HEIGHT, mc, "CORE output height")?;
    expect(rf, &CORE_DATAOUT_SIZE_0::REG, CORE_DATAOUT_SIZE_0::DATAOUT_WIDTH, 1, "CORE output width")?;
    expect(rf, &CORE_DATAOUT_SIZE_1::REG, CORE_DATAOUT_SIZE_1::DATAOUT_CHANNEL, n, "CORE output channels")?;
    expect(rf, &CORE_CLIP_TRUNCATE::REG, CORE_CLIP_TRUNCATE::CLIP_TRUNCATE, 0, "no accumulator truncation")?;
    // DPU: write-out of int32, all stages bypassed, identity conversion.
    expect(rf, &DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::FLYING_MODE, 0, "output from CORE")?;
    expect(rf, &DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::OUTPUT_MODE, u64::from(regcmd::DPU_OUTPUT_MODE_CAPTURE), "write to memory")?;
    expect(rf, &DPU_FEATURE_MODE_CFG::REG, DPU_FEATURE_MODE_CFG::CONV_MODE, 0, "direct convolution")?;
    expect(rf, &DPU_DATA_FORMAT::REG, DPU_DATA_FORMAT::OUT_PRECISION, u64::from(regcmd::PRECISION_INT32), "int32 output; int8/int16/fp output conversion not modelled")?;
    expect(rf, &DPU_DATA_FORMAT::REG, DPU_DATA_FORMAT::IN_PRECISION, 0, "int8 input")?;
    expect(rf, &DPU_DATA_FORMAT::REG, DPU_DATA_FORMAT::PROC_PRECISION, 0, "int8 processing")?;
    expect(rf, &DPU_BS_CFG::REG, DPU_BS_CFG::BS_BYPASS, 1, "BS stage bypassed")?;
    expect(rf, &DPU_BN_CFG::REG, DPU_BN_CFG::BN_BYPASS, 1, "BN stage bypassed")?;
    expect(rf, &DPU_EW_CFG::REG, DPU_EW_CFG::EW_BYPASS, 1, "EW stage bypassed")?;
    expect(rf, &DPU_OUT_CVT_OFFSET::REG, DPU_OUT_CVT_OFFSET::OUT_CVT_OFFSET, 0, "identity OUT_CVT")?;
    expect(rf, &DPU_OUT_CVT_SCALE::REG, DPU_OUT_CVT_SCALE::OUT_CVT_SCALE, 1, "identity OUT_CVT")?;
    expect(rf, &DPU_OUT_CVT_SCALE::REG, DPU_OUT_CVT_SCALE::FP32TOFP16_EN, 0, "no fp16 output")?;
    expect(rf, &DPU_OUT_CVT_SHIFT::REG, DPU_OUT_CVT_SHIFT::OUT_CVT_SHIFT, 0, "identity OUT_CVT")?;
    for f in [DPU_BS_OW_CFG::SIZE_E_0, DPU_BS_OW_CFG::SIZE_E_1, DPU_BS_OW_CFG::SIZE_E_2] {
        expect(rf, &DPU_BS_OW_CFG::REG, f, u64::from(regcmd::OW_SIZE_E_INT32), "int32 write-out")?;
    }
    expect(rf, &DPU_SURFACE_ADD::REG, DPU_SURFACE_ADD::SURF_ADD, u64::from(regcmd::SURF_ADD_INT32), "int32 surface")?;
    expect(rf, &DPU_DST_SURF_STRIDE::REG, DPU_DST_SURF_STRIDE::DST_SURF_STRIDE, 1, "ork's flat output")?;
    expect(rf, &DPU_DATA_CUBE_WIDTH::REG, DPU_DATA_CUBE_WIDTH::WIDTH, 1, "1-wide cube")?;
    expect(rf, &DPU_DATA_CUBE_HEIGHT::REG, DPU_DATA_CUBE_HEIGHT::HEIGHT, mc, "DPU height = mc")?;
    expect(rf, &DPU_DATA_CUBE_CHANNEL::REG, DPU_DATA_CUBE_CHANNEL::CHANNEL, n, "DPU channels = N")?;
    let s = rf.field(&DPU_DATA_CUBE_CHANNEL::REG, DPU_DATA_CUBE_CHANNEL::ORIG_CHANNEL);
    let g = u64::from(regcmd::NOTCH_ELEMS_INT32);
    if s < n || s % g != 0 {
        return Err(unmodelled(format!("row stride ORIG_CHANNEL={s} with N={n}")));
    }
    expect(rf, &DPU_DATA_CUBE_NOTCH_ADDR::REG, DPU_DATA_CUBE_NOTCH_ADDR::NOTCH_ADDR_0, n / g, "notch = N in 16-byte groups")?;
    expect(rf, &DPU_DATA_CUBE_NOTCH_ADDR::REG, DPU_DATA_CUBE_NOTCH_ADDR::NOTCH_ADDR_1, s / g, "notch = s in 16-byte groups")?;
    expect(rf, &DPU_WDMA_SIZE_0::REG, DPU_WDMA_SIZE_0::CHANNEL_WDMA, n, "WDMA channels")?;
    expect(rf, &DPU_WDMA_SIZE_1::REG, DPU_WDMA_SIZE_1::HEIGHT_WDMA, mc, "WDMA height")?;
    expect(rf, &DPU_WDMA_SIZE_1::REG, DPU_WDMA_SIZE_1::WIDTH_WDMA, 1, "WDMA width")?;
    for (reg, field, want, what) in PINNED {
        let got = rf.field(reg, *field);
        if got != *want {
            return Err(unmodelled(format!("{}.{} = {got}, only {want} is modelled ({what})", reg.name, field.name)));
        }
    }
    let a = u64::from(req(rf, &CNA_FEATURE_DATA_ADDR::REG)?);
    let b = u64::from(req(rf, &CNA_DCOMP_ADDR0::REG)?);
    let c = u64::from(req(rf, &DPU_DST_BASE_ADDR::REG)?);
    Ok(MatmulOp { mc, k, n, s, a, b, c })
}

/// Writes zero into the last word of a decoded matmul's output range, the word the matmul writes
/// last ([`Exec::Land`]: the timed simulator's stand-in for its result).
fn land_output(mem: &dyn DeviceMemory, op: &MatmulOp) -> Result<(), KifError> {
    let len = op.c_len();
    let cp = mem.resolve(op.c, len).ok_or_else(|| unmodelled(format!("C range {:#x}+{len} is outside every live BO of the domain", op.c)))?;
    // SAFETY: `resolve` checked that `len` (≥ 4: one int32 at least) bytes from `cp` lie inside
    // one live buffer; only its last four are written.
    unsafe { std::ptr::write_bytes(cp.add(len as usize - 4), 0, 4) };
    Ok(())
}

/// Runs one decoded matmul against the domain's memory.
fn execute(mem: &dyn DeviceMemory, op: &MatmulOp) -> Result<(), KifError> {
    let MatmulOp { mc, k, n, s, a, b, c } = *op;
    for (what, addr) in [("A", a), ("B", b), ("C", c)] {
        if addr % 16 != 0 {
            return Err(unmodelled(format!("{what} address {addr:#x} is not 16-byte aligned")));
        }
    }
    let a_len = mc * k;
    let b_len = k * n;
    let c_len = op.c_len();
    let res = |what: &str, addr: u64, len: u64| {
        mem.resolve(addr, len)
            .ok_or_else(|| unmodelled(format!("{what} range {addr:#x}+{len} is outside every live BO of the domain")))
    };
    let ap = res("A", a, a_len)?;
    let bp = res("B", b, b_len)?;
    let cp = res("C", c, c_len)?;
    let overlaps = |x: u64, xl: u64| x < c + c_len && c < x + xl;
    if overlaps(a, a_len) || overlaps(b, b_len) {
        return Err(unmodelled("C overlaps A or B".into()));
    }
    // SAFETY: each range was checked to lie inside its live BO; A and B are only read and
    // do not overlap C, which is the only range written.
    let (av, wv, cv) = unsafe {
        (
            std::slice::from_raw_parts(ap as *const i8, a_len as usize),
            std::slice::from_raw_parts(bp as *const i8, b_len as usize),
            std::slice::from_raw_parts_mut(cp, c_len as usize),
        )
    };
    let out = matmul_tiled(av, wv, mc as usize, k as usize, n as usize);
    let (n, s) = (n as usize, s as usize);
    for (r, row) in out.chunks_exact(n).enumerate() {
        let dst = &mut cv[r * s * 4..r * s * 4 + n * 4];
        for (d, v) in dst.chunks_exact_mut(4).zip(row) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

/// `C[mc][n] = A[mc][k] · Wᵀ` with A row-major int8 and W tiled `[n/32][k/32][32][32]` int8
/// (byte nt·KT·1024 + kt·1024 + nl·32 + kk holds W[nt·32+nl][kt·32+kk]). Returns row-major i32.
///
/// Exact int32 (|sum| ≤ K·128·128 < 2³¹ for K ≤ 131072). The inner loop is pairwise i16
/// products summed into 16 i32 lanes that stay live across all of K — the shape LLVM turns into
/// `pmaddwd` (x86) / `smlal` (aarch64) — with one horizontal sum per output.
pub fn matmul_tiled(a: &[i8], w: &[i8], mc: usize, k: usize, n: usize) -> Vec<i32> {
    let kt_n = k / 32;
    let nt_n = n / 32;
    let mut out = vec![0i32; mc * n];
    // One work item = 32 outputs (one N-block) of one row.
    let min_len = (4096 / k.max(1)).max(1);
    let avx2 = has_avx2();
    out.par_chunks_mut(32).with_min_len(min_len).enumerate().for_each(|(idx, o)| {
        let (m, nt) = (idx / nt_n, idx % nt_n);
        let a16: Vec<i16> = a[m * k..(m + 1) * k].iter().map(|&x| i16::from(x)).collect();
        let wblk = &w[nt * kt_n * 1024..(nt + 1) * kt_n * 1024];
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2 was detected at run time just above.
            unsafe { block_avx2(&a16, wblk, kt_n, o) };
            return;
        }
        let _ = avx2;
        block(&a16, wblk, kt_n, o);
    });
    out
}

/// One row × one N-block (32 outputs): `o[nl] = Σ_k a16[k] · W[nl][k]`.
#[inline(always)]
fn block(a16: &[i16], wblk: &[i8], kt_n: usize, o: &mut [i32]) {
    for (nl, out_nl) in o.iter_mut().enumerate() {
        let mut lanes = [0i32; 16];
        for kt in 0..kt_n {
            let av: &[i16; 32] = a16[kt * 32..kt * 32 + 32].try_into().unwrap();
            let wv: &[i8; 32] = wblk[kt * 1024 + nl * 32..kt * 1024 + nl * 32 + 32].try_into().unwrap();
            for i in 0..16 {
                let p0 = i32::from(av[2 * i]) * i32::from(i16::from(wv[2 * i]));
                let p1 = i32::from(av[2 * i + 1]) * i32::from(i16::from(wv[2 * i + 1]));
                lanes[i] += p0 + p1;
            }
        }
        *out_nl = lanes.iter().sum();
    }
}

/// [`block`] compiled with AVX2 enabled (the simulator is a test device: it may use whatever the
/// host offers; results are exact integers either way).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2(a16: &[i16], wblk: &[i8], kt_n: usize, o: &mut [i32]) {
    block(a16, wblk, kt_n, o)
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How long before a timed submit's modelled end the simulator stops sleeping and polls the
/// clock (yielding the CPU between looks): a sleeping thread on the 2-vCPU x86 builder wakes
/// 30–45 µs late even with 1 µs timer slack, a lateness of this machine's timer, not a board's
/// NPU interrupt; polled, the job ends within 1 µs of its modelled time (`cargo run --release
/// --example sleep_lateness`, idle machine: 1600 µs sleeps 43 µs late at the median, polled
/// 0.1 µs).
const POLL_BEFORE_END: std::time::Duration = std::time::Duration::from_micros(60);

/// Makes the calling thread's sleeps end on time: Linux lets a sleeping thread's timer fire up
/// to its *timer slack* late (50 µs by default), which would add to every timed submit a wait no
/// board's interrupt has. Set once per thread (1 µs); a refusal leaves the default.
fn tight_timer() {
    thread_local!(static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    SET.with(|s| {
        if !s.replace(true) {
            let _ = nix::sys::prctl::set_timerslack(1_000);
        }
    });
}

#[cfg(test)]
mod coverage_tests {
    use super::*;

    #[test]
    fn every_table_register_is_checked_or_ignored_with_a_reason() {
        for r in regs::REGISTERS {
            let checked = CHECKED.iter().any(|c| c.name == r.name);
            let ignored = IGNORED.iter().any(|(i, why)| i.name == r.name && !why.is_empty());
            assert!(checked != ignored, "{}: checked {checked}, ignored {ignored} (exactly one)", r.name);
        }
        assert_eq!(CHECKED.len() + IGNORED.len(), regs::REGISTERS.len(), "no duplicates");
        for (reg, field, _, _) in PINNED {
            assert!(CHECKED.iter().any(|c| c.name == reg.name), "{} pinned but not listed as checked", reg.name);
            assert!(reg.fields.contains(field), "{}.{} is not a field of it", reg.name, field.name);
        }
    }
}

