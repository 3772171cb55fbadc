//! Every `ORK_*` environment variable, parsed once into [`Config`], and the three standard ones
//! the plugin consults for default directories (`XDG_CACHE_HOME`, `HOME`, `XDG_RUNTIME_DIR`).
//!
//! Nothing else in the library reads the environment: the mechanism modules (`npu`, `vk`,
//! `cache`) receive these values as parameters (`NpuConfig` fields, function arguments) from the
//! code that builds them out of a [`Config`]. `docs/settings.md`'s tables hold exactly the rows
//! of the tests' `VARS` (every variable read here), grouped by who sets them, and README.md's
//! board-owner settings are a subset of them; tests keep both so. Bad values are reported once (log line) and
//! replaced by the default: configuration never aborts a host process.

use std::sync::OnceLock;

/// Which NPU kernel interface to use (`ORK_NPU`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpuSelect {
    /// Probe for a real NPU (vendor rknpu, then mainline rocket); none → no device.
    Auto,
    /// The in-process bit-exact simulator.
    Sim,
    Rknpu,
    Rocket,
}

/// Where decode matmuls (M below `ORK_MINM`) run (`ORK_DECODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeSelect {
    Auto,
    Npu,
    Gpu,
    Cpu,
}

/// Routing policy (`ORK_ROUTE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutePolicy {
    /// The measured threshold: M ≥ `ORK_MINM` → NPU, else `ORK_DECODE`.
    Threshold,
    /// The cost model picks the fastest available engine (`ORK_MINM` stays the NPU floor).
    Cost,
}

/// What to do when another process holds the NPU (`ORK_NPU_LOCK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Wait,
    Cpu,
    Off,
}

/// What to do in a host whose symbols and op/type enums match a layout but whose ggml version
/// lies outside every verified range (`ORK_UNVERIFIED_GGML`; `src/ffi/release.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnverifiedGgml {
    /// Register when the host is newer than every verified release and matches the newest
    /// layout (one warning line); refuse any other unverified host (one line).
    #[default]
    Newer,
    /// Register every host whose marks match a layout (one warning line when unverified).
    Register,
    /// Register only within a verified range.
    Refuse,
}

/// `ORK_CACHE_MAX_MB`'s default: the size limit of the `.orkpack` directory in MiB.
pub const DEFAULT_CACHE_MAX_MB: u64 = 8192;

/// `ORK_NPU_WORK`'s default: extra int8 terms may add 40 % to the layers' plain W8A8 NPU work.
pub const DEFAULT_NPU_WORK: f64 = 1.0;

/// Parsed configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub npu: NpuSelect,
    pub off: bool,
    pub min_m: usize,
    pub decode: DecodeSelect,
    pub route: RoutePolicy,
    pub npu_lock: LockMode,
    /// `ORK_UNVERIFIED_GGML`: a host outside the verified releases.
    pub unverified_ggml: UnverifiedGgml,
    pub lock_dir: Option<String>,
    /// 0 = auto, else 1..=3.
    pub act_terms: u8,
    /// 0 = auto, else 1 or 2.
    pub weight_terms: u8,
    pub soc: Option<String>,
    /// `ORK_NPU_CARD`: the rknpu node to open instead of scanning `/dev/dri/card*`.
    pub npu_card: Option<String>,
    pub max_cores: Option<u32>,
    /// `ORK_MM_TIMEOUT`: NPU submit timeout in ms (None = the NPU core's default).
    pub mm_timeout_ms: Option<u32>,
    pub no_affinity: bool,
    /// `ORK_KEEP_AWAKE`: the host team's other threads stay awake through an NPU matmul.
    pub keep_awake: bool,
    /// `ORK_HOST_THREADS`: a host pool of ORK's own of this size (None = ggml-cpu's OpenMP team, else one per big core).
    pub host_threads: Option<usize>,
    pub wcache_budget_mb: Option<u64>,
    /// `ORK_DOMAIN_CAP_MB`: weight bytes per IOMMU domain in MiB (None = the SoC's default).
    pub domain_cap_mb: Option<u64>,
    pub cache_enabled: bool,
    /// `ORK_CACHE_DIRECT`: write cache entries with `O_DIRECT` (`cache::PackCache`).
    pub cache_direct: bool,
    /// `ORK_MAP_WEIGHTS`: offer ggml `buffer_from_host_ptr` (weights read in place from the
    /// model file's mapping) instead of a copy in ORK's buffers.
    pub map_weights: bool,
    pub cache_dir: Option<String>,
    /// `ORK_ROTATE`: Hadamard rotation of K on both operands, with the budget of extra terms.
    pub rotate: bool,
    /// `ORK_STREAM`: weights past the residency budget are streamed to the NPU for prefill.
    pub stream: bool,
    /// `ORK_MEAN_CORRECT`: each row corrected along its weight's calibrated direction (with the
    /// rotation and a calibration file).
    pub mean_correct: bool,
    /// `ORK_CALIBRATE`: record each NPU weight's activation rows into the calibration file.
    pub calibrate: bool,
    /// `ORK_CALIBRATION`: the calibration file (None = in the cache directory).
    pub calibration: Option<String>,
    /// `ORK_NPU_WORK`: NPU rows per token as a ratio of plain W8A8 that extra int8 terms may use.
    pub npu_work: f64,
    /// `ORK_CACHE_MAX_MB`: size limit of the cache directory in MiB.
    pub cache_max_mb: u64,
    /// `ORK_VK_DEVICE`: Vulkan device index or name substring (None = the default choice).
    pub vk_device: Option<String>,
    pub profile: bool,
    pub log_level: log::LevelFilter,
    /// `ORK_SIM_FAULT`: the simulator's fault-injection spec, parsed where the simulator opens.
    pub sim_fault: Option<String>,
    /// `ORK_SIM_TIMING=board`: the simulator completes submits at a board's modelled time.
    pub sim_board_timing: bool,
    /// `XDG_CACHE_HOME` and `HOME` (non-empty), for the default cache directory.
    pub xdg_cache_home: Option<String>,
    pub home: Option<String>,
    /// `XDG_RUNTIME_DIR` (non-empty), for the default lock directory.
    pub xdg_runtime_dir: Option<String>,
}

/// A variable with named choices: its value, trimmed and in any case, looked up among `choices`
/// (alias, value); unset or empty is the first choice's value, the default. Anything else is the
/// default too, with one complaint `NAME="x" is not a|b|c; using a` (each value named by its first
/// alias).
fn choice<T: Copy + PartialEq>(get: &impl Fn(&str) -> Option<String>, bad: &mut Vec<String>, name: &str, choices: &[(&str, T)]) -> T {
    let default = choices[0].1;
    let Some(v) = get(name).map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty()) else { return default };
    if let Some(&(_, value)) = choices.iter().find(|(alias, _)| *alias == v) {
        return value;
    }
    let names: Vec<&str> = choices.iter().enumerate()
        .filter(|(i, (_, value))| !choices[..*i].iter().any(|(_, earlier)| earlier == value))
        .map(|(_, (alias, _))| *alias).collect();
    bad.push(format!("{name}={v:?} is not {}; using {}", names.join("|"), choices[0].0));
    default
}

/// An on/off variable: 1, true, yes or on / 0, false, no or off (any case, surrounding blanks
/// ignored); unset or empty is `default`, and so is anything else, with one complaint
/// `NAME="x" is not 0 or 1; taken as 0|1`.
fn switch(get: &impl Fn(&str) -> Option<String>, bad: &mut Vec<String>, name: &str, default: bool) -> bool {
    let Some(v) = get(name) else { return default };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => true,
        "0" | "false" | "no" | "off" => false,
        "" => default,
        _ => {
            bad.push(format!("{name}={v:?} is not 0 or 1; taken as {}", u8::from(default)));
            default
        }
    }
}

impl Config {
    /// Parses a configuration from a lookup function (the environment, or a map in tests).
    /// Returns the config and the complaints about bad values.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut bad = Vec::new();
        let npu = choice(&get, &mut bad, "ORK_NPU",
                         &[("auto", NpuSelect::Auto), ("sim", NpuSelect::Sim), ("rknpu", NpuSelect::Rknpu), ("rocket", NpuSelect::Rocket)]);
        let decode = choice(&get, &mut bad, "ORK_DECODE",
                            &[("auto", DecodeSelect::Auto), ("npu", DecodeSelect::Npu), ("gpu", DecodeSelect::Gpu), ("cpu", DecodeSelect::Cpu)]);
        let route = choice(&get, &mut bad, "ORK_ROUTE", &[("threshold", RoutePolicy::Threshold), ("cost", RoutePolicy::Cost)]);
        let npu_lock = choice(&get, &mut bad, "ORK_NPU_LOCK",
                              &[("wait", LockMode::Wait), ("cpu", LockMode::Cpu), ("off", LockMode::Off), ("0", LockMode::Off)]);
        let unverified_ggml = choice(&get, &mut bad, "ORK_UNVERIFIED_GGML",
                                     &[("newer", UnverifiedGgml::Newer), ("register", UnverifiedGgml::Register), ("refuse", UnverifiedGgml::Refuse)]);
        let mut num = |name: &str| -> Option<u64> {
            let v = get(name)?;
            match v.trim().parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    bad.push(format!("{name}={v:?} is not a number; ignored"));
                    None
                }
            }
        };
        let min_m = num("ORK_MINM").map(|n| n.max(1) as usize).unwrap_or(32);
        let mc = num("ORK_NPU_MC");
        let max_cores = mc.map(|n| n.min(u32::MAX as u64) as u32).filter(|&n| n >= 1);
        let wcache_budget_mb = num("ORK_WCACHE_BUDGET_MB");
        let ht = num("ORK_HOST_THREADS");
        let host_threads = ht.filter(|&n| n >= 1).map(|n| n.min(256) as usize);
        let domain_cap_mb = num("ORK_DOMAIN_CAP_MB").filter(|&n| n >= 1);
        let mm_timeout_ms = num("ORK_MM_TIMEOUT").map(|n| n.min(u32::MAX as u64) as u32);
        let cache_max_mb = num("ORK_CACHE_MAX_MB").unwrap_or(DEFAULT_CACHE_MAX_MB);
        let log_level = match get("ORK_LOG").as_deref().map(|s| s.trim().to_ascii_lowercase()) {
            None => log::LevelFilter::Info,
            Some(s) => s.parse().unwrap_or_else(|_| {
                bad.push(format!("ORK_LOG={s:?} is not a log level; using info"));
                log::LevelFilter::Info
            }),
        };
        if mc == Some(0) {
            bad.push("ORK_NPU_MC=0 is not a core count; using all cores".into());
        }
        if ht == Some(0) {
            bad.push("ORK_HOST_THREADS=0 is not a thread count; using one per big core".into());
        }
        let mut terms = |name: &str, max: u8| -> u8 {
            match get(name).as_deref().map(str::trim) {
                None | Some("") | Some("auto") => 0,
                Some(v) => match v.parse::<u8>() {
                    Ok(t) if (1..=max).contains(&t) => t,
                    _ => {
                        bad.push(format!("{name}={v:?} is not auto or 1..={max}; using auto"));
                        0
                    }
                },
            }
        };
        let weight_terms = terms("ORK_WEIGHT_TERMS", 2);
        let act_terms = terms("ORK_ACT_TERMS", 3);
        let npu_work = match get("ORK_NPU_WORK").filter(|v| !v.trim().is_empty()) {
            None => DEFAULT_NPU_WORK,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(w) if (1.0..=8.0).contains(&w) => w,
                _ => {
                    bad.push(format!("ORK_NPU_WORK={v:?} is not a ratio in 1..=8; using {DEFAULT_NPU_WORK}"));
                    DEFAULT_NPU_WORK
                }
            },
        };
        let [off, no_affinity, profile, rotate, mean_correct, calibrate, map_weights, stream, keep_awake] = [
            ("ORK_OFF", false), ("ORK_NO_AFFINITY", false), ("ORK_PROFILE", false), ("ORK_ROTATE", true), ("ORK_MEAN_CORRECT", true),
            ("ORK_CALIBRATE", false), ("ORK_MAP_WEIGHTS", true), ("ORK_STREAM", true), ("ORK_KEEP_AWAKE", true),
        ].map(|(name, default)| switch(&get, &mut bad, name, default));
        let text = |name: &str| get(name).filter(|s| !s.trim().is_empty());
        let sim_board_timing = choice(&get, &mut bad, "ORK_SIM_TIMING", &[("compute", false), ("board", true)]);
        let cfg = Config {
            npu,
            off,
            min_m,
            decode,
            route,
            npu_lock,
            unverified_ggml,
            lock_dir: text("ORK_LOCK_DIR"),
            weight_terms,
            rotate,
            stream,
            mean_correct,
            calibrate,
            calibration: text("ORK_CALIBRATION"),
            npu_work,
            act_terms,
            soc: text("ORK_SOC"),
            npu_card: text("ORK_NPU_CARD"),
            max_cores,
            mm_timeout_ms,
            no_affinity,
            keep_awake,
            host_threads,
            wcache_budget_mb,
            domain_cap_mb,
            map_weights,
            cache_enabled: get("ORK_CACHE").map(|v| v.trim() != "0").unwrap_or(true),
            cache_direct: get("ORK_CACHE_DIRECT").map(|v| v.trim() != "0").unwrap_or(true),
            cache_dir: text("ORK_CACHE_DIR"),
            cache_max_mb,
            vk_device: text("ORK_VK_DEVICE").map(|s| s.trim().to_string()),
            profile,
            log_level,
            sim_fault: text("ORK_SIM_FAULT"),
            sim_board_timing,
            xdg_cache_home: get("XDG_CACHE_HOME").filter(|s| !s.is_empty()),
            home: get("HOME").filter(|s| !s.is_empty()),
            xdg_runtime_dir: get("XDG_RUNTIME_DIR").filter(|s| !s.is_empty()),
        };
        (cfg, bad)
    }

    /// Whether rows may be corrected along their weights' calibrated directions (`ORK_MEAN_CORRECT`;
    /// the correction needs the rotation, `ORK_ROTATE`): the calibration store is opened only
    /// then, and each weight's precision (`route::precision::decide`) corrects only then.
    pub fn corrects_rows(&self) -> bool {
        self.rotate && self.mean_correct
    }

    /// The process-wide configuration, read from the environment on first use.
    pub fn get() -> &'static Config {
        static CFG: OnceLock<Config> = OnceLock::new();
        CFG.get_or_init(|| {
            let (cfg, bad) = Config::from_lookup(|k| std::env::var(k).ok());
            crate::logging::init(cfg.log_level);
            for b in bad {
                log::warn!("{b}");
            }
            cfg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// One documented variable: name, default, meaning.
    struct VarDoc {
        name: &'static str,
        default: &'static str,
        meaning: &'static str,
    }

    /// The table of every `ORK_*` variable the plugin reads (each is one row of `docs/settings.md`,
    /// [`markdown_row`] of it, under the heading of who sets it). `XDG_CACHE_HOME`, `HOME` and
    /// `XDG_RUNTIME_DIR` appear in the defaults they feed.
    const VARS: &[VarDoc] = &[
        VarDoc { name: "ORK_NPU", default: "auto", meaning: "NPU interface: auto (probe rknpu, then rocket), sim (bit-exact simulator), rknpu, rocket" },
        VarDoc { name: "ORK_OFF", default: "0", meaning: "1 = register no device: the same binary runs everything on the CPU (A/B runs)" },
        VarDoc { name: "ORK_MINM", default: "32", meaning: "minimum M (tokens in the ubatch) for a MUL_MAT to go to the NPU; smaller M follows ORK_DECODE" },
        VarDoc { name: "ORK_DECODE", default: "auto", meaning: "engine for MUL_MAT below ORK_MINM: auto, npu, gpu, cpu (auto = cpu until the GPU path is routed)" },
        VarDoc { name: "ORK_ROUTE", default: "threshold", meaning: "routing policy: threshold (M >= ORK_MINM on the NPU, else ORK_DECODE) or cost (the cost model of src/route/mod.rs picks the fastest available engine per MUL_MAT, ORK_MINM still the NPU floor)" },
        VarDoc { name: "ORK_NPU_LOCK", default: "wait", meaning: "cross-process NPU arbitration (advisory flock per NPU, taken by the first NPU matmul of a graph_compute call and kept while no other process asks for it, at most 20 ms; see src/route/arbiter.rs): wait (queue behind the other process), cpu (run the matmul's int8 arithmetic on the CPU instead), off" },
        VarDoc { name: "ORK_LOCK_DIR", default: "$XDG_RUNTIME_DIR, /run/lock or /tmp", meaning: "directory of the NPU lock files (ork-npu-<soc>-<interface>.lock)" },
        VarDoc { name: "ORK_ROTATE", default: "1", meaning: "1 = rotate K by a Hadamard matrix on both operands (weights when packed, activation rows on the host) (with a random sign diagonal) so that one int8 term each does the work, with the calibrated correction (ORK_MEAN_CORRECT) and extra terms within ORK_NPU_WORK (docs/precision.md); 0 = no rotation, the multi-term scheme (2 weight terms, 2 activation terms, 3 for F32/F16/BF16 weights: 3x-4x the NPU rows)" },
        VarDoc { name: "ORK_NPU_WORK", default: "1", meaning: "with ORK_ROTATE=1, the layers' NPU work per token (multiply-accumulates) as a ratio of plain W8A8 that extra int8 terms may use: granted to the attention value projections (1.05 holds these: 3-4 % more work), then the attention output projections (1.15), then the FFN down-projections (1.40), in the order of their measured gain, each to all layers or none; 1 = one term in every layer; the output head gets 2 weight + 2 activation terms outside it (docs/precision.md); F32/F16/BF16 weights always get two weight and two activation terms" },
        VarDoc { name: "ORK_MEAN_CORRECT", default: "1", meaning: "with ORK_ROTATE=1, 1 = correct every NPU matmul row along its weight's calibrated direction (the mean of the rows the weight saw in a calibration run, ORK_CALIBRATION): the host's exact product on that direction, computed once per weight, replaces the NPU's on each row's share of it, from that row alone (docs/precision.md); 0 = off" },
        VarDoc { name: "ORK_CALIBRATE", default: "0", meaning: "1 = record: every NPU matmul adds its activation rows to its weight's entry in the calibration file, written when the backend is freed (run a calibration text, e.g. llama-perplexity over a few chunks; tests/common.sh calibrate_models)" },
        VarDoc { name: "ORK_CALIBRATION", default: "<cache dir>/calibration.orkcal", meaning: "the calibration file (src/cache/calib.rs); without it, or for a weight it has no entry for, rows keep the NPU's result uncorrected" },
        VarDoc { name: "ORK_ACT_TERMS", default: "auto", meaning: "int8 terms per activation row (x ≈ Σ s_t·q_t, T·M NPU rows) for every weight, overriding the plan: auto (ORK_NPU_WORK's plan; without rotation 3 for F32/F16/BF16 weights, else 2), 1, 2, 3" },
        VarDoc { name: "ORK_WEIGHT_TERMS", default: "auto", meaning: "int8 terms per weight for every weight (its NPU and GPU copies alike), overriding the plan: auto (ORK_NPU_WORK's plan; without rotation 2), 1, or 2; a second term that does not fit the resident budget is dropped" },
        VarDoc { name: "ORK_SOC", default: "(device tree)", meaning: "force the SoC description: rk3588 or rk3576" },
        VarDoc { name: "ORK_NPU_CARD", default: "(scan /dev/dri/card*)", meaning: "the vendor rknpu DRM node to use, e.g. /dev/dri/card1, instead of the first /dev/dri/card* whose driver is rknpu" },
        VarDoc { name: "ORK_NPU_MC", default: "(all cores)", meaning: "cap on NPU cores per matmul (the core budget); the planner picks within it" },
        VarDoc { name: "ORK_MM_TIMEOUT", default: "60000", meaning: "NPU submit timeout in ms; a submit past it fails (the NPU is soft-reset) and the matmul runs on the CPU" },
        VarDoc { name: "ORK_HOST_THREADS", default: "(ggml-cpu's threads)", meaning: "threads of the host team that runs the passes around an NPU matmul (rotation and int8 terms of the activations, the output's dequantization). Unset: ggml-cpu's own OpenMP team (its -t threads) where llama.cpp runs on OpenMP, else one per big core (4 on RK3588); set: a pool of ORK's own of this size (the calling thread among them); fewer leaves cores to other work" },
        VarDoc { name: "ORK_KEEP_AWAKE", default: "1", meaning: "1 = while an NPU matmul runs, the host team's other threads wait for its next pass spinning (they yield their CPU) instead of sleeping, so each pass starts on every thread at once; 0 = each pass starts the team anew (not yet measured on a board: bench-scripts/paired_prefill.sh measures both)" },
        VarDoc { name: "ORK_NO_AFFINITY", default: "0", meaning: "1 (or true, yes, on) = do not pin NPU worker threads and ORK's own host pool (where there is no OpenMP team) to the big CPU cores" },
        VarDoc { name: "ORK_DOMAIN_CAP_MB", default: "3072", meaning: "weight bytes placed in one IOMMU domain before the next is opened (MiB; on `rocket`, per core's address space: a domain there is one file descriptor per core, each holding that core's part of every weight); lower it below the kernel's per-domain window (the fake kernel's ORK_FK_DOMAIN_MB) so weights span several domains" },
        VarDoc { name: "ORK_WCACHE_BUDGET_MB", default: "RAM - 1024 - ORK buffers", meaning: "resident weight budget (MiB); weights past it are streamed to the NPU for prefill (ORK_STREAM), else keep one int8 term, then stay on the CPU" },
        VarDoc { name: "ORK_STREAM", default: "1", meaning: "1 = weights past the resident budget run prefill on the NPU through a ring of NPU buffers filled from the .orkpack cache (or packed again) while the NPU runs the previous weight, where the cost model says it beats the CPU; 0 = they keep one int8 term, then stay on the CPU" },
        VarDoc { name: "ORK_MAP_WEIGHTS", default: "1", meaning: "1 = ORK's weight buffers are llama.cpp's own read-only mapping of the model file (ggml's buffer_from_host_ptr, used when llama.cpp maps the file: its default, not -lm none / --no-mmap): ggml-cpu and ORK read the GGUF bytes in place, with no second copy of them in ORK's memory, and weights are packed at their first NPU MUL_MAT; 0 = ggml copies the GGUF bytes into ORK's own buffers and they are packed as they are written (docs/cache.md \"The GGUF bytes\")" },
        VarDoc { name: "ORK_CACHE", default: "1", meaning: "0 = do not read or write .orkpack files" },
        VarDoc { name: "ORK_CACHE_DIRECT", default: "1", meaning: "1 = write .orkpack entries with O_DIRECT (no page cache: the first run's tiles do not push the model's mapped pages out of RAM; each write waits for the disk); 0 = buffered writes (the kernel writes them back later: faster on a slow disk such as eMMC when RAM is plentiful)" },
        VarDoc { name: "ORK_CACHE_MAX_MB", default: "8192", meaning: "size limit of the .orkpack cache directory; least-recently-used entries not in use are removed past it, and when that is not enough the new entry is not written (one warning)" },
        VarDoc { name: "ORK_CACHE_DIR", default: "$XDG_CACHE_HOME/ggml-ork or ~/.cache/ggml-ork", meaning: "where .orkpack files live" },
        VarDoc { name: "ORK_VK_DEVICE", default: "(first Mali)", meaning: "Vulkan device for GPU decode, by index or name substring" },
        VarDoc { name: "ORK_PROFILE", default: "0", meaning: "1 = print per-engine counts and time split when the backend is freed" },
        VarDoc { name: "ORK_UNVERIFIED_GGML", default: "newer", meaning: "a llama.cpp whose exported symbols and op/type enums match a layout this libggml-ork.so knows, but whose ggml version lies outside the releases verified with it (docs/releases.md): newer (register, with one warning line, when it is newer than every verified release; refuse any other), register (register any such), refuse (register only within the verified releases)" },
        VarDoc { name: "ORK_LOG", default: "info", meaning: "log level: error, warn, info, debug, trace" },
        VarDoc { name: "ORK_SIM_TIMING", default: "compute", meaning: "the simulator's timing: compute (every program computed bit-exactly, the host's own time) or board (programs not computed, only each program's last output word written, each submit completing at the hardware time modelled for a board's NPU core: src/npu/soc.rs NpuTiming; for benchmarks of the host path, the text is meaningless)" },
        VarDoc { name: "ORK_SIM_FAULT", default: "(none)", meaning: "simulator fault injection (tests): timeout_every, reset_every, sync_fail_every, never_run_every, hole_every, short_count_every (:N, comma-separated), efault_after_mb:N; a bad value makes the simulator fail to open" },
    ];

    /// One variable's row of `docs/settings.md`: `| \`name\` | default | meaning |`, without a newline.
    fn markdown_row(v: &VarDoc) -> String {
        format!("| `{}` | {} | {} |", v.name, v.default, v.meaning)
    }

    /// Every variable's row, in [`VARS`] order: the header, the separator and one row per variable,
    /// each line ending in a newline.
    fn markdown_table() -> String {
        let mut t = String::from("| variable | default | meaning |\n|---|---|---|\n");
        for v in VARS {
            t.push_str(&markdown_row(v));
            t.push('\n');
        }
        t
    }

    fn parse(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        let m: HashMap<String, String> = pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let (c, bad) = parse(&[]);
        assert!(bad.is_empty());
        assert_eq!(c.npu, NpuSelect::Auto);
        assert_eq!(c.min_m, 32);
        assert!(!c.off);
        assert!(c.cache_enabled);
        assert_eq!(c.cache_max_mb, 8192);
        assert_eq!(c.route, RoutePolicy::Threshold);
        assert_eq!(c.npu_lock, LockMode::Wait);
        assert!(c.map_weights, "weights are read in place from llama.cpp's mapping by default");
        let (c, bad) = parse(&[("ORK_MAP_WEIGHTS", "0")]);
        assert!(!c.map_weights && bad.is_empty());
        let (c, bad) = parse(&[("ORK_MAP_WEIGHTS", "maybe")]);
        assert!(c.map_weights && bad.len() == 1, "{bad:?}");
        assert!(parse(&[]).0.keep_awake, "the host team stays awake through a matmul by default");
        let (c, bad) = parse(&[("ORK_KEEP_AWAKE", "off")]);
        assert!(!c.keep_awake && bad.is_empty());
    }

    #[test]
    fn npu_work_and_rotate() {
        let (c, bad) = parse(&[("ORK_NPU_WORK", " "), ("ORK_ROTATE", "")]);
        assert_eq!((c.npu_work, c.rotate, bad.len()), (DEFAULT_NPU_WORK, true, 0), "empty means the default: {bad:?}");
        assert!(parse(&[]).0.rotate, "rotation is the default");
        let (c, bad) = parse(&[("ORK_NPU_WORK", "1.5"), ("ORK_ROTATE", "0")]);
        assert_eq!((c.npu_work, c.rotate, bad.len()), (1.5, false, 0));
        assert!(!parse(&[("ORK_ROTATE", " Off")]).0.rotate);
        let (c, bad) = parse(&[("ORK_NPU_WORK", "0.5"), ("ORK_ROTATE", "maybe")]);
        assert_eq!((c.npu_work, c.rotate, bad.len()), (DEFAULT_NPU_WORK, true, 2), "bad values: the defaults, one line each");
        assert!(bad[1].contains("taken as 1"), "{bad:?}");
        assert!(parse(&[]).0.mean_correct, "the correction is the default");
        assert!(!parse(&[("ORK_MEAN_CORRECT", "no")]).0.mean_correct);
        let (c, bad) = parse(&[("ORK_MEAN_CORRECT", "sometimes")]);
        assert!(c.mean_correct && bad.len() == 1 && bad[0].contains("taken as 1"), "{bad:?}");
    }

    #[test]
    fn route_and_lock() {
        let (c, bad) = parse(&[("ORK_ROUTE", "Cost"), ("ORK_NPU_LOCK", "cpu")]);
        assert!(bad.is_empty());
        assert_eq!(c.route, RoutePolicy::Cost);
        assert_eq!(c.npu_lock, LockMode::Cpu);
        let (c, bad) = parse(&[("ORK_ROUTE", "fast"), ("ORK_NPU_LOCK", "maybe")]);
        assert_eq!((c.route, c.npu_lock, bad.len()), (RoutePolicy::Threshold, LockMode::Wait, 2));
        assert_eq!(bad, ["ORK_ROUTE=\"fast\" is not threshold|cost; using threshold", "ORK_NPU_LOCK=\"maybe\" is not wait|cpu|off; using wait"]);
    }

    #[test]
    fn choices_in_any_case_with_aliases_and_one_line_per_bad_value() {
        let (c, bad) = parse(&[("ORK_NPU_LOCK", "0"), ("ORK_UNVERIFIED_GGML", " Refuse "), ("ORK_SIM_TIMING", "BOARD"), ("ORK_DECODE", "")]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!((c.npu_lock, c.unverified_ggml, c.sim_board_timing, c.decode), (LockMode::Off, UnverifiedGgml::Refuse, true, DecodeSelect::Auto));
        let (c, bad) = parse(&[("ORK_NPU", "npu"), ("ORK_DECODE", "Warp"), ("ORK_UNVERIFIED_GGML", "yes"), ("ORK_SIM_TIMING", "fast")]);
        assert_eq!((c.npu, c.decode, c.unverified_ggml, c.sim_board_timing), (NpuSelect::Auto, DecodeSelect::Auto, UnverifiedGgml::Newer, false));
        assert_eq!(bad, [
            "ORK_NPU=\"npu\" is not auto|sim|rknpu|rocket; using auto",
            "ORK_DECODE=\"warp\" is not auto|npu|gpu|cpu; using auto",
            "ORK_UNVERIFIED_GGML=\"yes\" is not newer|register|refuse; using newer",
            "ORK_SIM_TIMING=\"fast\" is not compute|board; using compute",
        ]);
    }

    #[test]
    fn values_and_bad_values() {
        let (c, bad) = parse(&[("ORK_NPU", "SIM"), ("ORK_MINM", "1"), ("ORK_OFF", "1"), ("ORK_DECODE", "warp"), ("ORK_NPU_MC", "x")]);
        assert_eq!(c.npu, NpuSelect::Sim);
        assert_eq!(c.min_m, 1);
        assert!(c.off);
        assert_eq!(c.decode, DecodeSelect::Auto);
        assert_eq!(c.max_cores, None);
        assert_eq!(bad.len(), 2, "{bad:?}");
        let (c, bad) = parse(&[("ORK_ACT_TERMS", "7"), ("ORK_WEIGHT_TERMS", "0"), ("ORK_NPU_MC", "0"), ("ORK_OFF", "2")]);
        assert_eq!((c.act_terms, c.weight_terms, c.max_cores, c.off), (0, 0, None, false));
        assert_eq!(bad.len(), 4, "{bad:?}");
        let host = |v: &str| parse(&[("ORK_HOST_THREADS", v)]);
        assert_eq!((host("3").0.host_threads, host("0").0.host_threads, host("0").1.len()), (Some(3), None, 1));
        assert_eq!((host("many").0.host_threads, host("many").1.len()), (None, 1), "not a number: one line, the default");
    }

    #[test]
    fn flags_accept_one_true_yes_on_in_any_case() {
        for v in ["1", " TRUE ", "yes", "On"] {
            let (c, bad) = parse(&[("ORK_NO_AFFINITY", v), ("ORK_OFF", v), ("ORK_PROFILE", v)]);
            assert!(c.no_affinity && c.off && c.profile && bad.is_empty(), "{v:?}: {bad:?}");
        }
        for v in ["0", "", "no", "OFF"] {
            let (c, bad) = parse(&[("ORK_NO_AFFINITY", v)]);
            assert!(!c.no_affinity && bad.is_empty(), "{v:?}: {bad:?}");
        }
        let (c, bad) = parse(&[("ORK_NO_AFFINITY", "2")]);
        assert!(!c.no_affinity);
        assert_eq!(bad.len(), 1, "{bad:?}");
    }

    #[test]
    fn device_and_directory_values() {
        let (c, bad) = parse(&[]);
        assert!(bad.is_empty());
        assert_eq!((c.npu_card, c.mm_timeout_ms, c.vk_device, c.sim_fault), (None, None, None, None));
        let (c, bad) = parse(&[
            ("ORK_NPU_CARD", "/dev/dri/card1"),
            ("ORK_MM_TIMEOUT", " 250 "),
            ("ORK_VK_DEVICE", " llvmpipe "),
            ("ORK_SIM_FAULT", "timeout_every:3"),
            ("XDG_CACHE_HOME", "/c"),
            ("HOME", "/h"),
            ("XDG_RUNTIME_DIR", ""),
        ]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(c.npu_card.as_deref(), Some("/dev/dri/card1"));
        assert_eq!(c.mm_timeout_ms, Some(250));
        assert_eq!(c.vk_device.as_deref(), Some("llvmpipe"));
        assert_eq!(c.sim_fault.as_deref(), Some("timeout_every:3"));
        assert_eq!((c.xdg_cache_home.as_deref(), c.home.as_deref(), c.xdg_runtime_dir), (Some("/c"), Some("/h"), None));
        let (c, bad) = parse(&[("ORK_MM_TIMEOUT", "soon"), ("ORK_NPU_CARD", " "), ("ORK_SIM_FAULT", " ")]);
        assert_eq!((c.mm_timeout_ms, c.npu_card, c.sim_fault), (None, None, None));
        assert_eq!(bad.len(), 1, "{bad:?}");
    }

    #[test]
    fn every_parsed_variable_is_in_vars() {
        let seen = std::cell::RefCell::new(Vec::new());
        let _ = Config::from_lookup(|k| {
            seen.borrow_mut().push(k.to_string());
            None
        });
        let seen = seen.into_inner();
        for k in &seen {
            assert!(k.starts_with("ORK_") == VARS.iter().any(|v| v.name == k), "{k}: VARS lists exactly the ORK_* variables read");
        }
        for v in VARS {
            assert!(seen.iter().any(|k| k == v.name), "{} is in VARS but not parsed", v.name);
        }
    }

    /// The lines between a file's `<!-- {marker}:begin -->` and `<!-- {marker}:end -->` lines that
    /// are a variable's table row (they start with "| `ORK_").
    fn variable_rows<'a>(file: &str, text: &'a str, marker: &str) -> Vec<&'a str> {
        let (begin, end) = (format!("<!-- {marker}:begin -->\n"), format!("<!-- {marker}:end -->"));
        let start = text.find(&begin).unwrap_or_else(|| panic!("{file} has the {marker}:begin marker")) + begin.len();
        let len = text[start..].find(&end).unwrap_or_else(|| panic!("{file} has the {marker}:end marker"));
        text[start..start + len].lines().filter(|l| l.starts_with("| `ORK_")).collect()
    }

    #[test]
    fn settings_doc_is_vars() {
        let rows = variable_rows("docs/settings.md", include_str!("../docs/settings.md"), "config-table");
        for r in &rows {
            assert!(
                VARS.iter().any(|v| markdown_row(v) == *r),
                "docs/settings.md's row differs from every row of config::VARS:\n{r}\nconfig::VARS renders to:\n{}",
                markdown_table()
            );
        }
        for v in VARS {
            let n = rows.iter().filter(|r| **r == markdown_row(v)).count();
            assert!(n == 1, "docs/settings.md holds {}'s row {n} times (once, under one heading); the row:\n{}", v.name, markdown_row(v));
        }
    }

    #[test]
    fn readme_settings_are_vars() {
        let rows = variable_rows("README.md", include_str!("../README.md"), "user-settings");
        assert!(!rows.is_empty(), "README.md lists the board owner's settings");
        for r in rows {
            let cells: Vec<&str> = r.split(" | ").collect();
            let name = cells[0].trim_start_matches("| ").trim_matches('`');
            let v = VARS.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("README.md's {name} is not in config::VARS"));
            assert!(cells.len() >= 3 && cells[1] == v.default, "README.md's {name}: default {:?}, config::VARS says {:?}", cells.get(1), v.default);
        }
    }
}
