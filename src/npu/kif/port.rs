//! Which port of the vendor `rknpu` interface answers on a node, and what it can be trusted with.
//!
//! Four out-of-tree ports carry the vendor interface to mainline kernels, and all of them answer
//! as DRM driver "rknpu". They differ where a wrong guess gives a wrong answer rather than an
//! error: which errno means "this IOMMU domain is full", whether domain ids are the process's own,
//! whether a sync covers the range it is given, whether `ACT_RESET` does anything, whether a
//! submit that returned 0 ran. So `Rknpu::open_path` (the vendor interface, `kif::rknpu`) asks the
//! device a few harmless questions once ([`Answers`]) and [`decide`] turns them into a [`Caps`]
//! (or a one-line refusal, and every MUL_MAT stays on the CPU). The rest of the interface reads
//! the caps, never a port's name.
//!
//! | port | how it is recognised | what differs from the vendor driver |
//! |---|---|---|
//! | vendor 0.9.6–0.9.8 | DRM version = GET_DRV_VERSION, unknown ACTION → EINVAL, IOMMU on, domain id 0 at open, a domain switch reads back | — |
//! | rkopnu (mainline `rocket` fork) | DRM version 0.0.0, description names rkopnu, an unknown ACTION answered 0 | full domain ENOSPC; syncs whole buffers; ACT_RESET does nothing; a hung job returns 0 with the task counter full and no device time |
//! | rknpu-mainline-dkms | GET_IOMMU_DOMAIN_ID ≥ 16 at open (the fd's own id) | ids 0..15 are pools shared with other processes: only the own id is used (one domain); full ENOSPC; ACT_RESET EBUSY while any process has a job queued; EIO when another core's job timed out |
//! | heliosrun | GET_IOMMU_EN = 0 | no IOMMU: one contiguous pool, ENOMEM when it is exhausted (one domain); fixed 200 MHz clock |
//! | ep1sode (0.9.6 in a 7.2 tree) | driver 0.9.6 whose domain switch does not read back | one window (all ids fold into 0); syncs whole buffers; a core-0-only device tree |
//!
//! A device that fits none of them (a DRM version that disagrees with GET_DRV_VERSION, an
//! unknown ACTION answered with success outside rkopnu, a driver older than 0.9.6) is refused.
//!
//! Sources: the reading of the four ports' public sources (facts only; a board settles
//! them), rknpu-facts §1.1/§1.4 for the stock answers.

use std::path::{Path, PathBuf};

use nix::errno::Errno;


/// An ACTION selector no driver defines: the vendor driver answers EINVAL (its switch's default).
pub const UNKNOWN_ACTION: u32 = 0x7f;
/// Domain ids a dkms fd gets for itself start here; below are pools shared between processes.
pub const DKMS_FIRST_OWN_ID: u32 = 16;
/// rkopnu's job timeout: a submit that hung is reported as done after it (the user timeout is
/// ignored).
pub const RKOPNU_JOB_TIMEOUT_MS: u32 = 500;
/// Lowest supported driver version, 0.9.6 encoded major·10000 + minor·100 + patch
/// (rknpu-facts §1.1 and conflict 6; encoding macro S1): older drivers have the pre-0.9 struct
/// layouts.
pub const MIN_DRV_VERSION: u32 = 906;

/// Encodes a driver version the way `RKNPU_GET_DRV_VERSION` reports it (rknpu-facts §1.1, S1).
pub const fn encode_version(major: u32, minor: u32, patch: u32) -> u32 {
    major * 10000 + minor * 100 + patch
}

/// Splits an encoded driver version into (major, minor, patch).
pub const fn decode_version(v: u32) -> (u32, u32, u32) {
    (v / 10000, (v / 100) % 100, v % 100)
}

/// What the device answered at open. Each field is the raw answer; `None` where the question
/// failed or was not asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    pub node: PathBuf,
    /// `DRM_IOCTL_VERSION`: (major, minor, patch) and description.
    pub drm_version: (u32, u32, u32),
    pub desc: String,
    /// `ACTION(GET_DRV_VERSION)`, encoded (908 = 0.9.8).
    pub drv_version: u32,
    /// `ACTION(UNKNOWN_ACTION)`: Ok(value) where the driver pretended to know it.
    pub unknown_action: Option<Result<u32, Errno>>,
    pub iommu_en: Option<u32>,
    /// `ACTION(GET_IOMMU_DOMAIN_ID)` right after open.
    pub domain_at_open: Option<u32>,
    /// A switch to domain 1 read back through GET_IOMMU_DOMAIN_ID (then switched back); asked only
    /// of a 0.9.6 driver at domain 0 (the one version a port folds domains on; a live domain
    /// other than 0 already shows the switch works). None where not asked or the switch failed.
    pub switch_reads_back: Option<bool>,
    /// The NPU clock: devfreq's `cur_freq`, else `ACTION(GET_FREQ)`.
    pub clock_hz: Option<u64>,
    /// NPU cores the device tree gives the driver (`of_node/interrupt-names`).
    pub dt_cores: Option<u32>,
}

/// The known ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Vendor,
    Rkopnu,
    Dkms,
    NoIommu,
    OneDomain,
}

impl Port {
    pub fn name(self) -> &'static str {
        match self {
            Port::Vendor => "vendor",
            Port::Rkopnu => "rkopnu",
            Port::Dkms => "dkms",
            Port::NoIommu => "no-iommu",
            Port::OneDomain => "one-domain",
        }
    }
}

/// What `ACT_RESET` does on this port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetKind {
    /// Resets the device (vendor).
    Works,
    /// Returns 0 and does nothing: never relied on.
    NoOp,
    /// Resets, but answers EBUSY while any process has a job queued: retried.
    Busy,
}

/// What the interface may rely on, decided once at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    pub port: Port,
    /// Domains ORK may place weights in (logical ids 0..domains).
    pub domains: u32,
    /// The kernel's id of logical domain 0 (dkms: the fd's own id).
    pub domain_base: u32,
    /// The errnos of MEM_CREATE that mean "this domain (or pool) is full".
    pub full: &'static [Errno],
    /// MEM_SYNC covers the whole buffer whatever range it is given.
    pub whole_sync: bool,
    pub reset: ResetKind,
    /// A submit that returned 0 ran all its tasks (its task counter is true).
    pub counter_trusted: bool,
    /// The submit writes `hw_elapse_time`.
    pub elapsed_reported: bool,
    /// A submit that took this long may be a hang reported as success.
    pub hang_after_ms: Option<u32>,
    /// EIO from SUBMIT means another core's job timed out and the device was reset: retried.
    pub eio_is_reset: bool,
    pub clock_hz: Option<u64>,
    pub cores: Option<u32>,
}

const VENDOR_FULL: &[Errno] = &[Errno::EFAULT, Errno::ENOMEM];
const ENOSPC_FULL: &[Errno] = &[Errno::ENOSPC, Errno::EFAULT, Errno::ENOMEM];
const POOL_FULL: &[Errno] = &[Errno::ENOMEM];

impl Caps {
    /// The vendor driver's caps (also what the interface's own unit tests assume).
    pub fn vendor() -> Caps {
        Caps {
            port: Port::Vendor,
            domains: super::MAX_DOMAINS,
            domain_base: 0,
            full: VENDOR_FULL,
            whole_sync: false,
            reset: ResetKind::Works,
            counter_trusted: true,
            elapsed_reported: true,
            hang_after_ms: None,
            eio_is_reset: false,
            clock_hz: None,
            cores: None,
        }
    }

    /// The one line `ork-selftest` and the load log print: `key=value` tokens.
    pub fn line(&self, a: &Answers) -> String {
        let (x, y, z) = a.drm_version;
        let (p, q, r) = decode_version(a.drv_version);
        let full: Vec<String> = self.full.iter().map(|e| format!("{e:?}")).collect();
        format!(
            "ORK NPU port: port={} node={} drm={x}.{y}.{z} drv={p}.{q}.{r} iommu={} domains={}{} full={} sync={} reset={} counter={} clock={} cores={}",
            self.port.name(),
            a.node.display(),
            a.iommu_en.map_or("?".to_string(), |v| v.to_string()),
            self.domains,
            if self.domain_base != 0 { format!("@{}", self.domain_base) } else { String::new() },
            full.join("|"),
            if self.whole_sync { "whole" } else { "range" },
            match self.reset {
                ResetKind::Works => "works",
                ResetKind::NoOp => "none",
                ResetKind::Busy => "busy-retried",
            },
            if self.counter_trusted { "trusted" } else { "untrusted" },
            self.clock_hz.map_or("?".to_string(), |h| format!("{}MHz", h / 1_000_000)),
            self.cores.map_or("soc".to_string(), |c| c.to_string()),
        )
    }
}

/// The caps of the port that gave `a`, or what makes it no known port (one clause, for the
/// refusal line).
pub fn decide(a: &Answers) -> Result<Caps, String> {
    let (x, y, z) = a.drm_version;
    let drm_enc = encode_version(x, y, z);
    let rkopnu = a.desc.to_ascii_lowercase().contains("rkopnu");
    let base = Caps { clock_hz: a.clock_hz, cores: a.dt_cores, ..Caps::vendor() };
    if a.drv_version < MIN_DRV_VERSION {
        let (p, q, r) = decode_version(a.drv_version);
        return Err(format!("driver {p}.{q}.{r} is older than 0.9.6 (pre-0.9 struct layouts)"));
    }
    if rkopnu {
        if a.drm_version != (0, 0, 0) || a.drv_version != encode_version(0, 9, 8) {
            return Err(format!("it calls itself rkopnu but reports DRM {x}.{y}.{z} and a driver other than 0.9.8"));
        }
        return Ok(Caps {
            port: Port::Rkopnu,
            full: ENOSPC_FULL,
            whole_sync: true,
            reset: ResetKind::NoOp,
            counter_trusted: false,
            elapsed_reported: false,
            hang_after_ms: Some(RKOPNU_JOB_TIMEOUT_MS),
            ..base
        });
    }
    if drm_enc != a.drv_version {
        let (p, q, r) = decode_version(a.drv_version);
        return Err(format!("its DRM version {x}.{y}.{z} disagrees with GET_DRV_VERSION {p}.{q}.{r}"));
    }
    if let Some(Ok(v)) = a.unknown_action {
        return Err(format!("it answers an undefined ACTION ({UNKNOWN_ACTION:#x}) with success ({v}): its errors cannot be trusted"));
    }
    if a.iommu_en == Some(0) {
        return Ok(Caps { port: Port::NoIommu, domains: 1, full: POOL_FULL, ..base });
    }
    // On the vendor driver GET_IOMMU_DOMAIN_ID is the device's live domain, device-wide: whatever
    // id (< 16) the last switch, buffer or job of any process named. Only an id no vendor driver
    // has is dkms's own per-file id.
    match a.domain_at_open {
        Some(id) if id >= DKMS_FIRST_OWN_ID => {
            return Ok(Caps {
                port: Port::Dkms,
                domains: 1,
                domain_base: id,
                full: ENOSPC_FULL,
                reset: ResetKind::Busy,
                eio_is_reset: true,
                ..base
            })
        }
        _ => {}
    }
    if a.switch_reads_back == Some(false) {
        return Ok(Caps { port: Port::OneDomain, domains: 1, whole_sync: true, ..base });
    }
    Ok(base)
}

/// The refusal line for a device that fits no known port.
pub fn refusal(a: &Answers, why: &str) -> String {
    let (x, y, z) = a.drm_version;
    format!(
        "{} (DRM \"rknpu\" {x}.{y}.{z}, \"{}\") fits no known rknpu port: {why}; the NPU is not used and every MUL_MAT runs on the CPU",
        a.node.display(),
        a.desc
    )
}

/// NPU cores named by a device-tree node's `interrupt-names` (NUL-separated strings).
pub fn cores_from_irq_names(blob: &[u8]) -> Option<u32> {
    let n = blob.split(|&b| b == 0).filter(|s| !s.is_empty()).count() as u32;
    (n > 0).then_some(n)
}

/// The device-tree core count behind a DRM node (`/sys/class/drm/<node>/device/of_node`; a
/// link such as `/dev/dri/by-path/…` is followed to the node's own name).
pub fn dt_cores(node: &Path) -> Option<u32> {
    let real = std::fs::canonicalize(node).unwrap_or_else(|_| node.to_path_buf());
    let name = real.file_name()?;
    let p = Path::new("/sys/class/drm").join(name).join("device/of_node/interrupt-names");
    cores_from_irq_names(&std::fs::read(p).ok()?)
}

/// The NPU's devfreq clock, if the kernel has one: `max_freq` (the top step the governor may
/// use, what a job runs at; `cur_freq` at open is often the idle step), else `cur_freq`, of
/// `/sys/class/devfreq/*npu*`.
pub fn devfreq_hz() -> Option<u64> {
    let rd = std::fs::read_dir("/sys/class/devfreq").ok()?;
    let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.to_string_lossy().contains("npu")).collect();
    dirs.sort();
    let read = |d: &Path, f: &str| -> Option<u64> { std::fs::read_to_string(d.join(f)).ok()?.trim().parse().ok() };
    dirs.iter().find_map(|d| read(d, "max_freq").or_else(|| read(d, "cur_freq")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vendor() -> Answers {
        Answers {
            node: "/dev/dri/card1".into(),
            drm_version: (0, 9, 8),
            desc: "RKNPU driver".into(),
            drv_version: 908,
            unknown_action: Some(Err(Errno::EINVAL)),
            iommu_en: Some(1),
            domain_at_open: Some(0),
            switch_reads_back: None,
            clock_hz: Some(1_000_000_000),
            dt_cores: Some(3),
        }
    }

    #[test]
    fn each_port_is_told_by_its_answers() {
        let c = decide(&vendor()).unwrap();
        assert_eq!((c.port, c.domains, c.whole_sync, c.reset, c.counter_trusted), (Port::Vendor, 16, false, ResetKind::Works, true));

        let rk = Answers { drm_version: (0, 0, 0), desc: "rkopnu (rknpu ABI on mainline rocket)".into(), unknown_action: Some(Ok(0)), ..vendor() };
        let c = decide(&rk).unwrap();
        assert_eq!(c.port, Port::Rkopnu);
        assert!(c.whole_sync && !c.counter_trusted && !c.elapsed_reported && c.reset == ResetKind::NoOp);
        assert!(c.full.contains(&Errno::ENOSPC));
        assert_eq!(c.hang_after_ms, Some(RKOPNU_JOB_TIMEOUT_MS));

        let c = decide(&Answers { domain_at_open: Some(17), ..vendor() }).unwrap();
        assert_eq!((c.port, c.domains, c.domain_base, c.reset, c.eio_is_reset), (Port::Dkms, 1, 17, ResetKind::Busy, true));
        assert!(c.full.contains(&Errno::ENOSPC));

        let c = decide(&Answers { iommu_en: Some(0), clock_hz: Some(200_000_000), ..vendor() }).unwrap();
        assert_eq!((c.port, c.domains, c.full), (Port::NoIommu, 1, POOL_FULL));
        assert_eq!(c.clock_hz, Some(200_000_000));

        let ep = Answers { drm_version: (0, 9, 6), drv_version: 906, switch_reads_back: Some(false), dt_cores: Some(1), ..vendor() };
        let c = decide(&ep).unwrap();
        assert_eq!((c.port, c.domains, c.whole_sync, c.cores), (Port::OneDomain, 1, true, Some(1)));
        // A stock 0.9.6 whose switch reads back is the vendor driver.
        assert_eq!(decide(&Answers { switch_reads_back: Some(true), ..ep }).unwrap().port, Port::Vendor);
    }

    #[test]
    fn what_fits_no_port_is_refused_in_one_line() {
        let odd = Answers { drm_version: (0, 9, 4), ..vendor() };
        let why = decide(&odd).unwrap_err();
        assert!(why.contains("0.9.4") && why.contains("0.9.8"), "{why}");
        let line = refusal(&odd, &why);
        assert!(line.contains("fits no known rknpu port") && !line.contains('\n'), "{line}");
        assert!(decide(&Answers { unknown_action: Some(Ok(0)), ..vendor() }).unwrap_err().contains("undefined ACTION"));
        assert!(decide(&Answers { drm_version: (0, 9, 5), drv_version: 905, ..vendor() }).unwrap_err().contains("older than 0.9.6"));
        // The vendor driver's live domain is device-wide: another process (or this one's last
        // run) may have left it anywhere below 16.
        assert_eq!(decide(&Answers { domain_at_open: Some(3), ..vendor() }).unwrap().port, Port::Vendor);
        let fake_rk = Answers { drm_version: (0, 9, 8), desc: "rkopnu".into(), ..vendor() };
        assert!(decide(&fake_rk).is_err());
    }

    #[test]
    fn the_caps_line_names_what_was_decided() {
        let rk = Answers { drm_version: (0, 0, 0), desc: "rkopnu".into(), unknown_action: Some(Ok(0)), ..vendor() };
        let line = decide(&rk).unwrap().line(&rk);
        for tok in ["port=rkopnu", "node=/dev/dri/card1", "drm=0.0.0", "drv=0.9.8", "full=ENOSPC|EFAULT|ENOMEM", "sync=whole", "reset=none", "counter=untrusted", "clock=1000MHz", "cores=3"] {
            assert!(line.split(' ').any(|t| t == tok), "{tok} in {line}");
        }
        let d = Answers { domain_at_open: Some(16), ..vendor() };
        assert!(decide(&d).unwrap().line(&d).contains(" domains=1@16 "));
    }

    #[test]
    fn device_tree_cores_count_the_irq_names() {
        assert_eq!(cores_from_irq_names(b"npu0_irq\0npu1_irq\0npu2_irq\0"), Some(3));
        assert_eq!(cores_from_irq_names(b"npu0_irq\0"), Some(1));
        assert_eq!(cores_from_irq_names(b""), None);
    }
}
