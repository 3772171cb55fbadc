//! The vendor `rknpu` DRM driver (Rockchip BSP kernels, driver ≥ 0.9.6) behind [`KernelInterface`].
//!
//! What this module owns: finding the NPU's DRM node, the version gate, the six rknpu ioctls
//! (ACTION, SUBMIT, MEM_CREATE, MEM_MAP, MEM_DESTROY, MEM_SYNC) with their `#[repr(C)]` argument
//! structs, the CPU mappings of buffer objects, and the recovery rules around submit.
//!
//! Decisions:
//! * **Node.** `ORK_NPU_CARD` names the node explicitly; otherwise every `/dev/dri/card*` is asked
//!   for its DRM driver name and the first one called "rknpu" wins; `/dev/dri/renderD*` only
//!   where no card node answers (cards are often group `video`, mode 0660, while the mainline
//!   ports' render nodes may be open to the user). ork's RE log reports that raw submits on the
//!   render node run zero tasks (rknpu-facts §1.1, unconfirmed by the kernel source): such a job
//!   leaves its output sentinels in place, so it is caught as never ran, resubmitted once and its
//!   MUL_MAT handed to the CPU, counted.
//! * **Port.** Four ports carry this interface to mainline kernels; [`port`] tells them apart at
//!   open from what the device answers and the caps it decides are all this module reads (the
//!   errno that means a domain is full, the kernel's own domain id, whole-buffer syncs, the reset,
//!   whether the task counter and device time are reported).
//! * **Version gate.** `ACTION(GET_DRV_VERSION)` must report ≥ 0.9.6 (encoded
//!   major·10000 + minor·100 + patch = 906). Older drivers have a different MEM_CREATE and SUBMIT
//!   layout (the pre-0.9 ABI, rknpu-facts cross-check conflict 6) and would be fed garbage.
//! * **Power.** `ACTION(POWER_ON)` is sent once and its EINVAL ignored: stock 0.9.8 has no such
//!   case and runtime PM powers the NPU per ioctl anyway (§1.1). `SET_PROC_NICE` is *not* sent: it
//!   would renice the host process (llama.cpp), which is not a library's call to make.
//! * **Buffers.** MEM_CREATE (page-rounded, `core_mask` word = 1 as ork passes it) → MEM_MAP →
//!   `mmap` of the DRM fd at the fake offset (via `memmap2::MmapOptions::map_raw`) →
//!   explicit MEM_SYNC around device access → munmap + MEM_DESTROY (§1.6). The `Bo`'s
//!   `size_bytes` is the page-rounded size. EFAULT/ENOMEM from MEM_CREATE means the domain's
//!   4 GiB IOVA window is full and becomes [`KifError::Fault`] so the caller can move on to the
//!   next domain.
//! * **Submit.** Blocking, `fence_fd = -1`, `subcore_task[0..=2]` all `{task_start, task_number}`
//!   (the kernel reads only the target core's entry, but with core_mask 0 it picks the core
//!   itself, so every plausible entry must be valid; conflict 7). Only single-core masks (or 0)
//!   are accepted: a multi-bit mask would make the kernel split the task list across cores, which
//!   the NPU core never asks for (it runs one host thread per core, §5). EINVAL/EBUSY are retried
//!   20× with 50 µs sleeps (the previous job on that core has not retired), then the device is
//!   soft-reset and the submit tried once more (§1.6). ETIMEDOUT becomes [`KifError::Timeout`]:
//!   the kernel has already reset the whole device (conflict 5). `hw_elapse_time` is ns
//!   (conflict 1).
//! * **Board quirks** (rknpu-facts §2.6, from ork; modelled by the fake kernel,
//!   docs/fake-kernel.md). Entering int8 mode from cold wedges the first submit unless ACT_RESET
//!   came first: the first submit of a connection issues one ACT_RESET (other cores' first
//!   submits wait for it). The first submit into a fresh output buffer returns stale data: the
//!   interface remembers which buffers (by handle) a submit has written since they were created
//!   or since the last reset, finds a job's outputs from the DPU destination registers of its
//!   regcmd, and runs a job with a cold output twice, the first result discarded. A timeout
//!   (the kernel reset the device) or an ACT_RESET makes every buffer cold again.
//! * **Domains.** MEM_CREATE and SUBMIT carry the domain id themselves, so no explicit switch is
//!   needed (the stock switch, action 25, serves only paths that map into "whatever domain is
//!   live", PRIME imports; it is sent only by the port probe). The oRKLLM-patched 0x1xx
//!   actions are never sent (conflict 2). Ids are capped at [`MAX_DOMAINS`] (conflict 4).
//! * **Import.** `mem_import_observed` keeps the trait's default (create + copy + sync). A dma-heap/PRIME
//!   path would not save the copy (host bytes must land in device memory either way), needs
//!   `DMA_BUF_IOCTL_SYNC` instead of MEM_SYNC, maps into the live domain only, and carries ork's
//!   unconfirmed quirks (anchor buffer per domain, aliased IOVAs) — not worth it yet.
//!
//! Sources: shared reference `rknpu-facts.md` §1.1–1.6 and §4, keys S1 (stock `rknpu_ioctl.h`,
//! 0.9.6/0.9.7), S2 (`rknpu_job.c`), S3 (`rknpu_drv.c`), S4 (`rknpu_gem.c` 0.9.8), S5
//! (`rknpu_iommu.c`), S12 (generic DRM uapi).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;

use super::drm::{self, DRM_COMMAND_BASE, DRM_IOCTL_TYPE};
use super::port::{self, Answers, Caps, ResetKind};
use super::{
    page_round, Bo, DomainId, Iova, KernelInterface, KifError, SubmitDone, SubmitJob, SyncDir, Warmth,
};

// ---------------------------------------------------------------------------------------------
// ABI: ioctl numbers, structs, enumerations
// ---------------------------------------------------------------------------------------------

/// Driver-relative ioctl numbers; the full nr is `DRM_COMMAND_BASE + n` (rknpu-facts §1.2, S1).
pub mod nr {
    pub const ACTION: u8 = 0x00;
    pub const SUBMIT: u8 = 0x01;
    pub const MEM_CREATE: u8 = 0x02;
    pub const MEM_MAP: u8 = 0x03;
    pub const MEM_DESTROY: u8 = 0x04;
    pub const MEM_SYNC: u8 = 0x05;
}

/// `rknpu_action.flags` selectors (rknpu-facts §1.4, S1) this driver sends.
pub mod action {
    pub const GET_HW_VERSION: u32 = 0;
    pub const GET_DRV_VERSION: u32 = 1;
    pub const GET_FREQ: u32 = 2;
    /// Soft reset of the whole device (rknpu-facts §1.4/§1.5, S1/S2).
    pub const ACT_RESET: u32 = 6;
    pub const GET_IOMMU_EN: u32 = 18;
    pub const POWER_ON: u32 = 20;
    pub const GET_IOMMU_DOMAIN_ID: u32 = 24;
    /// Stock domain switch (switch, then drop the reference; rknpu-facts conflict 2, S3/S5).
    pub const SET_IOMMU_DOMAIN_ID: u32 = 25;
}

/// `rknpu_mem_sync.flags` (rknpu-facts §1.3, S1).
pub mod sync_flags {
    pub const TO_DEVICE: u32 = 1;
    pub const FROM_DEVICE: u32 = 2;
}

/// The driver version encoding and the lowest supported version live with the port decision
/// that reads them ([`port`]).
pub use super::port::{decode_version, encode_version, MIN_DRV_VERSION};
/// Value for `rknpu_mem_create.core_mask`: ork passes 1; `reserved` before 0.9.8, harmless
/// (rknpu-facts §1.3, conflict 6).
pub const MEM_CREATE_CORE_MASK: u32 = 1;
/// Submit retries on EINVAL/EBUSY before a reset, and the sleep between them
/// (rknpu-facts §1.6, ork `submit.c`).
pub const SUBMIT_RETRIES: u32 = 20;
pub const SUBMIT_RETRY_SLEEP: Duration = Duration::from_micros(50);
/// Trailer entries the kernel fetches after `regcfg_amount` (`RKNPU_PC_DATA_EXTRA_AMOUNT`,
/// rknpu-facts §1.5).
pub const PC_DATA_EXTRA_ENTRIES: usize = 4;
/// Entries of `rknpu_submit.subcore_task` filled with the job's range (rknpu-facts §1.3, conflict 7).
pub const SUBCORE_ENTRIES_FILLED: usize = 3;
/// Core masks the vendor job code decodes: one bit per core, 0 = AUTO (rknpu-facts §1.4, S2).
pub const CORE_MASK_ALL: u32 = 0x7;

/// `struct rknpu_action` (8 B; rknpu-facts §1.3, S1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuAction {
    /// Action selector ([`action`]).
    pub flags: u32,
    /// In/out value.
    pub value: u32,
}

/// `struct rknpu_mem_create` (48 B; rknpu-facts §1.3, S1/S4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuMemCreate {
    /// Out: GEM handle (in: an existing handle skips allocation, S4).
    pub handle: u32,
    /// [`super::mem_flags`] bits.
    pub flags: u32,
    /// Bytes; page-rounded by the kernel.
    pub size: u64,
    /// Out: opaque kernel object cookie for SYNC/DESTROY/SUBMIT.
    pub obj_addr: u64,
    /// Out: NPU IOVA (fits 32 bits).
    pub dma_addr: u64,
    /// In/out: requested/achieved on-chip SRAM bytes.
    pub sram_size: u64,
    pub iommu_domain_id: i32,
    /// `core_mask` from 0.9.8, `reserved` before.
    pub core_mask: u32,
}

/// `struct rknpu_mem_map` (16 B; rknpu-facts §1.3, S1/S4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuMemMap {
    pub handle: u32,
    pub reserved: u32,
    /// Out: fake offset for `mmap` on the DRM fd.
    pub offset: u64,
}

/// `struct rknpu_mem_destroy` (16 B; rknpu-facts §1.3, S1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuMemDestroy {
    pub handle: u32,
    pub reserved: u32,
    pub obj_addr: u64,
}

/// `struct rknpu_mem_sync` (32 B; rknpu-facts §1.3, S1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuMemSync {
    /// [`sync_flags`] bits.
    pub flags: u32,
    pub reserved: u32,
    pub obj_addr: u64,
    pub offset: u64,
    pub size: u64,
}

/// `struct rknpu_subcore_task` (8 B; rknpu-facts §1.3, S1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuSubcoreTask {
    pub task_start: u32,
    pub task_number: u32,
}

/// `struct rknpu_submit` (104 B; rknpu-facts §1.3, S1 — identical in 0.9.6/0.9.7/0.9.8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RknpuSubmit {
    /// [`super::job_flags`] bits.
    pub flags: u32,
    /// Milliseconds.
    pub timeout: u32,
    pub task_start: u32,
    pub task_number: u32,
    /// Out: tasks completed (task_number on success, PC status count on timeout; S2).
    pub task_counter: u32,
    pub priority: i32,
    /// `obj_addr` (not the IOVA) of the buffer holding the `rknpu_task` array.
    pub task_obj_addr: u64,
    pub iommu_domain_id: u32,
    pub reserved: u32,
    pub task_base_addr: u64,
    /// Out: kernel-measured busy time, nanoseconds, blocking path only (conflict 1).
    pub hw_elapse_time: i64,
    pub core_mask: u32,
    pub fence_fd: i32,
    pub subcore_task: [RknpuSubcoreTask; 5],
}

/// Raw ioctl wrappers (`DRM_IOWR(DRM_COMMAND_BASE + n, T)`, rknpu-facts §1.2, S1). Each is
/// `unsafe`: the caller passes an open rknpu DRM fd and a pointer to a live argument struct.
pub mod sys {
    use super::*;
    nix::ioctl_readwrite!(rknpu_action, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::ACTION, RknpuAction);
    nix::ioctl_readwrite!(rknpu_submit, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::SUBMIT, RknpuSubmit);
    nix::ioctl_readwrite!(rknpu_mem_create, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::MEM_CREATE, RknpuMemCreate);
    nix::ioctl_readwrite!(rknpu_mem_map, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::MEM_MAP, RknpuMemMap);
    nix::ioctl_readwrite!(rknpu_mem_destroy, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::MEM_DESTROY, RknpuMemDestroy);
    nix::ioctl_readwrite!(rknpu_mem_sync, DRM_IOCTL_TYPE, DRM_COMMAND_BASE + nr::MEM_SYNC, RknpuMemSync);
}

// ---------------------------------------------------------------------------------------------
// Pure helpers (unit-tested without a device)
// ---------------------------------------------------------------------------------------------

/// The `rknpu_submit` for a job: blocking unless the caller set NONBLOCK, `fence_fd = -1`,
/// `subcore_task[0..=2]` all `{task_start, task_number}`.
pub fn build_submit(job: &SubmitJob<'_>, kernel_domain: u32) -> RknpuSubmit {
    let mut s = RknpuSubmit {
        flags: job.flags,
        timeout: job.timeout_ms,
        task_start: job.task_start,
        task_number: job.task_number,
        task_obj_addr: job.task_bo.obj_addr,
        iommu_domain_id: kernel_domain,
        core_mask: job.core_mask,
        fence_fd: -1,
        ..RknpuSubmit::default()
    };
    for e in s.subcore_task.iter_mut().take(SUBCORE_ENTRIES_FILLED) {
        *e = RknpuSubcoreTask { task_start: job.task_start, task_number: job.task_number };
    }
    s
}

/// `domain` is one of the port's `domains` logical domains ([`Caps::domains`]).
pub fn check_domain(op: &str, domain: DomainId, domains: u32) -> Result<(), KifError> {
    if domain.0 >= domains {
        return Err(KifError::Invalid(format!("{op}: IOMMU domain {} out of range (this port has {domains})", domain.0)));
    }
    Ok(())
}

/// Checks a job before it reaches the kernel, so that no EINVAL of ours triggers the
/// retry-then-reset path; `domains`: the port's domain count ([`Caps::domains`]).
pub fn validate_job(job: &SubmitJob<'_>, domains: u32) -> Result<(), KifError> {
    let task_bytes = std::mem::size_of::<super::RknpuTask>() as u64;
    if job.task_number == 0 {
        return Err(KifError::Invalid("submit: task_number is 0".into()));
    }
    check_domain("submit", job.domain, domains)?;
    if job.task_bo.domain != job.domain {
        return Err(KifError::Invalid(format!(
            "submit: task buffer is in domain {} but the job runs in domain {}",
            job.task_bo.domain.0, job.domain.0
        )));
    }
    let end = (job.task_start as u64 + job.task_number as u64) * task_bytes;
    if end > job.task_bo.size_bytes as u64 {
        return Err(KifError::Invalid(format!(
            "submit: tasks {}..{} overrun the {}-byte task buffer",
            job.task_start,
            job.task_start as u64 + job.task_number as u64,
            job.task_bo.size_bytes
        )));
    }
    if job.core_mask & !CORE_MASK_ALL != 0 || job.core_mask.count_ones() > 1 {
        return Err(KifError::Unsupported {
            driver: "rknpu",
            what: "core_mask must name one core (or 0 = kernel picks); kernel-side multi-core splits are not used",
        });
    }
    Ok(())
}

/// How a failed SUBMIT ioctl is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitErrorClass {
    /// EINVAL / EBUSY: the previous job on that core has not retired; retry shortly.
    Retry,
    /// ETIMEDOUT: the kernel reset the device.
    Timeout,
    /// EIO on a port where it means another core's job timed out and the kernel reset the
    /// device under this one (dkms): every buffer is cold; retry.
    DeviceReset,
    /// Anything else.
    Fail,
}

/// Classifies a SUBMIT errno (rknpu-facts §1.6); `eio_is_reset` where the port says EIO is
/// another core's timeout ([`Caps::eio_is_reset`]).
pub fn classify_submit_error(e: Errno, eio_is_reset: bool) -> SubmitErrorClass {
    match e {
        Errno::EINVAL | Errno::EBUSY => SubmitErrorClass::Retry,
        Errno::ETIMEDOUT => SubmitErrorClass::Timeout,
        Errno::EIO if eio_is_reset => SubmitErrorClass::DeviceReset,
        _ => SubmitErrorClass::Fail,
    }
}

/// Maps a MEM_CREATE errno: those the port answers when the domain's IOVA window (or its one
/// pool) is exhausted ([`Caps::full`]: EFAULT / ENOMEM on the vendor driver, ENOSPC on the
/// ports built on mainline's allocator) become [`KifError::Fault`].
pub fn map_mem_create_error(e: Errno, domain: DomainId, full: &[Errno]) -> KifError {
    if full.contains(&e) {
        KifError::Fault { op: "RKNPU_MEM_CREATE", domain: domain.0 }
    } else {
        KifError::Sys { op: "RKNPU_MEM_CREATE", source: e }
    }
}

// ---------------------------------------------------------------------------------------------
// Device discovery and open
// ---------------------------------------------------------------------------------------------

/// DRM driver name of the vendor NPU driver (rknpu-facts §1.1).
pub const DRIVER_NAME: &str = "rknpu";
/// Where primary DRM nodes live.
pub const DRI_DIR: &str = "/dev/dri";

/// Opens the vendor driver as a kernel interface on its node: `card` (the value of
/// `ORK_NPU_CARD`) if given, else the first `/dev/dri/card*` whose DRM driver name is "rknpu",
/// else the first such `/dev/dri/renderD*` (a card node is often group `video` mode 0660; the
/// render node may be the one a user can open). The error says what was looked at.
pub fn open(card: Option<&Path>) -> Result<Box<dyn KernelInterface>, KifError> {
    let path = match card {
        Some(p) => p.to_path_buf(),
        None => drm::find_by_driver(Path::new(DRI_DIR), "card", DRIVER_NAME)
            .or_else(|e| drm::find_by_driver(Path::new(DRI_DIR), "renderD", DRIVER_NAME).map_err(|_| e))?,
    };
    Ok(Box::new(Rknpu::open_path(&path)?))
}

/// One live buffer as this interface remembers it.
struct LiveBo {
    obj_addr: u64,
    domain: u32,
    iova: u32,
    size: usize,
    /// CPU address of the mapping (an integer so the map is `Send`).
    cpu_addr: usize,
}

/// A live connection to the vendor rknpu driver.
pub struct Rknpu {
    fd: File,
    path: PathBuf,
    hw_version: u32,
    /// Live buffers by handle, destroyed on drop if the caller forgot; also how a submit finds
    /// the regcmd and output buffers of its programs (the warm-up rule).
    live: Mutex<HashMap<u32, LiveBo>>,
    /// Output buffers written since creation or the last reset (cold-buffer quirk, §2.6).
    warmth: Warmth,
    /// Whether the NPU has been put into int8 mode (ACT_RESET before the first int8 job, §2.6).
    int8_entered: Mutex<bool>,
    /// What the device answered at open, and what this port can be trusted with ([`port`]).
    answers: Answers,
    caps: Caps,
    /// Submits that returned success after the port's job timeout (a hang reported as done,
    /// rkopnu); logged once.
    hangs: std::sync::atomic::AtomicU64,
}

impl Rknpu {
    /// Opens `path`, checks that it is the rknpu driver at version ≥ 0.9.6, and powers it on.
    pub fn open_path(path: &Path) -> Result<Rknpu, KifError> {
        let fd = drm::open_node(path)?;
        let ident = drm::ident(&fd)?;
        if ident.name != DRIVER_NAME {
            return Err(KifError::NoDevice(format!("{} is DRM driver \"{}\", not \"{DRIVER_NAME}\"", path.display(), ident.name)));
        }
        let mut dev = Rknpu {
            fd,
            path: path.to_path_buf(),
            hw_version: 0,
            live: Mutex::new(HashMap::new()),
            warmth: Warmth::default(),
            int8_entered: Mutex::new(false),
            answers: Answers::default(),
            caps: Caps::vendor(),
            hangs: std::sync::atomic::AtomicU64::new(0),
        };
        let drv_version = dev.action(action::GET_DRV_VERSION, 0)?;
        dev.answers = dev.probe(path, &ident, drv_version);
        // A device that fits no known port is refused in one line (the caller's), not guessed at.
        dev.caps = port::decide(&dev.answers).map_err(|why| KifError::NoDevice(port::refusal(&dev.answers, &why)))?;
        log::info!("{}", dev.caps.line(&dev.answers));
        dev.hw_version = dev.action(action::GET_HW_VERSION, 0).unwrap_or(0);
        match dev.action(action::POWER_ON, 0) {
            Ok(_) | Err(KifError::Sys { source: Errno::EINVAL, .. }) => {}
            Err(e) => log::warn!("rknpu: POWER_ON failed ({e}); relying on runtime PM"),
        }
        log::info!("{}", dev.describe());
        Ok(dev)
    }

    /// Sends `RKNPU_ACTION(selector, value)` and returns the value the kernel wrote back.
    pub fn action(&self, selector: u32, value: u32) -> Result<u32, KifError> {
        let mut a = RknpuAction { flags: selector, value };
        // SAFETY: `a` is a valid rknpu_action that lives across the call; `self.fd` is open.
        drm::restart(|| unsafe { sys::rknpu_action(self.fd.as_raw_fd(), &mut a) })
            .map_err(|source| KifError::Sys { op: "RKNPU_ACTION", source })?;
        Ok(a.value)
    }

    /// Asks the questions [`port::decide`] reads: all harmless on every known port (an undefined
    /// ACTION is EINVAL on the vendor driver; the domain switch is asked only of a 0.9.6 driver
    /// sitting at domain 0, and switched back).
    fn probe(&self, path: &Path, ident: &drm::DrmIdent, drv_version: u32) -> Answers {
        let ask = |sel: u32| self.action(sel, 0).ok();
        let unknown_action = match self.action(port::UNKNOWN_ACTION, 0) {
            Ok(v) => Some(Ok(v)),
            Err(KifError::Sys { source, .. }) => Some(Err(source)),
            Err(_) => None,
        };
        let iommu_en = ask(action::GET_IOMMU_EN);
        let domain_at_open = ask(action::GET_IOMMU_DOMAIN_ID);
        // A switch that fails says nothing either way (None: the vendor driver's rules).
        let switch_reads_back = if drv_version == encode_version(0, 9, 6) && domain_at_open == Some(0) && iommu_en == Some(1) {
            match self.action(action::SET_IOMMU_DOMAIN_ID, 1) {
                Ok(_) => {
                    let moved = ask(action::GET_IOMMU_DOMAIN_ID) == Some(1);
                    let _ = self.action(action::SET_IOMMU_DOMAIN_ID, 0);
                    Some(moved)
                }
                Err(_) => None,
            }
        } else {
            None
        };
        let clock_hz = port::devfreq_hz().or_else(|| ask(action::GET_FREQ).filter(|&f| f > 0).map(u64::from));
        Answers {
            node: path.to_path_buf(),
            drm_version: ident.version,
            desc: ident.desc.clone(),
            drv_version,
            unknown_action,
            iommu_en,
            domain_at_open,
            switch_reads_back,
            clock_hz,
            dt_cores: port::dt_cores(path),
        }
    }

    /// What the device answered at open and what this port is trusted with.
    pub fn caps(&self) -> (&Answers, &Caps) {
        (&self.answers, &self.caps)
    }

    /// The kernel's id of a logical domain (dkms: offset to the fd's own id).
    fn kernel_domain(&self, domain: DomainId) -> u32 {
        self.caps.domain_base + domain.0
    }

    fn destroy_raw(&self, handle: u32, obj_addr: u64) -> Result<(), KifError> {
        let arg = RknpuMemDestroy { handle, reserved: 0, obj_addr };
        let mut a = arg;
        // SAFETY: `a` is a valid rknpu_mem_destroy for the whole call; `self.fd` is open.
        drm::restart(|| unsafe { sys::rknpu_mem_destroy(self.fd.as_raw_fd(), &mut a) })
            .map(|_| ())
            .map_err(|source| KifError::Sys { op: "RKNPU_MEM_DESTROY", source })
    }

    fn submit_once(&self, job: &SubmitJob<'_>) -> nix::Result<RknpuSubmit> {
        let mut s = build_submit(job, self.kernel_domain(job.domain));
        // SAFETY: `s` is a valid rknpu_submit with no user pointers (task_obj_addr is a kernel
        // cookie of a live buffer the caller borrows for the duration); `self.fd` is open.
        drm::restart(|| unsafe { sys::rknpu_submit(self.fd.as_raw_fd(), &mut s) })?;
        Ok(s)
    }
}

impl KernelInterface for Rknpu {
    fn name(&self) -> &'static str {
        "rknpu"
    }

    fn describe(&self) -> String {
        let (a, b, c) = decode_version(self.answers.drv_version);
        format!("rknpu {a}.{b}.{c} ({} port) at {} (hw {:#010x})", self.caps.port.name(), self.path.display(), self.hw_version)
    }

    fn mem_create(&self, size_bytes: usize, flags: u32, domain: DomainId) -> Result<Bo, KifError> {
        if size_bytes == 0 {
            return Err(KifError::Invalid("mem_create: size 0".into()));
        }
        check_domain("mem_create", domain, self.caps.domains)?;
        let size = page_round(size_bytes);
        let mut c = RknpuMemCreate {
            flags,
            size: size as u64,
            iommu_domain_id: self.kernel_domain(domain) as i32,
            core_mask: MEM_CREATE_CORE_MASK,
            ..RknpuMemCreate::default()
        };
        // SAFETY: `c` is a valid rknpu_mem_create (handle 0 = allocate) for the whole call.
        drm::restart(|| unsafe { sys::rknpu_mem_create(self.fd.as_raw_fd(), &mut c) })
            .map_err(|e| map_mem_create_error(e, domain, self.caps.full))?;
        let (handle, obj_addr) = (c.handle, c.obj_addr);
        let fail = |e: KifError| {
            if let Err(d) = self.destroy_raw(handle, obj_addr) {
                log::warn!("rknpu: cleanup of half-created buffer {handle} failed: {d}");
            }
            e
        };
        let Ok(iova) = u32::try_from(c.dma_addr) else {
            return Err(fail(KifError::Invalid(format!("mem_create: kernel returned a non-32-bit IOVA {:#x}", c.dma_addr))));
        };
        let mut m = RknpuMemMap { handle, ..RknpuMemMap::default() };
        // SAFETY: `m` is a valid rknpu_mem_map for the whole call; `handle` is ours.
        drm::restart(|| unsafe { sys::rknpu_mem_map(self.fd.as_raw_fd(), &mut m) })
            .map_err(|source| fail(KifError::Sys { op: "RKNPU_MEM_MAP", source }))?;
        let map = memmap2::MmapOptions::new()
            .offset(m.offset)
            .len(size)
            .map_raw(&self.fd)
            .map_err(|e| fail(KifError::Sys { op: "mmap", source: drm::io_to_errno(&e) }))?;
        let ptr = map.as_mut_ptr();
        let rec = LiveBo { obj_addr, domain: domain.0, iova, size, cpu_addr: ptr as usize };
        self.live().insert(handle, rec);
        log::debug!("rknpu: mem_create {size} B flags {flags:#x} domain {} -> handle {handle} iova {iova:#010x}", domain.0);
        // SAFETY: `map` is a shared read-write mapping of exactly `size` bytes; moving it into the
        // Bo keeps it alive as long as the Bo (munmap on drop).
        Ok(unsafe { Bo::from_raw(handle, obj_addr, Iova(iova), size, domain, ptr, Box::new(map)) })
    }

    fn mem_sync(&self, bo: &Bo, dir: SyncDir, offset: usize, len: usize) -> Result<usize, KifError> {
        super::check_sync_range("rknpu mem_sync", bo, offset, len)?;
        // The kernel syncs the byte range it is given (dma_sync_*_range); the CPU's cache
        // maintenance widens it to whole lines. Some ports sync the whole buffer whatever the
        // range (Caps::whole_sync): that is what they maintained.
        let (start, end) = if self.caps.whole_sync { (0, bo.size_bytes) } else { super::line_span(offset, len, bo.size_bytes) };
        let mut s = RknpuMemSync {
            flags: match dir {
                SyncDir::ToDevice => sync_flags::TO_DEVICE,
                SyncDir::FromDevice => sync_flags::FROM_DEVICE,
            },
            obj_addr: bo.obj_addr,
            offset: offset as u64,
            size: len as u64,
            ..RknpuMemSync::default()
        };
        // SAFETY: `s` is a valid rknpu_mem_sync for the whole call; obj_addr names a live buffer
        // (borrowed by the caller).
        drm::restart(|| unsafe { sys::rknpu_mem_sync(self.fd.as_raw_fd(), &mut s) })
            .map(|_| end - start)
            .map_err(|source| {
                if source == Errno::EINVAL {
                    log::warn!("rknpu: MEM_SYNC EINVAL on handle {} (buffer not CACHEABLE?)", bo.handle);
                }
                KifError::Sys { op: "RKNPU_MEM_SYNC", source }
            })
    }

    fn mem_destroy(&self, bo: Bo) -> Result<(), KifError> {
        let (handle, obj_addr) = (bo.handle, bo.obj_addr);
        self.live().remove(&handle);
        self.warmth.forget(handle);
        drop(bo); // munmap first, then free the object.
        self.destroy_raw(handle, obj_addr)
    }

    fn submit(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError> {
        validate_job(job, self.caps.domains)?;
        self.enter_int8()?;
        let outs = self.job_outputs(job)?;
        // A reset under the job (dkms's EIO, a hang reported as done) made every buffer cold:
        // warm up again and submit again, a bounded number of times.
        let mut resets = 0;
        loop {
            let cold = self.warmth.cold(&outs);
            let warm = if cold.is_empty() {
                Ok(())
            } else {
                // §2.6: the first submit into a fresh output buffer returns stale data; run the
                // job once and throw its result away.
                self.warmth.warmups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                log::debug!("rknpu: warm-up submit for fresh output buffer(s) {cold:?}");
                self.submit_blocking(job).map(|_| self.warmth.mark(&cold))
            };
            match warm.and_then(|_| self.submit_blocking(job)) {
                Err(KifError::Reset) if resets < SUBMIT_RETRIES => resets += 1,
                r => return r,
            }
        }
    }

    fn reset(&self) -> Result<(), KifError> {
        self.warmth.clear();
        match self.caps.reset {
            ResetKind::Works => self.action(action::ACT_RESET, 0).map(|_| ()),
            // rkopnu's ACT_RESET returns 0 and does nothing: not sent; its own job timeout
            // resets the core, and what a wedged job reports is caught as a hang.
            ResetKind::NoOp => Ok(()),
            ResetKind::Busy => self.reset_when_idle(),
        }
    }

    fn syncs_whole_buffers(&self) -> bool {
        self.caps.whole_sync
    }

    fn max_domains(&self) -> u32 {
        self.caps.domains
    }

    fn cores(&self) -> Option<u32> {
        self.caps.cores
    }

    fn clock_hz(&self) -> Option<u64> {
        self.caps.clock_hz
    }

    fn fault_report(&self) -> Option<String> {
        let n = self.hangs.load(std::sync::atomic::Ordering::Relaxed);
        (n > 0).then(|| format!("rknpu ({} port): {n} submit(s) reported done after the job timeout (checked by their sentinels)", self.caps.port.name()))
    }
}

impl Rknpu {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u32, LiveBo>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Entering int8 mode from cold wedges the first submit unless ACT_RESET was issued first
    /// (rknpu-facts §2.6, ork `run()`): every job here is int8, so the first submit of this
    /// connection resets the device once. Other cores' first submits wait for it.
    fn enter_int8(&self) -> Result<(), KifError> {
        let mut entered = self.int8_entered.lock().unwrap_or_else(|p| p.into_inner());
        if !*entered {
            if self.caps.reset != ResetKind::NoOp {
                log::debug!("rknpu: ACT_RESET before the first int8 job");
            }
            self.reset()?;
            *entered = true;
        }
        Ok(())
    }

    /// The handles of the buffers the job's programs write (their DPU destination), found by
    /// reading each task's regcmd through its buffer's mapping.
    fn job_outputs(&self, job: &SubmitJob<'_>) -> Result<Vec<u32>, KifError> {
        let tasks = super::read_tasks(job.task_bo.bytes(), job.task_start, job.task_number)?;
        let live = self.live();
        let find = |addr: u64, len: usize| {
            live.iter().find(|(_, b)| {
                b.domain == job.domain.0 && addr >= u64::from(b.iova) && addr + len as u64 <= u64::from(b.iova) + b.size as u64
            })
        };
        let mut outs = Vec::new();
        for t in &tasks {
            let (addr, amount) = (t.regcmd_addr, t.regcfg_amount);
            let len = (amount as usize + PC_DATA_EXTRA_ENTRIES) * 8;
            let (_, b) = find(addr, len).ok_or_else(|| {
                KifError::Invalid(format!("submit: regcmd {addr:#x}+{len} is not inside a live buffer of domain {}", job.domain.0))
            })?;
            let off = (addr - u64::from(b.iova)) as usize;
            // SAFETY: the range lies inside a live mapping (checked by `find`); the live map's
            // lock is held, so `mem_destroy` cannot unmap it meanwhile; the caller does not write
            // regcmd while submitting it.
            let bytes = unsafe { std::slice::from_raw_parts((b.cpu_addr + off) as *const u8, len) };
            for dst in super::output_addrs(&crate::npu::regcmd::from_bytes(bytes)) {
                if let Some((&h, _)) = find(u64::from(dst), 1) {
                    if !outs.contains(&h) {
                        outs.push(h);
                    }
                }
            }
        }
        Ok(outs)
    }

    /// One job, blocking, with the EINVAL/EBUSY retry-then-reset rule.
    fn submit_blocking(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError> {
        let mut attempt = 0u32;
        let mut reset_done = false;
        loop {
            let t0 = std::time::Instant::now();
            match self.submit_once(job) {
                Ok(s) => {
                    let wall_ns = t0.elapsed().as_nanos() as u64;
                    if self.note_timeout(job, wall_ns) {
                        return Err(KifError::Reset);
                    }
                    let hw_elapse_ns = if self.caps.elapsed_reported { s.hw_elapse_time.max(0) as u64 } else { wall_ns };
                    if s.task_counter < job.task_number {
                        log::warn!("rknpu: submit returned with task_counter {} < task_number {}", s.task_counter, job.task_number);
                    }
                    return Ok(SubmitDone { hw_elapse_ns, task_counter: s.task_counter, synced_bytes: 0 });
                }
                Err(e) => match classify_submit_error(e, self.caps.eio_is_reset) {
                    SubmitErrorClass::Timeout => {
                        log::error!(
                            "rknpu: submit of {} task(s) on core mask {:#x} timed out after {} ms",
                            job.task_number,
                            job.core_mask,
                            job.timeout_ms
                        );
                        // The kernel soft-reset the device: every buffer is cold again.
                        self.warmth.clear();
                        return Err(KifError::Timeout { timeout_ms: job.timeout_ms });
                    }
                    SubmitErrorClass::DeviceReset => {
                        // Another core's job timed out and the kernel reset the device: this job
                        // did not run, and every output buffer is cold again (`submit` warms
                        // them up and submits again).
                        log::debug!("rknpu: submit EIO (the device was reset under it)");
                        self.warmth.clear();
                        return Err(KifError::Reset);
                    }
                    SubmitErrorClass::Retry if attempt < SUBMIT_RETRIES => {
                        attempt += 1;
                        std::thread::sleep(SUBMIT_RETRY_SLEEP);
                    }
                    SubmitErrorClass::Retry if !reset_done => {
                        log::warn!("rknpu: submit still {e} after {SUBMIT_RETRIES} retries; ACT_RESET");
                        self.reset()?;
                        reset_done = true;
                    }
                    _ => return Err(KifError::Sys { op: "RKNPU_SUBMIT", source: e }),
                },
            }
        }
    }
}

/// How long a dkms ACT_RESET is retried while the device answers EBUSY (another process has a
/// job queued), and the pause between tries (a reset there takes ≥ 100 ms).
pub const RESET_BUSY_TRIES: u32 = 40;
pub const RESET_BUSY_SLEEP: Duration = Duration::from_millis(50);

impl Rknpu {
    /// A submit that returned 0 after the port's job timeout, on a port that reports a hung job
    /// as done (rkopnu: counter full, nothing written, the core reset by the timeout): every
    /// buffer is cold again, and the job's output is only what its sentinels say (`npu::mm`
    /// checks each program's last output word before anything reads it, resubmits once, then
    /// hands the MUL_MAT to the CPU). Counted; logged once.
    fn note_timeout(&self, job: &SubmitJob<'_>, wall_ns: u64) -> bool {
        let Some(ms) = self.caps.hang_after_ms else { return false };
        if self.caps.counter_trusted || wall_ns < u64::from(ms) * 1_000_000 {
            return false;
        }
        self.warmth.clear();
        if self.hangs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
            log::warn!(
                "rknpu ({} port): a submit of {} task(s) returned success after {} ms, past the port's {ms} ms job timeout: the port reports a hung job as done, so its output counts only where its sentinels were overwritten (later ones are counted, not logged)",
                self.caps.port.name(),
                job.task_number,
                wall_ns / 1_000_000
            );
        }
        true
    }

    /// ACT_RESET on a port that answers EBUSY while any process has a job queued (dkms): tried
    /// again until the queue drains, for up to [`RESET_BUSY_TRIES`] × [`RESET_BUSY_SLEEP`].
    fn reset_when_idle(&self) -> Result<(), KifError> {
        let mut tries = 0;
        loop {
            match self.action(action::ACT_RESET, 0) {
                Err(KifError::Sys { source: Errno::EBUSY, .. }) if tries < RESET_BUSY_TRIES => {
                    tries += 1;
                    log::debug!("rknpu: ACT_RESET busy (a job is queued on the device); try {tries}");
                    std::thread::sleep(RESET_BUSY_SLEEP);
                }
                r => return r.map(|_| ()),
            }
        }
    }
}

impl Drop for Rknpu {
    fn drop(&mut self) {
        let live = std::mem::take(&mut *self.live());
        if !live.is_empty() {
            log::debug!("rknpu: destroying {} buffer(s) still alive at close", live.len());
        }
        for (handle, LiveBo { obj_addr, .. }) in live {
            if let Err(e) = self.destroy_raw(handle, obj_addr) {
                log::warn!("rknpu: MEM_DESTROY of leaked handle {handle} failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npu::kif::MAX_DOMAINS;

    #[test]
    fn version_encoding_round_trips() {
        assert_eq!(encode_version(0, 9, 8), 908);
        assert_eq!(decode_version(908), (0, 9, 8));
        assert_eq!(decode_version(10203), (1, 2, 3));
        assert!(encode_version(0, 9, 5) < MIN_DRV_VERSION);
        assert!(encode_version(0, 9, 6) >= MIN_DRV_VERSION);
    }

    #[test]
    fn submit_errors_are_classified() {
        assert_eq!(classify_submit_error(Errno::EBUSY, false), SubmitErrorClass::Retry);
        assert_eq!(classify_submit_error(Errno::EINVAL, false), SubmitErrorClass::Retry);
        assert_eq!(classify_submit_error(Errno::ETIMEDOUT, false), SubmitErrorClass::Timeout);
        assert_eq!(classify_submit_error(Errno::EIO, false), SubmitErrorClass::Fail);
        // dkms: EIO is another core's timeout, the device reset under this job.
        assert_eq!(classify_submit_error(Errno::EIO, true), SubmitErrorClass::DeviceReset);
    }

    /// A task buffer over plain heap memory (no device), `n_tasks` descriptors long.
    fn task_bo(n_tasks: usize, domain: u32) -> Bo {
        let mut mem = vec![0u8; n_tasks * 40].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        let len = mem.len();
        // SAFETY: `mem` is moved into the Bo as its keep-alive; the boxed slice's heap block
        // does not move when the box does.
        unsafe { Bo::from_raw(7, 0xdead_beef_0000, Iova(0x1000), len, DomainId(domain), ptr, Box::new(mem)) }
    }

    fn job(bo: &Bo, start: u32, number: u32, core_mask: u32, domain: u32) -> SubmitJob<'_> {
        SubmitJob {
            task_bo: bo,
            task_start: start,
            task_number: number,
            core_mask,
            domain: DomainId(domain),
            flags: super::super::job_flags::PC | super::super::job_flags::PINGPONG,
            timeout_ms: 6000,
        }
    }

    #[test]
    fn submit_struct_follows_the_facts() {
        let bo = task_bo(16, 2);
        let s = build_submit(&job(&bo, 3, 5, 0x4, 2), 2);
        assert_eq!(build_submit(&job(&bo, 3, 5, 0x4, 2), 18).iommu_domain_id, 18, "the kernel's id (dkms: the fd's own)");
        assert_eq!(s.flags, 0x5);
        assert_eq!(s.timeout, 6000);
        assert_eq!((s.task_start, s.task_number), (3, 5));
        assert_eq!(s.task_obj_addr, 0xdead_beef_0000, "task_obj_addr is the obj_addr, not the IOVA");
        assert_eq!(s.iommu_domain_id, 2);
        assert_eq!(s.core_mask, 0x4);
        assert_eq!(s.fence_fd, -1);
        assert_eq!((s.task_counter, s.priority, s.task_base_addr, s.hw_elapse_time), (0, 0, 0, 0));
        for e in &s.subcore_task[..3] {
            assert_eq!(*e, RknpuSubcoreTask { task_start: 3, task_number: 5 });
        }
        for e in &s.subcore_task[3..] {
            assert_eq!(*e, RknpuSubcoreTask::default());
        }
    }

    #[test]
    fn jobs_are_validated_before_the_kernel_sees_them() {
        let bo = task_bo(4, 1);
        assert!(validate_job(&job(&bo, 0, 4, 1, 1), MAX_DOMAINS).is_ok());
        assert!(validate_job(&job(&bo, 0, 4, 0, 1), MAX_DOMAINS).is_ok());
        assert!(matches!(validate_job(&job(&bo, 0, 0, 1, 1), MAX_DOMAINS), Err(KifError::Invalid(_))));
        assert!(matches!(validate_job(&job(&bo, 1, 4, 1, 1), MAX_DOMAINS), Err(KifError::Invalid(_))));
        assert!(matches!(validate_job(&job(&bo, 0, 1, 1, 2), MAX_DOMAINS), Err(KifError::Invalid(_))));
        assert!(matches!(validate_job(&job(&bo, 0, 1, 1, MAX_DOMAINS), MAX_DOMAINS), Err(KifError::Invalid(_))));
        // A port with one window (dkms's own id, a pool, ep1sode) has domain 0 alone.
        assert!(validate_job(&job(&task_bo(4, 0), 0, 1, 1, 0), 1).is_ok());
        assert!(matches!(validate_job(&job(&bo, 0, 1, 1, 1), 1), Err(KifError::Invalid(_))));
        assert!(matches!(validate_job(&job(&bo, 0, 1, 0x3, 1), MAX_DOMAINS), Err(KifError::Unsupported { .. })));
        assert!(matches!(validate_job(&job(&bo, 0, 1, 0x8, 1), MAX_DOMAINS), Err(KifError::Unsupported { .. })));
    }

    #[test]
    fn mem_create_errors_map_to_fault() {
        let d = DomainId(3);
        let vendor = Caps::vendor().full;
        assert!(matches!(map_mem_create_error(Errno::EFAULT, d, vendor), KifError::Fault { domain: 3, .. }));
        assert!(matches!(map_mem_create_error(Errno::ENOMEM, d, vendor), KifError::Fault { domain: 3, .. }));
        assert!(matches!(map_mem_create_error(Errno::EPERM, d, vendor), KifError::Sys { .. }));
        // The ports built on mainline's allocator say ENOSPC when a domain is full.
        assert!(matches!(map_mem_create_error(Errno::ENOSPC, d, vendor), KifError::Sys { .. }));
        let rk = port::Answers { drm_version: (0, 0, 0), desc: "rkopnu".into(), drv_version: 908, ..Default::default() };
        let full = port::decide(&rk).unwrap().full;
        assert!(matches!(map_mem_create_error(Errno::ENOSPC, d, full), KifError::Fault { domain: 3, .. }));
    }
}
