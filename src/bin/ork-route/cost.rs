//! What `ork-route` adds to the library's cost model (`ggml_ork::route::CostModel`, the one the
//! plugin's `ORK_ROUTE=cost` and its cut read): a model by SoC name, without the host's work, at
//! another NPU clock; a decision for a weight of the common role and its reason in words; where
//! each role stands in a
//! synthetic layer ([`layer_link`], [`chain`]); the NPU rows of a precision plan as a ratio.

use ggml_ork::config::{Config, DecodeSelect, RoutePolicy};
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::route::activation::{links, Act, Chain, Link, Step};
use ggml_ork::route::precision::{self, Precision, Role, Terms, ROLES};
use ggml_ork::route::{candidates, decide_precision, Availability, CostModel, Decision, MatMul, Phase};

/// The model for a SoC: RK3588 figures as cited in `ggml_ork::route`'s docs; RK3576 scaled by its
/// core count (2 vs 3) for MACs, same floor and bus.
pub fn for_soc(id: SocId) -> CostModel {
    CostModel::for_device(SocDesc::get(id))
}

/// [`for_soc`] without the host's work: the NPU's time alone.
pub fn npu_only(id: SocId) -> CostModel {
    CostModel { host: None, ..for_soc(id) }
}

/// The same model with the NPU at `hz` (a port's fixed clock, a devfreq step): the cores' int8
/// rate scales (`ggml_ork::npu::soc::NpuTiming::at_clock`), the feed and floor stay.
pub fn at_npu_clock(model: CostModel, hz: u64) -> CostModel {
    let soc = SocDesc { timing: model.soc.timing.at_clock(hz), ..model.soc.clone() };
    CostModel { host: model.host, ..CostModel::for_device(soc) }
}

/// `ggml_ork::route::decide` with an explicit cost model, for a weight of the common role
/// (`Role::Other`) reading an activation of its own.
pub fn decide_with(cfg: &Config, model: &CostModel, mm: &MatMul, av: Availability) -> Decision {
    let p = precision::decide(cfg, Role::Other, ggml_ork::quant::types::is_float(mm.ggml_type), &[0; ROLES], mm.k);
    decide_precision(cfg, model, mm, p, Chain::default(), av)
}

/// Why `d` ([`decide_with`]'s for `mm` under `cfg` with `av`) went the way it did, in words, with
/// the predicted times.
pub fn why(cfg: &Config, mm: &MatMul, av: Availability, d: &Decision) -> String {
    let us = |s: f64| if s.is_finite() { format!("{:.0} µs", s * 1e6) } else { "n/a".into() };
    let times = format!("npu {}, cpu {}, gpu {}", us(d.predicted.0), us(d.predicted.1), us(d.predicted.2));
    let (m, phase) = (mm.m, Phase::of(cfg, mm.m));
    let why = match (cfg.route, phase, cfg.decode) {
        (RoutePolicy::Threshold, Phase::Prefill, _) => format!("prefill: M={m} >= ORK_MINM={}", cfg.min_m),
        (RoutePolicy::Threshold, Phase::Decode, DecodeSelect::Npu) => format!("decode: M={m} < ORK_MINM, ORK_DECODE=npu"),
        (RoutePolicy::Threshold, Phase::Decode, DecodeSelect::Gpu) if av.gpu => format!("decode: M={m} < ORK_MINM, ORK_DECODE=gpu"),
        (RoutePolicy::Threshold, Phase::Decode, DecodeSelect::Gpu) => "decode: ORK_DECODE=gpu but no GPU engine".into(),
        (RoutePolicy::Threshold, Phase::Decode, _) => format!("decode: M={m} < ORK_MINM, ORK_DECODE=auto|cpu (ggml-cpu reads the GGUF in place)"),
        (RoutePolicy::Cost, _, _) => format!(
            "{}: cost model picks the fastest of {} candidates{}",
            if phase == Phase::Prefill { "prefill" } else { "decode" },
            candidates(cfg, phase, av).count(),
            if phase == Phase::Decode && av.npu_busy { ", NPU busy" } else { "" }
        ),
    };
    format!("{why} [{times}]")
}

/// One transformer layer as llama.cpp's graphs compute it — the attention block: Q, then Q's norm
/// and RoPE, then V and K; its output projection; the FFN: gate and up, their product, down —
/// and the head, as `Step`s: the synthetic graph a role's [`Link`] is read from (the library's
/// rule, `ggml_ork::route::activation::links`). A role it does not name reads an activation of
/// its own. (The backend reads the live graph instead.)
pub fn layer_link(role: Role) -> Link {
    let x = |t: usize| Act { tensor: t, base: t };
    let (attn_in, q_out, attn_out, ffn_in, ffn_act, head_in, own) = (1, 2, 3, 4, 5, 6, 7);
    let op = |t: usize| Step::Work { writes: t, act: None };
    let mm = |out: usize, t: usize| Step::Work { writes: out, act: Some(x(t)) };
    let g = [
        op(attn_in),
        mm(0x10, attn_in),
        op(q_out),
        Step::View,
        op(q_out),
        mm(0x11, attn_in),
        mm(0x12, attn_in),
        op(attn_out),
        mm(0x13, attn_out),
        op(ffn_in),
        mm(0x14, ffn_in),
        mm(0x15, ffn_in),
        op(ffn_act),
        mm(0x16, ffn_act),
        op(head_in),
        mm(0x17, head_in),
        op(own),
        mm(0x18, own),
        // The next layer writes them anew.
        op(attn_in),
        op(attn_out),
        op(ffn_in),
        op(ffn_act),
        op(head_in),
        op(own),
    ];
    let at = match role {
        Role::AttnQ => 1,
        Role::AttnV => 5,
        Role::AttnK => 6,
        Role::AttnOut => 8,
        Role::FfnGate => 10,
        Role::FfnUp => 11,
        Role::FfnDown => 13,
        Role::Head => 15,
        Role::Other => 17,
    };
    links(&g)[at]
}

/// Whether a weight with precision `p` whose activation the graph shows held (`link.held`: the
/// MUL_MAT before it read the same activation, nothing writing it between) reads it as the int8
/// terms that one made: rotated weights of one K share one rotation and no column scales, and
/// only one activation term is held. The backend reuses those terms (`backend::npu_mm`, the held
/// activation), so its MUL_MAT has no activation pass and its first piece is not cut short.
pub fn reads_held(link: Link, p: Precision) -> bool {
    p.rotated && p.terms.act == 1 && link.held
}

/// The cost model's [`Chain`] of a weight with precision `p` whose place in the graph is `link`.
pub fn chain(link: Link, p: Precision) -> Chain {
    Chain { held: reads_held(link, p) }
}

/// The layers' NPU work per token under `terms`, as a ratio of plain W8A8 (the quantity
/// `ORK_NPU_WORK` caps: every role but the head).
pub fn work_ratio(terms: &[Terms; ROLES], work: &precision::RoleWork) -> f64 {
    let layers = work.iter().zip(terms).enumerate().filter(|&(i, _)| i != Role::Head.index());
    let (sent, plain) = layers.fold((0, 0), |(s, p), (_, (&w, t))| (s + w * t.rows() as u64, p + w));
    sent as f64 / plain.max(1) as f64
}

/// NPU rows per token of a model with `counts` weights per role under `terms`, as a ratio of
/// plain W8A8 (every weight, the head included).
pub fn rows_ratio(terms: &[Terms; ROLES], counts: &[u64; ROLES]) -> f64 {
    let total: u64 = counts.iter().sum();
    let rows: u64 = counts.iter().zip(terms).map(|(&c, t)| c * t.rows() as u64).sum();
    rows as f64 / total.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_ork::route::activation::Again;

    #[test]
    fn a_layer_as_llama_cpp_computes_it() {
        use Again::*;
        for (role, held, read_again) in [
            (Role::Head, false, No),
            (Role::AttnQ, false, Yes),
            (Role::AttnV, true, Yes),
            (Role::AttnK, true, No),
            (Role::AttnOut, false, No),
            (Role::FfnGate, false, Yes),
            (Role::FfnUp, true, No),
            (Role::FfnDown, false, No),
            (Role::Other, false, No),
        ] {
            assert_eq!(layer_link(role), Link { held, read_again }, "{role:?}");
        }
    }

    #[test]
    fn what_the_graph_shows_held_is_reused_in_one_rotated_term() {
        let p = |rotated: bool, act: usize| Precision { terms: Terms { weight: 1, act }, rotated, mean_correct: rotated };
        for held in [false, true] {
            let l = Link { held, read_again: Again::Unknown };
            assert_eq!(chain(l, p(true, 1)), Chain { held });
            assert!(!reads_held(l, p(false, 1)) && !reads_held(l, p(true, 2)), "only one rotated activation term is held");
        }
    }

    /// SmolLM2-135M's weights per role (30 layers and the head) under the plan of ORK_NPU_WORK=1.15
    /// (the head's terms, two weight terms for V and the attention output): 1.29x the rows of
    /// plain W8A8 for 1.13x the work.
    #[test]
    fn rows_of_a_plan() {
        let two_w = Terms { weight: 2, act: 1 };
        let mut t = [Terms::PLAIN; ROLES];
        t[Role::Head.index()] = precision::HEAD_TERMS;
        t[Role::AttnV.index()] = two_w;
        t[Role::AttnOut.index()] = two_w;
        let counts = [1, 30, 30, 30, 30, 30, 30, 30, 0];
        assert!((rows_ratio(&t, &counts) - 1.294).abs() < 1e-3);
    }
}
