//! The fake NPU kernel: what `tests/fake-kernel/run.sh` preloads so that the product's real
//! kernel interfaces (`src/npu/kif/rknpu.rs`, `rocket.rs`, `drm.rs`) run without a board.
//!
//! In the spirit of Mesa's drm-shim: `src/shim.c` (the object LD_PRELOAD names) intercepts
//! open/openat, opendir, ioctl, mmap/munmap and close, and hands everything that concerns the
//! NPU's device nodes to this library; discovery reads (`/dev/dri`, `/dev/accel`,
//! `/proc/device-tree/compatible`) are redirected to a fake tree. Submits execute on the same
//! bit-exact datapath as the simulator ([`ggml_ork::npu::kif::sim::execute_tasks`]).
//!
//! The ioctl arguments are decoded here by byte offset from the reference facts
//! (`rknpu-facts.md` §1.2/§1.3/§1.7), not with the product's `#[repr(C)]` structs, so a layout
//! mistake in the product is not mirrored by its own test device.
//!
//! Personalities (`ORK_FAKE_KERNEL`):
//! * `rknpu` — vendor driver 0.9.8 on `/dev/dri/card1` (`card0` is a display controller,
//!   "rockchip-drm"): ACTION, MEM_CREATE/MAP/DESTROY/SYNC, SUBMIT. GEM handles per fd, IOMMU
//!   domains 0..15 device-wide, each a window of `ORK_FK_DOMAIN_MB` (default 4096) with IOVAs
//!   handed out top-down and EFAULT when a buffer does not fit; the task array is read from the
//!   task BO named by `task_obj_addr` (which must carry KERNEL_MAPPING); the target core's
//!   `subcore_task` entry gives the task range; `task_counter` is the number of programs the PC
//!   ran; ACT_RESET resets the device. The same device is also `/dev/dri/renderD129` (a second
//!   node; `ORK_FK_NODES=render` leaves `card1` out), and
//!   `/sys/class/drm/{card1,renderD129}/device/of_node/interrupt-names` lists one `npuN_irq` per
//!   core the device tree gives the driver.
//!   `ORK_FK_PORT` picks which rknpu driver answers (one [`Port`] row each, issue 39): `vendor`
//!   (the default, as above), or a port of the vendor ABI to a mainline kernel — `rkopnu` (on
//!   rocket: 16 domains per fd, bottom-up, ENOSPC; whole-buffer syncs; ACT_RESET a no-op; the
//!   user timeout ignored and a hang reported as success), `dkms` (64 device-wide domain ids, an
//!   own id per fd, shared pools 0..15, ENOSPC; an ACT_RESET of 100 ms), `helios` (no IOMMU: one
//!   CMA pool of `ORK_FK_CMA_MB`, ENOMEM), `ep1sode` (one domain, core 0 only, whole-buffer
//!   syncs) and `odd` (a DRM version that is no port's, for the product to refuse).
//! * `rocket` — mainline accel driver on `/dev/accel/accel0`: CREATE_BO, SUBMIT, PREP_BO,
//!   FINI_BO, GEM_CLOSE. One IOMMU address space per fd, handed out bottom-up from IOVA 0; each
//!   fd is bound to one core at open (the least used); SUBMIT returns at once and a per-core
//!   worker runs the job later; PREP_BO waits for the BO's write fence until an absolute
//!   CLOCK_MONOTONIC deadline (EBUSY if it has passed, ETIMEDOUT if it passes while waiting); a
//!   job naming a handle the fd does not own vanishes while the ioctl returns 0; a job whose
//!   program the hardware would not run is killed after the 500 ms job timeout and still signals
//!   its fence.
//!
//! Board behaviour (`ORK_FK_QUIRKS`, comma-separated; rknpu-facts §2.6, peer-facts §4):
//! * `cold` — the first submit into a buffer that no submit wrote since it was created (or since
//!   the last reset) leaves the output stale: its programs are decoded but write nothing;
//! * `wedge` — (rknpu) entering int8 mode from cold wedges the first submit unless ACT_RESET was
//!   issued first: the submit times out (ETIMEDOUT, task_counter 0) and the kernel resets;
//! * `never_run_every:N` — every N-th submit reports success (task_counter = task_number) and
//!   runs nothing;
//! * `no_clean` — from the first submit on, to-device syncs (MEM_SYNC TO_DEVICE, FINI_BO) clean
//!   nothing: the NPU never sees what the CPU wrote after that (activations, regcmd, sentinels,
//!   later weights). Not a board's behaviour: the check that the cache model is live and the
//!   product's syncs carry its results (its bit-exact suite must fail under it);
//! * `hang_every:N` — (rknpu) every N-th submit of a core hangs: on rkopnu reported as success (see
//!   [`Port::hang_as_success`]), elsewhere ETIMEDOUT and a device reset (counter `hangs`);
//! * `reset_busy:N` — (rknpu, modelled for dkms) the first N ACT_RESETs that would reset the
//!   device return EBUSY (counter `reset_busy`);
//! * `eio_every:N` — (rknpu, modelled for dkms) every N-th submit of a core returns EIO without running:
//!   another core's job timed out and the kernel reset the device (every buffer cold; `eio`);
//! * the window (`ORK_FK_DOMAIN_MB`) is the domain overflow: MEM_CREATE past it is EFAULT
//!   (ENOSPC on rkopnu and dkms; helios's CMA pool `ORK_FK_CMA_MB` runs out with ENOMEM).
//!
//! Caches (always on; peer-facts §6, rknpu-facts §1.6/§2.5): a board's NPU is not coherent with
//! the CPU's caches, so every BO has a CPU view (what the process's mappings and the kernel's own
//! CPU reads see) and a device view (what the NPU reads and writes). CPU writes reach the device
//! only through a to-device sync of those bytes (rknpu MEM_SYNC TO_DEVICE with its offset and
//! size; rocket FINI_BO, whole BO); device writes reach the CPU only through a from-device sync
//! (MEM_SYNC FROM_DEVICE; rocket PREP_BO once the fence signalled, whole BO), which also drops
//! CPU writes in those lines that were not cleaned first. Each sync works on whole 64-byte cache
//! lines. A line the CPU wrote and did not clean is dirty: after a job that writes the BO, every
//! dirty line is evicted over what the device wrote (peer-facts §6: a CPU write came back after
//! the next run and corrupted it until the touched lines were cleaned; counter `evicted_lines`).
//! So a missing or too narrow sync is seen here as a board would show it: stale activations or
//! regcmd in the NPU, stale results, lost or resurrected sentinels on the CPU.
//!
//! At exit one line of counters goes to stderr and, with `ORK_FK_STATS=<path>`, `key=value`
//! lines to that file (what the tests read). With `ORK_FK_RSS_MS=<ms>` a thread samples
//! /proc/self/smaps and the counters add the process's peak RSS less the emulator's own mappings
//! (device views, the kernel's mapping of each BO, line hashes, its code: [`EmuMaps`]), what a
//! board's process would hold.
//!
//! Unsafe: this is a kernel for the process it lives in: it reads and writes ioctl arguments
//! and user arrays through raw pointers the caller passed, and maps memfds. Each block says why
//! the access is valid in the terms a kernel would (the caller passed it; the BO is alive).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ggml_ork::npu::kif::sim::{execute_tasks, DeviceMemory, Exec, ProgramTrace};
use ggml_ork::npu::kif::RknpuTask;
use ggml_ork::npu::soc::{SocDesc, SocId};
use nix::libc;

const NOT_OURS: c_int = -100_000;
const PAGE: u64 = 4096;
const MAX_FD: usize = 4096;
const MAX_DOMAINS: u32 = 16;
const ROCKET_JOB_TIMEOUT: Duration = Duration::from_millis(500);
/// dkms: domain ids are device-wide, 0..15 shared pools, 16.. one per open file.
const DKMS_DOMAINS: u32 = 64;
/// dkms: how long an ACT_RESET takes.
const DKMS_RESET_TIME: Duration = Duration::from_millis(100);
/// helios: the CMA pool's first physical address (its "IOVAs" stay below 4 GiB).
const CMA_BASE: u64 = 0x1000_0000;

// ---------------------------------------------------------------------------------------------
// ioctl numbers, computed from the facts (`dir<<30 | size<<16 | type<<8 | nr`, type 'd')
// ---------------------------------------------------------------------------------------------

const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0x64 << 8) | nr
}
const fn iowr(nr: u64, size: u64) -> u64 {
    ioc(3, nr, size)
}
const fn iow(nr: u64, size: u64) -> u64 {
    ioc(1, nr, size)
}
const DRM_VERSION: u64 = iowr(0x00, 64);
const DRM_GEM_CLOSE: u64 = iow(0x09, 8);
const DRM_PRIME_HANDLE_TO_FD: u64 = iowr(0x2d, 12);
const DRM_PRIME_FD_TO_HANDLE: u64 = iowr(0x2e, 12);
const RKNPU_ACTION: u64 = iowr(0x40, 8);
const RKNPU_SUBMIT: u64 = iowr(0x41, 104);
const RKNPU_MEM_CREATE: u64 = iowr(0x42, 48);
const RKNPU_MEM_MAP: u64 = iowr(0x43, 16);
const RKNPU_MEM_DESTROY: u64 = iowr(0x44, 16);
const RKNPU_MEM_SYNC: u64 = iowr(0x45, 32);
const ROCKET_CREATE_BO: u64 = iowr(0x40, 24);
const ROCKET_SUBMIT: u64 = iow(0x41, 24);
const ROCKET_PREP_BO: u64 = iow(0x42, 16);
const ROCKET_FINI_BO: u64 = iow(0x43, 8);

// `rknpu_mem_create.flags` bits used here (§1.4).
const MEM_CACHEABLE: u32 = 1 << 1;
const MEM_KERNEL_MAPPING: u32 = 1 << 3;

// ---------------------------------------------------------------------------------------------
// Raw argument access
// ---------------------------------------------------------------------------------------------

/// An ioctl argument block of a known size.
struct Arg(*mut u8);

impl Arg {
    fn u32(&self, off: usize) -> u32 {
        // SAFETY: the caller of ioctl passed a pointer to the argument struct whose size the
        // request number encodes; every offset read here is inside that size (facts §1.3).
        unsafe { std::ptr::read_unaligned(self.0.add(off) as *const u32) }
    }
    fn u64(&self, off: usize) -> u64 {
        // SAFETY: as in `u32`.
        unsafe { std::ptr::read_unaligned(self.0.add(off) as *const u64) }
    }
    fn set_u32(&self, off: usize, v: u32) {
        // SAFETY: as in `u32`; the argument is read-write (_IOWR) where this is called.
        unsafe { std::ptr::write_unaligned(self.0.add(off) as *mut u32, v) }
    }
    fn set_u64(&self, off: usize, v: u64) {
        // SAFETY: as in `set_u32`.
        unsafe { std::ptr::write_unaligned(self.0.add(off) as *mut u64, v) }
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration and counters
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Personality {
    Rknpu,
    Rocket,
}

/// How a port maps MEM_CREATE's and SUBMIT's `iommu_domain_id` onto address spaces, and what
/// a full one answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    /// 16 device-wide domains, IOVAs top-down, EFAULT (vendor, odd).
    Vendor,
    /// 16 domains per open file, IOVAs bottom-up from 0, ENOSPC (rkopnu).
    PerFd,
    /// 64 device-wide ids: 0..15 shared pools, each file's own id >= 16, top-down, ENOSPC (dkms).
    DeviceWide,
    /// No IOMMU: one CMA pool whatever the id, physical addresses bottom-up, ENOMEM (helios).
    Cma,
    /// One window: every id < 16 folds into domain 0, top-down, EFAULT (ep1sode).
    OneDomain,
}

impl Memory {
    /// What MEM_CREATE answers when the buffer does not fit.
    fn full_errno(self) -> c_int {
        match self {
            Memory::Vendor | Memory::OneDomain => libc::EFAULT,
            Memory::PerFd | Memory::DeviceWide => libc::ENOSPC,
            Memory::Cma => libc::ENOMEM,
        }
    }
}

/// What ACT_RESET does on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reset {
    /// Resets the device (int8 mode entered, every buffer cold).
    Full,
    /// Resets the device and takes [`DKMS_RESET_TIME`] (dkms).
    Slow,
    /// Returns 0 and does nothing (rkopnu).
    None,
}

/// One rknpu driver (`ORK_FK_PORT`): the vendor driver, or a port of its ABI to a mainline
/// kernel. Every row's DRM driver name is "rknpu"; the product probes these answers and never
/// sees the row's name.
#[derive(Debug)]
struct Port {
    name: &'static str,
    /// DRM_IOCTL_VERSION major.minor.patch and description.
    drm: (u32, u32, u32),
    desc: &'static str,
    /// ACTION GET_DRV_VERSION (1), GET_FREQ (2), GET_IOMMU_EN (18).
    drv_version: u32,
    freq_hz: u32,
    iommu_en: u32,
    /// `/sys/class/devfreq/fdab0000.npu/cur_freq`, where the port has devfreq.
    devfreq_hz: Option<u64>,
    memory: Memory,
    /// MEM_SYNC maintains the whole buffer, offset and size ignored.
    sync_whole: bool,
    /// An unknown ACTION selector returns 0 (writing 0 back) instead of EINVAL.
    unknown_action_ok: bool,
    reset: Reset,
    /// rkopnu (the vendor ABI on rocket's job path): the user's timeout is ignored,
    /// `hw_elapse_time` is never written, and a job that hangs (a program the hardware would not
    /// run, a wedge) is reported as success: the job timeout passes, the device is reset, and
    /// SUBMIT returns 0 with `task_counter = task_number` and nothing written.
    hang_as_success: bool,
    /// The device tree gives the driver core 0 only: core masks naming another core are EINVAL.
    core0_only: bool,
}

/// The vendor driver 0.9.8: what the fake kernel played before the ports, unchanged.
const VENDOR: Port = Port {
    name: "vendor",
    drm: (0, 9, 8),
    desc: "RKNPU driver",
    drv_version: 908,
    freq_hz: 1_000_000_000,
    iommu_en: 1,
    devfreq_hz: Some(1_000_000_000),
    memory: Memory::Vendor,
    sync_whole: false,
    unknown_action_ok: false,
    reset: Reset::Full,
    hang_as_success: false,
    core0_only: false,
};

/// The ports, `vendor` first (the default).
static PORTS: [Port; 6] = [
    VENDOR,
    Port {
        name: "rkopnu",
        drm: (0, 0, 0),
        desc: "rkopnu (rknpu ABI on mainline rocket)",
        devfreq_hz: None,
        memory: Memory::PerFd,
        sync_whole: true,
        unknown_action_ok: true,
        reset: Reset::None,
        hang_as_success: true,
        ..VENDOR
    },
    Port { name: "dkms", freq_hz: 800_000_000, devfreq_hz: Some(800_000_000), memory: Memory::DeviceWide, reset: Reset::Slow, ..VENDOR },
    Port { name: "helios", freq_hz: 200_000_000, iommu_en: 0, devfreq_hz: None, memory: Memory::Cma, ..VENDOR },
    Port {
        name: "ep1sode",
        drm: (0, 9, 6),
        drv_version: 906,
        devfreq_hz: None,
        memory: Memory::OneDomain,
        sync_whole: true,
        core0_only: true,
        ..VENDOR
    },
    Port { name: "odd", drm: (0, 9, 4), ..VENDOR },
];

fn port_named(name: &str) -> Option<&'static Port> {
    PORTS.iter().find(|p| p.name == name)
}

#[derive(Clone, Debug, Default)]
struct Quirks {
    cold: bool,
    wedge: bool,
    never_run_every: Option<u64>,
    no_clean: bool,
    hang_every: Option<u64>,
    /// ACT_RESETs answered EBUSY before one resets (0: none).
    reset_busy: u64,
    eio_every: Option<u64>,
}

impl Quirks {
    /// Whether the quirk "every N-th submit" strikes submit number `nth` (from 1).
    fn every(n: Option<u64>, nth: u64) -> bool {
        n.is_some_and(|n| nth % n == 0)
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

fn die(msg: &str) -> ! {
    eprintln!("ork-fake-kernel: {msg}");
    std::process::abort()
}

fn parse_quirks(s: &str) -> Quirks {
    let mut q = Quirks::default();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        match item.split_once(':') {
            None if item == "cold" => q.cold = true,
            None if item == "wedge" => q.wedge = true,
            None if item == "no_clean" => q.no_clean = true,
            None if item == "none" => {}
            Some(("never_run_every", n)) => q.never_run_every = Some(positive(item, n)),
            Some(("hang_every", n)) => q.hang_every = Some(positive(item, n)),
            Some(("reset_busy", n)) => q.reset_busy = positive(item, n),
            Some(("eio_every", n)) => q.eio_every = Some(positive(item, n)),
            _ => die(&format!(
                "ORK_FK_QUIRKS: unknown quirk `{item}` (cold, wedge, never_run_every:N, no_clean, hang_every:N, reset_busy:N, eio_every:N, none)"
            )),
        }
    }
    q
}

/// The N of quirk `item`: a positive number, or the process dies.
fn positive(item: &str, n: &str) -> u64 {
    match n.parse::<u64>() {
        Ok(n) if n > 0 => n,
        _ => die(&format!("ORK_FK_QUIRKS: `{item}`: N must be a positive number")),
    }
}

#[derive(Default)]
struct Stats {
    opens: AtomicU64,
    ioctls: AtomicU64,
    mem_create: AtomicU64,
    efault: AtomicU64,
    /// MEM_CREATE past a full window on rkopnu / dkms, and past helios's CMA pool.
    enospc: AtomicU64,
    enomem: AtomicU64,
    /// dkms: buffers created in the pools 0..15 shared with other processes.
    shared_pool_bos: AtomicU64,
    submits: AtomicU64,
    programs: AtomicU64,
    jobs_per_core: [AtomicU64; 3],
    programs_per_core: [AtomicU64; 3],
    act_reset: AtomicU64,
    stale: AtomicU64,
    wedged: AtomicU64,
    never_ran: AtomicU64,
    /// rknpu: jobs that hung (`hang_every`; on rkopnu also a wedge or a program the hardware
    /// would not run, reported as success), ACT_RESETs answered EBUSY, submits answered EIO.
    hangs: AtomicU64,
    reset_busy: AtomicU64,
    eio: AtomicU64,
    bad: AtomicU64,
    vanished: AtomicU64,
    killed: AtomicU64,
    prep_timeouts: AtomicU64,
    max_domain: AtomicU64,
    domains_used: AtomicU64,
    client_maps: AtomicU64,
    syncs: AtomicU64,
    synced_bytes: AtomicU64,
    evicted_lines: AtomicU64,
    prime_exports: AtomicU64,
    prime_imports: AtomicU64,
    /// rocket: address spaces (fds) that held a BO, and the most bytes of BOs live at once
    /// (every object once, however many handles name it).
    spaces_used: AtomicU64,
    live_bo_bytes: AtomicU64,
    peak_bo_bytes: AtomicU64,
    /// `ORK_FK_RSS_MS`: samples of /proc/self/smaps taken, the largest process RSS seen (KiB),
    /// the emulator's own share of it at that sample, and the largest RSS less the emulator's
    /// share (see [`EmuMaps`]).
    rss_samples: AtomicU64,
    rss_peak_kib: AtomicU64,
    rss_emu_at_peak_kib: AtomicU64,
    rss_less_emu_peak_kib: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Buffer objects and address spaces
// ---------------------------------------------------------------------------------------------

/// A buffer object in two views, because a board's NPU is not coherent with the CPU caches
/// (peer-facts §6; see "Caches" in the crate docs):
/// * the CPU view: a memfd, which every client mmap maps and the kernel maps at `cpu` (the
///   kernel's own CPU reads, e.g. of the vendor task array, see what user space wrote);
/// * the device view: a private anonymous mapping at `dev`, all the NPU reads and writes.
///
/// A to-device sync copies whole cache lines of the range from the CPU view into the device
/// view (a clean), a from-device sync copies them back (an invalidate: CPU writes in those lines
/// that were not cleaned first are lost).
struct KBo {
    memfd: OwnedFd,
    cpu: usize,
    dev: usize,
    size: u64,
    flags: u32,
    iova: u64,
    domain: u32,
    obj_addr: u64,
    /// Written by a submit since creation or the last reset (the `cold` quirk).
    warm: AtomicBool,
    /// Jobs queued that write this BO (rocket's write fence).
    pending: AtomicU32,
    /// Per cache line, a hash of its CPU bytes as of its last sync (what memory held when the
    /// CPU's copy was last clean): a line whose CPU bytes hash otherwise is dirty.
    clean: Mutex<LineHashes>,
}

impl Drop for KBo {
    fn drop(&mut self) {
        if let Some(k) = KERNEL.get() {
            k.stats.live_bo_bytes.fetch_sub(self.size, Ordering::Relaxed);
        }
        // SAFETY: `cpu..cpu+size` and `dev..dev+size` are the mappings made in `KBo::new`,
        // unmapped only here.
        unsafe {
            libc::munmap(self.cpu as *mut c_void, self.size as usize);
            libc::munmap(self.dev as *mut c_void, self.size as usize);
        }
        emu_maps().forget(&[self.cpu, self.dev]);
    }
}

/// The per-line hashes of a BO's CPU view in a mapping of their own (zero pages until written),
/// so that their memory is the emulator's and [`EmuMaps`] can tell it apart from the process's.
struct LineHashes {
    ptr: *mut u64,
    len: usize,
}

// SAFETY: a private mapping owned by this value; access goes through `&`/`&mut`.
unsafe impl Send for LineHashes {}
// SAFETY: as above.
unsafe impl Sync for LineHashes {}

impl LineHashes {
    fn new(len: usize) -> Option<LineHashes> {
        let bytes = (len * 8).max(1);
        // SAFETY: a fresh private anonymous mapping; checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        emu_maps().note(p as usize, bytes);
        Some(LineHashes { ptr: p as *mut u64, len })
    }
}

impl std::ops::Deref for LineHashes {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        // SAFETY: `len` u64s mapped at `ptr` (zero-filled), alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for LineHashes {
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `deref`; `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for LineHashes {
    fn drop(&mut self) {
        emu_maps().forget(&[self.ptr as usize]);
        // SAFETY: the mapping made in `new`, unmapped only here.
        unsafe { libc::munmap(self.ptr as *mut c_void, (self.len * 8).max(1)) };
    }
}

/// The emulator's own mappings, which a board does not have in the process: each BO's device
/// view (a board's NPU reads DRAM, not a second copy), the kernel's own mapping of each BO's
/// memfd (the same pages as the product's mapping, but RSS counts a page once per mapping that
/// has it faulted in, so every page the kernel's CPU view touched counts twice) and the
/// per-line hashes of the cache model. By start address → length.
#[derive(Default)]
struct EmuMaps(Mutex<BTreeMap<usize, usize>>);

static EMU_MAPS: OnceLock<EmuMaps> = OnceLock::new();

fn emu_maps() -> &'static EmuMaps {
    EMU_MAPS.get_or_init(EmuMaps::default)
}

impl EmuMaps {
    fn note(&self, at: usize, len: usize) {
        self.0.lock().unwrap().insert(at, len);
    }
    fn forget(&self, at: &[usize]) {
        let mut m = self.0.lock().unwrap();
        for a in at {
            m.remove(a);
        }
    }
    /// Whether a mapping starting at `start` is (or begins with) one of the emulator's.
    fn holds(&self, start: usize) -> bool {
        let m = self.0.lock().unwrap();
        m.range(..=start).next_back().is_some_and(|(&a, &len)| start < a + len)
    }
}

/// One pass over /proc/self/smaps: (the process's RSS, the emulator's share), KiB, and with
/// `keep` the smaps text with the emulator's mappings marked. A mapping counts as the emulator's
/// when it starts inside one of [`EmuMaps`] (the kernel may merge adjacent anonymous device views
/// into one mapping; they all carry MAP_NORESERVE, which the product's mappings do not), or is
/// the fake kernel's own code (its library and the shim). Read line by line through a small
/// buffer, so that the sampler itself adds little to what it measures.
fn sample_rss(keep: bool) -> Option<(u64, u64, String)> {
    use std::io::BufRead;
    let mut r = std::io::BufReader::with_capacity(1 << 16, std::fs::File::open("/proc/self/smaps").ok()?);
    let (mut total, mut emu, mut cur_emu) = (0u64, 0u64, false);
    let m = emu_maps();
    let mut marked = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            break;
        }
        if keep {
            marked.push_str(&line);
        }
        if let Some(rest) = line.strip_prefix("Rss:") {
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            total += kib;
            if cur_emu {
                emu += kib;
            }
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(_)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                let path = words.nth(4).unwrap_or("");
                cur_emu = m.holds(a) || path.ends_with("/libork_fake_kernel.so") || path.ends_with("/libork_fake_kernel_shim.so");
                if cur_emu && keep {
                    marked.push_str("OrkFakeKernel: emulator\n");
                }
            }
        }
    }
    Some((total, emu, marked))
}

impl Kernel {
    /// Takes one RSS sample (`ORK_FK_RSS_MS`) into the counters.
    fn rss_sample(&self) {
        let Some((total, emu, marked)) = sample_rss(env("ORK_FK_RSS_SMAPS").is_some()) else { return };
        let s = &self.stats;
        add(&s.rss_samples, 1);
        if total > s.rss_peak_kib.load(Ordering::Relaxed) {
            s.rss_peak_kib.store(total, Ordering::Relaxed);
            s.rss_emu_at_peak_kib.store(emu, Ordering::Relaxed);
        }
        let less = total.saturating_sub(emu);
        if less > s.rss_less_emu_peak_kib.fetch_max(less, Ordering::Relaxed) {
            // `ORK_FK_RSS_SMAPS=<file>`: the smaps of the sample with the most RSS less the
            // emulator's, its mappings marked `OrkFakeKernel: emulator` (written at exit).
            if env("ORK_FK_RSS_SMAPS").is_some() {
                *self.rss_smaps.lock().unwrap() = marked;
            }
        }
    }
}

static NEXT_BO: AtomicU64 = AtomicU64::new(1);

impl KBo {
    fn new(size: u64, flags: u32, iova: u64, domain: u32) -> Result<KBo, c_int> {
        let name = CString::new("ork-fake-bo").unwrap();
        // SAFETY: memfd_create with a valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(libc::ENOMEM);
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our own memfd.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(libc::ENOMEM);
        }
        // SAFETY: a fresh shared mapping of the whole memfd; checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), size as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        // SAFETY: a fresh private anonymous mapping (zero pages, reserved lazily); checked
        // against MAP_FAILED.
        let d = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if d == libc::MAP_FAILED {
            // SAFETY: unmapping the CPU view mapped just above.
            unsafe { libc::munmap(p, size as usize) };
            return Err(libc::ENOMEM);
        }
        let Some(clean) = LineHashes::new((size / LINE) as usize) else {
            // SAFETY: unmapping the two views mapped just above.
            unsafe {
                libc::munmap(p, size as usize);
                libc::munmap(d, size as usize);
            }
            return Err(libc::ENOMEM);
        };
        emu_maps().note(p as usize, size as usize);
        emu_maps().note(d as usize, size as usize);
        let id = NEXT_BO.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = KERNEL.get() {
            let live = k.stats.live_bo_bytes.fetch_add(size, Ordering::Relaxed) + size;
            k.stats.peak_bo_bytes.fetch_max(live, Ordering::Relaxed);
        }
        Ok(KBo {
            memfd,
            cpu: p as usize,
            dev: d as usize,
            size,
            flags,
            iova,
            domain,
            // Looks like an arm64 kernel pointer, never like an IOVA.
            obj_addr: 0xffff_ff80_0000_0000 | (id << 12),
            warm: AtomicBool::new(false),
            // All zeros: a zero line hashes to 0, so the hashes are left to untouched zero
            // pages (a BO costs memory only where it is written).
            clean: Mutex::new(clean),
            pending: AtomicU32::new(0),
        })
    }
}

/// Cache line of the CPUs sharing memory with the NPU (Cortex-A76/A55): the unit of a sync.
const LINE: u64 = 64;

/// Direction of a modelled cache-maintenance operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// Clean: the CPU's bytes reach memory, where the device reads them.
    ToDevice,
    /// Invalidate: the CPU's next reads see what the device wrote.
    FromDevice,
}

impl KBo {
    /// Cache maintenance of `off..off + len`, widened to whole lines: copies those lines from
    /// one view into the other. Returns the bytes maintained.
    fn sync(&self, dir: Dir, off: u64, len: u64) -> u64 {
        let start = off / LINE * LINE;
        let end = ((off + len).div_ceil(LINE) * LINE).min(self.size);
        if start >= end {
            return 0;
        }
        let (from, to) = match dir {
            Dir::ToDevice => (self.cpu, self.dev),
            Dir::FromDevice => (self.dev, self.cpu),
        };
        // SAFETY: both mappings are `size` bytes long and live as long as `self`; `start < end ≤
        // size`; the two mappings are distinct memory (a memfd and an anonymous mapping).
        unsafe { std::ptr::copy_nonoverlapping((from as *const u8).add(start as usize), (to as *mut u8).add(start as usize), (end - start) as usize) };
        let mut clean = self.clean.lock().unwrap();
        for l in start / LINE..end / LINE {
            clean[l as usize] = line_hash(self.cpu_line(l));
        }
        end - start
    }

    /// The CPU view's bytes of line `l`.
    fn cpu_line(&self, l: u64) -> &[u8] {
        // SAFETY: line `l` lies inside the CPU view (callers iterate lines below size / LINE),
        // which lives as long as `self`.
        unsafe { std::slice::from_raw_parts((self.cpu as *const u8).add((l * LINE) as usize), LINE as usize) }
    }

    /// After a job wrote this BO: dirty CPU lines (written, never cleaned) are evicted and land
    /// in memory over what the device wrote (peer-facts §6). Returns the lines written back.
    fn evict_dirty(&self) -> u64 {
        let mut clean = self.clean.lock().unwrap();
        let mut n = 0;
        for (l, h) in clean.iter_mut().enumerate() {
            let cur = line_hash(self.cpu_line(l as u64));
            if cur != *h {
                let o = l * LINE as usize;
                // SAFETY: one line inside both views (both `size` bytes, distinct memory).
                unsafe { std::ptr::copy_nonoverlapping((self.cpu as *const u8).add(o), (self.dev as *mut u8).add(o), LINE as usize) };
                *h = cur;
                n += 1;
            }
        }
        n
    }
}

/// A 64-bit hash of one cache line (FNV-1a over its eight words, then a final mix), shifted so
/// that a line of zeros hashes to 0.
fn line_hash(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in b.chunks_exact(8) {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h ^ (h >> 29)) ^ ZERO_LINE_HASH
}

/// The unshifted hash of a line of zeros.
const ZERO_LINE_HASH: u64 = {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < 8 {
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h ^ (h >> 29)
};

/// One IOMMU address space: live BOs by IOVA.
#[derive(Default)]
struct Space {
    bos: BTreeMap<u64, Arc<KBo>>,
    used: u64,
    /// rocket: the space has held a BO (counted in `spaces_used`).
    ever_used: bool,
}

impl Space {
    /// Highest gap of `size` below `top`, not below `floor` (the Linux IOVA allocator, vendor).
    fn top_down(&self, size: u64, top: u64, floor: u64) -> Option<u64> {
        let mut ceiling = top;
        for (&start, bo) in self.bos.iter().rev() {
            let end = start + bo.size;
            if end <= ceiling && ceiling - end >= size && ceiling - size >= floor {
                return Some(ceiling - size);
            }
            ceiling = ceiling.min(start);
        }
        (ceiling >= floor + size).then(|| ceiling - size)
    }

    /// Lowest gap of `size` from `floor` below `top` (drm_mm first fit, rocket from 0; helios's
    /// CMA pool from its base).
    fn bottom_up(&self, size: u64, floor: u64, top: u64) -> Option<u64> {
        let mut at = floor;
        for (&start, bo) in &self.bos {
            if start >= at + size {
                return Some(at);
            }
            at = at.max(start + bo.size);
        }
        (at + size <= top).then_some(at)
    }

    fn bo_at(&self, iova: u64) -> Option<&Arc<KBo>> {
        let (&start, bo) = self.bos.range(..=iova).next_back()?;
        (iova < start + bo.size).then_some(bo)
    }

    fn make_cold(&self) {
        for bo in self.bos.values() {
            bo.warm.store(false, Ordering::Relaxed);
        }
    }
}

impl DeviceMemory for Space {
    fn resolve(&self, iova: u64, len: u64) -> Option<*mut u8> {
        let (&start, bo) = self.bos.range(..=iova).next_back()?;
        let off = iova - start;
        // SAFETY: `off + len ≤ size` is checked first; the mapping lives as long as the BO,
        // which the space holds while the caller borrows it.
        (off + len <= bo.size).then(|| unsafe { (bo.dev as *mut u8).add(off as usize) })
    }
}

// ---------------------------------------------------------------------------------------------
// The device and its open files
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Display,
    Rknpu,
    Rocket,
}

/// Per open file: GEM handles and mmap offsets (both are per drm_file in DRM).
struct File {
    node: Node,
    handles: HashMap<u32, Arc<KBo>>,
    offsets: HashMap<u64, Arc<KBo>>,
    next_handle: u32,
    next_offset: u64,
    /// rocket: the fd's address space and core.
    rocket: Option<Arc<RocketFile>>,
    /// rknpu on dkms: the file's own domain id (>= 16).
    own_domain: Option<u32>,
}

/// Which address space an rknpu buffer lives in: a domain id, of the device (`fd` = [`DEVICE`])
/// or, on rkopnu, of one open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SpaceKey {
    fd: c_int,
    id: u32,
}

/// [`SpaceKey::fd`] of a device-wide domain.
const DEVICE: c_int = -1;

struct RocketFile {
    space: RwLock<Space>,
    core: usize,
}

struct RknpuDev {
    /// IOMMU domains (device-wide, or per file on rkopnu; each its own window), or helios's one
    /// CMA pool.
    domains: RwLock<HashMap<SpaceKey, Space>>,
    objs: Mutex<HashMap<u64, Arc<KBo>>>,
    int8_ready: AtomicBool,
    /// dkms: the domain ids 16..63 open files hold (bit = id).
    own_ids: Mutex<u64>,
    /// ACT_RESETs asked for that would reset the device (the `reset_busy` quirk).
    reset_calls: AtomicU64,
    /// Submits per core, what `hang_every` and `eio_every` count: a core's N-th submit strikes,
    /// so the resubmit of a job that was struck (the next one on its core) never is, whatever the
    /// other cores submit meanwhile.
    core_submits: [AtomicU64; 3],
    /// vendor: the device's live IOMMU domain, what GET_IOMMU_DOMAIN_ID answers: the last one a
    /// switch, a MEM_CREATE or a SUBMIT named (device-wide, kept after the process that moved it).
    live_domain: AtomicU32,
}

struct RocketJob {
    file: Arc<RocketFile>,
    tasks: Vec<(u32, u32)>,
    outs: Vec<Arc<KBo>>,
    submitted: Instant,
    seq: u64,
}

/// What a kernel is built from (`ORK_FAKE_KERNEL`, `ORK_FK_*`; the tests build their own).
struct Config {
    personality: Personality,
    /// rknpu: which driver answers (`ORK_FK_PORT`).
    port: &'static Port,
    soc: SocDesc,
    tree: PathBuf,
    /// An IOMMU window (`ORK_FK_DOMAIN_MB`) and helios's CMA pool (`ORK_FK_CMA_MB`), bytes.
    window: u64,
    cma: u64,
    /// rkopnu: how long a hung job takes before the device is reset (`ORK_FK_JOB_TIMEOUT_MS`).
    job_timeout: Duration,
    /// rknpu: `ORK_FK_NODES=render`: no `/dev/dri/card1`, only `renderD129`.
    render_only: bool,
    quirks: Quirks,
}

/// A size in MiB from `var` (default `default`), within `range`, as bytes; or the process dies.
fn env_mib(var: &str, default: u64, range: std::ops::RangeInclusive<u64>) -> u64 {
    match env(var) {
        None => default << 20,
        Some(s) => match s.parse::<u64>() {
            Ok(mb) if range.contains(&mb) => mb << 20,
            _ => die(&format!("{var}={s}: {}..{}", range.start(), range.end())),
        },
    }
}

impl Config {
    fn from_env() -> Config {
        let personality = match env("ORK_FAKE_KERNEL").as_deref() {
            Some("rknpu") => Personality::Rknpu,
            Some("rocket") => Personality::Rocket,
            other => die(&format!("ORK_FAKE_KERNEL={other:?}: must be rknpu or rocket")),
        };
        let port = match env("ORK_FK_PORT") {
            None => &PORTS[0],
            Some(s) => port_named(&s).unwrap_or_else(|| die(&format!("ORK_FK_PORT={s}: vendor, rkopnu, dkms, helios, ep1sode or odd"))),
        };
        let soc_id = match env("ORK_FK_SOC") {
            None => SocId::Rk3588,
            Some(s) => SocId::parse(&s).unwrap_or_else(|| die(&format!("ORK_FK_SOC={s}: rk3588 or rk3576"))),
        };
        let job_timeout = match env("ORK_FK_JOB_TIMEOUT_MS") {
            None => ROCKET_JOB_TIMEOUT,
            Some(s) => match s.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => die(&format!("ORK_FK_JOB_TIMEOUT_MS={s}: a positive number of ms")),
            },
        };
        let render_only = match env("ORK_FK_NODES").as_deref() {
            None | Some("both") => false,
            Some("render") => true,
            Some(s) => die(&format!("ORK_FK_NODES={s}: both or render")),
        };
        Config {
            personality,
            port,
            soc: SocDesc::get(soc_id),
            tree: env("ORK_FK_TREE")
                .map(PathBuf::from)
                .unwrap_or_else(|| std::env::temp_dir().join(format!("ork-fake-kernel-{}", std::process::id()))),
            window: env_mib("ORK_FK_DOMAIN_MB", 4096, 1..=4096),
            // The pool's addresses stay below 4 GiB.
            cma: env_mib("ORK_FK_CMA_MB", 1024, 1..=(4096 - (CMA_BASE >> 20))),
            job_timeout,
            render_only,
            quirks: parse_quirks(&env("ORK_FK_QUIRKS").unwrap_or_default()),
        }
    }
}

struct Kernel {
    /// What the kernel was built from: personality, port, SoC, fake tree, windows, quirks.
    cfg: Config,
    stats: Stats,
    files: Mutex<HashMap<c_int, File>>,
    is_dev: Vec<AtomicBool>,
    rknpu: RknpuDev,
    /// Open rocket fds per core (for the core choice at open).
    rocket_fds_per_core: Mutex<[u32; 3]>,
    rocket_queues: Vec<Mutex<mpsc::Sender<RocketJob>>>,
    fence: (Mutex<()>, Condvar),
    /// Client mappings of BOs: address → length.
    maps: Mutex<HashMap<usize, usize>>,
    /// PRIME: exported dma-bufs by (st_dev, st_ino) of their file (a dup of the BO's memfd).
    dmabufs: Mutex<HashMap<(u64, u64), std::sync::Weak<KBo>>>,
    redirects: Mutex<HashMap<String, &'static CStr>>,
    /// `ORK_FK_RSS_SMAPS`: the marked smaps of the largest RSS less the emulator's.
    rss_smaps: Mutex<String>,
}

static KERNEL: OnceLock<Kernel> = OnceLock::new();

fn kernel() -> &'static Kernel {
    KERNEL.get_or_init(|| Kernel::new(Config::from_env()))
}

impl Kernel {
    fn new(c: Config) -> Kernel {
        // The rocket cores' workers (rknpu submits run in the ioctl).
        let rocket_cores = if c.personality == Personality::Rocket { c.soc.cores.min(3) } else { 0 };
        let k = Kernel {
            cfg: c,
            stats: Stats::default(),
            files: Mutex::new(HashMap::new()),
            is_dev: (0..MAX_FD).map(|_| AtomicBool::new(false)).collect(),
            rknpu: RknpuDev {
                domains: RwLock::new(HashMap::new()),
                objs: Mutex::new(HashMap::new()),
                int8_ready: AtomicBool::new(false),
                own_ids: Mutex::new(0),
                reset_calls: AtomicU64::new(0),
                core_submits: Default::default(),
                live_domain: AtomicU32::new(0),
            },
            rocket_fds_per_core: Mutex::new([0; 3]),
            rocket_queues: (0..rocket_cores)
                .map(|core| {
                    let (tx, rx) = mpsc::channel::<RocketJob>();
                    std::thread::Builder::new()
                        .name(format!("fk-rocket-core{core}"))
                        .spawn(move || {
                            while let Ok(job) = rx.recv() {
                                kernel().rocket_run(core as usize, job);
                            }
                        })
                        .expect("spawn fake rocket core");
                    Mutex::new(tx)
                })
                .collect(),
            fence: (Mutex::new(()), Condvar::new()),
            maps: Mutex::new(HashMap::new()),
            dmabufs: Mutex::new(HashMap::new()),
            redirects: Mutex::new(HashMap::new()),
            rss_smaps: Mutex::new(String::new()),
        };
        k.make_tree();
        if let Some(ms) = env("ORK_FK_RSS_MS") {
            let ms = ms.parse::<u64>().ok().filter(|&m| m > 0).unwrap_or_else(|| die(&format!("ORK_FK_RSS_MS={ms}: a positive number of ms")));
            std::thread::Builder::new()
                .name("fk-rss".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_millis(ms));
                    if let Some(k) = KERNEL.get() {
                        k.rss_sample();
                    }
                })
                .expect("spawn fake kernel RSS sampler");
        }
        k
    }

    fn make_tree(&self) {
        let t = &self.cfg.tree;
        let mk = |rel: &str, body: &[u8]| {
            let p = t.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap_or_else(|e| die(&format!("{}: {e}", p.display())));
            std::fs::write(&p, body).unwrap_or_else(|e| die(&format!("{}: {e}", p.display())));
        };
        mk("dev/dri/card0", b"");
        match self.cfg.personality {
            Personality::Rknpu => {
                for node in self.rknpu_nodes() {
                    mk(&format!("dev/dri/{node}"), b"");
                    mk(&format!("sys/class/drm/{node}/device/of_node/interrupt-names"), self.interrupt_names().as_bytes());
                }
            }
            Personality::Rocket => mk("dev/accel/accel0", b""),
        }
        let compat = format!("radxa,rock-5b\0rockchip,{}\0", self.cfg.soc.id.name());
        mk("proc/device-tree/compatible", compat.as_bytes());
        // Vendor kernels run the NPU at up to 1 GHz (devfreq); mainline boards clock it at
        // 200 MHz by default (peer-facts §2); of the ports only dkms has a devfreq node.
        let hz = match self.cfg.personality {
            Personality::Rocket => Some(200_000_000),
            Personality::Rknpu => self.cfg.port.devfreq_hz,
        };
        // The directory is there either way (the product lists it): empty without devfreq.
        let devfreq = t.join("sys/class/devfreq");
        std::fs::create_dir_all(&devfreq).unwrap_or_else(|e| die(&format!("{}: {e}", devfreq.display())));
        if let Some(hz) = hz {
            mk("sys/class/devfreq/fdab0000.npu/cur_freq", format!("{hz}\n").as_bytes());
        }
    }

    /// The rknpu device's nodes: `card1` (unless `ORK_FK_NODES=render`) and `renderD129`.
    fn rknpu_nodes(&self) -> Vec<&'static str> {
        let card = (!self.cfg.render_only).then_some("card1");
        card.into_iter().chain(["renderD129"]).collect()
    }

    /// The NPU's `interrupt-names` property: one NUL-terminated `npuN_irq` per core the device
    /// tree gives the driver (core 0 only on ep1sode's tree).
    fn interrupt_names(&self) -> String {
        let cores = if self.cfg.port.core0_only { 1 } else { self.cfg.soc.cores };
        (0..cores).map(|c| format!("npu{c}_irq\0")).collect()
    }

    fn redirect(&self, path: &str) -> Option<&'static CStr> {
        let rel = path.strip_prefix('/')?;
        let to = self.cfg.tree.join(rel);
        let keep = path == "/dev/dri" || path == "/dev/accel" || to.exists();
        if !keep {
            return None;
        }
        let mut r = self.redirects.lock().unwrap();
        let c = r.entry(path.to_string()).or_insert_with(|| {
            let c = CString::new(to.to_string_lossy().into_owned()).unwrap();
            Box::leak(c.into_boxed_c_str())
        });
        Some(*c)
    }

    fn open(&self, path: &str) -> c_int {
        let node = match (self.cfg.personality, path) {
            (_, "/dev/dri/card0") => Node::Display,
            (Personality::Rknpu, "/dev/dri/card1") if !self.cfg.render_only => Node::Rknpu,
            (Personality::Rknpu, "/dev/dri/renderD129") => Node::Rknpu,
            (Personality::Rocket, "/dev/accel/accel0") => Node::Rocket,
            (_, p) if p.starts_with("/dev/dri/") || p.starts_with("/dev/accel/") => return -libc::ENOENT,
            _ => return NOT_OURS,
        };
        let name = CString::new(format!("ork-fake-{}", path.rsplit('/').next().unwrap_or("node"))).unwrap();
        // SAFETY: memfd_create with a valid name; the fd stands for the open device file.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return -libc::EMFILE;
        }
        if fd as usize >= MAX_FD {
            // SAFETY: closing the fd we just created.
            unsafe { libc::close(fd) };
            return -libc::EMFILE;
        }
        let rocket = (node == Node::Rocket).then(|| {
            let mut per = self.rocket_fds_per_core.lock().unwrap();
            let cores = self.cfg.soc.cores.min(3) as usize;
            let core = (0..cores).min_by_key(|&c| per[c]).unwrap_or(0);
            per[core] += 1;
            Arc::new(RocketFile { space: RwLock::new(Space::default()), core })
        });
        let own_domain = if node == Node::Rknpu && self.cfg.port.memory == Memory::DeviceWide {
            match self.take_own_domain() {
                Some(id) => Some(id),
                None => {
                    // SAFETY: closing the fd we just created.
                    unsafe { libc::close(fd) };
                    return -libc::EMFILE;
                }
            }
        } else {
            None
        };
        let f = File {
            node,
            handles: HashMap::new(),
            offsets: HashMap::new(),
            next_handle: 1,
            next_offset: 0x1_0000_0000,
            rocket,
            own_domain,
        };
        self.files.lock().unwrap().insert(fd, f);
        self.is_dev[fd as usize].store(true, Ordering::Release);
        add(&self.stats.opens, 1);
        fd
    }

    fn close(&self, fd: c_int) {
        self.is_dev[fd as usize].store(false, Ordering::Release);
        let Some(f) = self.files.lock().unwrap().remove(&fd) else { return };
        if let Some(rf) = &f.rocket {
            self.rocket_fds_per_core.lock().unwrap()[rf.core] -= 1;
        }
        if f.node == Node::Rknpu {
            // The kernel frees a file's GEM objects when it is closed.
            for bo in f.handles.values() {
                self.rknpu_free(fd, bo);
            }
            if let Some(id) = f.own_domain {
                *self.rknpu.own_ids.lock().unwrap() &= !(1u64 << id);
            }
        }
    }

    /// dkms: the lowest domain id >= 16 no open file holds, now held (None: all 48 are).
    fn take_own_domain(&self) -> Option<u32> {
        let mut held = self.rknpu.own_ids.lock().unwrap();
        let id = (MAX_DOMAINS..DKMS_DOMAINS).find(|&id| *held & (1u64 << id) == 0)?;
        *held |= 1u64 << id;
        Some(id)
    }

    fn ioctl(&self, fd: c_int, req: u64, arg: *mut c_void) -> c_int {
        add(&self.stats.ioctls, 1);
        let a = Arg(arg as *mut u8);
        if arg.is_null() {
            return -libc::EFAULT;
        }
        let node = match self.files.lock().unwrap().get(&fd) {
            Some(f) => f.node,
            None => return -libc::EBADF,
        };
        match (node, req) {
            (_, DRM_VERSION) => self.drm_version(node, &a),
            (Node::Rknpu, RKNPU_ACTION) => self.rknpu_action(fd, &a),
            (Node::Rknpu, RKNPU_MEM_CREATE) => self.rknpu_mem_create(fd, &a),
            (Node::Rknpu, RKNPU_MEM_MAP) => self.with_file(fd, |f| match f.handles.get(&a.u32(0)) {
                Some(bo) => {
                    let off = f.next_offset;
                    f.next_offset += bo.size;
                    f.offsets.insert(off, bo.clone());
                    a.set_u64(8, off);
                    0
                }
                None => -libc::EINVAL,
            }),
            (Node::Rknpu, RKNPU_MEM_DESTROY) => self.rknpu_mem_destroy(fd, &a),
            (Node::Rknpu, RKNPU_MEM_SYNC) => self.rknpu_mem_sync(&a),
            (Node::Rknpu, RKNPU_SUBMIT) => self.rknpu_submit(fd, &a),
            (Node::Rocket, ROCKET_CREATE_BO) => self.rocket_create_bo(fd, &a),
            (Node::Rocket, ROCKET_SUBMIT) => self.rocket_submit(fd, &a),
            (Node::Rocket, ROCKET_PREP_BO) => self.rocket_prep_bo(fd, &a),
            (Node::Rocket, ROCKET_FINI_BO) => {
                if a.u32(4) != 0 {
                    return -libc::EINVAL;
                }
                // dma_sync_sgtable_for_device of the whole BO: a clean.
                let Some(bo) = self.with_file(fd, |f| f.handles.get(&a.u32(0)).cloned()) else { return -libc::ENOENT };
                add(&self.stats.syncs, 1);
                if !self.cleans_lost() {
                    add(&self.stats.synced_bytes, bo.sync(Dir::ToDevice, 0, bo.size));
                }
                0
            }
            (Node::Rocket, DRM_GEM_CLOSE) => self.rocket_gem_close(fd, &a),
            (Node::Rocket, DRM_PRIME_HANDLE_TO_FD) => self.prime_export(fd, &a),
            (Node::Rocket, DRM_PRIME_FD_TO_HANDLE) => self.prime_import(fd, &a),
            (_, r) => {
                eprintln!("ork-fake-kernel: {node:?} node: ioctl {r:#x} is not modelled (ENOTTY)");
                -libc::ENOTTY
            }
        }
    }

    /// The `no_clean` quirk strikes: cleans are lost from the first submit on.
    fn cleans_lost(&self) -> bool {
        self.cfg.quirks.no_clean && self.stats.submits.load(Ordering::Relaxed) > 0
    }

    fn with_file<R>(&self, fd: c_int, f: impl FnOnce(&mut File) -> R) -> R {
        let mut files = self.files.lock().unwrap();
        f(files.get_mut(&fd).expect("file of a live fd"))
    }

    /// `struct drm_version` (LP64): three i32, then (len usize, ptr) for name, date, desc.
    fn drm_version(&self, node: Node, a: &Arg) -> c_int {
        let (name, date, desc, ver) = match node {
            Node::Display => ("rockchip-drm", "20140818", "Rockchip Soc DRM", (1, 0, 0)),
            Node::Rknpu => ("rknpu", "20240828", self.cfg.port.desc, self.cfg.port.drm),
            Node::Rocket => ("rocket", "20240101", "rocket DRM", (0, 0, 1)),
        };
        a.set_u32(0, ver.0);
        a.set_u32(4, ver.1);
        a.set_u32(8, ver.2);
        for (i, s) in [name, date, desc].iter().enumerate() {
            let len_off = 16 + i * 16;
            let cap = a.u64(len_off) as usize;
            let ptr = a.u64(len_off + 8) as *mut u8;
            if cap > 0 && !ptr.is_null() {
                let n = cap.min(s.len());
                // SAFETY: the caller provided `cap` writable bytes at `ptr` (drm_version contract).
                unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), ptr, n) };
            }
            a.set_u64(len_off, s.len() as u64);
        }
        0
    }

    // ---- rknpu ---------------------------------------------------------------------------

    /// `rknpu_action` (8 B): flags u32 @0 (the selector), value u32 @4 (in/out).
    fn rknpu_action(&self, fd: c_int, a: &Arg) -> c_int {
        let port = self.cfg.port;
        let v = match a.u32(0) {
            0 => 0x4649_5245, // GET_HW_VERSION ("FIRE")
            1 => port.drv_version,
            2 => port.freq_hz,
            6 => match self.rknpu_act_reset() {
                Ok(()) => 0,
                Err(e) => return -e,
            },
            18 => port.iommu_en,
            19 => 0,
            // POWER_ON: no such case in 0.9.8 (an unknown selector: 0 on rkopnu, below).
            20 if !port.unknown_action_ok => return -libc::EINVAL,
            22 | 23 => 0,
            24 if port.memory == Memory::Vendor => self.rknpu.live_domain.load(Ordering::Relaxed),
            24 => self.with_file(fd, |f| f.own_domain.unwrap_or(0)),
            25 => match self.rknpu_set_domain(fd, a.u32(4)) {
                Ok(()) => 0,
                Err(e) => return -e,
            },
            other if port.unknown_action_ok => {
                eprintln!("ork-fake-kernel: rknpu ACTION {other} is unknown to the {} port: answered 0", port.name);
                0
            }
            other => {
                eprintln!("ork-fake-kernel: rknpu ACTION {other} is not modelled (EINVAL)");
                return -libc::EINVAL;
            }
        };
        a.set_u32(4, v);
        0
    }

    /// ACTION ACT_RESET (6): resets the device (dkms: in 100 ms, after the EBUSYs of the
    /// `reset_busy` quirk); on rkopnu returns 0 and does nothing. Counted in `act_reset` when it
    /// answers 0.
    fn rknpu_act_reset(&self) -> Result<(), c_int> {
        if self.cfg.port.reset != Reset::None {
            let n = self.rknpu.reset_calls.fetch_add(1, Ordering::Relaxed) + 1;
            if n <= self.cfg.quirks.reset_busy {
                add(&self.stats.reset_busy, 1);
                return Err(libc::EBUSY);
            }
            if self.cfg.port.reset == Reset::Slow {
                std::thread::sleep(DKMS_RESET_TIME);
            }
            self.rknpu_reset();
        }
        add(&self.stats.act_reset, 1);
        Ok(())
    }

    /// ACTION SET_IOMMU_DOMAIN_ID (25): ids below 16 (dkms: also the file's own id); helios and
    /// ep1sode answer 0 to any id and do nothing. rkopnu keeps the id per file, but nothing reads
    /// it back (GET answers 0, SUBMIT names its domain), so it is not stored here.
    fn rknpu_set_domain(&self, fd: c_int, id: u32) -> Result<(), c_int> {
        let ok = match self.cfg.port.memory {
            Memory::Vendor | Memory::PerFd => id < MAX_DOMAINS,
            Memory::DeviceWide => id < MAX_DOMAINS || self.with_file(fd, |f| f.own_domain) == Some(id),
            Memory::Cma | Memory::OneDomain => true,
        };
        if ok {
            self.note_live_domain(id);
            Ok(())
        } else {
            Err(libc::EINVAL)
        }
    }

    /// vendor: a switch, MEM_CREATE or SUBMIT in domain `id` makes it the device's live one.
    fn note_live_domain(&self, id: u32) {
        if self.cfg.port.memory == Memory::Vendor {
            self.rknpu.live_domain.store(id, Ordering::Relaxed);
        }
    }

    /// Soft reset: the mode is int8-ready, every buffer cold again (ork re-warms after a reset).
    fn rknpu_reset(&self) {
        self.rknpu.int8_ready.store(true, Ordering::Relaxed);
        for s in self.rknpu.domains.read().unwrap().values() {
            s.make_cold();
        }
    }

    /// The address space a domain id of `fd` names (MEM_CREATE, SUBMIT), or EINVAL. See
    /// [`Memory`]: helios's pool and ep1sode's window are domain 0 whatever id below 16 is
    /// passed; dkms takes 0..15 and the file's own id.
    fn space_key(&self, fd: c_int, id: u32) -> Result<SpaceKey, c_int> {
        let dev = |id| SpaceKey { fd: DEVICE, id };
        let key = match self.cfg.port.memory {
            Memory::Vendor => (id < MAX_DOMAINS).then(|| dev(id)),
            Memory::PerFd => (id < MAX_DOMAINS).then_some(SpaceKey { fd, id }),
            Memory::DeviceWide => (id < MAX_DOMAINS || self.with_file(fd, |f| f.own_domain) == Some(id)).then(|| dev(id)),
            Memory::Cma | Memory::OneDomain => (id < MAX_DOMAINS).then(|| dev(0)),
        };
        key.ok_or(libc::EINVAL)
    }

    /// Where a buffer of `size` goes in `space`: top-down in a window (vendor, dkms, ep1sode),
    /// bottom-up from 0 (rkopnu), bottom-up in the CMA pool (helios).
    fn place(&self, space: &Space, size: u64) -> Option<u64> {
        match self.cfg.port.memory {
            Memory::Vendor | Memory::DeviceWide | Memory::OneDomain => space.top_down(size, self.cfg.window, PAGE),
            Memory::PerFd => space.bottom_up(size, 0, self.cfg.window),
            Memory::Cma => space.bottom_up(size, CMA_BASE, CMA_BASE + self.cfg.cma),
        }
    }

    /// MEM_CREATE found no room in `space`: counts and logs it, returns the port's errno.
    fn space_full(&self, size: u64, key: SpaceKey, space: &Space) -> c_int {
        let errno = self.cfg.port.memory.full_errno();
        let (counter, name) = match errno {
            libc::ENOSPC => (&self.stats.enospc, "ENOSPC"),
            libc::ENOMEM => (&self.stats.enomem, "ENOMEM"),
            _ => (&self.stats.efault, "EFAULT"),
        };
        add(counter, 1);
        let (what, cap) = if self.cfg.port.memory == Memory::Cma { ("CMA pool", self.cfg.cma) } else { ("window", self.cfg.window) };
        eprintln!(
            "ork-fake-kernel: MEM_CREATE {size} B in domain {}: {what} of {} MiB full ({} MiB used): {name}",
            key.id,
            cap >> 20,
            space.used >> 20
        );
        errno
    }

    /// `rknpu_mem_create` (48 B): handle u32 @0, flags u32 @4, size u64 @8, obj_addr u64 @16,
    /// dma_addr u64 @24, sram_size u64 @32, iommu_domain_id s32 @40, core_mask u32 @44.
    fn rknpu_mem_create(&self, fd: c_int, a: &Arg) -> c_int {
        add(&self.stats.mem_create, 1);
        if a.u32(0) != 0 {
            // An existing handle (PRIME import) skips allocation (S4): not used by the product.
            eprintln!("ork-fake-kernel: MEM_CREATE on an existing handle (import) is not modelled");
            return -libc::EINVAL;
        }
        let (flags, size, domain) = (a.u32(4), a.u64(8), a.u32(40));
        if size == 0 {
            return -libc::EINVAL;
        }
        let key = match self.space_key(fd, domain) {
            Ok(k) => k,
            Err(e) => return -e,
        };
        self.note_live_domain(domain);
        let size = size.div_ceil(PAGE) * PAGE;
        let mut doms = self.rknpu.domains.write().unwrap();
        let space = doms.entry(key).or_default();
        let Some(iova) = self.place(space, size) else { return -self.space_full(size, key, space) };
        let bo = match KBo::new(size, flags, iova, key.id) {
            Ok(b) => Arc::new(b),
            Err(e) => return -e,
        };
        space.bos.insert(iova, bo.clone());
        space.used += size;
        let used_domains = doms.values().filter(|s| !s.bos.is_empty()).count() as u64;
        drop(doms);
        if self.cfg.port.memory == Memory::DeviceWide && key.id < MAX_DOMAINS {
            add(&self.stats.shared_pool_bos, 1);
        }
        self.stats.domains_used.fetch_max(used_domains, Ordering::Relaxed);
        self.stats.max_domain.fetch_max(u64::from(key.id), Ordering::Relaxed);
        self.rknpu.objs.lock().unwrap().insert(bo.obj_addr, bo.clone());
        let handle = self.with_file(fd, |f| {
            let h = f.next_handle;
            f.next_handle += 1;
            f.handles.insert(h, bo.clone());
            h
        });
        a.set_u32(0, handle);
        a.set_u64(16, bo.obj_addr);
        a.set_u64(24, iova);
        a.set_u64(32, 0);
        0
    }

    /// Frees `fd`'s buffer `bo` (MEM_DESTROY, close).
    fn rknpu_free(&self, fd: c_int, bo: &Arc<KBo>) {
        self.rknpu.objs.lock().unwrap().remove(&bo.obj_addr);
        let key = match self.cfg.port.memory {
            Memory::PerFd => SpaceKey { fd, id: bo.domain },
            _ => SpaceKey { fd: DEVICE, id: bo.domain },
        };
        let mut doms = self.rknpu.domains.write().unwrap();
        if let Some(s) = doms.get_mut(&key) {
            if s.bos.remove(&bo.iova).is_some() {
                s.used -= bo.size;
            }
        }
    }

    /// `rknpu_mem_destroy` (16 B): handle u32 @0, reserved u32 @4, obj_addr u64 @8.
    fn rknpu_mem_destroy(&self, fd: c_int, a: &Arg) -> c_int {
        let (handle, obj) = (a.u32(0), a.u64(8));
        let bo = self.with_file(fd, |f| {
            let bo = f.handles.get(&handle).filter(|b| b.obj_addr == obj).cloned()?;
            f.handles.remove(&handle);
            f.offsets.retain(|_, b| !Arc::ptr_eq(b, &bo));
            Some(bo)
        });
        match bo {
            Some(bo) => {
                self.rknpu_free(fd, &bo);
                0
            }
            None => -libc::EINVAL,
        }
    }

    /// `rknpu_mem_sync` (32 B): flags u32 @0, reserved @4, obj_addr u64 @8, offset @16, size @24.
    fn rknpu_mem_sync(&self, a: &Arg) -> c_int {
        let (flags, obj, off, size) = (a.u32(0), a.u64(8), a.u64(16), a.u64(24));
        let objs = self.rknpu.objs.lock().unwrap();
        let Some(bo) = objs.get(&obj) else { return -libc::EINVAL };
        // rkopnu and ep1sode maintain the whole buffer whatever range is asked.
        let whole = self.cfg.port.sync_whole;
        if bo.flags & MEM_CACHEABLE == 0 || flags & !3 != 0 || flags == 0 || (!whole && off + size > bo.size) {
            return -libc::EINVAL;
        }
        let bo = bo.clone();
        drop(objs);
        let (off, size) = if whole { (0, bo.size) } else { (off, size) };
        // TO_DEVICE cleans, FROM_DEVICE invalidates; both bits: clean, then invalidate.
        let mut n = 0;
        if flags & 1 != 0 && !self.cleans_lost() {
            n += bo.sync(Dir::ToDevice, off, size);
        }
        if flags & 2 != 0 {
            n += bo.sync(Dir::FromDevice, off, size);
        }
        add(&self.stats.syncs, 1);
        add(&self.stats.synced_bytes, n);
        0
    }

    /// `rknpu_submit` (104 B): flags @0, timeout @4, task_start @8, task_number @12,
    /// task_counter @16 (out), priority @20, task_obj_addr u64 @24, iommu_domain_id @32,
    /// reserved @36, task_base_addr u64 @40, hw_elapse_time s64 @48 (out), core_mask @56,
    /// fence_fd @60, subcore_task[5] {start, number} @64.
    ///
    /// Ports: rkopnu ignores the user's timeout, never writes `hw_elapse_time` and reports a
    /// hang as success ([`Kernel::rknpu_hang_reported`]); ep1sode refuses masks naming a core
    /// but 0; the quirk `eio_every` answers EIO before the job runs.
    fn rknpu_submit(&self, fd: c_int, a: &Arg) -> c_int {
        let t0 = Instant::now();
        let port = self.cfg.port;
        let nth = self.stats.submits.fetch_add(1, Ordering::Relaxed) + 1;
        let (task_number, task_obj, domain, core_mask, timeout) = (a.u32(12), a.u64(24), a.u32(32), a.u32(56), a.u32(4));
        // rkopnu: the job timeout is rocket's, whatever the caller asked.
        let timeout = if port.hang_as_success { self.cfg.job_timeout.as_millis() as u32 } else { timeout };
        a.set_u32(16, 0);
        if task_number == 0 {
            return -libc::EINVAL;
        }
        let Ok(key) = self.space_key(fd, domain) else { return -libc::EINVAL };
        self.note_live_domain(domain);
        let all = if port.core0_only { 1 } else { (1u32 << self.cfg.soc.cores) - 1 };
        if core_mask & !all != 0 {
            if port.core0_only {
                eprintln!("ork-fake-kernel: rknpu SUBMIT with core mask {core_mask:#x}: the device tree gives the {} driver core 0 only (EINVAL)", port.name);
            }
            return -libc::EINVAL;
        }
        if core_mask.count_ones() > 1 {
            eprintln!("ork-fake-kernel: rknpu SUBMIT with multi-core mask {core_mask:#x}: kernel-side splits are not modelled (EINVAL)");
            return -libc::EINVAL;
        }
        // core_mask 0 = AUTO: the least-loaded core; here core 0.
        let core = if core_mask == 0 { 0 } else { core_mask.trailing_zeros() as usize };
        // The kernel reads only the target core's subcore entry (facts §1.3, conflict 7).
        let (start, number) = (a.u32(64 + core * 8), a.u32(64 + core * 8 + 4));
        if number == 0 {
            eprintln!("ork-fake-kernel: rknpu SUBMIT: subcore_task[{core}] has task_number 0 (a kernel Oops on the board)");
            add(&self.stats.bad, 1);
            return -libc::EINVAL;
        }
        let task_bo = match self.rknpu.objs.lock().unwrap().get(&task_obj) {
            Some(b) => b.clone(),
            None => return -libc::EINVAL,
        };
        let tsize = std::mem::size_of::<RknpuTask>() as u64;
        if (u64::from(start) + u64::from(number)) * tsize > task_bo.size {
            return -libc::EINVAL;
        }
        if task_bo.flags & MEM_KERNEL_MAPPING == 0 {
            eprintln!("ork-fake-kernel: rknpu SUBMIT: task buffer without KERNEL_MAPPING: the kernel reads a malformed task; the job hangs");
            add(&self.stats.bad, 1);
            return -libc::ETIMEDOUT;
        }
        // SAFETY: the range was checked against the task BO's size; the kernel mapping lives
        // as long as `task_bo`.
        let raw = unsafe {
            std::slice::from_raw_parts((task_bo.cpu as *const u8).add((u64::from(start) * tsize) as usize), (u64::from(number) * tsize) as usize)
        };
        let tasks: Vec<RknpuTask> = raw.chunks_exact(tsize as usize).map(ggml_ork_pod_read).collect();
        let core_nth = self.rknpu.core_submits[core.min(2)].fetch_add(1, Ordering::Relaxed) + 1;
        if Quirks::every(self.cfg.quirks.eio_every, core_nth) {
            add(&self.stats.eio, 1);
            eprintln!("ork-fake-kernel: rknpu SUBMIT: another core's job timed out and the device was reset: EIO (eio_every)");
            self.rknpu_reset();
            return -libc::EIO;
        }
        add(&self.stats.jobs_per_core[core], 1);
        if self.cfg.quirks.wedge && !self.rknpu.int8_ready.load(Ordering::Relaxed) {
            add(&self.stats.wedged, 1);
            let why = "int8 mode entered without a reset: the job wedged";
            if port.hang_as_success {
                return self.rknpu_hang_reported(a, task_number, why);
            }
            eprintln!("ork-fake-kernel: rknpu SUBMIT: {why} ({timeout} ms timeout, device reset)");
            self.rknpu_reset();
            return -libc::ETIMEDOUT;
        }
        if Quirks::every(self.cfg.quirks.hang_every, core_nth) {
            let why = "the job hangs (hang_every)";
            if port.hang_as_success {
                return self.rknpu_hang_reported(a, task_number, why);
            }
            add(&self.stats.hangs, 1);
            eprintln!("ork-fake-kernel: rknpu SUBMIT: {why} ({timeout} ms timeout, device reset)");
            self.rknpu_reset();
            return -libc::ETIMEDOUT;
        }
        if Quirks::every(self.cfg.quirks.never_run_every, nth) {
            add(&self.stats.never_ran, 1);
            a.set_u32(16, task_number);
            if !port.hang_as_success {
                a.set_u64(48, 1000);
            }
            return 0;
        }
        let doms = self.rknpu.domains.read().unwrap();
        let Some(space) = doms.get(&key) else { return -libc::EINVAL };
        if port.hang_as_success {
            // A program the hardware would not run hangs before anything of the job lands: the
            // job is decoded first, writing nothing.
            if let Err(e) = execute_tasks(&self.cfg.soc, space, &tasks, usize::MAX, timeout, &mut |_: &ProgramTrace| Exec::Skip) {
                drop(doms);
                add(&self.stats.bad, 1);
                return self.rknpu_hang_reported(a, task_number, &format!("the hardware would not run this job: {e}"));
            }
        }
        let mut written: Vec<Arc<KBo>> = Vec::new();
        let cold = self.cfg.quirks.cold;
        let stats = &self.stats;
        let mut hook = |t: &ProgramTrace| {
            let Some(bo) = space.bo_at(t.c_iova) else { return Exec::Run };
            if !written.iter().any(|b| Arc::ptr_eq(b, bo)) {
                written.push(bo.clone());
            }
            if cold && !bo.warm.load(Ordering::Relaxed) {
                add(&stats.stale, 1);
                Exec::Skip
            } else {
                Exec::Run
            }
        };
        let r = execute_tasks(&self.cfg.soc, space, &tasks, usize::MAX, timeout, &mut hook);
        for b in &written {
            b.warm.store(true, Ordering::Relaxed);
            add(&self.stats.evicted_lines, b.evict_dirty());
        }
        drop(doms);
        match r {
            Ok(ran) => {
                add(&self.stats.programs, ran as u64);
                add(&self.stats.programs_per_core[core], ran as u64);
                a.set_u32(16, ran as u32);
                if !port.hang_as_success {
                    a.set_u64(48, t0.elapsed().as_nanos() as u64);
                }
                0
            }
            Err(e) => {
                add(&self.stats.bad, 1);
                eprintln!("ork-fake-kernel: rknpu SUBMIT on core {core}, domain {domain}: the hardware would not run this job: {e}; timeout and device reset");
                self.rknpu_reset();
                -libc::ETIMEDOUT
            }
        }
    }

    /// rkopnu: a job that hangs is reported as success. Rocket's job timeout passes
    /// (`ORK_FK_JOB_TIMEOUT_MS`, default 500 ms), its timeout handler resets the core that timed
    /// out (mainline rocket resets per core, so the int8 mode is entered and the other cores'
    /// buffers stay as they were), and the port returns 0 with `task_counter = task_number`,
    /// nothing written and `hw_elapse_time` left as passed (counter `hangs`).
    fn rknpu_hang_reported(&self, a: &Arg, task_number: u32, why: &str) -> c_int {
        add(&self.stats.hangs, 1);
        eprintln!(
            "ork-fake-kernel: rknpu SUBMIT ({}): {why}; after the {} ms job timeout the core is reset and the job reported as done",
            self.cfg.port.name,
            self.cfg.job_timeout.as_millis()
        );
        std::thread::sleep(self.cfg.job_timeout);
        self.rknpu.int8_ready.store(true, Ordering::Relaxed);
        a.set_u32(16, task_number);
        0
    }

    // ---- rocket --------------------------------------------------------------------------

    fn rocket_file(&self, fd: c_int) -> Arc<RocketFile> {
        self.with_file(fd, |f| f.rocket.clone().expect("rocket file"))
    }

    /// `drm_rocket_create_bo` (24 B): size u32 @0, handle u32 @4 (out), dma_address u64 @8
    /// (out), offset u64 @16 (out).
    fn rocket_create_bo(&self, fd: c_int, a: &Arg) -> c_int {
        add(&self.stats.mem_create, 1);
        let size = u64::from(a.u32(0));
        if size == 0 {
            return -libc::EINVAL;
        }
        let size = size.div_ceil(PAGE) * PAGE;
        let rf = self.rocket_file(fd);
        let mut space = rf.space.write().unwrap();
        let Some(iova) = space.bottom_up(size, 0, self.cfg.window) else {
            add(&self.stats.efault, 1);
            return -libc::ENOSPC;
        };
        let bo = match KBo::new(size, MEM_CACHEABLE, iova, 0) {
            Ok(b) => Arc::new(b),
            Err(e) => return -e,
        };
        if space.bos.is_empty() && !space.ever_used {
            space.ever_used = true;
            add(&self.stats.spaces_used, 1);
        }
        space.bos.insert(iova, bo.clone());
        space.used += size;
        drop(space);
        self.stats.domains_used.fetch_max(1, Ordering::Relaxed);
        let (handle, offset) = self.with_file(fd, |f| {
            let h = f.next_handle;
            f.next_handle += 1;
            f.handles.insert(h, bo.clone());
            let off = f.next_offset;
            f.next_offset += size;
            f.offsets.insert(off, bo.clone());
            (h, off)
        });
        a.set_u32(4, handle);
        a.set_u64(8, iova);
        a.set_u64(16, offset);
        0
    }

    fn rocket_gem_close(&self, fd: c_int, a: &Arg) -> c_int {
        let handle = a.u32(0);
        let rf = self.rocket_file(fd);
        let bo = self.with_file(fd, |f| {
            let bo = f.handles.remove(&handle)?;
            f.offsets.retain(|_, b| !Arc::ptr_eq(b, &bo));
            Some(bo)
        });
        let Some(bo) = bo else { return -libc::EINVAL };
        // Only the creating fd's space maps the BO (an imported handle has no IOVA there).
        let mut space = rf.space.write().unwrap();
        if space.bos.get(&bo.iova).is_some_and(|b| Arc::ptr_eq(b, &bo)) {
            space.bos.remove(&bo.iova);
            space.used -= bo.size;
        }
        0
    }

    /// `DRM_IOCTL_PRIME_HANDLE_TO_FD` (`drm_prime_handle`, 12 B: handle u32 @0, flags u32 @4,
    /// fd s32 @8 out). The dma-buf is a dup of the BO's memfd: mmap of it maps the BO's pages
    /// (its CPU view), as a dma-buf of a shmem GEM object does.
    fn prime_export(&self, fd: c_int, a: &Arg) -> c_int {
        let Some(bo) = self.with_file(fd, |f| f.handles.get(&a.u32(0)).cloned()) else { return -libc::ENOENT };
        let cloexec = if a.u32(4) & libc::O_CLOEXEC as u32 != 0 { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
        // SAFETY: fcntl(F_DUPFD*) on the BO's own memfd, which lives as long as `bo`.
        let dfd = unsafe { libc::fcntl(bo.memfd.as_raw_fd(), cloexec, 0) };
        if dfd < 0 {
            return -libc::EMFILE;
        }
        let Some(key) = file_key(dfd) else { return -libc::EBADF };
        self.dmabufs.lock().unwrap().insert(key, Arc::downgrade(&bo));
        add(&self.stats.prime_exports, 1);
        a.set_u32(8, dfd as u32);
        0
    }

    /// `DRM_IOCTL_PRIME_FD_TO_HANDLE`: a handle on this fd for the GEM object behind a dma-buf
    /// (the same handle if the fd already has one). Like mainline's self-import
    /// (`drm_gem_prime_import` returns the exporting device's own object): the handle names the
    /// *same* object — same pages, same device view, so syncs through either fd act on both —
    /// but rocket maps a BO into an IOMMU domain only in CREATE_BO, for the creating fd: the
    /// importing fd's address space gets nothing, and a job there cannot address it.
    fn prime_import(&self, fd: c_int, a: &Arg) -> c_int {
        let Some(key) = file_key(a.u32(8) as c_int) else { return -libc::EBADF };
        let Some(bo) = self.dmabufs.lock().unwrap().get(&key).and_then(std::sync::Weak::upgrade) else { return -libc::EINVAL };
        add(&self.stats.prime_imports, 1);
        let h = self.with_file(fd, |f| {
            if let Some((&h, _)) = f.handles.iter().find(|(_, b)| Arc::ptr_eq(b, &bo)) {
                return h;
            }
            let h = f.next_handle;
            f.next_handle += 1;
            f.handles.insert(h, bo.clone());
            h
        });
        a.set_u32(0, h);
        0
    }

    /// `drm_rocket_submit` (24 B): jobs u64 @0, job_count u32 @8, job_struct_size u32 @12,
    /// reserved u64 @16. `drm_rocket_job` (40 B): tasks u64 @0, in_bo_handles u64 @8,
    /// out_bo_handles u64 @16, task_count @24, task_struct_size @28, in count @32, out count @36.
    /// `drm_rocket_task` (8 B): regcmd u32 @0, regcmd_count u32 @4.
    fn rocket_submit(&self, fd: c_int, a: &Arg) -> c_int {
        let (jobs, count, jsize) = (a.u64(0), a.u32(8), a.u32(12) as usize);
        if a.u64(16) != 0 || jsize < 40 || jobs == 0 {
            return -libc::EINVAL;
        }
        let rf = self.rocket_file(fd);
        for j in 0..count as usize {
            add(&self.stats.submits, 1);
            let job = Arg((jobs as usize + j * jsize) as *mut u8);
            let (tasks_p, in_p, out_p) = (job.u64(0), job.u64(8), job.u64(16));
            let (ntask, tsize, nin, nout) = (job.u32(24), job.u32(28) as usize, job.u32(32), job.u32(36));
            if tsize < 8 || ntask == 0 {
                return -libc::EINVAL;
            }
            let read_handles = |p: u64, n: u32| -> Vec<u32> {
                (0..n as usize)
                    // SAFETY: the caller passed `n` u32 handles at `p` (drm_rocket_job contract).
                    .map(|i| unsafe { std::ptr::read_unaligned((p as usize + i * 4) as *const u32) })
                    .collect()
            };
            let (ins, outs) = (read_handles(in_p, nin), read_handles(out_p, nout));
            let tasks: Vec<(u32, u32)> = (0..ntask as usize)
                .map(|i| {
                    let t = Arg((tasks_p as usize + i * tsize) as *mut u8);
                    (t.u32(0), t.u32(4))
                })
                .collect();
            let resolved = self.with_file(fd, |f| {
                let all: Option<Vec<Arc<KBo>>> = ins.iter().chain(&outs).map(|h| f.handles.get(h).cloned()).collect();
                all.map(|v| v[ins.len()..].to_vec())
            });
            let Some(out_bos) = resolved else {
                // Mainline drops the job and the ioctl still returns 0 (peer-facts §2).
                add(&self.stats.vanished, 1);
                eprintln!("ork-fake-kernel: rocket SUBMIT names a handle this fd does not own: the job vanished (ioctl returns 0)");
                continue;
            };
            for b in &out_bos {
                b.pending.fetch_add(1, Ordering::AcqRel);
            }
            let seq = self.stats.submits.load(Ordering::Relaxed);
            let job = RocketJob { file: rf.clone(), tasks, outs: out_bos, submitted: Instant::now(), seq };
            self.rocket_queues[rf.core].lock().unwrap().send(job).expect("fake rocket core alive");
        }
        0
    }

    /// One core of the rocket personality runs a job (each task on its own: TASK_NUMBER 1).
    fn rocket_run(&self, core: usize, job: RocketJob) {
        add(&self.stats.jobs_per_core[core], 1);
        let never = self.cfg.quirks.never_run_every.is_some_and(|n| job.seq % n == 0);
        let mut killed = None;
        if never {
            add(&self.stats.never_ran, 1);
        } else {
            let space = job.file.space.read().unwrap();
            let mut written: Vec<Arc<KBo>> = Vec::new();
            let cold = self.cfg.quirks.cold;
            let stats = &self.stats;
            for &(regcmd, count) in &job.tasks {
                if count < 4 {
                    killed = Some(format!("regcmd_count {count} has no trailer"));
                    break;
                }
                let t = RknpuTask { regcfg_amount: count - 4, regcmd_addr: u64::from(regcmd), ..RknpuTask::default() };
                let mut hook = |t: &ProgramTrace| {
                    let Some(bo) = space.bo_at(t.c_iova) else { return Exec::Run };
                    if !written.iter().any(|b| Arc::ptr_eq(b, bo)) {
                        written.push(bo.clone());
                    }
                    if cold && !bo.warm.load(Ordering::Relaxed) {
                        add(&stats.stale, 1);
                        Exec::Skip
                    } else {
                        Exec::Run
                    }
                };
                match execute_tasks(&self.cfg.soc, &*space, &[t], usize::MAX, 500, &mut hook) {
                    Ok(n) => {
                        add(&self.stats.programs, n as u64);
                        add(&self.stats.programs_per_core[core], n as u64);
                    }
                    Err(e) => {
                        killed = Some(e.to_string());
                        break;
                    }
                }
            }
            for b in &written {
                b.warm.store(true, Ordering::Relaxed);
                add(&self.stats.evicted_lines, b.evict_dirty());
            }
        }
        if let Some(why) = killed {
            add(&self.stats.killed, 1);
            eprintln!("ork-fake-kernel: rocket job on core {core} would hang: {why}; killed by the 500 ms job timeout, its fence still signals");
            let left = ROCKET_JOB_TIMEOUT.saturating_sub(job.submitted.elapsed());
            std::thread::sleep(left);
        }
        let _g = self.fence.0.lock().unwrap();
        for b in &job.outs {
            b.pending.fetch_sub(1, Ordering::AcqRel);
        }
        self.fence.1.notify_all();
    }

    /// `drm_rocket_prep_bo` (16 B): handle u32 @0, reserved u32 @4, timeout_ns s64 @8 — an
    /// absolute CLOCK_MONOTONIC deadline.
    fn rocket_prep_bo(&self, fd: c_int, a: &Arg) -> c_int {
        if a.u32(4) != 0 {
            return -libc::EINVAL;
        }
        let Some(bo) = self.with_file(fd, |f| f.handles.get(&a.u32(0)).cloned()) else { return -libc::ENOENT };
        let deadline = a.u64(8) as i64;
        let passed_at_call = monotonic_ns() >= deadline;
        let mut g = self.fence.0.lock().unwrap();
        loop {
            if bo.pending.load(Ordering::Acquire) == 0 {
                // The fence signalled: dma_sync_sgtable_for_cpu of the whole BO, an invalidate.
                add(&self.stats.syncs, 1);
                add(&self.stats.synced_bytes, bo.sync(Dir::FromDevice, 0, bo.size));
                return 0;
            }
            let now = monotonic_ns();
            if now >= deadline {
                add(&self.stats.prep_timeouts, 1);
                return if passed_at_call { -libc::EBUSY } else { -libc::ETIMEDOUT };
            }
            let wait = Duration::from_nanos(((deadline - now) as u64).min(10_000_000));
            g = self.fence.1.wait_timeout(g, wait).unwrap().0;
        }
    }

    // ---- mmap ----------------------------------------------------------------------------

    fn mmap(&self, addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> Result<*mut c_void, c_int> {
        let bo = self.with_file(fd, |f| f.offsets.get(&(off as u64)).cloned()).ok_or(libc::EINVAL)?;
        if len as u64 > bo.size || flags & libc::MAP_SHARED == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: maps the BO's own memfd; the result is checked against MAP_FAILED.
        let p = unsafe { libc::mmap(addr, len, prot, flags, bo.memfd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        self.maps.lock().unwrap().insert(p as usize, len);
        add(&self.stats.client_maps, 1);
        Ok(p)
    }

    fn report(&self) {
        let s = &self.stats;
        if s.opens.load(Ordering::Relaxed) == 0 {
            return;
        }
        if env("ORK_FK_RSS_MS").is_some() {
            self.rss_sample();
            if let Some(p) = env("ORK_FK_RSS_SMAPS") {
                let _ = std::fs::write(p, self.rss_smaps.lock().map(|t| t.clone()).unwrap_or_default());
            }
        }
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let live_maps = self.maps.lock().map(|m| m.len()).unwrap_or(0);
        let mut pairs: Vec<(&str, String)> = vec![("personality", format!("{:?}", self.cfg.personality).to_lowercase())];
        if self.cfg.personality == Personality::Rknpu {
            pairs.push(("port", self.cfg.port.name.to_string()));
        }
        pairs.extend([
            ("opens", g(&s.opens).to_string()),
            ("ioctls", g(&s.ioctls).to_string()),
            ("mem_create", g(&s.mem_create).to_string()),
            ("efault", g(&s.efault).to_string()),
            ("enospc", g(&s.enospc).to_string()),
            ("enomem", g(&s.enomem).to_string()),
            ("shared_pool_bos", g(&s.shared_pool_bos).to_string()),
            ("domains_used", g(&s.domains_used).to_string()),
            ("max_domain", g(&s.max_domain).to_string()),
            ("submits", g(&s.submits).to_string()),
            ("programs", g(&s.programs).to_string()),
            ("jobs_per_core", s.jobs_per_core.iter().map(|c| g(c).to_string()).collect::<Vec<_>>().join(",")),
            ("programs_per_core", s.programs_per_core.iter().map(|c| g(c).to_string()).collect::<Vec<_>>().join(",")),
            ("act_reset", g(&s.act_reset).to_string()),
            ("stale", g(&s.stale).to_string()),
            ("wedged", g(&s.wedged).to_string()),
            ("never_ran", g(&s.never_ran).to_string()),
            ("hangs", g(&s.hangs).to_string()),
            ("reset_busy", g(&s.reset_busy).to_string()),
            ("eio", g(&s.eio).to_string()),
            ("bad", g(&s.bad).to_string()),
            ("vanished", g(&s.vanished).to_string()),
            ("killed", g(&s.killed).to_string()),
            ("prep_timeouts", g(&s.prep_timeouts).to_string()),
            ("client_maps", g(&s.client_maps).to_string()),
            ("syncs", g(&s.syncs).to_string()),
            ("synced_bytes", g(&s.synced_bytes).to_string()),
            ("evicted_lines", g(&s.evicted_lines).to_string()),
            ("prime_exports", g(&s.prime_exports).to_string()),
            ("prime_imports", g(&s.prime_imports).to_string()),
            ("spaces_used", g(&s.spaces_used).to_string()),
            ("peak_bo_bytes", g(&s.peak_bo_bytes).to_string()),
            ("live_client_maps", live_maps.to_string()),
        ]);
        if g(&s.rss_samples) > 0 {
            pairs.extend([
                ("rss_samples", g(&s.rss_samples).to_string()),
                ("rss_peak_kib", g(&s.rss_peak_kib).to_string()),
                ("rss_emu_at_peak_kib", g(&s.rss_emu_at_peak_kib).to_string()),
                ("rss_less_emu_peak_kib", g(&s.rss_less_emu_peak_kib).to_string()),
            ]);
        }
        let line: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!("ork-fake-kernel: {}", line.join(" "));
        if let Some(p) = env("ORK_FK_STATS") {
            let body: String = pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&p) {
                let _ = f.write_all(format!("pid={}\n{body}\n", std::process::id()).as_bytes());
            }
        }
        if env("ORK_FK_TREE").is_none() {
            let _ = std::fs::remove_dir_all(&self.cfg.tree);
        }
    }
}

fn ggml_ork_pod_read(c: &[u8]) -> RknpuTask {
    let u = |o: usize| u32::from_le_bytes(c[o..o + 4].try_into().unwrap());
    // rknpu_task (packed, 40 B): flags, op_idx, enable_mask, int_mask, int_clear, int_status,
    // regcfg_amount, regcfg_offset (u32 each), regcmd_addr u64 @32.
    RknpuTask {
        flags: u(0),
        op_idx: u(4),
        enable_mask: u(8),
        int_mask: u(12),
        int_clear: u(16),
        int_status: u(20),
        regcfg_amount: u(24),
        regcfg_offset: u(28),
        regcmd_addr: u64::from_le_bytes(c[32..40].try_into().unwrap()),
    }
}

/// (st_dev, st_ino) of an open file: what identifies a dma-buf here.
fn file_key(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat fills the stat buffer we own; `fd` is checked by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

// ---------------------------------------------------------------------------------------------
// Entry points for shim.c
// ---------------------------------------------------------------------------------------------

/// Runs `f`, turning a panic into `fallback` (no unwinding into C).
fn guard<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("ork-fake-kernel: internal panic");
        fallback
    })
}

/// Whether `fd` is an open fake device file. Lock-free (the shim calls it on every fd).
#[no_mangle]
pub extern "C" fn ork_fk_is_dev(fd: c_int) -> c_int {
    match KERNEL.get() {
        Some(k) if fd >= 0 && (fd as usize) < MAX_FD => k.is_dev[fd as usize].load(Ordering::Acquire) as c_int,
        _ => 0,
    }
}

/// Opens a device node: an fd, -errno, or `NOT_OURS` (-100000) for paths that are not nodes.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ork_fk_open(path: *const c_char, _flags: c_int) -> c_int {
    // SAFETY: the shim passes open()'s path argument, a C string.
    let p = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
    guard(-libc::EIO, || kernel().open(&p))
}

/// Where a discovery path lives in the fake tree, or NULL.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ork_fk_redirect(path: *const c_char) -> *const c_char {
    // SAFETY: the shim passes a C string.
    let p = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
    guard(std::ptr::null(), || kernel().redirect(&p).map_or(std::ptr::null(), |c| c.as_ptr()))
}

/// An ioctl on a fake device fd: ≥ 0 or -errno.
///
/// # Safety
/// `arg` points at the argument block the request number describes.
#[no_mangle]
pub unsafe extern "C" fn ork_fk_ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    #[allow(clippy::useless_conversion)] // reason: c_ulong is u32 on 32-bit targets
    let req = u64::from(req);
    guard(-libc::EIO, || kernel().ioctl(fd, req, arg))
}

/// mmap of a fake device fd at a BO's fake offset.
///
/// # Safety
/// `err` is writable.
#[no_mangle]
pub unsafe extern "C" fn ork_fk_mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: libc::off_t, err: *mut c_int) -> *mut c_void {
    #[allow(clippy::useless_conversion)] // reason: off_t is i32 on some 32-bit targets
    let off = i64::from(off);
    match guard(Err(libc::EIO), || kernel().mmap(addr, len, prot, flags, fd, off)) {
        Ok(p) => p,
        Err(e) => {
            // SAFETY: the shim passes a pointer to its local errno slot.
            unsafe { *err = e };
            libc::MAP_FAILED
        }
    }
}

/// Every munmap of the process (to track client mappings of BOs). Takes only the map lock,
/// which is never held across a libc call.
#[no_mangle]
pub extern "C" fn ork_fk_munmap(addr: *mut c_void, _len: usize) {
    if let Some(k) = KERNEL.get() {
        if let Ok(mut m) = k.maps.lock() {
            m.remove(&(addr as usize));
        }
    }
}

/// close() of a fake device fd.
#[no_mangle]
pub extern "C" fn ork_fk_close(fd: c_int) {
    if let Some(k) = KERNEL.get() {
        guard((), || k.close(fd));
    }
}

/// At exit: the counters (stderr, and `ORK_FK_STATS`).
#[no_mangle]
pub extern "C" fn ork_fk_report() {
    if let Some(k) = KERNEL.get() {
        guard((), || k.report());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(p: usize, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: test reads inside a live BO's mapping (callers pass in-range spans).
        unsafe { std::slice::from_raw_parts((p + off) as *const u8, len) }.to_vec()
    }
    fn fill(p: usize, off: usize, len: usize, v: u8) {
        // SAFETY: as in `view`.
        unsafe { std::ptr::write_bytes((p + off) as *mut u8, v, len) };
    }

    /// An ioctl argument block of `n` bytes for the tests.
    fn arg(n: usize) -> Vec<u8> {
        vec![0u8; n]
    }
    fn ioctl(k: &Kernel, fd: c_int, req: u64, a: &mut [u8]) -> c_int {
        k.ioctl(fd, req, a.as_mut_ptr() as *mut c_void)
    }
    fn u32_at(a: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(a[o..o + 4].try_into().unwrap())
    }
    fn u64_at(a: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(a[o..o + 8].try_into().unwrap())
    }
    /// CREATE_BO of `size` on `fd`: (errno-or-0, handle, iova, mmap offset).
    fn create_bo(k: &Kernel, fd: c_int, size: u32) -> (c_int, u32, u64, u64) {
        let mut a = arg(24);
        a[0..4].copy_from_slice(&size.to_le_bytes());
        let r = ioctl(k, fd, ROCKET_CREATE_BO, &mut a);
        (r, u32_at(&a, 4), u64_at(&a, 8), u64_at(&a, 16))
    }

    /// rocket under the kernel model: every fd is its own address space with its own window
    /// (`ORK_FK_DOMAIN_MB`, here 1 MiB); PRIME export/import shares one object between fds —
    /// the same pages through every mapping, one device view that a sync through either handle
    /// maintains — and gives the importing fd no NPU address for it.
    #[test]
    fn rocket_fds_have_own_windows_and_prime_shares_pages_without_an_address() {
        // SAFETY: set before the kernel is first built; no other test of this binary reads them.
        unsafe {
            std::env::set_var("ORK_FAKE_KERNEL", "rocket");
            std::env::set_var("ORK_FK_DOMAIN_MB", "1");
            std::env::set_var("ORK_FK_QUIRKS", "none");
        }
        let k = kernel();
        let (f0, f1) = (k.open("/dev/accel/accel0"), k.open("/dev/accel/accel0"));
        assert!(f0 >= 0 && f1 >= 0);
        // Per-descriptor windows: fd 0's 1 MiB fills, fd 1 still has its own from IOVA 0.
        let (r, h0, iova0, off0) = create_bo(k, f0, 3 * PAGE as u32);
        assert_eq!((r, iova0), (0, 0), "the first BO of an fd sits at IOVA 0");
        let (r, big, _, _) = create_bo(k, f0, (1 << 20) - 3 * PAGE as u32);
        assert_eq!(r, 0, "the rest of fd 0's window");
        assert_eq!(create_bo(k, f0, PAGE as u32).0, -libc::ENOSPC, "fd 0's window is full");
        let (r, own1, iova1, _) = create_bo(k, f1, PAGE as u32);
        assert_eq!((r, iova1), (0, 0), "fd 1 has a window of its own");
        // Export from fd 0, import on fd 1.
        let p0 = k.mmap(std::ptr::null_mut(), 3 * PAGE as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f0, off0 as i64).unwrap() as usize;
        fill(p0, 0, 3 * PAGE as usize, 0x5a);
        let mut a = arg(12);
        a[0..4].copy_from_slice(&h0.to_le_bytes());
        a[4..8].copy_from_slice(&(libc::O_CLOEXEC as u32).to_le_bytes());
        assert_eq!(ioctl(k, f0, DRM_PRIME_HANDLE_TO_FD, &mut a), 0);
        let dmabuf = u32_at(&a, 8) as c_int;
        let mut b = arg(12);
        b[8..12].copy_from_slice(&(dmabuf as u32).to_le_bytes());
        assert_eq!(ioctl(k, f1, DRM_PRIME_FD_TO_HANDLE, &mut b), 0);
        let h1 = u32_at(&b, 0);
        assert_ne!(h1, own1, "a new handle on fd 1");
        let mut again = b.clone();
        assert_eq!(ioctl(k, f1, DRM_PRIME_FD_TO_HANDLE, &mut again), 0);
        assert_eq!(u32_at(&again, 0), h1, "importing the same dma-buf again gives the same handle");
        // The same pages: what fd 0's mapping wrote, the dma-buf's mapping reads, and back.
        // SAFETY: a shared mapping of the dma-buf (a memfd) of 3 pages, checked below.
        let p1 = unsafe { libc::mmap(std::ptr::null_mut(), 3 * PAGE as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, dmabuf, 0) };
        assert_ne!(p1, libc::MAP_FAILED);
        let p1 = p1 as usize;
        assert_eq!(view(p1, 0, 3 * PAGE as usize), vec![0x5a; 3 * PAGE as usize], "an import that copies would read a stale or empty buffer");
        fill(p1, 100, 8, 0x11);
        assert_eq!(view(p0, 100, 8), vec![0x11; 8]);
        // One device view: a clean through fd 1's handle is what the object (fd 0's) holds.
        let bo0 = k.with_file(f0, |f| f.handles[&h0].clone());
        assert_eq!(view(bo0.dev, 100, 8), vec![0; 8], "nothing cleaned yet");
        let mut fini = arg(8);
        fini[0..4].copy_from_slice(&h1.to_le_bytes());
        assert_eq!(ioctl(k, f1, ROCKET_FINI_BO, &mut fini), 0);
        assert_eq!(view(bo0.dev, 96, 16), [vec![0x5a; 4], vec![0x11; 8], vec![0x5a; 4]].concat());
        // No NPU address on fd 1: its space holds only its own BO (at the same IOVA 0).
        let rf1 = k.rocket_file(f1);
        let sp = rf1.space.read().unwrap();
        assert!(sp.bos.values().all(|b| !Arc::ptr_eq(b, &bo0)), "the imported object is mapped in fd 1's space");
        drop(sp);
        // Closing the imported handle leaves fd 1's own BO at IOVA 0 mapped.
        let mut close = arg(8);
        close[0..4].copy_from_slice(&h1.to_le_bytes());
        assert_eq!(ioctl(k, f1, DRM_GEM_CLOSE, &mut close), 0);
        assert!(rf1.space.read().unwrap().bo_at(0).is_some_and(|b| !Arc::ptr_eq(b, &bo0)));
        let _ = big;
        // SAFETY: unmapping the mapping made above; closing the dma-buf fd we own.
        unsafe {
            libc::munmap(p1 as *mut c_void, 3 * PAGE as usize);
            libc::close(dmabuf);
        }
    }

    /// The cache model: CPU writes are invisible to the device until a to-device sync of their
    /// lines; device writes invisible to the CPU until a from-device sync, which drops CPU writes
    /// that were not cleaned.
    #[test]
    fn views_meet_only_through_syncs_of_whole_lines() {
        let bo = KBo::new(2 * PAGE, MEM_CACHEABLE, 0x1000, 0).unwrap();
        fill(bo.cpu, 0, 256, 0xaa);
        assert_eq!(view(bo.dev, 0, 256), vec![0; 256], "no sync: the device reads stale memory");
        // A 4-byte sync at 100 cleans the whole line 64..128, nothing else.
        assert_eq!(bo.sync(Dir::ToDevice, 100, 4), 64);
        assert_eq!(view(bo.dev, 64, 64), vec![0xaa; 64]);
        assert_eq!(view(bo.dev, 0, 64), vec![0; 64]);
        assert_eq!(view(bo.dev, 128, 128), vec![0; 128]);
        // The device writes; the CPU sees it only after an invalidate, which also drops the
        // uncleaned CPU write in line 0..64.
        fill(bo.dev, 0, 128, 0x55);
        assert_eq!(view(bo.cpu, 0, 4), vec![0xaa; 4]);
        assert_eq!(bo.sync(Dir::FromDevice, 0, 128), 128);
        assert_eq!(view(bo.cpu, 0, 128), vec![0x55; 128]);
        assert_eq!(view(bo.cpu, 128, 128), vec![0xaa; 128], "lines outside the range keep the CPU's bytes");
        // The range is clamped to the buffer.
        assert_eq!(bo.sync(Dir::ToDevice, 2 * PAGE - 4, 4), 64);
        // Every line is clean now (synced, or never written): a job's write stays.
        bo.sync(Dir::ToDevice, 0, 2 * PAGE);
        fill(bo.dev, 512, 128, 0x77);
        assert_eq!(bo.evict_dirty(), 0);
        assert_eq!(view(bo.dev, 512, 128), vec![0x77; 128]);
        // A CPU write into an output not cleaned before the job (a sentinel, say) comes back
        // after it, over the device's result, one whole line (peer-facts §6).
        fill(bo.cpu, 600, 4, 0x7f);
        fill(bo.dev, 512, 128, 0x33);
        assert_eq!(bo.evict_dirty(), 1);
        assert_eq!(view(bo.dev, 576, 64), view(bo.cpu, 576, 64));
        assert_eq!(view(bo.dev, 600, 4), vec![0x7f; 4]);
        assert_eq!(view(bo.dev, 512, 64), vec![0x33; 64]);
        // Cleaned before the job, it does not.
        fill(bo.cpu, 700, 4, 0x7e);
        bo.sync(Dir::ToDevice, 700, 4);
        fill(bo.dev, 640, 128, 0x44);
        assert_eq!(bo.evict_dirty(), 0);
        assert_eq!(view(bo.dev, 640, 128), vec![0x44; 128]);
    }

    /// The RSS sampler counts a synced BO's device view, the kernel's own mapping of its memfd
    /// and its line hashes as the emulator's (2.125× the BO), and the client's mapping of the
    /// same pages as the process's.
    #[test]
    fn rss_sampler_tells_the_emulator_s_mappings_from_the_process_s() {
        const MIB: u64 = 1 << 20;
        let _quiet = RSS_QUIET.write().unwrap_or_else(|e| e.into_inner());
        let size = 16 * MIB;
        let bo = KBo::new(size, 0, 0, 0).unwrap();
        // SAFETY: a shared mapping of the BO's memfd (what the product's mmap gets), checked below.
        let client = unsafe {
            libc::mmap(std::ptr::null_mut(), size as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, bo.memfd.as_raw_fd(), 0)
        };
        assert_ne!(client, libc::MAP_FAILED);
        let (t0, e0, _) = sample_rss(false).unwrap();
        fill(client as usize, 0, size as usize, 0x5a);
        assert_eq!(bo.sync(Dir::ToDevice, 0, size), size);
        let (t1, e1, marked) = sample_rss(true).unwrap();
        let kib = |b: u64| (b / 1024) as i64;
        let emu = (e1 - e0) as i64;
        let own = (t1 - e1) as i64 - (t0 - e0) as i64;
        assert!((emu - kib(size * 17 / 8)).abs() < kib(MIB), "emulator's share grew by {emu} KiB, expected 2.125 x {} KiB", kib(size));
        assert!((own - kib(size)).abs() < kib(2 * MIB), "the process's own share grew by {own} KiB, expected {} KiB", kib(size));
        assert!(marked.contains("OrkFakeKernel: emulator"));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(client, size as usize) };
    }

    // ---- the rknpu ports ---------------------------------------------------------------------

    /// Held (shared) by every [`TestKernel`], and alone by the RSS sampler's test, whose two
    /// samples must not see other tests' buffers come and go.
    static RSS_QUIET: RwLock<()> = RwLock::new(());

    /// A kernel of its own for one test (not the process's [`KERNEL`]): rknpu on `port`, with
    /// `quirks`, 64 MiB windows and CMA pool, a 20 ms job timeout, its tree removed on drop.
    struct TestKernel {
        k: Kernel,
        _quiet: std::sync::RwLockReadGuard<'static, ()>,
    }

    impl std::ops::Deref for TestKernel {
        type Target = Kernel;
        fn deref(&self) -> &Kernel {
            &self.k
        }
    }

    impl Drop for TestKernel {
        fn drop(&mut self) {
            let fds: Vec<c_int> = self.k.files.lock().unwrap().keys().copied().collect();
            for fd in fds {
                self.k.close(fd);
                // SAFETY: the memfd `open` made for this fake file, closed only here.
                unsafe { libc::close(fd) };
            }
            let _ = std::fs::remove_dir_all(&self.k.cfg.tree);
        }
    }

    fn rknpu_kernel_with(port: &str, quirks: &str, tune: impl FnOnce(&mut Config)) -> TestKernel {
        static N: AtomicU64 = AtomicU64::new(0);
        let mut c = Config {
            personality: Personality::Rknpu,
            port: port_named(port).unwrap(),
            soc: SocDesc::get(SocId::Rk3588),
            tree: std::env::temp_dir().join(format!("ork-fk-unit-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))),
            window: 64 << 20,
            cma: 64 << 20,
            job_timeout: Duration::from_millis(20),
            render_only: false,
            quirks: parse_quirks(quirks),
        };
        tune(&mut c);
        let quiet = RSS_QUIET.read().unwrap_or_else(|e| e.into_inner());
        TestKernel { k: Kernel::new(c), _quiet: quiet }
    }
    fn rknpu_kernel(port: &str, quirks: &str) -> TestKernel {
        rknpu_kernel_with(port, quirks, |_| {})
    }

    /// ACTION `sel` with value `v`: (errno-or-0, the value written back).
    fn action(k: &Kernel, fd: c_int, sel: u32, v: u32) -> (c_int, u32) {
        let mut a = arg(8);
        a[0..4].copy_from_slice(&sel.to_le_bytes());
        a[4..8].copy_from_slice(&v.to_le_bytes());
        let r = ioctl(k, fd, RKNPU_ACTION, &mut a);
        (r, u32_at(&a, 4))
    }
    /// MEM_CREATE of `size` in domain `domain`: (errno-or-0, handle, obj_addr, dma_addr).
    fn mem_create(k: &Kernel, fd: c_int, size: u64, flags: u32, domain: u32) -> (c_int, u32, u64, u64) {
        let mut a = arg(48);
        a[4..8].copy_from_slice(&flags.to_le_bytes());
        a[8..16].copy_from_slice(&size.to_le_bytes());
        a[40..44].copy_from_slice(&domain.to_le_bytes());
        let r = ioctl(k, fd, RKNPU_MEM_CREATE, &mut a);
        (r, u32_at(&a, 0), u64_at(&a, 16), u64_at(&a, 24))
    }
    fn mem_sync(k: &Kernel, fd: c_int, flags: u32, obj: u64, off: u64, size: u64) -> c_int {
        let mut a = arg(32);
        a[0..4].copy_from_slice(&flags.to_le_bytes());
        a[8..16].copy_from_slice(&obj.to_le_bytes());
        a[16..24].copy_from_slice(&off.to_le_bytes());
        a[24..32].copy_from_slice(&size.to_le_bytes());
        ioctl(k, fd, RKNPU_MEM_SYNC, &mut a)
    }
    /// DRM_IOCTL_VERSION: (errno-or-0, major.minor.patch, name, desc).
    fn drm_version(k: &Kernel, fd: c_int) -> (c_int, (u32, u32, u32), String, String) {
        let (mut name, mut desc) = (vec![0u8; 64], vec![0u8; 64]);
        let mut a = arg(64);
        a[16..24].copy_from_slice(&64u64.to_le_bytes());
        a[24..32].copy_from_slice(&(name.as_mut_ptr() as u64).to_le_bytes());
        a[48..56].copy_from_slice(&64u64.to_le_bytes());
        a[56..64].copy_from_slice(&(desc.as_mut_ptr() as u64).to_le_bytes());
        let r = ioctl(k, fd, DRM_VERSION, &mut a);
        let s = |b: &[u8], len: u64| String::from_utf8_lossy(&b[..len as usize]).into_owned();
        (r, (u32_at(&a, 0), u32_at(&a, 4), u32_at(&a, 8)), s(&name, u64_at(&a, 16)), s(&desc, u64_at(&a, 48)))
    }
    /// A task buffer (KERNEL_MAPPING) of one task whose regcmd lies at `regcmd` in domain
    /// `domain`: its obj_addr.
    fn task_bo(k: &Kernel, fd: c_int, domain: u32, regcmd: u64) -> u64 {
        let (r, handle, obj, _) = mem_create(k, fd, PAGE, MEM_CACHEABLE | MEM_KERNEL_MAPPING, domain);
        assert_eq!(r, 0);
        let bo = k.with_file(fd, |f| f.handles[&handle].clone());
        let mut t = [0u8; 40];
        t[24..28].copy_from_slice(&1u32.to_le_bytes());
        t[32..40].copy_from_slice(&regcmd.to_le_bytes());
        // SAFETY: the task BO's CPU view is a page long and alive (`bo`).
        unsafe { std::ptr::copy_nonoverlapping(t.as_ptr(), bo.cpu as *mut u8, t.len()) };
        obj
    }
    /// SUBMIT of task 0 of `task_obj` on `core_mask` (subcore entry of core 0 or the mask's
    /// core), `hw_elapse_time` preset to a marker: the argument block after the call.
    fn submit(k: &Kernel, fd: c_int, task_obj: u64, domain: u32, core_mask: u32) -> (c_int, Vec<u8>) {
        let mut a = arg(104);
        a[4..8].copy_from_slice(&6000u32.to_le_bytes());
        a[12..16].copy_from_slice(&1u32.to_le_bytes());
        a[24..32].copy_from_slice(&task_obj.to_le_bytes());
        a[32..36].copy_from_slice(&domain.to_le_bytes());
        a[48..56].copy_from_slice(&0xdead_beefu64.to_le_bytes());
        a[56..60].copy_from_slice(&core_mask.to_le_bytes());
        let core = if core_mask == 0 { 0 } else { core_mask.trailing_zeros() as usize };
        a[64 + core * 8 + 4..64 + core * 8 + 8].copy_from_slice(&1u32.to_le_bytes());
        let r = ioctl(k, fd, RKNPU_SUBMIT, &mut a);
        (r, a)
    }
    fn stat(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// What each port answers before any buffer: DRM version and description, the ACTION
    /// versions, clock and IOMMU, an unknown selector (0 on rkopnu only) and POWER_ON.
    #[test]
    fn ports_answer_their_versions_and_actions() {
        // (port, DRM version, desc, GET_DRV_VERSION, GET_FREQ, GET_IOMMU_EN, unknown ACTION)
        let rows = [
            ("vendor", (0, 9, 8), "RKNPU driver", 908, 1_000_000_000, 1, -libc::EINVAL),
            ("rkopnu", (0, 0, 0), "rkopnu (rknpu ABI on mainline rocket)", 908, 1_000_000_000, 1, 0),
            ("dkms", (0, 9, 8), "RKNPU driver", 908, 800_000_000, 1, -libc::EINVAL),
            ("helios", (0, 9, 8), "RKNPU driver", 908, 200_000_000, 0, -libc::EINVAL),
            ("ep1sode", (0, 9, 6), "RKNPU driver", 906, 1_000_000_000, 1, -libc::EINVAL),
            ("odd", (0, 9, 4), "RKNPU driver", 908, 1_000_000_000, 1, -libc::EINVAL),
        ];
        for (port, ver, desc, drv, freq, iommu, unknown) in rows {
            let k = rknpu_kernel(port, "none");
            let fd = k.open("/dev/dri/card1");
            assert!(fd >= 0);
            let (r, v, name, d) = drm_version(&k, fd);
            assert_eq!((r, v, name.as_str(), d.as_str()), (0, ver, "rknpu", desc), "{port}: DRM_IOCTL_VERSION");
            assert_eq!(action(&k, fd, 1, 0), (0, drv), "{port}: GET_DRV_VERSION");
            assert_eq!(action(&k, fd, 2, 0), (0, freq), "{port}: GET_FREQ");
            assert_eq!(action(&k, fd, 18, 0), (0, iommu), "{port}: GET_IOMMU_EN");
            assert_eq!(action(&k, fd, 0x7f, 5).0, unknown, "{port}: an unknown ACTION selector");
            assert_eq!(action(&k, fd, 20, 5).0, unknown, "{port}: POWER_ON, unknown to 0.9.8");
            if unknown == 0 {
                assert_eq!(action(&k, fd, 0x7f, 5).1, 0, "{port}: 0 written back");
            }
            // The display controller is the same on every port.
            let card0 = k.open("/dev/dri/card0");
            assert_eq!(drm_version(&k, card0).2, "rockchip-drm");
        }
    }

    /// The fake tree: `renderD129` beside `card1` (or alone with `ORK_FK_NODES=render`), the
    /// interrupt names of the cores the device tree gives the driver, devfreq where the port has it.
    #[test]
    fn ports_make_their_nodes_and_sysfs() {
        let read = |k: &Kernel, rel: &str| std::fs::read(k.cfg.tree.join(rel)).ok();
        let irqs = |node: &str| format!("sys/class/drm/{node}/device/of_node/interrupt-names");
        let devfreq = "sys/class/devfreq/fdab0000.npu/cur_freq";
        let k = rknpu_kernel("vendor", "none");
        for node in ["card1", "renderD129"] {
            assert!(k.cfg.tree.join("dev/dri").join(node).exists(), "{node}");
            assert_eq!(read(&k, &irqs(node)).as_deref(), Some(&b"npu0_irq\0npu1_irq\0npu2_irq\0"[..]), "{node}");
        }
        assert_eq!(read(&k, devfreq).as_deref(), Some(&b"1000000000\n"[..]));
        let (a, b) = (k.open("/dev/dri/card1"), k.open("/dev/dri/renderD129"));
        assert!(a >= 0 && b >= 0, "one device, two nodes");
        assert_eq!(drm_version(&k, b).2, "rknpu");
        assert_eq!(k.open("/dev/dri/renderD128"), -libc::ENOENT);
        assert_eq!(read(&rknpu_kernel("dkms", "none"), devfreq).as_deref(), Some(&b"800000000\n"[..]));
        for port in ["rkopnu", "helios", "ep1sode"] {
            let k = rknpu_kernel(port, "none");
            assert!(read(&k, devfreq).is_none(), "{port} has no devfreq node");
            assert_eq!(std::fs::read_dir(k.cfg.tree.join("sys/class/devfreq")).map(|d| d.count()).ok(), Some(0), "{port}: an empty listing");
        }
        let k = rknpu_kernel("ep1sode", "none");
        assert_eq!(read(&k, &irqs("renderD129")).as_deref(), Some(&b"npu0_irq\0"[..]), "ep1sode's tree: core 0 only");
        let k = rknpu_kernel_with("vendor", "none", |c| c.soc = SocDesc::get(SocId::Rk3576));
        assert_eq!(read(&k, &irqs("card1")).as_deref(), Some(&b"npu0_irq\0npu1_irq\0"[..]), "rk3576: two cores");
        let k = rknpu_kernel_with("vendor", "none", |c| c.render_only = true);
        assert!(!k.cfg.tree.join("dev/dri/card1").exists() && read(&k, &irqs("card1")).is_none());
        assert_eq!(k.open("/dev/dri/card1"), -libc::ENOENT);
        assert!(k.open("/dev/dri/renderD129") >= 0);
        assert!(read(&k, &irqs("renderD129")).is_some());
    }

    /// vendor, unchanged: 16 device-wide domains (two fds share one), IOVAs top-down, EFAULT
    /// when full, syncs of the range asked, ACT_RESET resets.
    #[test]
    fn vendor_domains_are_device_wide_top_down_and_efault() {
        let k = rknpu_kernel("vendor", "none");
        let (f0, f1) = (k.open("/dev/dri/card1"), k.open("/dev/dri/renderD129"));
        let (r, _, obj, iova) = mem_create(&k, f0, 2 * PAGE, MEM_CACHEABLE, 3);
        assert_eq!((r, iova), (0, k.cfg.window - 2 * PAGE));
        assert_eq!(mem_create(&k, f1, PAGE, 0, 3).3, k.cfg.window - 3 * PAGE, "the other fd, the same domain 3");
        assert_eq!(mem_create(&k, f1, k.cfg.window, 0, 3).0, -libc::EFAULT);
        assert_eq!(mem_create(&k, f1, PAGE, 0, 16).0, -libc::EINVAL);
        assert_eq!((stat(&k.stats.efault), stat(&k.stats.enospc)), (1, 0));
        // GET_IOMMU_DOMAIN_ID is the device's live domain: the last one a buffer, a job or a
        // switch of any file named.
        assert_eq!(action(&k, f0, 24, 9), (0, 3), "GET_IOMMU_DOMAIN_ID after buffers in domain 3");
        assert_eq!(action(&k, f0, 25, 15).0, 0);
        assert_eq!(action(&k, f1, 24, 0), (0, 15), "switched by the other file");
        assert_eq!(action(&k, f0, 25, 16).0, -libc::EINVAL);
        assert_eq!(action(&k, f0, 24, 0), (0, 15));
        assert_eq!(mem_sync(&k, f0, 1, obj, 100, 4), 0);
        assert_eq!(stat(&k.stats.synced_bytes), 64, "one line");
        assert_eq!(mem_sync(&k, f0, 1, obj, PAGE, 2 * PAGE), -libc::EINVAL, "past the buffer");
        assert_eq!(action(&k, f0, 6, 0), (0, 0));
        assert!(k.rknpu.int8_ready.load(Ordering::Relaxed));
    }

    /// rkopnu: 16 domains per fd, bottom-up from IOVA 0, ENOSPC when full; whole-buffer syncs;
    /// ACT_RESET does nothing (no int8 mode, buffers stay warm).
    #[test]
    fn rkopnu_domains_per_fd_bottom_up_enospc_whole_syncs_no_reset() {
        let k = rknpu_kernel("rkopnu", "none");
        let (f0, f1) = (k.open("/dev/dri/card1"), k.open("/dev/dri/card1"));
        let (r, h, obj, iova) = mem_create(&k, f0, 2 * PAGE, MEM_CACHEABLE, 0);
        assert_eq!((r, iova), (0, 0), "the first buffer of a domain gets IOVA 0");
        assert_eq!(mem_create(&k, f0, PAGE, 0, 0).3, 2 * PAGE, "bottom-up");
        assert_eq!(mem_create(&k, f0, PAGE, 0, 5).3, 0, "domain 5 of fd 0: a window of its own");
        assert_eq!(mem_create(&k, f1, PAGE, 0, 0).3, 0, "fd 1's domain 0 is not fd 0's");
        assert_eq!(mem_create(&k, f0, k.cfg.window, 0, 0).0, -libc::ENOSPC, "fd 0's domain 0 is full");
        assert_eq!(mem_create(&k, f1, k.cfg.window - PAGE, 0, 0).0, 0, "fd 1's is not");
        assert_eq!(mem_create(&k, f0, PAGE, 0, 16).0, -libc::EINVAL);
        assert_eq!((stat(&k.stats.enospc), stat(&k.stats.efault)), (1, 0));
        assert_eq!(action(&k, f0, 25, 7).0, 0, "SET_IOMMU_DOMAIN_ID below 16");
        assert_eq!(action(&k, f0, 25, 16).0, -libc::EINVAL);
        assert_eq!(action(&k, f0, 24, 9), (0, 0), "GET_IOMMU_DOMAIN_ID answers 0");
        // A 4-byte sync maintains the whole buffer, and a range past it is not refused.
        assert_eq!(mem_sync(&k, f0, 1, obj, 100, 4), 0);
        assert_eq!(stat(&k.stats.synced_bytes), 2 * PAGE);
        assert_eq!(mem_sync(&k, f0, 2, obj, PAGE, 8 * PAGE), 0);
        assert_eq!(stat(&k.stats.synced_bytes), 4 * PAGE);
        // ACT_RESET: 0, and nothing happens.
        let bo = k.with_file(f0, |f| f.handles[&h].clone());
        bo.warm.store(true, Ordering::Relaxed);
        assert_eq!(action(&k, f0, 6, 0), (0, 0));
        assert!(!k.rknpu.int8_ready.load(Ordering::Relaxed), "int8 mode not entered");
        assert!(bo.warm.load(Ordering::Relaxed), "buffers not made cold");
        // Closing fd 0 frees its windows: its domain 0 starts at 0 again for a new fd.
        k.close(f0);
        let f2 = k.open("/dev/dri/card1");
        assert_eq!(mem_create(&k, f2, PAGE, 0, 0).3, 0);
    }

    /// rkopnu: a job that hangs (a program the hardware would not run; the wedge, which its
    /// ACT_RESET does not prevent; `hang_every`) is reported as success after the job timeout:
    /// task_counter = task_number, hw_elapse_time and the output untouched, the device reset.
    #[test]
    fn rkopnu_reports_a_hang_as_success() {
        let k = rknpu_kernel("rkopnu", "wedge,hang_every:3");
        let fd = k.open("/dev/dri/card1");
        let (r, h, _, out_iova) = mem_create(&k, fd, PAGE, MEM_CACHEABLE, 0);
        assert_eq!((r, out_iova), (0, 0));
        let out = k.with_file(fd, |f| f.handles[&h].clone());
        fill(out.dev, 0, PAGE as usize, 0x5a);
        // The regcmd at 1 MiB: no buffer there, the hardware would not run it.
        let task = task_bo(&k, fd, 0, 1 << 20);
        assert_eq!(action(&k, fd, 6, 0).0, 0, "ACT_RESET: a no-op");
        // 1: wedged (int8 mode never entered by ACT_RESET here), reported as done.
        let t0 = Instant::now();
        let (r, a) = submit(&k, fd, task, 0, 1);
        assert_eq!((r, u32_at(&a, 16), u64_at(&a, 48)), (0, 1, 0xdead_beef), "success, task_counter full, hw_elapse_time untouched");
        assert!(t0.elapsed() >= k.cfg.job_timeout, "the job timeout passed");
        assert_eq!((stat(&k.stats.wedged), stat(&k.stats.hangs)), (1, 1));
        assert!(k.rknpu.int8_ready.load(Ordering::Relaxed), "rocket's timeout reset entered int8 mode");
        // 2: a program the hardware would not run: the same.
        let (r, a) = submit(&k, fd, task, 0, 0);
        assert_eq!((r, u32_at(&a, 16), u64_at(&a, 48)), (0, 1, 0xdead_beef));
        assert_eq!((stat(&k.stats.hangs), stat(&k.stats.bad)), (2, 1));
        // 3: hang_every:3.
        let (r, a) = submit(&k, fd, task, 0, 4);
        assert_eq!((r, u32_at(&a, 16), u64_at(&a, 48)), (0, 1, 0xdead_beef));
        assert_eq!(stat(&k.stats.hangs), 3);
        assert_eq!(view(out.dev, 0, PAGE as usize), vec![0x5a; PAGE as usize], "nothing written");
        assert_eq!(stat(&k.stats.programs), 0);
    }

    /// dkms: 64 device-wide ids; each fd's own id (16, 17, ...) from GET_IOMMU_DOMAIN_ID is a
    /// window of its own; 0..15 are shared pools (counted); another fd's id and ids >= 64 are
    /// EINVAL; top-down, ENOSPC when full.
    #[test]
    fn dkms_gives_each_fd_its_own_domain_id_and_counts_shared_pools() {
        let k = rknpu_kernel("dkms", "none");
        let _display = k.open("/dev/dri/card0");
        let (f0, f1) = (k.open("/dev/dri/card1"), k.open("/dev/dri/renderD129"));
        assert_eq!(action(&k, f0, 24, 0), (0, 16), "the first fd opened");
        assert_eq!(action(&k, f1, 24, 0), (0, 17), "the next");
        let (r, _, _, iova) = mem_create(&k, f0, PAGE, 0, 16);
        assert_eq!((r, iova), (0, k.cfg.window - PAGE), "own window, top-down");
        assert_eq!(mem_create(&k, f1, PAGE, 0, 17).3, k.cfg.window - PAGE, "fd 1's own window");
        assert_eq!(mem_create(&k, f0, PAGE, 0, 17).0, -libc::EINVAL, "fd 1's id");
        assert_eq!(mem_create(&k, f0, PAGE, 0, 40).0, -libc::EINVAL, "nobody's id");
        assert_eq!(mem_create(&k, f0, PAGE, 0, 64).0, -libc::EINVAL);
        assert_eq!(stat(&k.stats.shared_pool_bos), 0);
        assert_eq!(mem_create(&k, f0, PAGE, 0, 3).0, 0, "a shared pool works");
        assert_eq!(mem_create(&k, f1, PAGE, 0, 3).3, k.cfg.window - 2 * PAGE, "and is shared");
        assert_eq!(stat(&k.stats.shared_pool_bos), 2);
        assert_eq!(mem_create(&k, f0, k.cfg.window, 0, 16).0, -libc::ENOSPC);
        assert_eq!((stat(&k.stats.enospc), stat(&k.stats.efault)), (1, 0));
        assert_eq!(action(&k, f0, 25, 16).0, 0);
        assert_eq!(action(&k, f0, 25, 3).0, 0);
        assert_eq!(action(&k, f0, 25, 17).0, -libc::EINVAL);
        assert_eq!(action(&k, f0, 25, 64).0, -libc::EINVAL);
        // An fd's id is freed with it.
        k.close(f0);
        assert_eq!(action(&k, k.open("/dev/dri/card1"), 24, 0).1, 16);
    }

    /// dkms: ACT_RESET takes 100 ms; `reset_busy:2` answers the first two EBUSY without a reset.
    #[test]
    fn dkms_reset_is_busy_then_slow() {
        let k = rknpu_kernel("dkms", "reset_busy:2");
        let fd = k.open("/dev/dri/card1");
        assert_eq!(action(&k, fd, 6, 0).0, -libc::EBUSY);
        assert_eq!(action(&k, fd, 6, 0).0, -libc::EBUSY);
        assert!(!k.rknpu.int8_ready.load(Ordering::Relaxed), "a busy reset resets nothing");
        let t0 = Instant::now();
        assert_eq!(action(&k, fd, 6, 0), (0, 0));
        assert!(t0.elapsed() >= DKMS_RESET_TIME);
        assert!(k.rknpu.int8_ready.load(Ordering::Relaxed));
        assert_eq!((stat(&k.stats.reset_busy), stat(&k.stats.act_reset)), (2, 1));
    }

    /// `eio_every:N`: every N-th submit is EIO without running, every buffer cold again.
    #[test]
    fn dkms_eio_every_fails_a_submit_and_colds_the_buffers() {
        let k = rknpu_kernel("dkms", "eio_every:2");
        let fd = k.open("/dev/dri/card1");
        let (_, h, _, _) = mem_create(&k, fd, PAGE, MEM_CACHEABLE, 16);
        let bo = k.with_file(fd, |f| f.handles[&h].clone());
        let task = task_bo(&k, fd, 16, 1 << 20);
        assert_eq!(submit(&k, fd, task, 16, 1).0, -libc::ETIMEDOUT, "1: runs (a program the hardware would not run)");
        bo.warm.store(true, Ordering::Relaxed);
        assert_eq!(submit(&k, fd, task, 16, 1).0, -libc::EIO, "2: EIO");
        assert_eq!(stat(&k.stats.eio), 1);
        assert_eq!(stat(&k.stats.jobs_per_core[0]), 1, "the EIO job never reached a core");
        assert!(!bo.warm.load(Ordering::Relaxed), "the device was reset");
        assert_eq!(submit(&k, fd, task, 17, 1).0, -libc::EINVAL, "another fd's domain id");
    }

    /// `hang_every` on a port that does not report hangs as success: ETIMEDOUT and a reset.
    #[test]
    fn hang_every_elsewhere_is_a_timeout() {
        let k = rknpu_kernel("vendor", "hang_every:1");
        let fd = k.open("/dev/dri/card1");
        let task = task_bo(&k, fd, 0, 1 << 20);
        let (r, a) = submit(&k, fd, task, 0, 1);
        assert_eq!((r, u32_at(&a, 16)), (-libc::ETIMEDOUT, 0));
        assert_eq!(stat(&k.stats.hangs), 1);
        assert!(k.rknpu.int8_ready.load(Ordering::Relaxed));
    }

    /// helios: no IOMMU; one CMA pool of `ORK_FK_CMA_MB` whatever id below 16, addresses
    /// bottom-up from 0x1000_0000, ENOMEM when it runs out; SET_IOMMU_DOMAIN_ID does nothing.
    #[test]
    fn helios_has_one_cma_pool_and_enomem() {
        let k = rknpu_kernel_with("helios", "none", |c| c.cma = 1 << 20);
        let fd = k.open("/dev/dri/card1");
        let (r, _, obj, iova) = mem_create(&k, fd, 512 << 10, MEM_CACHEABLE, 0);
        assert_eq!((r, iova), (0, CMA_BASE));
        assert_eq!(mem_create(&k, fd, 512 << 10, 0, 7).3, CMA_BASE + (512 << 10), "domain 7: the same pool");
        assert_eq!(mem_create(&k, fd, PAGE, 0, 3).0, -libc::ENOMEM);
        assert_eq!(mem_create(&k, fd, PAGE, 0, 16).0, -libc::EINVAL);
        assert_eq!((stat(&k.stats.enomem), stat(&k.stats.efault), stat(&k.stats.enospc)), (1, 0, 0));
        assert_eq!(action(&k, fd, 25, 7), (0, 0));
        assert_eq!(action(&k, fd, 24, 0), (0, 0));
        assert_eq!(mem_sync(&k, fd, 1, obj, 100, 4), 0);
        assert_eq!(stat(&k.stats.synced_bytes), 64, "the range asked");
    }

    /// ep1sode: every id below 16 folds into domain 0's window (EFAULT when full); SET does
    /// nothing; whole-buffer syncs; core masks naming a core but 0 are EINVAL.
    #[test]
    fn ep1sode_has_one_domain_core0_and_whole_syncs() {
        let k = rknpu_kernel("ep1sode", "none");
        let fd = k.open("/dev/dri/card1");
        let (r, _, obj, iova) = mem_create(&k, fd, 2 * PAGE, MEM_CACHEABLE, 3);
        assert_eq!((r, iova), (0, k.cfg.window - 2 * PAGE));
        assert_eq!(mem_create(&k, fd, PAGE, 0, 0).3, k.cfg.window - 3 * PAGE, "id 0 and id 3: one window");
        assert_eq!(mem_create(&k, fd, k.cfg.window, 0, 9).0, -libc::EFAULT);
        assert_eq!((stat(&k.stats.efault), stat(&k.stats.enospc)), (1, 0));
        assert_eq!(action(&k, fd, 25, 3).0, 0);
        assert_eq!(action(&k, fd, 24, 0), (0, 0), "SET had no effect");
        assert_eq!(mem_sync(&k, fd, 1, obj, 100, 4), 0);
        assert_eq!(stat(&k.stats.synced_bytes), 2 * PAGE, "the whole buffer");
        let task = task_bo(&k, fd, 3, 1 << 20);
        assert_eq!(submit(&k, fd, task, 3, 2).0, -libc::EINVAL, "core 1");
        assert_eq!(submit(&k, fd, task, 3, 4).0, -libc::EINVAL, "core 2");
        assert_eq!(submit(&k, fd, task, 3, 1).0, -libc::ETIMEDOUT, "core 0 runs it (from domain 3 = 0)");
        assert_eq!(stat(&k.stats.jobs_per_core[0]), 1);
    }
}
