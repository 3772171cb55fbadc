//! What hardware is this: the SoC, and which NPU kernel interface (if any) is present.
//!
//! This module owns two questions asked once at start-up and by `ork-selftest`:
//!
//! * **Which SoC?** Like ork, the answer comes from the device tree, not from the DRM device:
//!   `/proc/device-tree/compatible` is a list of NUL-separated strings ("radxa,rock-5b",
//!   "rockchip,rk3588"), and a substring match on "rk3588" / "rk3576" decides (rknpu-facts §1.1,
//!   ork `src/soc.c`). "rk3588s" is an RK3588 for the NPU's purposes (same NPU, 3 cores). The
//!   environment variable `ORK_SOC` overrides it (for offline tools and for boards with odd
//!   device trees); an unparsable `ORK_SOC` is an error rather than silently ignored.
//! * **Which kernel interface?** The vendor `rknpu` DRM driver on `/dev/dri/card*`, then
//!   `/dev/dri/renderD*` (or the node
//!   `ORK_NPU_CARD` names) or the mainline `rocket` accel driver on `/dev/accel/accel*`, each
//!   recognised by its DRM driver name. The vendor driver wins when both are present (it is the
//!   richer interface: domains, core masks, kernel timing). When neither is found the error is one
//!   human sentence saying what was looked at and what was there instead, e.g.
//!   "no /dev/dri/card* with DRM driver \"rknpu\" (card0=rockchip-drm) and no /dev/accel/accel*
//!   nodes".
//!
//! The decisions are pure functions over the file contents / the list of nodes and their driver
//! names, so they are unit-tested without a board; thin wrappers read the real files. Safe Rust
//! only: the one ioctl involved (`DRM_IOCTL_VERSION`) lives in [`crate::npu::kif::drm`].
//!
//! The values of `ORK_SOC` and `ORK_NPU_CARD` come in as arguments (parsed by `crate::config`).

use std::path::{Path, PathBuf};

use super::kif::drm;
use super::soc::SocId;

/// Where the device tree's root `compatible` property is exposed (rknpu-facts §1.1).
pub const DT_COMPATIBLE: &str = "/proc/device-tree/compatible";

/// Why detection failed. Every message is one line meant for a human.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    #[error("ORK_SOC={0:?} is not one of rk3588, rk3576")]
    BadSocOverride(String),
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("device tree compatible [{0}] names neither rk3588 nor rk3576")]
    UnknownSoc(String),
    #[error("{0}")]
    NoNpu(String),
}

/// SoC named by a device-tree `compatible` blob (NUL-separated strings), if any.
pub fn soc_from_compatible(contents: &[u8]) -> Option<SocId> {
    contents
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .find_map(|s| {
            if s.contains("rk3588") {
                Some(SocId::Rk3588)
            } else if s.contains("rk3576") {
                Some(SocId::Rk3576)
            } else {
                None
            }
        })
}

/// The SoC from an optional override (the value of `ORK_SOC`) and the compatible blob.
pub fn soc_from(override_value: Option<&str>, compatible: &[u8]) -> Result<SocId, DetectError> {
    if let Some(v) = override_value.filter(|v| !v.trim().is_empty()) {
        return SocId::parse(v).ok_or_else(|| DetectError::BadSocOverride(v.to_string()));
    }
    soc_from_compatible(compatible).ok_or_else(|| {
        let names: Vec<String> = compatible
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        DetectError::UnknownSoc(names.join(", "))
    })
}

/// Detects the SoC of this machine: the override (the value of `ORK_SOC`), else
/// `/proc/device-tree/compatible`.
pub fn detect_soc(override_value: Option<&str>) -> Result<SocId, DetectError> {
    if let Some(v) = override_value.filter(|v| !v.trim().is_empty()) {
        return soc_from(Some(v), &[]);
    }
    let blob = std::fs::read(DT_COMPATIBLE)
        .map_err(|e| DetectError::Unreadable { path: DT_COMPATIBLE.into(), reason: e.to_string() })?;
    soc_from(None, &blob)
}

/// Which NPU kernel interface a node belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KifKind {
    /// Vendor `rknpu` DRM driver (`/dev/dri/card*`).
    Rknpu,
    /// Mainline `rocket` accel driver (`/dev/accel/accel*`).
    Rocket,
}

impl KifKind {
    pub fn name(self) -> &'static str {
        match self {
            KifKind::Rknpu => "rknpu",
            KifKind::Rocket => "rocket",
        }
    }
}

/// A found NPU node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpuNode {
    pub kind: KifKind,
    pub path: PathBuf,
}

/// One probed node: its path and its DRM driver name, or why it could not be asked.
pub type ProbedNode = (PathBuf, Result<String, String>);

fn describe_probed(dir: &str, prefix: &str, driver: &str, nodes: &[ProbedNode]) -> String {
    if nodes.is_empty() {
        return format!("no {dir}/{prefix}* nodes");
    }
    let seen: Vec<String> = nodes
        .iter()
        .map(|(p, r)| {
            let base = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            match r {
                Ok(name) => format!("{base}={name}"),
                Err(e) => format!("{base}: {e}"),
            }
        })
        .collect();
    format!("no {dir}/{prefix}* with DRM driver \"{driver}\" ({})", seen.join(", "))
}

/// Picks the NPU node from probed card and accel nodes: the first card whose driver is "rknpu",
/// else the first accel node whose driver is "rocket", else a one-line reason.
pub fn choose_node(cards: &[ProbedNode], accels: &[ProbedNode]) -> Result<NpuNode, DetectError> {
    let hit = |nodes: &[ProbedNode], driver: &str| {
        nodes.iter().find(|(_, r)| r.as_deref() == Ok(driver)).map(|(p, _)| p.clone())
    };
    if let Some(path) = hit(cards, "rknpu") {
        return Ok(NpuNode { kind: KifKind::Rknpu, path });
    }
    if let Some(path) = hit(accels, "rocket") {
        return Ok(NpuNode { kind: KifKind::Rocket, path });
    }
    Err(DetectError::NoNpu(format!(
        "{} and {}",
        describe_probed("/dev/dri", "card", "rknpu", cards),
        describe_probed("/dev/accel", "accel", "rocket", accels)
    )))
}

fn probe(dir: &Path, prefix: &str) -> Vec<ProbedNode> {
    drm::list_nodes(dir, prefix)
        .into_iter()
        .map(|p| {
            let r = drm::driver_name_of(&p).map_err(|e| e.to_string());
            (p, r)
        })
        .collect()
}

/// Finds the NPU kernel interface on this machine. `card` (the value of `ORK_NPU_CARD`), when
/// given, replaces the scan of `/dev/dri/card*` by that one node.
pub fn find_npu_node(card: Option<&Path>) -> Result<NpuNode, DetectError> {
    let cards = match card {
        Some(p) => {
            let p = p.to_path_buf();
            let r = drm::driver_name_of(&p).map_err(|e| e.to_string());
            vec![(p, r)]
        }
        // Card nodes first; a render node of the same driver where the card is not there or
        // cannot be opened (cards are often group `video`, mode 0660).
        None => {
            let mut nodes = probe(Path::new("/dev/dri"), "card");
            nodes.extend(probe(Path::new("/dev/dri"), "renderD"));
            nodes
        }
    };
    let accels = probe(Path::new("/dev/accel"), "accel");
    choose_node(&cards, &accels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatible_strings_name_the_soc() {
        assert_eq!(soc_from_compatible(b"radxa,rock-5b\0rockchip,rk3588\0"), Some(SocId::Rk3588));
        assert_eq!(soc_from_compatible(b"friendlyarm,nanopi-r6s\0rockchip,rk3588s\0"), Some(SocId::Rk3588));
        assert_eq!(soc_from_compatible(b"armsom,sige5\0rockchip,rk3576\0"), Some(SocId::Rk3576));
        assert_eq!(soc_from_compatible(b"ROCKCHIP,RK3576"), Some(SocId::Rk3576));
        assert_eq!(soc_from_compatible(b"raspberrypi,5-model-b\0brcm,bcm2712\0"), None);
        assert_eq!(soc_from_compatible(b""), None);
    }

    #[test]
    fn override_wins_and_is_validated() {
        let blob = b"radxa,rock-5b\0rockchip,rk3588\0";
        assert_eq!(soc_from(Some("rk3576"), blob), Ok(SocId::Rk3576));
        assert_eq!(soc_from(Some("RK3588 "), b""), Ok(SocId::Rk3588));
        assert_eq!(soc_from(Some(""), blob), Ok(SocId::Rk3588));
        assert_eq!(soc_from(Some("rk3399"), blob), Err(DetectError::BadSocOverride("rk3399".into())));
        let e = soc_from(None, b"brcm,bcm2712\0").unwrap_err();
        assert_eq!(e.to_string(), "device tree compatible [brcm,bcm2712] names neither rk3588 nor rk3576");
    }

    fn node(p: &str, r: Result<&str, &str>) -> ProbedNode {
        (PathBuf::from(p), r.map(str::to_string).map_err(str::to_string))
    }

    #[test]
    fn rknpu_card_is_found_among_others() {
        let cards = [node("/dev/dri/card0", Ok("rockchip-drm")), node("/dev/dri/card1", Ok("rknpu"))];
        let got = choose_node(&cards, &[]).unwrap();
        assert_eq!(got, NpuNode { kind: KifKind::Rknpu, path: "/dev/dri/card1".into() });
    }

    #[test]
    fn rocket_is_found_when_no_rknpu() {
        let cards = [node("/dev/dri/card0", Ok("rockchip-drm"))];
        let accels = [node("/dev/accel/accel0", Ok("rocket"))];
        let got = choose_node(&cards, &accels).unwrap();
        assert_eq!(got, NpuNode { kind: KifKind::Rocket, path: "/dev/accel/accel0".into() });
        // The vendor driver wins when both exist.
        let cards = [node("/dev/dri/card1", Ok("rknpu"))];
        assert_eq!(choose_node(&cards, &accels).unwrap().kind, KifKind::Rknpu);
    }

    #[test]
    fn no_npu_reason_is_one_line_and_names_what_was_seen() {
        let cards = [
            node("/dev/dri/card0", Ok("rockchip-drm")),
            node("/dev/dri/card1", Err("open: EACCES: Permission denied")),
        ];
        let e = choose_node(&cards, &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            "no /dev/dri/card* with DRM driver \"rknpu\" (card0=rockchip-drm, card1: open: EACCES: \
             Permission denied) and no /dev/accel/accel* nodes"
        );
        assert!(!e.contains('\n'));
        let e = choose_node(&[], &[]).unwrap_err().to_string();
        assert_eq!(e, "no /dev/dri/card* nodes and no /dev/accel/accel* nodes");
    }
}
