//! Host-CPU topology: which CPUs are the big cluster, and pinning NPU-driver threads to them.
//!
//! Why this exists: on big.LITTLE parts the scheduler parks unpinned worker threads on the little
//! cores, which are about 2× slower at the copy/accumulate work between submits; the multi-core
//! matmul then waits for its slowest worker. Pinning the per-core NPU threads to the big cluster
//! took ork's 3-core prefill from 1.11× to 1.92× of one core (seed 001; rknpu-facts §5).
//!
//! Decisions:
//! * **Detection by frequency, not by CPU number.** RK3588 has 4×A55 (cpu0-3, 1800 MHz) and
//!   4×A76 (cpu4-7, binned 2304/2352 MHz); RK3576 has 4×A53 + 4×A72. Rather than hard-code
//!   "high-numbered CPUs are big", the CPUs' maximum frequencies
//!   (`cpufreq/cpuinfo_max_freq`, falling back to the scheduler's `cpu_capacity`) are sorted and
//!   split at the largest relative gap, provided that gap is at least [`BIG_GAP_RATIO`] (1.20×,
//!   ork `ork_big_core_set`, rknpu-facts §5). Binning noise inside a cluster (2304 vs 2352 MHz,
//!   1.02×) never reaches that. With no such gap (all CPUs alike, e.g. an x86 host) every CPU is
//!   "big". With no readable frequency or capacity at all, the answer is empty: do not pin.
//! * **Only online CPUs** (`/sys/devices/system/cpu/online`) are considered.
//! * **Opt-out.** `ORK_NO_AFFINITY=1` (parsed by `crate::config`, passed in as `no_affinity`)
//!   makes [`big_cores_for_pinning`] return nothing, so callers simply skip pinning (seed 001
//!   kept the same switch).
//! * **Mechanism only.** Which worker goes to which big CPU is the NPU pool's business; this
//!   module lists the CPUs (ascending) and pins the calling thread.
//!
//! Safe Rust only; pinning goes through `core_affinity` (`sched_setaffinity`).

use std::path::Path;

/// Minimum ratio between the slowest big CPU and the fastest little CPU for a split
/// (rknpu-facts §5, ork `ork_big_core_set`: "largest relative gap (≥1.20×)").
pub const BIG_GAP_RATIO: f64 = 1.20;

const SYS_CPU: &str = "/sys/devices/system/cpu";

/// The big cluster from `(cpu id, max frequency or capacity)` pairs: the CPUs at or above the
/// largest relative gap between consecutive sorted values, if that gap is ≥ [`BIG_GAP_RATIO`];
/// otherwise all CPUs. Returned ascending by CPU id; empty input gives an empty answer.
pub fn big_cluster(cpus: &[(usize, u64)]) -> Vec<usize> {
    let mut v: Vec<(usize, u64)> = cpus.iter().copied().filter(|&(_, f)| f > 0).collect();
    v.sort_by_key(|&(id, f)| (f, id));
    let mut best: Option<(f64, u64)> = None; // (ratio, threshold = first value above the gap)
    for w in v.windows(2) {
        let (lo, hi) = (w[0].1, w[1].1);
        let ratio = hi as f64 / lo as f64;
        if ratio >= BIG_GAP_RATIO && best.is_none_or(|(r, _)| ratio > r) {
            best = Some((ratio, hi));
        }
    }
    let mut ids: Vec<usize> = match best {
        Some((_, threshold)) => v.iter().filter(|&&(_, f)| f >= threshold).map(|&(id, _)| id).collect(),
        None => v.iter().map(|&(id, _)| id).collect(),
    };
    ids.sort_unstable();
    ids
}

/// Parses a kernel CPU list such as "0-3,6,8-9" (`/sys/devices/system/cpu/online`).
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    out.extend(a..=b);
                }
            }
            None => {
                if let Ok(a) = part.parse::<usize>() {
                    out.push(a);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Online CPUs of this machine (empty if sysfs is unavailable).
pub fn online_cpus() -> Vec<usize> {
    match std::fs::read_to_string(Path::new(SYS_CPU).join("online")) {
        Ok(s) => parse_cpu_list(&s),
        Err(_) => Vec::new(),
    }
}

/// `(cpu, metric)` for every online CPU: `cpuinfo_max_freq` (kHz) when every CPU has one, else
/// `cpu_capacity` when every CPU has one, else empty.
pub fn read_cpu_metrics() -> Vec<(usize, u64)> {
    let cpus = online_cpus();
    let base = Path::new(SYS_CPU);
    let collect = |rel: &str| -> Option<Vec<(usize, u64)>> {
        cpus.iter()
            .map(|&c| read_u64(&base.join(format!("cpu{c}")).join(rel)).map(|v| (c, v)))
            .collect()
    };
    if cpus.is_empty() {
        return Vec::new();
    }
    collect("cpufreq/cpuinfo_max_freq")
        .or_else(|| collect("cpu_capacity"))
        .unwrap_or_default()
}

/// The big cluster of this machine (ascending CPU ids; empty when the topology is unknown).
pub fn big_cores() -> Vec<usize> {
    big_cluster(&read_cpu_metrics())
}

/// The CPUs NPU-driver threads should be pinned to: [`big_cores`], or nothing when
/// `no_affinity` (`ORK_NO_AFFINITY`).
pub fn big_cores_for_pinning(no_affinity: bool) -> Vec<usize> {
    if no_affinity {
        log::debug!("hostcpu: ORK_NO_AFFINITY set; not pinning");
        return Vec::new();
    }
    let big = big_cores();
    log::debug!("hostcpu: big cluster {big:?}");
    big
}

/// Restricts the calling thread to the CPUs `cpus` (a set, not one CPU: the scheduler still
/// balances the thread among them). Returns whether the kernel accepted it; an empty list or a
/// CPU beyond the mask's size is refused.
pub fn pin_current_thread_to_set(cpus: &[usize]) -> bool {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    if cpus.is_empty() || cpus.iter().any(|&c| set.set(c).is_err()) {
        return false;
    }
    match sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("hostcpu: could not pin thread to cpus {cpus:?}: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rk3588_big_cluster_is_the_a76s() {
        let f = [
            (0, 1_800_000),
            (1, 1_800_000),
            (2, 1_800_000),
            (3, 1_800_000),
            (4, 2_352_000),
            (5, 2_352_000),
            (6, 2_304_000),
            (7, 2_304_000),
        ];
        assert_eq!(big_cluster(&f), vec![4, 5, 6, 7]);
    }

    #[test]
    fn rk3576_big_cluster_by_capacity_and_unordered_input() {
        // cpu_capacity style values, big cores listed first and low-numbered.
        let c = [(0, 1024), (1, 1024), (2, 1024), (3, 1024), (4, 485), (5, 485), (6, 485), (7, 485)];
        assert_eq!(big_cluster(&c), vec![0, 1, 2, 3]);
    }

    #[test]
    fn equal_cpus_are_all_big_and_small_gaps_do_not_split() {
        let f: Vec<(usize, u64)> = (0..8).map(|i| (i, 3_000_000)).collect();
        assert_eq!(big_cluster(&f), (0..8).collect::<Vec<_>>());
        // 1.15× is binning, not a cluster boundary.
        let f = [(0, 2_000_000), (1, 2_300_000)];
        assert_eq!(big_cluster(&f), vec![0, 1]);
        assert!(big_cluster(&[]).is_empty());
    }

    #[test]
    fn largest_gap_wins_with_three_tiers() {
        // A prime core, big cores and little cores: 1.8 → 2.4 (1.33×) → 3.0 (1.25×).
        let f = [(0, 1_800_000), (1, 1_800_000), (2, 2_400_000), (3, 2_400_000), (4, 3_000_000)];
        assert_eq!(big_cluster(&f), vec![2, 3, 4]);
        // Zero readings are ignored rather than dividing by zero.
        let f = [(0, 0), (1, 1_000_000), (2, 2_000_000)];
        assert_eq!(big_cluster(&f), vec![2]);
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-7\n"), (0..8).collect::<Vec<_>>());
        assert_eq!(parse_cpu_list("0-2,4,6-7"), vec![0, 1, 2, 4, 6, 7]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("3,1,1"), vec![1, 3]);
    }

    #[test]
    fn the_opt_out_pins_nothing() {
        assert!(big_cores_for_pinning(true).is_empty());
    }

    #[test]
    fn pinning_to_a_set_keeps_the_thread_on_it() {
        let allowed: Vec<usize> = core_affinity::get_core_ids().unwrap_or_default().iter().map(|c| c.id).collect();
        if allowed.is_empty() {
            return;
        }
        // On a thread of its own, so the test harness's thread keeps its mask.
        let got = std::thread::spawn(move || {
            let ok = pin_current_thread_to_set(&allowed[..1]);
            (ok, core_affinity::get_core_ids().unwrap_or_default().iter().map(|c| c.id).collect::<Vec<_>>(), allowed[0])
        })
        .join()
        .unwrap();
        assert!(got.0);
        assert_eq!(got.1, vec![got.2], "the thread's mask is the set");
        assert!(!pin_current_thread_to_set(&[]));
        assert!(!pin_current_thread_to_set(&[1000]), "a CPU no machine here has");
    }
}
