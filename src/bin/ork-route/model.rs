//! A whole model's predicted rates from the route cost model (`ork-route`'s summary lines): a
//! dense transformer's MUL_MAT shapes ([`ModelShape`]), each routed by
//! [`ggml_ork::route::decide_precision`] ([`predict`]), and the work per prompt token the host
//! coefficients are divided by ([`prefill_work`]).

use ggml_ork::config::Config;
use crate::cost::{chain, layer_link, reads_held};
use ggml_ork::route::precision::{self, Role};
use ggml_ork::route::{decide_precision, Availability, CostModel, Engine, MatMul};

/// Predicted rates of a whole model (tokens/s) from its MUL_MAT shapes.
#[derive(Clone, Debug)]
pub struct ModelRates {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

/// Shapes of a dense transformer: (K, N, ggml type) per MUL_MAT of one layer, layer count, and
/// the LM head (computed for one row per step in llama.cpp).
#[derive(Clone, Debug)]
pub struct ModelShape {
    pub layers: usize,
    /// `(K, N, ggml type, precision role)` of each matmul of one layer.
    pub per_layer: Vec<(usize, usize, u32, precision::Role)>,
    pub head: Option<(usize, usize, u32)>,
    /// Attention width (heads × head dim) for the CPU's attention cost in prefill.
    pub attn_dim: usize,
}

impl ModelShape {
    /// The model's matmul weights per precision role.
    pub fn role_counts(&self) -> [u64; precision::ROLES] {
        let mut c = [0; precision::ROLES];
        c[Role::Head.index()] = self.head.is_some() as u64;
        for &(_, _, _, role) in &self.per_layer {
            c[role.index()] += self.layers as u64;
        }
        c
    }

    /// The model's matmul work per precision role (`precision::RoleWork`: Σ K·N).
    pub fn role_work(&self) -> precision::RoleWork {
        let mut w = [0; precision::ROLES];
        if let Some((k, n, _)) = self.head {
            w[Role::Head.index()] = (k * n) as u64;
        }
        for &(k, n, _, role) in &self.per_layer {
            w[role.index()] += (k * n * self.layers) as u64;
        }
        w
    }

    /// Qwen3-1.7B (28 layers, hidden 2048, 16 q / 8 kv heads of 128, FFN 6144, tied 151936
    /// vocab), Q8_0 — the anchors' model.
    pub fn qwen3_1_7b() -> ModelShape {
        let q8 = 8;
        ModelShape {
            layers: 28,
            per_layer: [
                (2048, 2048, Role::AttnQ),
                (2048, 1024, Role::AttnK),
                (2048, 1024, Role::AttnV),
                (2048, 2048, Role::AttnOut),
                (2048, 6144, Role::FfnGate),
                (2048, 6144, Role::FfnUp),
                (6144, 2048, Role::FfnDown),
            ]
            .into_iter()
            .map(|(k, n, role)| (k, n, q8, role))
            .collect(),
            head: Some((2048, 151936, q8)),
            attn_dim: 2048,
        }
    }
}

/// Predicts prefill (ubatch `m` rows from an empty context) and single-stream decode rates with
/// the given policy: each MUL_MAT goes where [`crate::cost::decide_with`] puts it; the CPU also runs
/// attention (prefill: 2·M²·dim·layers ops causal) at its int8 rate.
pub fn predict(cfg: &Config, model: &CostModel, shape: &ModelShape, m: usize) -> ModelRates {
    let work = shape.role_work();
    let t = |rows: usize, k: usize, n: usize, ty: u32, role: precision::Role| {
        let p = precision::decide(cfg, role, ggml_ork::quant::types::is_float(ty), &work, k);
        let d = decide_precision(cfg, model, &MatMul { m: rows, k, n, ggml_type: ty }, p, chain(layer_link(role), p), Availability::default());
        match d.engine {
            Engine::Npu => d.predicted.0,
            Engine::Cpu => d.predicted.1,
            Engine::Gpu => d.predicted.2,
        }
    };
    let layer = |rows: usize| shape.per_layer.iter().map(|&(k, n, ty, role)| t(rows, k, n, ty, role)).sum::<f64>();
    let head = |rows: usize| shape.head.map_or(0.0, |(k, n, ty)| t(rows, k, n, ty, precision::Role::Head));
    let attn = 2.0 * (m * m) as f64 * shape.attn_dim as f64 * shape.layers as f64 / model.cpu_ops;
    let prefill_s = layer(m) * shape.layers as f64 + head(1) + attn;
    let decode_s = layer(1) * shape.layers as f64 + head(1);
    ModelRates { prefill_tok_s: m as f64 / prefill_s, decode_tok_s: 1.0 / decode_s }
}

/// The work per prompt token of a prefill in ubatches of `m` rows that the host coefficients
/// ([`ggml_ork::route::HostCost`]) are divided by: submits on the busiest core, activation row·K (all, and of the
/// MUL_MATs that quantize their activation: not those reading the held one,
/// [`reads_held`]) and output row·N, summed over the layers' NPU MUL_MATs (one term
/// each unless the plan adds some).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillWork {
    pub matmuls: usize,
    pub submits_per_token: f64,
    pub row_k_per_token: f64,
    /// Of `row_k_per_token`, the rows quantized by an activation pass.
    pub act_row_k_per_token: f64,
    pub row_n_per_token: f64,
}

pub fn prefill_work(cfg: &Config, model: &CostModel, shape: &ModelShape, m: usize) -> PrefillWork {
    let work = shape.role_work();
    let cores = cfg.max_cores.unwrap_or(model.soc.cores);
    let (mut submits, mut rk, mut ark, mut rn) = (0.0, 0.0, 0.0, 0.0);
    for &(k, n, ty, role) in &shape.per_layer {
        let p = precision::decide(cfg, role, ggml_ork::quant::types::is_float(ty), &work, k);
        let terms = p.terms;
        if let Some(s) = model.npu_submits(m, k, n, terms, cores) {
            submits += s as f64 / m as f64;
            rk += (terms.act * k) as f64;
            if !reads_held(layer_link(role), p) {
                ark += (terms.act * k) as f64;
            }
            rn += (terms.rows() * n) as f64;
        }
    }
    let l = shape.layers as f64;
    PrefillWork { matmuls: shape.per_layer.len() * shape.layers, submits_per_token: submits * l, row_k_per_token: rk * l, act_row_k_per_token: ark * l, row_n_per_token: rn * l }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_ork::route::{activation, HostCost, A76_OVER_HERE};
    use ggml_ork::npu::soc::SocId;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        let m: std::collections::HashMap<_, _> = pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned()).0
    }

    #[test]
    fn predictions_near_the_anchors() {
        // One-term W8A8 (what the anchors measured): prefill within 2x of 178-278 tok/s and
        // decode within 1.5x of 12.8 tok/s with everything on the NPU.
        let c = cfg(&[("ORK_ACT_TERMS", "1"), ("ORK_WEIGHT_TERMS", "1"), ("ORK_DECODE", "npu"), ("ORK_MINM", "1")]);
        // The anchors ran their own engines' host paths, not this one: the NPU-only model.
        let mut model = crate::cost::npu_only(SocId::Rk3588);
        model.split_s = 0.0; // the anchors ran inside ork's own engine / a fused graph
        let r = predict(&c, &model, &ModelShape::qwen3_1_7b(), 256);
        assert!((89.0..=556.0).contains(&r.prefill_tok_s), "{r:?}");
        assert!((8.5..=19.2).contains(&r.decode_tok_s), "{r:?}");
    }

    #[test]
    fn the_default_precision_keeps_the_prefill_rate() {
        // Qwen3-1.7B Q8_0 inside llama.cpp on RK3588 (docs/precision.md), the NPU's time alone:
        // the default plan (rotated, one term in every layer) at 330 tok/s or more, within 5 % of
        // plain W8A8 and over twice the unrotated multi-term scheme; the largest budget the role
        // plan fills (1.40: value, output and down-projections) still above the best published
        // open prefill (278 tok/s). With the host's measured work (`with_host_the_prefill_rate_
        // falls_by_the_host_time`) the default plan predicts less: the issue's ≥ 330 with host
        // is a target of the host-path work, not asserted here.
        let model = crate::cost::npu_only(SocId::Rk3588);
        let q = ModelShape::qwen3_1_7b();
        let rate = |env: &[(&str, &str)]| predict(&cfg(env), &model, &q, 256).prefill_tok_s;
        let (default, wide, plain, multi) = (rate(&[]), rate(&[("ORK_NPU_WORK", "1.40")]), rate(&[("ORK_ACT_TERMS", "1"), ("ORK_WEIGHT_TERMS", "1")]), rate(&[("ORK_ROTATE", "0")]));
        assert!(default >= 330.0 && default >= 0.95 * plain && default >= 2.0 * multi, "default {default:.0}, plain {plain:.0}, multi-term {multi:.0}");
        assert!(wide >= 278.0, "ORK_NPU_WORK=1.40 {wide:.0}");
        // The calibrated correction's host work (K + N per row, at ggml-cpu's rate) is small
        // beside the NPU run and the rest of the host's work.
        let host = crate::cost::for_soc(SocId::Rk3588);
        let rate = |env: &[(&str, &str)]| predict(&cfg(env), &host, &q, 256).prefill_tok_s;
        let (corrected, uncorrected) = (rate(&[]), rate(&[("ORK_MEAN_CORRECT", "0")]));
        assert!(corrected < uncorrected && uncorrected - corrected <= 0.01 * uncorrected, "with {corrected:.0}, without {uncorrected:.0}");
    }

    #[test]
    fn with_host_the_prefill_rate_falls_by_the_host_time() {
        // Qwen3-1.7B Q8_0 pp512 on RK3588: the with-host prediction's time per token, not
        // pipelined, is the NPU-only one plus the host's coefficients times the work per token,
        // recomputed here from the coefficients and `prefill_work`'s counts.
        let c = cfg(&[]);
        let q = ModelShape::qwen3_1_7b();
        let (npu, host) = (crate::cost::npu_only(SocId::Rk3588), crate::cost::for_soc(SocId::Rk3588));
        assert!(host.host.is_some_and(|h| h.pipelined), "the backend pipelines");
        let mut serial = host.clone();
        serial.host = serial.host.map(|h| HostCost { pipelined: false, ..h });
        let (a, b) = (predict(&c, &npu, &q, 512), predict(&c, &serial, &q, 512));
        let w = prefill_work(&c, &host, &q, 512);
        // Activation row·K only where the activation is quantized: Q, attention output, gate and
        // down (K, V and up read the held one), (3 × 2048 + 6144) × 28.
        assert_eq!((w.matmuls, w.row_k_per_token, w.act_row_k_per_token, w.row_n_per_token), (196, 516096.0, 344064.0, 573440.0), "{w:?}");
        let h = host.host.unwrap();
        let per_token = A76_OVER_HERE
            * (h.act_quant_s * w.act_row_k_per_token + h.check_s * (w.row_k_per_token - w.act_row_k_per_token) + h.output_s * w.row_n_per_token + h.npu_io_s * (w.row_k_per_token + w.row_n_per_token) + h.matmul_s * w.matmuls as f64 / 512.0);
        let correction = q.per_layer.iter().map(|&(k, n, _, _)| host.mean_correct_s(1, k, n)).sum::<f64>() * q.layers as f64;
        let want = 1.0 / a.prefill_tok_s + per_token + correction;
        assert!(((1.0 / b.prefill_tok_s) / want - 1.0).abs() < 1e-9, "with host {:.1} tok/s, expected {:.1}", b.prefill_tok_s, 1.0 / want);
        assert!(b.prefill_tok_s < a.prefill_tok_s);
        // Pipelined (the default), the passes hide under the NPU's time wherever they are the
        // smaller; the NPU runs' own host part never does.
        let p = predict(&c, &host, &q, 512);
        assert!(p.prefill_tok_s > b.prefill_tok_s && p.prefill_tok_s < a.prefill_tok_s, "pipelined {:.0}", p.prefill_tok_s);
        // K after Q (2048 × 1024, M = 512) reads the held activation: the reuse check in place of
        // an activation pass (cut into pieces, the graph vouches and none runs), and its first
        // piece is not cut short (one short end's weight feed less), so it costs less than the
        // same MUL_MAT quantizing its own activation, by at least that pass's first piece.
        let p1 = precision::decide(&c, precision::Role::AttnK, false, &q.role_work(), 2048);
        assert!(reads_held(layer_link(precision::Role::AttnK), p1) && !reads_held(layer_link(precision::Role::AttnQ), p1));
        assert_eq!(h.host_parts(512, 2048, 1024, p1.terms, true).1 .0, A76_OVER_HERE * (h.check_s * (512 * 2048) as f64), "its pass is the reuse check");
        let held_chain = activation::Chain { held: true };
        let (held, own) = (host.npu_host(512, 2048, 1024, p1.terms, 3, held_chain).0, host.npu_host(512, 2048, 1024, p1.terms, 3, activation::Chain::default()).0);
        let act = h.host_parts(512, 2048, 1024, p1.terms, false).1 .0;
        assert!(held + act * 16.0 / 512.0 <= own, "held {held:e}, own {own:e}");
        // A MUL_MAT reading the held activation cuts only its last piece short.
        assert_eq!(chain(layer_link(precision::Role::AttnV), p1), held_chain);
        assert_eq!(host.npu_host(512, 2048, 1024, p1.terms, 3, held_chain).1, ggml_ork::npu::plan::Ends { first: false, last: true });
        // One MUL_MAT, by hand: cut into 4 pieces, passes 4 ms against 10 ms of NPU: the ends.
        // No rows: the NPU's time alone (nothing cut, nothing to pass), not a panic.
        let model = crate::cost::for_soc(SocId::Rk3588);
        assert_eq!(model.npu_host(0, 2048, 2048, precision::Terms::PLAIN, 3, activation::Chain::default()).0, model.npu_s(0, 2048, 2048, precision::Terms::PLAIN, 3));
        assert!((h.combine(10e-3, 1e-3, (2e-3, 2e-3), 4, 0.25, 0.25) - 12e-3).abs() < 1e-12);
        // Short ends: only their rows' passes add.
        assert!((h.combine(10e-3, 1e-3, (2e-3, 2e-3), 6, 1.0 / 32.0, 1.0 / 16.0) - (11e-3 + 2e-3 * 3.0 / 32.0)).abs() < 1e-12);
        // Passes longer than the NPU: what it does not cover adds.
        assert!((h.combine(2e-3, 1e-3, (4e-3, 4e-3), 4, 0.25, 0.25) - (2e-3 + 1e-3 + 2e-3 + 4e-3)).abs() < 1e-12);
        assert!((h.combine(2e-3, 1e-3, (4e-3, 4e-3), 1, 1.0, 1.0) - 11e-3).abs() < 1e-12, "uncut: all of it");
    }

}
