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
//!   keeps every live BO of each fd by IOVA range and scans each task's regcmd: the BO holding the
//!   DPU destination (the register table's `DPU_DST_BASE_ADDR`; rknpu-facts §2.2 row 61, S6) is
//!   an out-BO, every other BO an address register points into (and the regcmd BO itself) is an
//!   in-BO; an address register that points into no live BO of the job's fd is refused (the
//!   board would fault on it). The submit ioctl returns at once; completion is awaited with
//!   PREP_BO on a one-page completion BO of the fd that every job also names as an out-BO, so
//!   the wait maintains 4 KiB, and the caller's own `mem_sync(FromDevice)` invalidates the output
//!   once. PREP_BO's timeout is an *absolute* CLOCK_MONOTONIC time (`rocket_gem.c`,
//!   `drm_timeout_abs_to_jiffies`).
//! * **Cache maintenance.** `SyncDir::ToDevice` → FINI_BO, `SyncDir::FromDevice` → PREP_BO, each
//!   on the whole BO (mainline has no ranged variant), so a ranged `mem_sync` maintains the whole
//!   buffer and says so in the bytes it returns ([`KernelInterface::syncs_whole_buffers`]: the
//!   NPU core then keeps its per-submit buffers small). The first stored uapi version has neither
//!   ioctl; `open` probes FINI_BO on a scratch BO and refuses such kernels, because without
//!   PREP_BO there is no way to wait for a job.
//! * **One fd per core and domain.** Mainline binds every job of one fd to one core (peer-facts
//!   §2) and gives every fd its own IOMMU address space from IOVA 0 (0 is a valid address). The
//!   interface's address spaces are its fds: space `d·FDS + c` is core `c`'s fd for domain `d`
//!   ([`KernelInterface::space_of`]), and a job with `core_mask = 1 << c` runs in it. A buffer is
//!   addressable by its own fd's jobs only ([`KernelInterface::per_core_spaces`]), so the NPU core
//!   gives every core its own scratch and its own part of each weight — the N-blocks that core
//!   computes (`npu::plan::core_parts`) — and a weight is held once; each domain adds one window
//!   per core, so the weights are not capped at one window (see [`Rocket`]). Not taken: sharing
//!   one buffer between the fds through DRM PRIME (the imported handle gets no NPU address,
//!   [`Rocket`]). The kernel resets a core itself when a job exceeds its fixed 500 ms timeout, so
//!   [`KernelInterface::reset`] has nothing to do. Memory flags are ignored: rocket BOs are always
//!   cacheable shmem.
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
//! semantics; CREATE_BO is the only place a BO is mapped into an fd's IOMMU domain),
//! `rocket_drv.c` (no PRIME import hook: a self-import is the DRM core's, the same object),
//! §2.1–2.2 (regcmd entry encoding, DPU DST_BASE_ADDR).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;

use super::drm::{self, DRM_COMMAND_BASE, DRM_IOCTL_TYPE};
use super::{
    page_round, read_tasks, Bo, DomainId, Iova, KernelInterface, KifError, RknpuTask, SubmitDone, SubmitJob, SyncDir,
    Warmth, PAGE_BYTES,
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

/// Raw ioctl wrappers (rknpu-facts §1.7, S8). Each is `unsafe`: the caller passes an open rocket
/// accel fd and a pointer to a live argument struct whose embedded user pointers are valid.
pub mod sys {
    use super::*;
    nix::ioctl_readwrite!(rocket_create_bo, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::CREATE_BO, DrmRocketCreateBo);
    nix::ioctl_write_ptr!(rocket_submit, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::SUBMIT, DrmRocketSubmit);
    nix::ioctl_write_ptr!(rocket_prep_bo, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::PREP_BO, DrmRocketPrepBo);
    nix::ioctl_write_ptr!(rocket_fini_bo, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::FINI_BO, DrmRocketFiniBo);
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

/// Opens the mainline rocket driver on the first `/dev/accel/accel*` whose DRM driver name is
/// "rocket" as a kernel interface, one fd per core of [`FDS`].
pub fn open() -> Result<Box<dyn KernelInterface>, KifError> {
    let path = drm::find_by_driver(Path::new(ACCEL_DIR), "accel", DRIVER_NAME)?;
    Ok(Box::new(Rocket::open_path(&path)?))
}

/// File descriptors per domain group: one per NPU core (RK3588 has 3). Mainline binds all jobs
/// of one fd to one core's scheduler (peer-facts §2), so a job on `core_mask = 1 << c` goes to
/// the fd of core `c`.
pub const FDS: usize = 3;

/// Address spaces (fds) at most: [`FDS`] per domain, [`super::MAX_DOMAINS`] domains.
pub const MAX_SPACES: usize = FDS * super::MAX_DOMAINS as usize;

/// Bookkeeping of one live BO on one fd, keyed by its IOVA.
struct BoRec {
    handle: u32,
    size_bytes: usize,
    /// CPU address of the mapping (kept as an integer so the map is `Send`).
    cpu_addr: usize,
}

/// One open fd: its own IOMMU address space (IOVAs start at 0) and its own core.
struct CoreFd {
    fd: File,
    /// Live BOs of this fd by IOVA start. Held while a submit reads regcmd through the
    /// mappings, so a concurrent `mem_destroy` cannot unmap them mid-read.
    bos: Mutex<BTreeMap<u32, BoRec>>,
    /// Output buffers of this fd written since creation (GEM handles are per fd; §2.6).
    warmth: Warmth,
    /// A one-page BO every job of this fd names as an output besides its own: the job's fence
    /// lands on it, and the completion wait (PREP_BO, which also syncs the whole BO it names)
    /// waits on it, so the wait maintains one page instead of a whole output buffer (the
    /// caller's `mem_sync(FromDevice)` maintains the output once). Created on first submit.
    done: Mutex<Option<(u32, memmap2::MmapRaw)>>,
}

/// A live connection to the rocket driver: one fd per core and domain.
///
/// Address spaces: mainline gives every fd its own IOMMU address space (a 32-bit window from
/// IOVA 0) and runs its jobs on one core. The interface numbers its fds *spaces*: space
/// `s = d·FDS + c` is the fd of core `c` for domain `d` ([`KernelInterface::space_of`]);
/// domain `d`'s [`FDS`] fds are opened together, in core order, the first time one is needed
/// (domain 0's at open). A buffer lives in exactly one space and only jobs of that space's core
/// can address it ([`KernelInterface::per_core_spaces`]): the NPU core gives each core its own
/// scratch and its own part of every weight (the N-blocks that core computes), so a weight is
/// held once and every domain adds [`FDS`] windows of room.
///
/// Why not share one buffer between the fds: DRM PRIME export/import between two fds of the
/// same device hands the importing fd a handle to the *same* GEM object (the pages are shared),
/// but mainline rocket maps a BO into an IOMMU domain only in CREATE_BO, for the creating fd
/// (`rocket_gem.c`; `rocket_drv.c` sets no PRIME import hook), and a job runs with its own fd's
/// domain attached (`rocket_job.c`): the imported handle has no NPU address in the importing
/// fd's space. The fake kernel models exactly that (fake-kernel/src/lib.rs, PRIME).
pub struct Rocket {
    path: PathBuf,
    /// Space → fd, opened by domain group ([`Rocket::fd`]).
    fds: Mutex<Vec<Option<Arc<CoreFd>>>>,
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
    fn open(path: &Path) -> Result<CoreFd, KifError> {
        let fd = drm::open_node(path)?;
        let name = drm::ident(&fd)?.name;
        if name != DRIVER_NAME {
            return Err(KifError::NoDevice(format!("{} is DRM driver \"{name}\", not \"{DRIVER_NAME}\"", path.display())));
        }
        Ok(CoreFd { fd, bos: Mutex::new(BTreeMap::new()), warmth: Warmth::default(), done: Mutex::new(None) })
    }

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

    /// CREATE_BO + mmap. Returns (handle, IOVA, mapping). IOVA 0 is a valid address. A full
    /// address space is [`KifError::Fault`] naming `space`.
    fn create(&self, size: usize, space: u32) -> Result<(u32, u32, memmap2::MmapRaw), KifError> {
        let size32 = u32::try_from(size)
            .map_err(|_| KifError::Invalid(format!("rocket: a BO is at most 4 GiB, asked {size} B")))?;
        let mut c = DrmRocketCreateBo { size: size32, ..DrmRocketCreateBo::default() };
        // SAFETY: `c` is a valid drm_rocket_create_bo for the whole call; `self.fd` is open.
        drm::restart(|| unsafe { sys::rocket_create_bo(self.fd.as_raw_fd(), &mut c) }).map_err(|e| match e {
            Errno::ENOMEM | Errno::ENOSPC | Errno::EFAULT => KifError::Fault { op: "DRM_ROCKET_CREATE_BO", domain: space },
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

    /// The handle of this fd's completion BO (created on first use).
    fn done_handle(&self, space: u32) -> Result<u32, KifError> {
        let mut d = lock(&self.done);
        if let Some((h, _)) = &*d {
            return Ok(*h);
        }
        let (h, _, map) = self.create(PAGE_BYTES, space)?;
        *d = Some((h, map));
        Ok(h)
    }

    /// Reads the regcmd entries of `tasks` through this fd's mappings, with the handle of the
    /// buffer holding each task's regcmd.
    fn read_regcmd(&self, tasks: &[DrmRocketTask]) -> Result<Vec<(u32, Vec<RegCmd>)>, KifError> {
        let bos = lock(&self.bos);
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            let len_bytes = t.regcmd_count as usize * 8;
            let (&start, rec) = bos.range(..=t.regcmd).next_back().ok_or_else(|| {
                KifError::Invalid(format!("rocket: regcmd {:#010x} is not in a live buffer of its fd", t.regcmd))
            })?;
            let off = (t.regcmd - start) as usize;
            if off + len_bytes > rec.size_bytes {
                return Err(KifError::Invalid(format!("rocket: regcmd {:#010x} + {} entries overruns its buffer", t.regcmd, t.regcmd_count)));
            }
            // SAFETY: the range lies inside a live mapping (checked above); the map lock is
            // held, so `mem_destroy` cannot unmap it meanwhile; the caller does not write regcmd
            // while submitting it (the same contract the device needs).
            let bytes = unsafe { std::slice::from_raw_parts((rec.cpu_addr + off) as *const u8, len_bytes) };
            out.push((rec.handle, regcmd::from_bytes(bytes)));
        }
        Ok(out)
    }

    /// The in/out handle lists of a job, from its regcmd. Every address register must point
    /// into a live buffer of this fd: anything else would be read through another address
    /// space's mapping (an IOMMU fault on the board), so it is refused here.
    fn job_refs(&self, progs: &[(u32, Vec<RegCmd>)]) -> Result<(Vec<u32>, Vec<u32>), KifError> {
        let ranges: Vec<(u32, usize, u32)> = lock(&self.bos).iter().map(|(&iova, r)| (iova, r.size_bytes, r.handle)).collect();
        let entries: Vec<RegCmd> = progs.iter().flat_map(|(_, e)| e.iter().copied()).collect();
        for e in entries.iter().filter(|e| e.target_op() != 0 && super::is_address_reg(e)) {
            let v = e.value();
            if !ranges.iter().any(|&(s, size, _)| v >= s && (v as u64) < s as u64 + size as u64) {
                return Err(KifError::Invalid(format!("rocket: address register {e} points at no live buffer of this core's address space")));
            }
        }
        let mut regcmd_handles: Vec<u32> = progs.iter().map(|(h, _)| *h).collect();
        let (mut ins, outs) = classify_refs(&entries, &ranges);
        ins.append(&mut regcmd_handles);
        ins.sort_unstable();
        ins.dedup();
        ins.retain(|h| outs.binary_search(h).is_err());
        Ok((ins, outs))
    }

    /// Submits one job and waits for it on the completion BO `done`. Returns the bytes of cache
    /// maintenance done (the wait's PREP_BO of the one-page completion BO).
    fn run(&self, tasks: &[DrmRocketTask], ins: &[u32], outs: &[u32], done: u32, timeout_ms: u32) -> Result<usize, KifError> {
        let mut with_done = outs.to_vec();
        with_done.push(done);
        self.submit(tasks, ins, &with_done)?;
        self.prep_bo(done, timeout_ms)?;
        Ok(PAGE_BYTES)
    }
}

impl Rocket {
    /// Opens domain 0's [`FDS`] fds on `path` (one per core), checks the driver name, and checks
    /// that PREP_BO/FINI_BO exist.
    pub fn open_path(path: &Path) -> Result<Rocket, KifError> {
        let dev = Rocket { path: path.to_path_buf(), fds: Mutex::new(vec![None; MAX_SPACES]) };
        dev.fd(0)?;
        // Probe FINI_BO: kernels with only CREATE_BO/SUBMIT cannot wait for a job.
        let probe = dev.mem_create(PAGE_BYTES, 0, DomainId(0))?;
        let fini = dev.fd(0)?.fini_bo(probe.handle);
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

    /// The fd of `space`, opening its domain's [`FDS`] fds (in core order) on first use.
    fn fd(&self, space: u32) -> Result<Arc<CoreFd>, KifError> {
        let s = space as usize;
        if s >= MAX_SPACES {
            return Err(KifError::Invalid(format!("rocket: address space {space} past the {MAX_SPACES} this interface opens")));
        }
        let mut fds = lock(&self.fds);
        if fds[s].is_none() {
            let group = s / FDS * FDS;
            for (i, slot) in fds[group..group + FDS].iter_mut().enumerate() {
                if slot.is_none() {
                    *slot = Some(Arc::new(CoreFd::open(&self.path)?));
                    log::debug!("rocket: opened the fd of core {i} for domain {}", group / FDS);
                }
            }
        }
        Ok(fds[s].clone().expect("fd just opened"))
    }

    fn open_fds(&self) -> usize {
        lock(&self.fds).iter().filter(|f| f.is_some()).count()
    }
}

impl KernelInterface for Rocket {
    fn name(&self) -> &'static str {
        "rocket"
    }

    fn describe(&self) -> String {
        format!("rocket (mainline accel) at {}, {} fds (one per core and domain)", self.path.display(), self.open_fds())
    }

    fn per_core_spaces(&self) -> bool {
        true
    }

    fn syncs_whole_buffers(&self) -> bool {
        true
    }

    fn space_of(&self, domain: DomainId, core: u32) -> DomainId {
        DomainId(domain.0 * FDS as u32 + core % FDS as u32)
    }

    /// `domain` is an address space ([`Rocket`]): the fd of one core for one domain.
    fn mem_create(&self, size_bytes: usize, flags: u32, domain: DomainId) -> Result<Bo, KifError> {
        if size_bytes == 0 {
            return Err(KifError::Invalid("mem_create: size 0".into()));
        }
        let size = page_round(size_bytes);
        let fd = self.fd(domain.0)?;
        let (handle, iova, map) = fd.create(size, domain.0)?;
        let ptr = map.as_mut_ptr();
        lock(&fd.bos).insert(iova, BoRec { handle, size_bytes: size, cpu_addr: ptr as usize });
        log::debug!("rocket: create_bo {size} B flags {flags:#x} (ignored) in space {} -> handle {handle} iova {iova:#010x}", domain.0);
        // SAFETY: `map` is a shared read-write mapping of exactly `size` bytes, moved into the Bo,
        // which keeps it alive (munmap on drop).
        Ok(unsafe { Bo::from_raw(handle, 0, Iova(iova), size, domain, ptr, Box::new(map)) })
    }

    /// Mainline rocket has no ranged sync (PREP_BO/FINI_BO take a handle; ranged ones exist only
    /// out of tree, peer-facts §6): every sync maintains the whole buffer.
    fn mem_sync(&self, bo: &Bo, dir: SyncDir, offset: usize, len: usize) -> Result<usize, KifError> {
        super::check_sync_range("rocket mem_sync", bo, offset, len)?;
        let fd = self.fd(bo.domain.0)?;
        match dir {
            SyncDir::ToDevice => fd.fini_bo(bo.handle)?,
            SyncDir::FromDevice => fd.prep_bo(bo.handle, DEFAULT_WAIT_MS)?,
        }
        Ok(bo.size_bytes)
    }

    fn mem_destroy(&self, bo: Bo) -> Result<(), KifError> {
        let handle = bo.handle;
        let fd = self.fd(bo.domain.0)?;
        lock(&fd.bos).remove(&bo.iova.0);
        fd.warmth.forget(handle);
        drop(bo); // munmap before the handle goes.
        drm::gem_close(&fd.fd, handle)
    }

    fn submit(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError> {
        let space = job.domain.0;
        let space_core = space as usize % FDS;
        if job.core_mask != 0 && job.core_mask != 1 << space_core {
            return Err(KifError::Invalid(format!(
                "rocket: core_mask {:#x} in address space {space}, which is core {space_core}'s (KernelInterface::space_of)",
                job.core_mask
            )));
        }
        if job.task_bo.domain != job.domain {
            return Err(KifError::Invalid(format!("rocket: task buffer in space {}, job in space {space}", job.task_bo.domain.0)));
        }
        let fd = self.fd(space)?;
        let descs = read_tasks(job.task_bo.bytes(), job.task_start, job.task_number)?;
        let tasks = descs.iter().map(rocket_task_from).collect::<Result<Vec<_>, _>>()?;
        let progs = fd.read_regcmd(&tasks)?;
        let (ins, outs) = fd.job_refs(&progs)?;
        let done = fd.done_handle(space)?;
        let timeout_ms = if job.timeout_ms == 0 { DEFAULT_WAIT_MS } else { job.timeout_ms };
        log::trace!("rocket: submit {} task(s) in space {space} (core {space_core}), in {ins:?}, out {outs:?}", tasks.len());
        let cold = fd.warmth.cold(&outs);
        let mut synced = 0;
        if !cold.is_empty() {
            // §2.6: the first submit into a fresh output buffer returns stale data.
            fd.warmth.warmups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            log::debug!("rocket: warm-up job for fresh output buffer(s) {cold:?}");
            synced += fd.run(&tasks, &ins, &outs, done, timeout_ms)?;
            fd.warmth.mark(&cold);
        }
        synced += fd.run(&tasks, &ins, &outs, done, timeout_ms)?;
        Ok(SubmitDone { hw_elapse_ns: 0, task_counter: job.task_number, synced_bytes: synced })
    }

    fn reset(&self) -> Result<(), KifError> {
        log::debug!("rocket: reset requested; the kernel resets cores itself on job timeout");
        Ok(())
    }
}

impl Drop for Rocket {
    fn drop(&mut self) {
        let live: usize = lock(&self.fds).iter().flatten().map(|f| std::mem::take(&mut *lock(&f.bos)).len()).sum();
        if live > 0 {
            log::debug!("rocket: {live} BO(s) still alive at close; the kernel frees them with the fds");
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
