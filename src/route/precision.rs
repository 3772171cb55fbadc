//! Precision policy: how many int8 terms each weight and its activation rows get on the NPU.
//!
//! With the rotation of K (`quant::rotate`, `ORK_ROTATE`, on by default) one int8 term per
//! weight and one per activation row — plain W8A8 work, one NPU row per token — already removes
//! the activation outliers' damage (SmolLM2-135M Q8_0, KLD vs F16: 0.142 unrotated, 0.0064
//! rotated). What is left is not spread evenly over the matmuls: an extra term buys much more on
//! some than on others. So extra terms are a **budget**: the output head gets a second weight
//! and a second activation term ([`HEAD_TERMS`]), and `ORK_NPU_WORK` (default 1: none) caps the
//! NPU work of the layers' matmuls per token as a ratio of plain W8A8; extra terms go to the
//! matmul roles in the order of their measured KLD gain per unit of work ([`EXTRAS`]), each to
//! every layer or to none, while the layers stay within the cap. Work, not rows: an NPU row of
//! a value projection costs K·N multiply-accumulates, a tenth of a down-projection's in the
//! usual grouped-query shapes, and the board's prefill time follows the MACs.
//!
//! The ratio is worked out over the weights ORK's buffers announced when ggml placed them
//! (before any is loaded), so every weight of a role gets the same terms, and the decision is
//! made per weight when it is packed. The sensitivity is measured per role, on whole models
//! (SmolLM2-135M and Gemma-3-270M), rather than per tensor from its own statistics: after the
//! rotation every weight and activation row is close to Gaussian and its int8 error about the
//! same (relative NMSE ≈ 6·10⁻⁵), so a tensor's own numbers do not tell them apart; what does is
//! how much of a matmul's error reaches the logits — the output head's directly, a value
//! projection's through every query head that shares it — and that is a property of the role,
//! which the KLD of a whole model with one role's terms raised measures (docs/precision.md has
//! the table and the commands).
//!
//! Most of what is left after the rotation is the weight error along the rows' common component,
//! and the backend removes that without NPU work: the calibrated correction (`quant::mean`,
//! `ORK_MEAN_CORRECT`) gives each row the host's exact product on its share of its weight's
//! calibrated direction. With it one term everywhere already meets the CPU's own Q8_0 accuracy
//! on both measured families (KLD vs F16 with the head's terms: SmolLM2 0.0036 vs the CPU's
//! 0.0044, Gemma 0.0025 vs 0.0031), so the default budget is 1: one term in every layer, the
//! head's terms outside it. A larger budget buys extra terms for its NPU work (docs/precision.md).
//!
//! Float weights (F32, F16, BF16) always get two weight terms and two activation terms: their
//! mantissas carry more than one int8 term holds, and both terms are what bring them to the
//! CPU's own F16 output. The budget is about the extra terms of the quantized types GGUF models
//! ship in.
//!
//! `ORK_ACT_TERMS` / `ORK_WEIGHT_TERMS` override the plan for every weight (a blanket, as with
//! `ORK_ROTATE=0`, which keeps the unrotated multi-term scheme: two weight terms, two activation
//! terms, three for float weights).

use crate::config::Config;

/// Activation terms that meet a weight's second int8 term (its cross terms with later activation
/// terms sit below both terms' resolution).
pub const LO_ACT_TERMS: usize = 1;

/// What a weight is in its model, as far as precision goes: the matmul roles of a transformer
/// layer (GGUF's tensor names), the output head, and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The output head (`output.weight`, or a tied `token_embd.weight`): its error reaches the
    /// logits directly.
    Head,
    /// Attention query projection (`attn_q`).
    AttnQ,
    /// Attention key projection (`attn_k`).
    AttnK,
    /// Attention value projection (`attn_v`): with grouped-query attention one value head
    /// serves several query heads, so its error reaches all of them.
    AttnV,
    /// Attention output projection (`attn_output`).
    AttnOut,
    /// FFN gate projection (`ffn_gate`).
    FfnGate,
    /// FFN up projection (`ffn_up`).
    FfnUp,
    /// The FFN down-projection (`ffn_down`): its input, the gated FFN activation, carries the
    /// largest outliers of the model.
    FfnDown,
    /// Every other matmul weight (fused QKV, expert weights, unnamed ones).
    Other,
}

/// Number of [`Role`]s.
pub const ROLES: usize = 9;

impl Role {
    /// Every role, in [`Role::index`] order.
    pub const ALL: [Role; ROLES] =
        [Role::Head, Role::AttnQ, Role::AttnK, Role::AttnV, Role::AttnOut, Role::FfnGate, Role::FfnUp, Role::FfnDown, Role::Other];

    /// The role of a weight from its GGUF tensor name.
    pub fn of(name: &str) -> Role {
        let base = name.rsplit_once('.').map_or(name, |(b, _)| b);
        let leaf = base.rsplit('.').next().unwrap_or(base);
        match leaf {
            "output" | "token_embd" => Role::Head,
            "attn_q" => Role::AttnQ,
            "attn_k" => Role::AttnK,
            "attn_v" => Role::AttnV,
            "attn_output" => Role::AttnOut,
            "ffn_gate" => Role::FfnGate,
            "ffn_up" => Role::FfnUp,
            "ffn_down" | "ffn_down_shexp" => Role::FfnDown,
            _ => Role::Other,
        }
    }

    /// Index into [`RoleWork`] and plans.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Int8 terms of one matmul: weight terms (resident) and activation terms per input row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    pub weight: usize,
    pub act: usize,
}

impl Terms {
    /// Plain W8A8.
    pub const PLAIN: Terms = Terms { weight: 1, act: 1 };

    /// NPU rows sent per input row: every activation term against the first weight term, and
    /// [`LO_ACT_TERMS`] of them against the second.
    pub fn rows(self) -> usize {
        self.act + (self.weight - 1) * LO_ACT_TERMS.min(self.act)
    }
}

/// The output head's terms: two weight terms, two activation terms. The head is outside the
/// budget: its error reaches the logits directly (SmolLM2-135M Q8_0, KLD 0.0064 → 0.0054;
/// Gemma-3-270M Q8_0, 0.0042 → 0.0035), and it runs on the NPU only when every token's logits
/// are asked for (perplexity, all-logits requests): in generation its one row per step stays
/// below ORK_MINM.
pub const HEAD_TERMS: Terms = Terms { weight: 2, act: 2 };

/// Extra terms in the order they are granted within the budget: measured KLD gain per unit of
/// NPU work on SmolLM2-135M Q8_0 and Gemma-3-270M Q8_0 (rotated, 8 × 128 tokens,
/// docs/precision.md): the value projections' second weight term (3–4 % of a layer's MACs), the
/// attention output projections' (8–12 %), then the down-projections' (≈ 25 %). In the usual
/// shapes 1.05 holds the first, 1.15 the first two, 1.40 all three; the default (1) none.
pub const EXTRAS: &[(Role, Terms)] = &[
    (Role::AttnV, Terms { weight: 2, act: 1 }),
    (Role::AttnOut, Terms { weight: 2, act: 1 }),
    (Role::FfnDown, Terms { weight: 2, act: 1 }),
];

/// A model's matmul work per role: Σ K·N over its weights of that role (multiply-accumulates per
/// token of plain W8A8), as ORK's buffers announce them; indexed by [`Role::index`].
pub type RoleWork = [u64; ROLES];

/// The terms of every role under the budget: the head's [`HEAD_TERMS`] (outside it), then
/// `EXTRAS` granted in order while the layers' NPU work (MACs per token, every
/// NPU row costs its weight's K·N) stays within `budget` × their plain W8A8 work. Returns terms
/// by [`Role::index`].
pub fn plan(budget: f64, work: &RoleWork) -> [Terms; ROLES] {
    let mut terms = [Terms::PLAIN; ROLES];
    terms[Role::Head.index()] = HEAD_TERMS;
    // The layers' plain W8A8 work: every role but the head.
    let total = (work.iter().sum::<u64>() - work[Role::Head.index()]) as f64;
    let mut used = total;
    for &(role, t) in EXTRAS {
        let i = role.index();
        let extra = (t.rows() - terms[i].rows()) as f64 * work[i] as f64;
        if work[i] > 0 && used + extra <= budget * total + 1e-9 {
            terms[i] = t;
            used += extra;
        }
    }
    terms
}

/// One weight's precision, decided once ([`decide`]) and carried with the weight: its int8
/// terms, whether K goes through the rotation, and whether its rows are corrected along its
/// calibrated direction. The NPU run, the GPU copy, the cost model and the `.orkpack` key read
/// this; none of them looks at the configuration for it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    pub terms: Terms,
    /// Both operands go through the rotation of K (`quant::rotate`); else the weight's column
    /// equalisation.
    pub rotated: bool,
    /// Each row is corrected along the weight's calibrated direction where the calibration file
    /// has one (`quant::mean`; needs the rotation).
    pub mean_correct: bool,
}

/// The precision of one `[N, K]` weight of `role` (`float_source`: an F16/BF16/F32 source;
/// `work`: the model's announced work per role): rotated where `ORK_ROTATE` asks and K has a
/// rotation; its terms the budget plan for its role when rotated, the unrotated multi-term
/// scheme otherwise, explicit `ORK_WEIGHT_TERMS` / `ORK_ACT_TERMS` overriding either; corrected
/// where it is rotated and [`Config::corrects_rows`].
pub fn decide(cfg: &Config, role: Role, float_source: bool, work: &RoleWork, k: usize) -> Precision {
    let rotated = cfg.rotate && crate::quant::rotate::Rotation::exists(k);
    let mut t = if rotated {
        let mut t = plan(cfg.npu_work, work)[role.index()];
        if float_source {
            // 11+ mantissa bits that one int8 weight term does not carry: measured on SmolLM2
            // F16, one weight term leaves perplexity +1.2 % against the CPU's F16, two -0.05 %
            // (a second activation term instead: +0.65 %); with both, the greedy text equals the
            // CPU's F16 at the demo prompt's near-tie, which two weight terms alone tip.
            t.weight = 2;
            t.act = t.act.max(2);
        }
        t
    } else {
        Terms { weight: 2, act: if float_source { 3 } else { 2 } }
    };
    if cfg.weight_terms != 0 {
        t.weight = cfg.weight_terms as usize;
    }
    if cfg.act_terms != 0 {
        t.act = cfg.act_terms as usize;
    }
    Precision { terms: t, rotated, mean_correct: rotated && cfg.corrects_rows() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        Config::from_lookup(|k| pairs.iter().find(|(a, _)| *a == k).map(|(_, b)| b.to_string())).0
    }

    /// Work per role of a model of `layers` layers of the usual seven matmuls (K·N of q, k, v,
    /// o, gate, up, down) and a head.
    fn layered(layers: u64, shapes: [u64; 7], head: u64) -> RoleWork {
        let mut w = [0; ROLES];
        w[Role::Head.index()] = head;
        for (r, s) in [Role::AttnQ, Role::AttnK, Role::AttnV, Role::AttnOut, Role::FfnGate, Role::FfnUp, Role::FfnDown].into_iter().zip(shapes) {
            w[r.index()] = layers * s;
        }
        w
    }

    fn smollm2() -> RoleWork {
        let (h, kv, f) = (576, 192, 1536);
        layered(30, [h * h, h * kv, h * kv, h * h, h * f, h * f, f * h], 49152 * h)
    }

    fn gemma3() -> RoleWork {
        let (h, q, kv, f) = (640, 1024, 256, 2048);
        layered(18, [h * q, h * kv, h * kv, q * h, h * f, h * f, f * h], 262144 * h)
    }

    fn qwen3() -> RoleWork {
        let (h, kv, f) = (2048, 1024, 6144);
        layered(28, [h * h, h * kv, h * kv, h * h, h * f, h * f, f * h], 151936 * h)
    }

    /// The layers' NPU work under `terms` as a ratio of plain W8A8 (`ork-route`'s `cost::work_ratio`).
    fn work_ratio(terms: &[Terms; ROLES], work: &RoleWork) -> f64 {
        let layers = |t: &dyn Fn(usize) -> u64| (0..ROLES).filter(|&i| i != Role::Head.index()).map(|i| work[i] * t(i)).sum::<u64>();
        layers(&|i| terms[i].rows() as u64) as f64 / layers(&|_| 1).max(1) as f64
    }

    /// Terms by role with `set` applied over plain.
    fn with(set: &[(Role, Terms)]) -> [Terms; ROLES] {
        let mut t = [Terms::PLAIN; ROLES];
        for &(r, x) in set {
            t[r.index()] = x;
        }
        t
    }

    #[test]
    fn roles_from_gguf_names() {
        assert_eq!(Role::of("output.weight"), Role::Head);
        assert_eq!(Role::of("token_embd.weight"), Role::Head);
        assert_eq!(Role::of("blk.7.ffn_down.weight"), Role::FfnDown);
        assert_eq!(Role::of("blk.7.ffn_up.weight"), Role::FfnUp);
        assert_eq!(Role::of("blk.7.ffn_gate.weight"), Role::FfnGate);
        assert_eq!(Role::of("blk.0.attn_output.weight"), Role::AttnOut);
        assert_eq!(Role::of("blk.0.attn_q.weight"), Role::AttnQ);
        assert_eq!(Role::of("blk.0.attn_k.weight"), Role::AttnK);
        assert_eq!(Role::of("blk.0.attn_v.weight"), Role::AttnV);
        assert_eq!(Role::of("blk.0.attn_qkv.weight"), Role::Other);
        assert_eq!(Role::of(""), Role::Other);
        for (i, r) in Role::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn the_budget_grants_extras_in_order_and_stays_within_it() {
        let two_w = Terms { weight: 2, act: 1 };
        // SmolLM2-135M, Gemma-3-270M, Qwen3-1.7B: the head outside the budget, the value and output
        // projections within 1.15 (12.5 %, 14.7 %, 12.5 % more work); the down-projections not.
        for (name, w) in [("smollm2", smollm2()), ("gemma3", gemma3()), ("qwen3", qwen3())] {
            let t = plan(1.15, &w);
            assert_eq!(t, with(&[(Role::Head, HEAD_TERMS), (Role::AttnV, two_w), (Role::AttnOut, two_w)]), "{name}");
            let r = work_ratio(&t, &w);
            assert!(r <= 1.15 && r > 1.12, "{name}: {r}");
            // The default budget reaches the down-projections too (37.5 %, 38.2 %, 37.5 %).
            let t = plan(1.40, &w);
            assert_eq!(t, with(&[(Role::Head, HEAD_TERMS), (Role::AttnV, two_w), (Role::AttnOut, two_w), (Role::FfnDown, two_w)]), "{name}");
            assert!(work_ratio(&t, &w) <= 1.40, "{name}");
            // A tight one: the head and the value projections.
            assert_eq!(plan(1.05, &w), with(&[(Role::Head, HEAD_TERMS), (Role::AttnV, two_w)]), "{name}");
        }
        let smol = smollm2();
        // No budget (the default): plain in every layer, the head's terms outside it.
        assert_eq!(plan(1.0, &smol), with(&[(Role::Head, HEAD_TERMS)]));
        // Nothing announced (e.g. test-backend-ops' unnamed weights): nothing granted but the head's.
        assert_eq!(plan(1.15, &[0; ROLES]), with(&[(Role::Head, HEAD_TERMS)]));
        // A model with fused QKV (no value projection of its own) gives the budget to the next.
        let mut fused = smol;
        for r in [Role::AttnQ, Role::AttnK, Role::AttnV] {
            fused[Role::Other.index()] += fused[r.index()];
            fused[r.index()] = 0;
        }
        let t = plan(1.15, &fused);
        assert_eq!(t, with(&[(Role::Head, HEAD_TERMS), (Role::AttnOut, two_w)]));
        assert!(work_ratio(&t, &fused) <= 1.15);
    }

    #[test]
    fn overrides_and_the_unrotated_scheme() {
        let smol = smollm2();
        let rot = cfg(&[]);
        assert!(rot.rotate, "rotation is the default");
        assert_eq!(decide(&rot, Role::AttnQ, false, &smol, 576).terms, Terms::PLAIN);
        assert_eq!(decide(&rot, Role::AttnV, false, &smol, 576).terms, Terms::PLAIN, "the default budget: one term in every layer");
        assert_eq!(decide(&rot, Role::Head, false, &smol, 576).terms, HEAD_TERMS, "the head outside it");
        assert_eq!(decide(&cfg(&[("ORK_NPU_WORK", "1.05")]), Role::AttnV, false, &smol, 576).terms, Terms { weight: 2, act: 1 });
        assert_eq!(decide(&rot, Role::FfnDown, false, &smol, 576).terms, Terms::PLAIN);
        assert_eq!(decide(&rot, Role::AttnOut, false, &smol, 576).terms, Terms::PLAIN);
        assert_eq!(decide(&rot, Role::FfnUp, false, &smol, 576).terms, Terms::PLAIN);
        assert_eq!(decide(&rot, Role::Other, true, &smol, 576).terms, Terms { weight: 2, act: 2 }, "float weights: two and two");
        assert_eq!(decide(&rot, Role::Head, true, &smol, 576).terms, Terms { weight: 2, act: 2 });
        let legacy = cfg(&[("ORK_ROTATE", "0")]);
        assert_eq!(decide(&legacy, Role::Other, false, &smol, 576).terms, Terms { weight: 2, act: 2 });
        assert_eq!(decide(&legacy, Role::Other, true, &smol, 576).terms, Terms { weight: 2, act: 3 });
        let blanket = cfg(&[("ORK_ACT_TERMS", "1"), ("ORK_WEIGHT_TERMS", "1")]);
        assert_eq!(decide(&blanket, Role::Head, false, &smol, 576).terms, Terms::PLAIN);
        assert_eq!(Terms { weight: 2, act: 2 }.rows(), 3);
        assert_eq!(Terms { weight: 2, act: 3 }.rows(), 4);
    }

    /// One decision per weight: rotated where asked and K has a rotation, its terms the plan
    /// under that (a K without a rotation gets the unrotated scheme, not the rotated plan's one
    /// term), corrected only where rotated and the correction is on.
    #[test]
    fn a_weight_is_rotated_corrected_and_termed_once() {
        let smol = smollm2();
        let on = cfg(&[]);
        let d = decide(&on, Role::AttnQ, false, &smol, 576);
        assert_eq!(d, Precision { terms: Terms::PLAIN, rotated: true, mean_correct: true });
        assert!(!crate::quant::rotate::Rotation::exists(40));
        let d = decide(&on, Role::AttnQ, false, &smol, 40);
        assert_eq!(d, Precision { terms: Terms { weight: 2, act: 2 }, rotated: false, mean_correct: false }, "no rotation for K = 40");
        let d = decide(&cfg(&[("ORK_ROTATE", "0")]), Role::AttnQ, false, &smol, 576);
        assert_eq!(d, Precision { terms: Terms { weight: 2, act: 2 }, rotated: false, mean_correct: false });
        let d = decide(&cfg(&[("ORK_MEAN_CORRECT", "0")]), Role::AttnQ, true, &smol, 576);
        assert_eq!(d, Precision { terms: Terms { weight: 2, act: 2 }, rotated: true, mean_correct: false });
    }
}
