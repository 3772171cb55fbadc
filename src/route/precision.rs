//! Precision policy: how many int8 terms each weight and its activation rows get on the NPU.
//!
//! With the rotation of K (`quant::rotate`, `ORK_ROTATE=1`; the default is still the unrotated
//! multi-term scheme, see docs/precision.md for what the rotated plan does not reach yet) one int8 term per
//! weight and one per activation row — plain W8A8 work, one NPU row per token — already removes
//! the activation outliers' damage (SmolLM2-135M Q8_0, KLD vs F16: 0.142 unrotated, 0.0064
//! rotated). What is left is spread over the weight and the activation terms about evenly, and it
//! is not spread evenly over the matmuls: an extra term buys much more on some than on others.
//! So extra terms are a **budget**: `ORK_NPU_WORK` (default 1.25) caps the NPU rows a model sends
//! per token as a ratio of plain W8A8, and extra terms go to the matmul roles in the order of
//! their measured KLD gain per NPU row ([`EXTRAS`]) while the whole model stays within the cap.
//! The ratio is worked out over the weights ORK's buffers announced when ggml placed them
//! (before any is loaded), so every weight of a role gets the same terms, and the decision is
//! made per weight when it is packed. The sensitivity is measured per role, on whole models,
//! rather than per tensor at run time: a matmul's own error (its relative NMSE, about 6·10⁻⁵ for
//! every rotated activation) does not tell how much of it reaches the logits — the output head's
//! error does so directly, one residual branch's is diluted — while the KLD of a whole model with
//! one role's terms raised does (docs/precision.md has the table and the commands).
//!
//! Float weights (F32, F16, BF16) always get a second weight term: their mantissas carry more
//! than one int8 term holds, and the second term is what brings them to the CPU's own F16
//! perplexity. The budget is about the extra terms of the quantized types GGUF models ship in.
//!
//! `ORK_ACT_TERMS` / `ORK_WEIGHT_TERMS` override the plan for every weight (a blanket, as with
//! `ORK_ROTATE=0`, which keeps the former multi-term defaults: two weight terms, two activation
//! terms, three for float weights).

use crate::config::Config;

/// Activation terms that meet a weight's second int8 term (its cross terms with later activation
/// terms sit below both terms' resolution).
pub const LO_ACT_TERMS: usize = 1;

/// What a weight is in its model, as far as precision goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The output head (`output.weight`, or a tied `token_embd.weight`): its error reaches the
    /// logits directly.
    Head,
    /// The FFN down-projection (`ffn_down`): its input, the gated FFN activation, carries the
    /// largest outliers of the model.
    FfnDown,
    /// Every other matmul weight.
    Other,
}

impl Role {
    /// The role of a weight from its GGUF tensor name.
    pub fn of(name: &str) -> Role {
        let base = name.rsplit_once('.').map_or(name, |(b, _)| b);
        let leaf = base.rsplit('.').next().unwrap_or(base);
        match leaf {
            "output" | "token_embd" => Role::Head,
            "ffn_down" | "ffn_down_shexp" => Role::FfnDown,
            _ => Role::Other,
        }
    }

    /// Index into [`RoleCounts`].
    pub fn index(self) -> usize {
        match self {
            Role::Head => 0,
            Role::FfnDown => 1,
            Role::Other => 2,
        }
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

/// Extra terms in the order they are granted: measured KLD gain per NPU row, largest first
/// (SmolLM2-135M Q8_0, rotated, 8 × 128 tokens, docs/precision.md): the head's second weight and
/// activation terms (KLD 0.0064 → 0.0054 for +1 % rows), then the down-projection's second
/// weight term (0.0054 → 0.0042 for +14 %; its second activation term instead: 0.0046).
pub const EXTRAS: &[(Role, Terms)] = &[(Role::Head, Terms { weight: 2, act: 2 }), (Role::FfnDown, Terms { weight: 2, act: 1 })];

/// Matmul weights per role (announced by ORK's buffers), indexed by [`Role::index`].
pub type RoleCounts = [u64; 3];

/// The terms of every role under the budget: `EXTRAS` granted in order while the model's NPU
/// rows stay within `budget` × its plain W8A8 rows. Returns terms by [`Role::index`].
pub fn plan(budget: f64, counts: &RoleCounts) -> [Terms; 3] {
    let total: u64 = counts.iter().sum();
    let mut terms = [Terms::PLAIN; 3];
    let mut rows = total as f64;
    for &(role, t) in EXTRAS {
        let i = role.index();
        let extra = (t.rows() - terms[i].rows()) as f64 * counts[i] as f64;
        if counts[i] > 0 && rows + extra <= budget * total as f64 + 1e-9 {
            terms[i] = t;
            rows += extra;
        }
    }
    terms
}

/// NPU rows per token of a model with `counts` weights per role under `terms`, as a ratio of
/// plain W8A8.
pub fn rows_ratio(terms: &[Terms; 3], counts: &RoleCounts) -> f64 {
    let total: u64 = counts.iter().sum();
    let rows: u64 = counts.iter().zip(terms).map(|(&c, t)| c * t.rows() as u64).sum();
    rows as f64 / total.max(1) as f64
}

/// The terms one weight gets: the budget plan for its role with the rotation (`counts`: the
/// model's announced weights), the former multi-term defaults without; explicit
/// `ORK_WEIGHT_TERMS` / `ORK_ACT_TERMS` override either.
pub fn terms_for(cfg: &Config, role: Role, float_source: bool, counts: &RoleCounts) -> Terms {
    let mut t = if cfg.rotate {
        let mut t = plan(cfg.npu_work, counts)[role.index()];
        if float_source {
            // 11+ mantissa bits that one int8 weight term does not carry: measured on SmolLM2
            // F16, one weight term leaves perplexity +1.2 % against the CPU's F16, two -0.05 %
            // (a second activation term instead: +0.65 %).
            t.weight = 2;
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
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        Config::from_lookup(|k| pairs.iter().find(|(a, _)| *a == k).map(|(_, b)| b.to_string())).0
    }

    #[test]
    fn roles_from_gguf_names() {
        assert_eq!(Role::of("output.weight"), Role::Head);
        assert_eq!(Role::of("token_embd.weight"), Role::Head);
        assert_eq!(Role::of("blk.7.ffn_down.weight"), Role::FfnDown);
        assert_eq!(Role::of("blk.7.ffn_up.weight"), Role::Other);
        assert_eq!(Role::of("blk.0.attn_output.weight"), Role::Other);
        assert_eq!(Role::of(""), Role::Other);
    }

    #[test]
    fn the_budget_grants_extras_in_order_and_stays_within_it() {
        // SmolLM2-135M: 30 layers of 7 matmuls and a tied head.
        let smol: RoleCounts = [1, 30, 180];
        let t = plan(1.25, &smol);
        assert_eq!(t, [Terms { weight: 2, act: 2 }, Terms { weight: 2, act: 1 }, Terms::PLAIN]);
        let r = rows_ratio(&t, &smol);
        assert!(r <= 1.25 && r > 1.15, "{r}");
        // A tight budget: the head only; none: plain everywhere.
        assert_eq!(plan(1.05, &smol), [Terms { weight: 2, act: 2 }, Terms::PLAIN, Terms::PLAIN]);
        assert_eq!(plan(1.0, &smol), [Terms::PLAIN; 3]);
        // Nothing announced (e.g. test-backend-ops' unnamed weights): plain.
        assert_eq!(plan(1.25, &[0, 0, 0]), [Terms::PLAIN; 3]);
        // A model whose down-projections alone would break the budget skips them.
        let fused: RoleCounts = [1, 10, 20];
        let t = plan(1.25, &fused);
        assert_eq!(t[1], Terms::PLAIN);
        assert!(rows_ratio(&t, &fused) <= 1.25);
    }

    #[test]
    fn overrides_and_the_unrotated_defaults() {
        let smol: RoleCounts = [1, 30, 180];
        let rot = cfg(&[("ORK_ROTATE", "1")]);
        assert_eq!(terms_for(&rot, Role::Other, false, &smol), Terms::PLAIN);
        assert_eq!(terms_for(&rot, Role::FfnDown, false, &smol), Terms { weight: 2, act: 1 });
        assert_eq!(terms_for(&rot, Role::Other, true, &smol), Terms { weight: 2, act: 1 }, "float weights: two weight terms");
        assert_eq!(terms_for(&rot, Role::Head, true, &smol), Terms { weight: 2, act: 2 });
        // The default is the unrotated multi-term scheme.
        assert_eq!(terms_for(&cfg(&[]), Role::Other, false, &smol), Terms { weight: 2, act: 2 });
        let legacy = cfg(&[("ORK_ROTATE", "0")]);
        assert_eq!(terms_for(&legacy, Role::Other, false, &smol), Terms { weight: 2, act: 2 });
        assert_eq!(terms_for(&legacy, Role::Other, true, &smol), Terms { weight: 2, act: 3 });
        let blanket = cfg(&[("ORK_ROTATE", "1"), ("ORK_ACT_TERMS", "1"), ("ORK_WEIGHT_TERMS", "1")]);
        assert_eq!(terms_for(&blanket, Role::Head, false, &smol), Terms::PLAIN);
        assert_eq!(Terms { weight: 2, act: 2 }.rows(), 3);
        assert_eq!(Terms { weight: 2, act: 3 }.rows(), 4);
    }
}
