//! Routing policy: which engine runs a MUL_MAT.
//!
//! Today's policy is the seeds' measured one (seed 000/001): prefill (M ≥ `ORK_MINM`, default 32)
//! is compute-bound and goes to the NPU; below the threshold the matmul follows `ORK_DECODE`
//! (`cpu` by default, where ggml-cpu's quantized GEMV reads the GGUF bytes in place; `npu` runs
//! it on the NPU too). The phase-aware cost model (issue "routing") will replace the threshold;
//! the override variables stay.

use crate::config::{Config, DecodeSelect};

/// Where one MUL_MAT runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Npu,
    Gpu,
    /// Declined: ggml's CPU backend runs it.
    Cpu,
}

/// Why a MUL_MAT was left to the CPU (for the profile counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decline {
    SmallM,
}

/// Chooses the engine for a MUL_MAT of `m` rows. `gpu_ready` says whether a GPU engine exists.
pub fn choose(cfg: &Config, m: usize, gpu_ready: bool) -> Result<Engine, Decline> {
    if m >= cfg.min_m {
        return Ok(Engine::Npu);
    }
    match cfg.decode {
        DecodeSelect::Npu => Ok(Engine::Npu),
        DecodeSelect::Gpu if gpu_ready => Ok(Engine::Gpu),
        DecodeSelect::Gpu | DecodeSelect::Cpu | DecodeSelect::Auto => Err(Decline::SmallM),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        let m: std::collections::HashMap<_, _> = pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned()).0
    }

    #[test]
    fn threshold_and_overrides() {
        let c = cfg(&[]);
        assert_eq!(choose(&c, 32, false), Ok(Engine::Npu));
        assert_eq!(choose(&c, 31, false), Err(Decline::SmallM));
        let c = cfg(&[("ORK_MINM", "1")]);
        assert_eq!(choose(&c, 1, false), Ok(Engine::Npu));
        let c = cfg(&[("ORK_DECODE", "npu")]);
        assert_eq!(choose(&c, 1, false), Ok(Engine::Npu));
        let c = cfg(&[("ORK_DECODE", "gpu")]);
        assert_eq!(choose(&c, 1, true), Ok(Engine::Gpu));
        assert_eq!(choose(&c, 1, false), Err(Decline::SmallM));
    }
}
