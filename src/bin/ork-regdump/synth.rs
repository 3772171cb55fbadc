//! `ork-regdump --synth`: a planned matmul's regcmd streams at fixed IOVAs, as entries and as
//! text. `tests/npu_golden.rs` compiles this file too (`#[path]`): the golden texts are its output.

use ggml_ork::npu::kif::Iova;
use ggml_ork::npu::layout::WeightGeometry;
use ggml_ork::npu::plan::{plan, SubmitIovas};
use ggml_ork::npu::regcmd::{self, RegcmdError};
use ggml_ork::npu::regs::{self, RegCmd};
use ggml_ork::npu::soc::SocDesc;

/// Fixed IOVAs of [`synth_fixed`] (ork's `ork_i8_npu_synth_dump` uses 0x1000000 / 0x2000000 /
/// 0x3000000 for A / B / C, rknpu-facts §10); the regcmd buffer goes at 0x4000000.
pub const SYNTH_A_IOVA: u32 = 0x0100_0000;
pub const SYNTH_B_IOVA: u32 = 0x0200_0000;
pub const SYNTH_C_IOVA: u32 = 0x0300_0000;
pub const SYNTH_REGCMD_IOVA: u32 = 0x0400_0000;

/// Plans `[M, K] × [N, K]ᵀ` on `soc` with `max_cores` and synthesises every submit's regcmd
/// stream with the fixed IOVAs above (A, B, C scratch offsets as `mm.rs` would place them).
/// Returns `(core, submit index, entries)` — what `ork-regdump --synth` and the golden tests show.
pub fn synth_fixed(
    soc: &SocDesc,
    m: usize,
    k: usize,
    n: usize,
    max_cores: u32,
) -> Result<Vec<(u32, usize, Vec<RegCmd>)>, RegcmdError> {
    let geom = WeightGeometry::new(soc, n, k);
    let p = plan(soc, &geom, m, max_cores);
    let at = SubmitIovas {
        act: Iova(SYNTH_A_IOVA),
        weights: Iova(SYNTH_B_IOVA),
        out: Iova(SYNTH_C_IOVA),
        regcmd: Iova(SYNTH_REGCMD_IOVA),
    };
    let mut out = Vec::new();
    for cp in &p.cores {
        for (i, sub) in cp.submits.iter().enumerate() {
            let scratch = |ab: &_| sub.a_blocks.iter().find(|(b, _)| b == ab).expect("a submit's block").1;
            out.push((cp.core, i, sub.regcmd_at(&at, soc.pc_data_amount_scale, scratch)?));
        }
    }
    Ok(out)
}

/// Decoded text of [`synth_fixed`]: a header line per submit, then one line per entry.
pub fn synth_text(soc: &SocDesc, m: usize, k: usize, n: usize, max_cores: u32) -> Result<String, RegcmdError> {
    let mut s = format!("# {} M={m} K={k} N={n} max_cores={max_cores}\n", soc.id.name());
    for (core, i, entries) in synth_fixed(soc, m, k, n, max_cores)? {
        s += &format!("## core {core} submit {i}: {} programs\n", entries.len() / regcmd::PROGRAM_ENTRIES);
        s += &regs::decode(&entries);
    }
    Ok(s)
}
