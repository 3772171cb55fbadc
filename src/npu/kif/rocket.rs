//! The mainline `rocket` accel driver (`/dev/accel/accel*`, Linux ≥ 6.18) behind
//! [`KernelInterface`].
//!
//! What this module owns: finding the accel node, the rocket ioctls (CREATE_BO, SUBMIT, PREP_BO,
//! FINI_BO, plus the DRM core's GEM_CLOSE), the CPU mappings of its buffer objects, and the
//! translation of the vendor-shaped job (an array of [`RknpuTask`] descriptors in a task buffer)
//! into rocket jobs.
//!
//! Decisions:
//! * **Translation.** The trait is shaped after the vendor driver, so `submit` reads the task
//!   descriptors `task_start..task_start+task_number` back out of the mapped task buffer and turns
//!   each into one `drm_rocket_task { regcmd = regcmd_addr, regcmd_count = regcfg_amount + 4 }`:
//!   rocket counts *all* entries including the 4-entry trailer (it programs
//!   `REGISTER_AMOUNTS = (count + 1) / 2 - 1`), the vendor kernel adds the 4 itself
//!   (rknpu-facts §1.5/§1.7, S2/S8). All tasks go into one rocket job, which the kernel runs
//!   sequentially on one core with TASK_NUMBER 1 per task, so the PC-chain links in the trailers
//!   are harmless (with TASK_NUMBER 1 the sequencer does not walk; §2.4).
//! * **Dependencies and completion.** Rocket has implicit sync: a job waits for the write fences
//!   of its in-BOs and of its out-BOs, and attaches its own fence to its out-BOs. The interface
//!   keeps every live BO by IOVA range and scans each task's regcmd: the BO holding the DPU
//!   destination (the register table's `DPU_DST_BASE_ADDR`; rknpu-facts §2.2 row 61, S6) is an
//!   out-BO, every other BO whose range contains a register value (and the regcmd BO itself) is
//!   an in-BO. A false positive only adds an ordering dependency, never a wrong result. The
//!   submit ioctl returns at once; completion is awaited with PREP_BO on each out-BO (which also
//!   makes the CPU view coherent). Its timeout is an *absolute* CLOCK_MONOTONIC time
//!   (`rocket_gem.c`, `drm_timeout_abs_to_jiffies`).
//! * **Cache maintenance.** `SyncDir::ToDevice` → FINI_BO, `SyncDir::FromDevice` → PREP_BO, each
//!   on the whole BO (mainline has no ranged variant), so a ranged `mem_sync` maintains the whole
//!   buffer and says so in the bytes it returns. The
//!   first stored uapi version has neither ioctl; `open` probes FINI_BO on a scratch BO and refuses
//!   such kernels, because without PREP_BO there is no way to wait for a job.
//! * **One fd per core.** Mainline binds every job of one fd to one core (peer-facts §2), so
//!   the interface opens [`FDS`] fds and runs a job with `core_mask = 1 << c` on fd `c`; each fd
//!   has its own IOMMU address space starting at IOVA 0 (0 is a valid address), so buffers
//!   live on fd 0 and are mirrored into the other fds on first use (see [`Rocket`]). Domains
//!   other than 0 are [`KifError::Unsupported`]; the kernel resets a core itself when a job
//!   exceeds its fixed 500 ms timeout, so [`KernelInterface::reset`] has nothing to do. Memory
//!   flags are ignored: rocket BOs are always cacheable shmem.
//! * **Cold output buffers** (rknpu-facts §2.6): as on rknpu, a job whose output buffer no job
//!   has written yet runs twice, the first result discarded.
//! * **Known blind spot.** Mainline `rocket_ioctl_submit` drops per-job errors (a bad BO handle
//!   makes the job vanish while the ioctl returns 0), and a job killed by the 500 ms timeout
//!   still signals its fence. The handle lists therefore name only buffers that address
//!   registers point into (never a buffer another thread may be destroying); what still goes
//!   wrong is invisible to the ioctls and left to the output check of the NPU core.
//!
//! Sources: shared reference `rknpu-facts.md` §1.7 (S8: `include/uapi/drm/rocket_accel.h`, both
//! stored versions, and `drivers/accel/rocket/rocket_job.c`), `rocket_gem.c` (PREP/FINI
//! semantics), §2.1–2.2 (regcmd entry encoding, DPU DST_BASE_ADDR).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;

use super::drm::{self, DRM_COMMAND_BASE, DRM_IOCTL_TYPE};
use super::{
    page_round, Bo, DomainId, Iova, KernelInterface, KifError, RknpuTask, SubmitDone, SubmitJob, SyncDir, Warmth,
    PAGE_BYTES,
};
use crate::npu::regcmd;
use crate::npu::regs::{RegCmd, DPU_DST_BASE_ADDR};

// ---------------------------------------------------------------------------------------------
// ABI
// ---------------------------------------------------------------------------------------------

/// Driver-relative ioctl numbers (rknpu-facts §1.7, S8).
pub mod nr {
    pub const CREATE_BO: u8 = 0x00;
    pub const SUBMIT: u8 = 0x01;
    pub const PREP_BO: u8 = 0x02;
    pub const FINI_BO: u8 = 0x03;
}

/// `struct drm_rocket_create_bo` (24 B; rknpu-facts §1.7, S8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrmRocketCreateBo {
    /// In: bytes.
    pub size: u32,
    /// Out: GEM handle.
    pub handle: u32,
    /// Out: NPU address, private to the fd.
    pub dma_address: u64,
    /// Out: mmap offset on the accel fd.
    pub offset: u64,
}

/// `struct drm_rocket_prep_bo` (16 B; rknpu-facts §1.7, S8 newer header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrmRocketPrepBo {
    pub handle: u32,
    pub reserved: u32,
    /// Absolute CLOCK_MONOTONIC deadline in ns (`drm_timeout_abs_to_jiffies`, rocket_gem.c).
    pub timeout_ns: i64,
}

/// `struct drm_rocket_fini_bo` (8 B; rknpu-facts §1.7, S8 newer header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrmRocketFiniBo {
    pub handle: u32,
    pub reserved: u32,
}

/// `struct drm_rocket_task` (8 B; rknpu-facts §1.7, S8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrmRocketTask {
    /// NPU address of the task's regcmd.
    pub regcmd: u32,
    /// ALL regcmd entries, trailer included.
    pub regcmd_count: u32,
}

/// `struct drm_rocket_job` (40 B; rknpu-facts §1.7, S8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrmRocketJob {
    /// User pointer to `DrmRocketTask[task_count]`.
    pub tasks: u64,
    /// User pointer to `u32[in_bo_handle_count]`.
    pub in_bo_handles: u64,
    /// User pointer to `u32[out_bo_handle_count]`.
    pub out_bo_handles: u64,
    pub task_count: u32,
    pub task_struct_size: u32,
    pub in_bo_handle_count: u32,
    pub out_bo_handle_count: u32,
}

/// `struct drm_rocket_submit` (24 B; rknpu-facts §1.7, S8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrmRocketSubmit {
    /// User pointer to `DrmRocketJob[job_count]`.
    pub jobs: u64,
    pub job_count: u32,
    pub job_struct_size: u32,
    /// Must be 0.
    pub reserved: u64,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<DrmRocketCreateBo>() == 24);
    assert!(offset_of!(DrmRocketCreateBo, handle) == 4);
    assert!(offset_of!(DrmRocketCreateBo, dma_address) == 8);
    assert!(offset_of!(DrmRocketCreateBo, offset) == 16);
    assert!(size_of::<DrmRocketPrepBo>() == 16);
    assert!(offset_of!(DrmRocketPrepBo, timeout_ns) == 8);
    assert!(size_of::<DrmRocketFiniBo>() == 8);
    assert!(size_of::<DrmRocketTask>() == 8);
    assert!(offset_of!(DrmRocketTask, regcmd_count) == 4);
    assert!(size_of::<DrmRocketJob>() == 40);
    assert!(offset_of!(DrmRocketJob, in_bo_handles) == 8);
    assert!(offset_of!(DrmRocketJob, out_bo_handles) == 16);
    assert!(offset_of!(DrmRocketJob, task_count) == 24);
    assert!(offset_of!(DrmRocketJob, task_struct_size) == 28);
    assert!(offset_of!(DrmRocketJob, in_bo_handle_count) == 32);
    assert!(offset_of!(DrmRocketJob, out_bo_handle_count) == 36);
    assert!(size_of::<DrmRocketSubmit>() == 24);
    assert!(offset_of!(DrmRocketSubmit, job_count) == 8);
    assert!(offset_of!(DrmRocketSubmit, job_struct_size) == 12);
    assert!(offset_of!(DrmRocketSubmit, reserved) == 16);
};

/// Raw ioctl wrappers (rknpu-facts §1.7, S8). Each is `unsafe`: the caller passes an open rocket
/// accel fd and a pointer to a live argument struct whose embedded user pointers are valid.
pub mod sys {
    use super::*;
    nix::ioctl_readwrite!(
        rocket_create_bo,
        DRM_IOCTL_TYPE,
        DRM_COMMAND_BASE + nr::CREATE_BO,
        DrmRocketCreateBo
    );
    nix::ioctl_write_ptr!(rocket_submit, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::SUBMIT, DrmRocketSubmit);
    nix::ioctl_write_ptr!(rocket_prep_bo, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::PREP_BO, DrmRocketPrepBo);
    nix::ioctl_write_ptr!(rocket_fini_bo, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::FINI_BO, DrmRocketFiniBo);
}

/// Full request numbers, for logs and the ABI tests.
pub mod request {
    use super::*;
    use std::mem::size_of;
    pub const CREATE_BO: u64 = nix::request_code_readwrite!(
        DRM_IOCTL_TYPE,
        DRM_COMMAND_BASE + nr::CREATE_BO,
        size_of::<DrmRocketCreateBo>()
    ) as u64;
    pub const SUBMIT: u64 = nix::request_code_write!(
        DRM_IOCTL_TYPE,
        DRM_COMMAND_BASE + nr::SUBMIT,
        size_of::<DrmRocketSubmit>()
    ) as u64;
    pub const PREP_BO: u64 = nix::request_code_write!(
        DRM_IOCTL_TYPE,
        DRM_COMMAND_BASE + nr::PREP_BO,
        size_of::<DrmRocketPrepBo>()
    ) as u64;
    pub const FINI_BO: u64 = nix::request_code_write!(
        DRM_IOCTL_TYPE,
        DRM_COMMAND_BASE + nr::FINI_BO,
        size_of::<DrmRocketFiniBo>()
    ) as u64;
}

/// Entries the vendor kernel adds to `regcfg_amount` (`RKNPU_PC_DATA_EXTRA_AMOUNT`; rknpu-facts
/// §1.5, S2). Rocket's `regcmd_count` includes them.
pub const PC_DATA_EXTRA_AMOUNT: u32 = 4;
/// PREP_BO wait used by `mem_sync(FromDevice)` and for submits with `timeout_ms == 0`: ork's
/// default submit timeout (`ORK_MM_TIMEOUT`, rknpu-facts §1.3 / §9).
pub const DEFAULT_WAIT_MS: u32 = 60_000;
/// DRM driver name of the mainline driver (rocket_drv.c, S8).
pub const DRIVER_NAME: &str = "rocket";
/// Where accel nodes live.
pub const ACCEL_DIR: &str = "/dev/accel";

// ---------------------------------------------------------------------------------------------
// Pure helpers (unit-tested without a device)
// ---------------------------------------------------------------------------------------------

/// The rocket task for one vendor descriptor: same regcmd, count = body + trailer.
pub fn rocket_task_from(t: &RknpuTask) -> Result<DrmRocketTask, KifError> {
    let addr = t.regcmd_addr;
    let amount = t.regcfg_amount;
    let regcmd = u32::try_from(addr)
        .map_err(|_| KifError::Invalid(format!("rocket: regcmd address {addr:#x} is not 32-bit")))?;
    if regcmd % 16 != 0 {
        return Err(KifError::Invalid(format!("rocket: regcmd address {regcmd:#010x} not 16-byte aligned")));
    }
    let regcmd_count = amount
        .checked_add(PC_DATA_EXTRA_AMOUNT)
        .ok_or_else(|| KifError::Invalid(format!("rocket: regcfg_amount {amount} overflows")))?;
    Ok(DrmRocketTask { regcmd, regcmd_count })
}

/// Reads `task_number` descriptors starting at `task_start` from a task buffer's bytes.
pub fn read_tasks(task_bytes: &[u8], task_start: u32, task_number: u32) -> Result<Vec<RknpuTask>, KifError> {
    let sz = std::mem::size_of::<RknpuTask>();
    let start = task_start as usize * sz;
    let end = start + task_number as usize * sz;
    if task_number == 0 || end > task_bytes.len() {
        return Err(KifError::Invalid(format!(
            "rocket: tasks {task_start}..+{task_number} do not fit the {}-byte task buffer",
            task_bytes.len()
        )));
    }
    Ok(task_bytes[start..end].chunks_exact(sz).map(bytemuck::pod_read_unaligned::<RknpuTask>).collect())
}

/// Which BO ranges a regcmd stream references. `ranges` are `(iova_start, size_bytes, handle)`.
/// Returns (in-handles, out-handles), each sorted and disjoint: a BO named by a DPU
/// `DST_BASE_ADDR` write (the program's output) is an out-BO; a BO another address register
/// points into (activations, weights, the PC chain link) is an in-BO. Only address registers
/// count: IOVAs start at 0 on rocket, so plain values (sizes, strides, 0) fall inside some BO,
/// and naming another thread's BO that is destroyed meanwhile makes the kernel drop the whole
/// job while the ioctl returns 0 (seen under the fake kernel: a wrong perplexity, no error).
pub fn classify_refs(entries: &[RegCmd], ranges: &[(u32, usize, u32)]) -> (Vec<u32>, Vec<u32>) {
    let find = |v: u32| {
        ranges
            .iter()
            .find(|&&(start, size, _)| v >= start && (v as u64) < start as u64 + size as u64)
            .map(|&(_, _, h)| h)
    };
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for &e in entries {
        if e.target_op() == 0 || !super::is_address_reg(&e) {
            continue; // no-op entry, or a value that is not an address
        }
        if let Some(h) = find(e.value()) {
            if e.writes(&DPU_DST_BASE_ADDR::REG) {
                outs.push(h);
            } else {
                ins.push(h);
            }
        }
    }
    outs.sort_unstable();
    outs.dedup();
    ins.sort_unstable();
    ins.dedup();
    ins.retain(|h| outs.binary_search(h).is_err());
    (ins, outs)
}

// ---------------------------------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------------------------------

/// Finds the first `/dev/accel/accel*` whose DRM driver name is "rocket".
pub fn find_node() -> Result<PathBuf, KifError> {
    drm::find_by_driver(Path::new(ACCEL_DIR), "accel", DRIVER_NAME)
}

/// Opens the mainline rocket driver as a kernel interface, one fd per core of [`FDS`].
pub fn open() -> Result<Box<dyn KernelInterface>, KifError> {
    let path = find_node()?;
    Ok(Box::new(Rocket::open_path(&path)?))
}

/// File descriptors opened per device: one per NPU core (RK3588 has 3). Mainline binds all
/// jobs of one fd to one core's scheduler (peer-facts §2), so a job on `core_mask = 1 << c`
/// goes to fd `c`.
pub const FDS: usize = 3;

/// Bookkeeping of one live BO on one fd, keyed by its IOVA.
struct BoRec {
    handle: u32,
    size_bytes: usize,
    /// CPU address of the mapping (kept as an integer so the map is `Send`).
    cpu_addr: usize,
    /// Bumped by every `mem_sync(ToDevice)`: the CPU changed the bytes (primary BOs only).
    gen: u64,
}

/// One open fd: its own IOMMU address space (IOVAs start at 0) and its own core.
struct CoreFd {
    fd: File,
    /// Live BOs of this fd by IOVA start. Held while a submit reads regcmd through the
    /// mappings, so a concurrent `mem_destroy` cannot unmap them mid-read.
    bos: Mutex<BTreeMap<u32, BoRec>>,
}

/// The copy of a primary BO (fd 0) in another core's address space.
struct Mirror {
    handle: u32,
    iova: u32,
    size_bytes: usize,
    map: memmap2::MmapRaw,
    /// The primary's `gen` this copy was made from (`u64::MAX` = never).
    synced_gen: u64,
}

/// A live connection to the rocket driver: one fd per core.
///
/// Buffers are created on fd 0 (the *primary*: the `Bo`'s IOVA and CPU mapping are fd 0's). A
/// job for core 0 runs on fd 0 as is. A job for core `c > 0` runs on fd `c`, whose address space
/// is private: every buffer the job touches gets a *mirror* BO on fd `c` (created on first use);
/// before the job, mirrors whose primary changed since (`mem_sync(ToDevice)` bumps a generation)
/// are refreshed by copy, and the regcmd is copied with its address registers translated into fd
/// `c`'s IOVAs; after the job the outputs are copied back into the primary. A weight is
/// therefore resident once per core that runs it — the price of mainline's per-fd address
/// spaces (PRIME imports get no NPU address on rocket).
pub struct Rocket {
    path: PathBuf,
    fds: Vec<CoreFd>,
    /// Per core: primary handle → mirror on that core's fd (index 0 stays empty). Lock order:
    /// a core's `mirrors` before any `bos`.
    mirrors: Vec<Mutex<HashMap<u32, Mirror>>>,
    /// Output buffers written since creation (primary handles; cold-buffer quirk, §2.6).
    warmth: Warmth,
}

fn monotonic_now_ns() -> i64 {
    let mut ts = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill; CLOCK_MONOTONIC always exists.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    #[allow(clippy::useless_conversion)] // reason: time_t / c_long are i32 on 32-bit targets
    let ns = i64::from(ts.tv_sec) * 1_000_000_000 + i64::from(ts.tv_nsec);
    ns
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CoreFd {
    fn fini_bo(&self, handle: u32) -> Result<(), KifError> {
        let a = DrmRocketFiniBo { handle, reserved: 0 };
        // SAFETY: `a` is a valid drm_rocket_fini_bo for the whole call; `self.fd` is open.
        drm::restart(|| unsafe { sys::rocket_fini_bo(self.fd.as_raw_fd(), &a) })
            .map(|_| ())
            .map_err(|source| KifError::Sys { op: "DRM_ROCKET_FINI_BO", source })
    }

    /// Waits (until `timeout_ms` from now) for jobs writing `handle`, then syncs it for the CPU.
    fn prep_bo(&self, handle: u32, timeout_ms: u32) -> Result<(), KifError> {
        let a = DrmRocketPrepBo {
            handle,
            reserved: 0,
            // An absolute CLOCK_MONOTONIC deadline, not a duration (rocket_gem.c).
            timeout_ns: monotonic_now_ns() + timeout_ms as i64 * 1_000_000,
        };
        // SAFETY: `a` is a valid drm_rocket_prep_bo for the whole call; `self.fd` is open.
        drm::restart(|| unsafe { sys::rocket_prep_bo(self.fd.as_raw_fd(), &a) })
            .map(|_| ())
            .map_err(|source| match source {
                Errno::ETIMEDOUT | Errno::EBUSY => KifError::Timeout { timeout_ms },
                source => KifError::Sys { op: "DRM_ROCKET_PREP_BO", source },
            })
    }

    /// CREATE_BO + mmap. Returns (handle, IOVA, mapping). IOVA 0 is a valid address.
    fn create(&self, size: usize) -> Result<(u32, u32, memmap2::MmapRaw), KifError> {
        let size32 = u32::try_from(size)
            .map_err(|_| KifError::Invalid(format!("rocket: a BO is at most 4 GiB, asked {size} B")))?;
        let mut c = DrmRocketCreateBo { size: size32, ..DrmRocketCreateBo::default() };
        // SAFETY: `c` is a valid drm_rocket_create_bo for the whole call; `self.fd` is open.
        drm::restart(|| unsafe { sys::rocket_create_bo(self.fd.as_raw_fd(), &mut c) }).map_err(|e| match e {
            Errno::ENOMEM | Errno::ENOSPC | Errno::EFAULT => KifError::Fault { op: "DRM_ROCKET_CREATE_BO", domain: 0 },
            source => KifError::Sys { op: "DRM_ROCKET_CREATE_BO", source },
        })?;
        let handle = c.handle;
        let fail = |e: KifError| {
            if let Err(d) = drm::gem_close(&self.fd, handle) {
                log::warn!("rocket: cleanup of half-created BO {handle} failed: {d}");
            }
            e
        };
        let Ok(iova) = u32::try_from(c.dma_address) else {
            return Err(fail(KifError::Invalid(format!("rocket: non-32-bit NPU address {:#x}", c.dma_address))));
        };
        let map = memmap2::MmapOptions::new()
            .offset(c.offset)
            .len(size)
            .map_raw(&self.fd)
            .map_err(|e| fail(KifError::Sys { op: "mmap", source: drm::io_to_errno(&e) }))?;
        Ok((handle, iova, map))
    }

    fn submit(&self, tasks: &[DrmRocketTask], ins: &[u32], outs: &[u32]) -> Result<(), KifError> {
        let rj = DrmRocketJob {
            tasks: tasks.as_ptr() as u64,
            in_bo_handles: ins.as_ptr() as u64,
            out_bo_handles: outs.as_ptr() as u64,
            task_count: tasks.len() as u32,
            task_struct_size: std::mem::size_of::<DrmRocketTask>() as u32,
            in_bo_handle_count: ins.len() as u32,
            out_bo_handle_count: outs.len() as u32,
        };
        let s = DrmRocketSubmit {
            jobs: &rj as *const DrmRocketJob as u64,
            job_count: 1,
            job_struct_size: std::mem::size_of::<DrmRocketJob>() as u32,
            reserved: 0,
        };
        // SAFETY: `s` points at `rj`, which points at `tasks`, `ins` and `outs`; all four live
        // until the ioctl returns (the kernel copies them in during the call).
        drm::restart(|| unsafe { sys::rocket_submit(self.fd.as_raw_fd(), &s) })
            .map(|_| ())
            .map_err(|source| KifError::Sys { op: "DRM_ROCKET_SUBMIT", source })
    }
}

impl Rocket {
    /// Opens [`FDS`] fds on `path` (one per core), checks the driver name, and checks that
    /// PREP_BO/FINI_BO exist.
    pub fn open_path(path: &Path) -> Result<Rocket, KifError> {
        let mut fds = Vec::with_capacity(FDS);
        for _ in 0..FDS {
            let fd = drm::open_node(path)?;
            let name = drm::driver_name(&fd)?;
            if name != DRIVER_NAME {
                return Err(KifError::NoDevice(format!(
                    "{} is DRM driver \"{name}\", not \"{DRIVER_NAME}\"",
                    path.display()
                )));
            }
            fds.push(CoreFd { fd, bos: Mutex::new(BTreeMap::new()) });
        }
        let dev = Rocket { path: path.to_path_buf(), fds, mirrors: (0..FDS).map(|_| Mutex::new(HashMap::new())).collect(), warmth: Warmth::default() };
        // Probe FINI_BO: kernels with only CREATE_BO/SUBMIT cannot wait for a job.
        let probe = dev.mem_create(PAGE_BYTES, 0, DomainId(0))?;
        let fini = dev.fds[0].fini_bo(probe.handle);
        dev.mem_destroy(probe)?;
        if let Err(e) = fini {
            log::error!("rocket: FINI_BO probe failed ({e}); kernel too old");
            return Err(KifError::Unsupported {
                driver: "rocket",
                what: "kernel without DRM_ROCKET_PREP_BO/FINI_BO (cannot wait for jobs)",
            });
        }
        log::info!("{}", dev.describe());
        Ok(dev)
    }

    /// Reads the regcmd entries of `tasks` through fd 0's mappings, with the primary handle of
    /// the buffer holding each task's regcmd.
    fn read_regcmd(&self, tasks: &[DrmRocketTask]) -> Result<Vec<(u32, u32, Vec<RegCmd>)>, KifError> {
        let bos = lock(&self.fds[0].bos);
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            let len_bytes = t.regcmd_count as usize * 8;
            let (&start, rec) = bos.range(..=t.regcmd).next_back().ok_or_else(|| {
                KifError::Invalid(format!("rocket: regcmd {:#010x} is not in a live buffer", t.regcmd))
            })?;
            let off = (t.regcmd - start) as usize;
            if off + len_bytes > rec.size_bytes {
                return Err(KifError::Invalid(format!(
                    "rocket: regcmd {:#010x} + {} entries overruns its buffer",
                    t.regcmd, t.regcmd_count
                )));
            }
            // SAFETY: the range lies inside a live mapping (checked above); the map lock is
            // held, so `mem_destroy` cannot unmap it meanwhile; the caller does not write regcmd
            // while submitting it (the same contract the device needs).
            let bytes = unsafe { std::slice::from_raw_parts((rec.cpu_addr + off) as *const u8, len_bytes) };
            out.push((rec.handle, t.regcmd - start, regcmd::from_bytes(bytes)));
        }
        Ok(out)
    }

    /// The in/out handle lists (primary handles) of a job, from its regcmd.
    fn job_refs(&self, progs: &[(u32, u32, Vec<RegCmd>)]) -> (Vec<u32>, Vec<u32>) {
        let ranges: Vec<(u32, usize, u32)> =
            lock(&self.fds[0].bos).iter().map(|(&iova, r)| (iova, r.size_bytes, r.handle)).collect();
        let entries: Vec<RegCmd> = progs.iter().flat_map(|(_, _, e)| e.iter().copied()).collect();
        let mut regcmd_handles: Vec<u32> = progs.iter().map(|(h, _, _)| *h).collect();
        let (mut ins, mut outs) = classify_refs(&entries, &ranges);
        if outs.is_empty() {
            // Nothing to wait on: make the regcmd buffers the completion carriers.
            log::debug!("rocket: job writes no known buffer; waiting on its regcmd buffer instead");
            regcmd_handles.sort_unstable();
            regcmd_handles.dedup();
            outs = regcmd_handles;
        } else {
            ins.extend(regcmd_handles);
        }
        ins.sort_unstable();
        ins.dedup();
        ins.retain(|h| outs.binary_search(h).is_err());
        (ins, outs)
    }

    /// Runs the job on fd 0 (core 0): the buffers are the primaries. Returns the bytes of cache
    /// maintenance done (the completion wait, PREP_BO, also invalidates each whole output BO).
    fn run_primary(&self, progs: &[(u32, u32, Vec<RegCmd>)], tasks: &[DrmRocketTask], ins: &[u32], outs: &[u32], timeout_ms: u32) -> Result<usize, KifError> {
        let _ = progs;
        let fd = &self.fds[0];
        fd.submit(tasks, ins, outs)?;
        let mut synced = 0;
        for &h in outs {
            fd.prep_bo(h, timeout_ms)?;
            synced += lock(&fd.bos).values().find(|r| r.handle == h).map_or(0, |r| r.size_bytes);
        }
        Ok(synced)
    }

    /// Runs the job on fd `core` through mirrors (see [`Rocket`]). Returns the bytes of cache
    /// maintenance done (every FINI_BO/PREP_BO of a whole mirror or primary).
    fn run_mirrored(&self, core: usize, progs: &[(u32, u32, Vec<RegCmd>)], ins: &[u32], outs: &[u32], timeout_ms: u32) -> Result<usize, KifError> {
        let cfd = &self.fds[core];
        let mut synced = 0;
        let mut mirrors = lock(&self.mirrors[core]);
        // Primary records by handle and by IOVA (for translation).
        let prim: Vec<(u32, u32, usize, usize, u64)> =
            lock(&self.fds[0].bos).iter().map(|(&iova, r)| (r.handle, iova, r.size_bytes, r.cpu_addr, r.gen)).collect();
        let by_handle = |h: u32| prim.iter().find(|p| p.0 == h).copied();
        let by_addr = |v: u32| prim.iter().find(|p| v >= p.1 && (v as u64) < p.1 as u64 + p.2 as u64).copied();
        // Every buffer the job names (inputs, outputs, the regcmd buffers) and every buffer an
        // address register points into gets a mirror; refresh the stale ones.
        let mut need: Vec<u32> = ins.iter().chain(outs).copied().collect();
        for (_, _, entries) in progs {
            for e in entries.iter().filter(|e| super::is_address_reg(e)) {
                if let Some(p) = by_addr(e.value()) {
                    need.push(p.0);
                }
            }
        }
        need.sort_unstable();
        need.dedup();
        for &h in &need {
            let (_, _, size, cpu, gen) = by_handle(h).ok_or_else(|| KifError::Invalid(format!("rocket: handle {h} is not live")))?;
            if let std::collections::hash_map::Entry::Vacant(v) = mirrors.entry(h) {
                let (mh, miova, map) = cfd.create(size)?;
                log::debug!("rocket: mirror of BO {h} on core {core}: handle {mh} iova {miova:#010x}");
                v.insert(Mirror { handle: mh, iova: miova, size_bytes: size, map, synced_gen: u64::MAX });
            }
            let m = mirrors.get_mut(&h).expect("mirror just made");
            if m.synced_gen != gen {
                // SAFETY: both mappings are live and `size` bytes long (the mirror was created
                // with the primary's size); the caller does not write the primary while
                // submitting it; nothing else writes the mirror.
                unsafe { std::ptr::copy_nonoverlapping(cpu as *const u8, m.map.as_mut_ptr(), m.size_bytes) };
                m.synced_gen = gen;
                cfd.fini_bo(m.handle)?;
                synced += m.size_bytes;
            }
        }
        // Regcmd with the address registers moved into fd `core`'s address space.
        let mut tasks = Vec::with_capacity(progs.len());
        for (h, off, entries) in progs {
            let translated: Vec<RegCmd> = entries
                .iter()
                .map(|&e| {
                    if !super::is_address_reg(&e) {
                        return Ok(e);
                    }
                    let v = e.value();
                    let p = by_addr(v).ok_or_else(|| KifError::Invalid(format!("rocket: address register {e} points at no live buffer")))?;
                    let m = &mirrors[&p.0];
                    Ok(RegCmd::raw(e.target_op(), e.offset(), m.iova + (v - p.1)))
                })
                .collect::<Result<_, KifError>>()?;
            let m = &mirrors[h];
            let bytes = regcmd::to_bytes(&translated);
            // SAFETY: `off + bytes.len()` lies inside the primary regcmd buffer (checked in
            // `read_regcmd`), and the mirror has the primary's size.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), m.map.as_mut_ptr().add(*off as usize), bytes.len()) };
            // The mirror now differs from the primary: refresh it from the primary next time.
            let m = mirrors.get_mut(h).expect("mirror");
            m.synced_gen = u64::MAX;
            cfd.fini_bo(m.handle)?;
            synced += m.size_bytes;
            tasks.push(DrmRocketTask { regcmd: m.iova + off, regcmd_count: entries.len() as u32 });
        }
        let mins: Vec<u32> = ins.iter().map(|h| mirrors[h].handle).collect();
        let mouts: Vec<u32> = outs.iter().map(|h| mirrors[h].handle).collect();
        cfd.submit(&tasks, &mins, &mouts)?;
        for &h in &mouts {
            cfd.prep_bo(h, timeout_ms)?;
        }
        // Results back into the primaries the caller reads. The copy is a CPU write into the
        // primary: cleaned to memory at once (FINI_BO), or the caller's `mem_sync(FromDevice)`
        // (PREP_BO: an invalidate) would drop it and read the primary's stale device copy.
        for &h in outs {
            let (_, _, _, cpu, _) = by_handle(h).expect("live primary");
            let m = &mirrors[&h];
            // SAFETY: as above, both mappings are live and the mirror's size is the primary's.
            unsafe { std::ptr::copy_nonoverlapping(m.map.as_ptr(), cpu as *mut u8, m.size_bytes) };
            self.fds[0].fini_bo(h)?;
            synced += 2 * m.size_bytes;
        }
        Ok(synced)
    }

    fn run_on(&self, core: usize, progs: &[(u32, u32, Vec<RegCmd>)], tasks: &[DrmRocketTask], ins: &[u32], outs: &[u32], timeout_ms: u32) -> Result<usize, KifError> {
        if core == 0 {
            self.run_primary(progs, tasks, ins, outs, timeout_ms)
        } else {
            self.run_mirrored(core, progs, ins, outs, timeout_ms)
        }
    }
}

impl KernelInterface for Rocket {
    fn name(&self) -> &'static str {
        "rocket"
    }

    fn describe(&self) -> String {
        format!("rocket (mainline accel) at {}, {} fds (one per core)", self.path.display(), self.fds.len())
    }

    /// Every buffer a job on core `c ≥ 1` names is mirrored whole onto fd `c` (`run_mirrored`).
    fn weight_copies(&self, cores: u32) -> u32 {
        cores.clamp(1, self.fds.len().max(1) as u32)
    }

    fn mem_create(&self, size_bytes: usize, flags: u32, domain: DomainId) -> Result<Bo, KifError> {
        if domain.0 != 0 {
            return Err(KifError::Unsupported { driver: "rocket", what: "IOMMU domains other than 0" });
        }
        if size_bytes == 0 {
            return Err(KifError::Invalid("mem_create: size 0".into()));
        }
        let size = page_round(size_bytes);
        let (handle, iova, map) = self.fds[0].create(size)?;
        let ptr = map.as_mut_ptr();
        lock(&self.fds[0].bos).insert(iova, BoRec { handle, size_bytes: size, cpu_addr: ptr as usize, gen: 0 });
        log::debug!("rocket: create_bo {size} B flags {flags:#x} (ignored) -> handle {handle} iova {iova:#010x}");
        // SAFETY: `map` is a shared read-write mapping of exactly `size` bytes, moved into the Bo,
        // which keeps it alive (munmap on drop).
        Ok(unsafe { Bo::from_raw(handle, 0, Iova(iova), size, domain, ptr, Box::new(map)) })
    }

    /// Mainline rocket has no ranged sync (PREP_BO/FINI_BO take a handle; ranged ones exist only
    /// out of tree, peer-facts §6): every sync maintains the whole buffer.
    fn mem_sync(&self, bo: &Bo, dir: SyncDir, offset: usize, len: usize) -> Result<usize, KifError> {
        super::check_sync_range("rocket mem_sync", bo, offset, len)?;
        match dir {
            SyncDir::ToDevice => {
                if let Some(r) = lock(&self.fds[0].bos).get_mut(&bo.iova.0) {
                    r.gen += 1;
                }
                self.fds[0].fini_bo(bo.handle)?
            }
            SyncDir::FromDevice => self.fds[0].prep_bo(bo.handle, DEFAULT_WAIT_MS)?,
        }
        Ok(bo.size_bytes)
    }

    fn mem_destroy(&self, bo: Bo) -> Result<(), KifError> {
        let handle = bo.handle;
        let gone: Vec<(usize, Mirror)> =
            self.mirrors.iter().enumerate().filter_map(|(c, m)| lock(m).remove(&handle).map(|m| (c, m))).collect();
        for (core, m) in gone {
            let mh = m.handle;
            drop(m); // munmap before the handle goes.
            drm::gem_close(&self.fds[core].fd, mh)?;
        }
        lock(&self.fds[0].bos).remove(&bo.iova.0);
        self.warmth.forget(handle);
        drop(bo); // munmap before the handle goes.
        drm::gem_close(&self.fds[0].fd, handle)
    }

    fn submit(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError> {
        if job.domain.0 != 0 {
            return Err(KifError::Unsupported { driver: "rocket", what: "IOMMU domains other than 0" });
        }
        if job.core_mask.count_ones() > 1 || job.core_mask >= 1 << self.fds.len() {
            return Err(KifError::Unsupported { driver: "rocket", what: "core_mask must name one of the opened cores (or 0)" });
        }
        let core = if job.core_mask == 0 { 0 } else { job.core_mask.trailing_zeros() as usize };
        let descs = read_tasks(job.task_bo.bytes(), job.task_start, job.task_number)?;
        let tasks = descs.iter().map(rocket_task_from).collect::<Result<Vec<_>, _>>()?;
        let progs = self.read_regcmd(&tasks)?;
        let (ins, outs) = self.job_refs(&progs);
        let timeout_ms = if job.timeout_ms == 0 { DEFAULT_WAIT_MS } else { job.timeout_ms };
        log::trace!("rocket: submit {} task(s) on core {core}, in {ins:?}, out {outs:?}", tasks.len());
        let cold = self.warmth.cold(&outs);
        let mut synced = 0;
        if !cold.is_empty() {
            // §2.6: the first submit into a fresh output buffer returns stale data.
            self.warmth.warmups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            log::debug!("rocket: warm-up job for fresh output buffer(s) {cold:?}");
            synced += self.run_on(core, &progs, &tasks, &ins, &outs, timeout_ms)?;
            self.warmth.mark(&cold);
        }
        synced += self.run_on(core, &progs, &tasks, &ins, &outs, timeout_ms)?;
        Ok(SubmitDone { hw_elapse_ns: 0, task_counter: job.task_number, synced_bytes: synced })
    }

    fn reset(&self) -> Result<(), KifError> {
        log::debug!("rocket: reset requested; the kernel resets cores itself on job timeout");
        Ok(())
    }
}

impl Drop for Rocket {
    fn drop(&mut self) {
        let live = std::mem::take(&mut *lock(&self.fds[0].bos));
        let mirrors: usize = self.mirrors.iter().map(|m| std::mem::take(&mut *lock(m)).len()).sum();
        if !live.is_empty() || mirrors > 0 {
            log::debug!("rocket: {} BO(s) and {mirrors} mirror(s) still alive at close; the kernel frees them with the fds", live.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npu::regs::{Block, CNA_DCOMP_ADDR0, CNA_FEATURE_DATA_ADDR, PC_BASE_ADDRESS};


    #[test]
    fn regcmd_count_includes_trailer() {
        let t = RknpuTask { regcfg_amount: 108, regcmd_addr: 0x1000_0000, ..RknpuTask::default() };
        let r = rocket_task_from(&t).unwrap();
        assert_eq!(r.regcmd, 0x1000_0000);
        assert_eq!(r.regcmd_count, 112);
        // Mainline's REGISTER_AMOUNTS for that count equals the vendor kernel's 55 (§1.5),
        // written the way rocket_job.c computes it.
        #[allow(clippy::manual_div_ceil)] // reason: mirrors the kernel's expression
        let amounts = (r.regcmd_count + 1) / 2 - 1;
        assert_eq!(amounts, 55);
    }

    #[test]
    fn bad_regcmd_addresses_are_rejected() {
        let t = RknpuTask { regcfg_amount: 108, regcmd_addr: 0x1_0000_0000, ..RknpuTask::default() };
        assert!(rocket_task_from(&t).is_err());
        let t = RknpuTask { regcfg_amount: 108, regcmd_addr: 0x1008, ..RknpuTask::default() };
        assert!(rocket_task_from(&t).is_err());
    }

    #[test]
    fn tasks_read_back_from_bytes() {
        let ts = [
            RknpuTask { regcfg_amount: 1, regcmd_addr: 0x100, ..Default::default() },
            RknpuTask { regcfg_amount: 2, regcmd_addr: 0x200, ..Default::default() },
            RknpuTask { regcfg_amount: 3, regcmd_addr: 0x300, ..Default::default() },
        ];
        let bytes: Vec<u8> = bytemuck::cast_slice(&ts).to_vec();
        let got = read_tasks(&bytes, 1, 2).unwrap();
        assert_eq!(got, ts[1..].to_vec());
        assert!(read_tasks(&bytes, 2, 2).is_err());
        assert!(read_tasks(&bytes, 0, 0).is_err());
    }

    #[test]
    fn refs_are_split_into_in_and_out() {
        // regcmd @0x1000 (h1), A @0x10000 (h2), W @0x20000 (h3), C @0x30000 (h4), unused h5.
        let ranges = [(0x1000, 0x1000, 1), (0x10000, 0x1000, 2), (0x20000, 0x8000, 3), (0x30000, 0x1000, 4), (0x40000, 0x1000, 5)];
        let entries = [
            RegCmd::write(&CNA_FEATURE_DATA_ADDR::REG, 0x10000), // A
            RegCmd::write(&CNA_DCOMP_ADDR0::REG, 0x20400),       // W (+offset)
            RegCmd::write(&DPU_DST_BASE_ADDR::REG, 0x30000),     // C
            RegCmd::raw(0x0000, 0x0000, 0x40000),                // no-op entry naming h5: ignored
            RegCmd::write(&PC_BASE_ADDRESS::REG, 0x1000),        // PC chain link into the regcmd BO
            RegCmd::write(&DPU_DST_BASE_ADDR::REG, 0x30000),     // duplicate
        ];
        let (ins, outs) = classify_refs(&entries, &ranges);
        assert_eq!(outs, vec![4]);
        assert_eq!(ins, vec![1, 2, 3]);
    }

    #[test]
    fn out_wins_over_in() {
        let ranges = [(0x30000, 0x1000, 4)];
        // a DPU RDMA read of C (0x5020), then the DPU's write of it
        let entries = [
            RegCmd::raw(Block::DpuRdma.target_op(), 0x5020, 0x30000),
            RegCmd::write(&DPU_DST_BASE_ADDR::REG, 0x30000),
        ];
        let (ins, outs) = classify_refs(&entries, &ranges);
        assert_eq!(outs, vec![4]);
        assert!(ins.is_empty());
    }
}
