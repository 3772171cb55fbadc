//! Program synthesis: the regcmd stream of one int8 matmul program, and PC chaining of several.
//!
//! This module owns *what* a program writes; [`crate::npu::regs`] owns *where* the bits go.
//! One program computes `C[mc][N] (int32, row stride s) = A[mc][K] (int8, flat row-major) ·
//! Wᵀ` with W tiled `[N/32][K/32][32][32]` (rknpu-facts §3.2). It is the 108-entry body of ork's
//! RKNN capture "INT8_MM_INT8_TO_INT32" (rknpu-facts §2.2, entries 0–107, every value from that
//! table) plus the 4 trailer entries (§2.1/§2.4): the chain link (PC_BASE_ADDRESS of the next
//! program, or a NOP), PC_REGISTER_AMOUNTS (0x37 or 0), the 0x0041 word and the kick.
//!
//! Decisions:
//! * The duplicates of the capture are kept (CNA_CBUF_CON0 at entries 0 and 15, CNA_CONV_CON1 at
//!   3 and 5; §2.1): both copies always carry the same value, so "the later copy wins" does not
//!   matter.
//! * The flat activation/output layout is the opaque, hardware-verified combination of ork
//!   (conflict 9): CONV_CON1 GROUP_LINE_OFF=1, DMA_CON1 LINE_STRIDE = K/16, DMA_CON2 SURF_STRIDE =
//!   0, DST_SURF_STRIDE field 1, NOTCH in 4-element groups, ORIG_CHANNEL = s. No general unit rule
//!   is derived from it.
//! * The two "scheduler" registers (§2.3) are chosen by [`Schedule`]: the template (CBUF 1 data
//!   bank / 11 weight banks, FEATURE_GRAINS = mc + 1) or ork's M-scheduler (FEATURE_GRAINS =
//!   min(mc + 1, R), CBUF split by the ork formula, valid only for K % 512 == 0, K ≤ 4096).
//! * Kick value 0x0d = CNA + CORE + DPU (Mesa's GLOBAL OPERATION_ENABLE labels, conflict 3).
//! * Each program occupies [`PROGRAM_BYTES`] = 896 bytes; chained programs are back to back.

use crate::npu::kif::Iova;
use crate::npu::regs::{self, RegCmd, RegError};

/// Body entries of the int8 matmul template: `regcfg_amount` of its task (rknpu-facts §2.2).
pub const BODY_ENTRIES: usize = 108;
/// Trailer entries after the body (`RKNPU_PC_DATA_EXTRA_AMOUNT`, rknpu-facts §1.5 / §2.1).
pub const TRAILER_ENTRIES: usize = 4;
/// Entries of one program.
pub const PROGRAM_ENTRIES: usize = BODY_ENTRIES + TRAILER_ENTRIES;
/// Bytes of one program in the regcmd buffer (112 × 8).
pub const PROGRAM_BYTES: usize = PROGRAM_ENTRIES * 8;
/// Task `enable_mask` and kick value: CNA + CORE + DPU (rknpu-facts §1.3, §2.2 row 111).
pub const OP_ENABLE_MATMUL: u32 = 0x0d;
/// Task `int_mask`: DPU group 0 and 1 done, pair-complete (rknpu-facts §1.3).
pub const INT_MASK_DPU: u32 = 0x300;
/// Task `int_clear` (rknpu-facts §1.3).
pub const INT_CLEAR_ALL: u32 = 0x1ffff;
/// Minimum 0x1040 value of ork's M-scheduler: 1 weight bank, 11 data banks (rknpu-facts §2.3).
pub const CBUF_SCHED_FLOOR: u32 = 0x1b;
/// Template CBUF split: 11 weight banks, 1 data bank (RKNN capture value 0xb1, §2.2 row 0).
pub const CBUF_TEMPLATE_WEIGHT_BANKS: u32 = 11;
pub const CBUF_TEMPLATE_DATA_BANKS: u32 = 1;
/// int8 row budget of ork's scheduler: `2 * cbuf_elems` = 2 × 32768 bytes (rknpu-facts §2.3).
pub const SCHED_ROW_BUDGET_BYTES: u32 = 65536;
/// int8 bytes per CBUF data entry used for CBUF_CON1 DATA_ENTRIES = ceil(K/64) (§2.2 row 16).
pub const CBUF_ENTRY_CHANNELS_INT8: u32 = 64;
/// DPU DATA_FORMAT OUT_PRECISION code of int32 output (rknpu-facts §2.2 row 59, S9).
pub const PRECISION_INT32: u32 = 4;
/// DPU SURFACE_ADD field for int32 output (register value 0x80, §2.2 row 94).
pub const SURF_ADD_INT32: u32 = 8;
/// int32 output elements per 16-byte notch group (§2.2 row 65).
pub const NOTCH_ELEMS_INT32: u32 = 4;
/// DMA burst length written by the capture (§2.2 rows 27, 58).
pub const BURST_LEN_MAX: u32 = 15;
/// DPU FEATURE_MODE_CFG OUTPUT_MODE of the capture (§2.2 row 58).
pub const DPU_OUTPUT_MODE_CAPTURE: u32 = 2;
/// DPU BS_OW_CFG SIZE_E_* for int32 output (§2.2 row 71).
pub const OW_SIZE_E_INT32: u32 = 7;

/// Errors of program synthesis.
#[derive(Debug, thiserror::Error)]
pub enum RegcmdError {
    #[error("regcmd synth: {0}")]
    Field(#[from] RegError),
    #[error("regcmd synth mc={mc} K={k} N={n} s={s}: {why}")]
    Shape { mc: u32, k: u32, n: u32, s: u32, why: &'static str },
}

/// The two scheduler registers (rknpu-facts §2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// CNA_CONV_CON2 FEATURE_GRAINS (rows; a performance hint per ork's measurement).
    pub feature_grains: u32,
    /// CNA_CBUF_CON0 DATA_BANK / WEIGHT_BANK.
    pub data_banks: u32,
    pub weight_banks: u32,
}

impl Schedule {
    /// The capture's template: 1 data bank, 11 weight banks, FEATURE_GRAINS = mc + 1. Used for
    /// K-slice programs with K ∉ {512, 1024} and for M = 1 full-K programs (0xb1 / 0x20).
    pub fn template(mc: u32) -> Schedule {
        Schedule {
            feature_grains: mc + 1,
            data_banks: CBUF_TEMPLATE_DATA_BANKS,
            weight_banks: CBUF_TEMPLATE_WEIGHT_BANKS,
        }
    }

    /// ork's M-scheduler for K % 512 == 0, 512 ≤ K ≤ 4096 (rknpu-facts §2.3): with
    /// `scale = K/512`, `base = 177 - 15(scale-1)`, `slope = 15·scale`, `mg = ceil(mc/64)`,
    /// CBUF_CON0 = max(0x1b, base - slope(mg-1)); FEATURE_GRAINS = min(mc+1, R), R = 65536/K
    /// floored to a power of two. Returns `None` outside the formula's envelope.
    pub fn scheduler(mc: u32, k: u32) -> Option<Schedule> {
        if k == 0 || k % 512 != 0 || k > 4096 || mc == 0 {
            return None;
        }
        let scale = k / 512;
        let base = 177 - 15 * (scale - 1);
        let slope = 15 * scale;
        let mg = mc.div_ceil(64);
        let v = base.saturating_sub(slope * (mg - 1)).max(CBUF_SCHED_FLOOR);
        // The formula's floor is reached exactly when its value falls below 0x1b; past it the
        // data would not fit (the planner's caps keep mc inside).
        if base < slope * (mg - 1) + CBUF_SCHED_FLOOR {
            return None;
        }
        let r = pow2_floor((SCHED_ROW_BUDGET_BYTES / k).max(1));
        Some(Schedule { feature_grains: (mc + 1).min(r), data_banks: v & 0xf, weight_banks: v >> 4 })
    }
}

fn pow2_floor(x: u32) -> u32 {
    if x == 0 {
        0
    } else {
        1 << (31 - x.leading_zeros())
    }
}

/// One int8 matmul program: `C[mc][n] (int32, row stride dst_stride elements at c) =
/// A[mc][k] (int8, row-major, k bytes per row at a) · Wᵀ`, W = `[n/32][k/32][32][32]` int8 at b.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulProgram {
    pub mc: u32,
    pub k: u32,
    pub n: u32,
    /// Destination row stride `s` in int32 elements (s ≥ n, s % 4 == 0).
    pub dst_stride: u32,
    pub a: Iova,
    pub b: Iova,
    pub c: Iova,
    pub sched: Schedule,
}

macro_rules! w {
    ($reg:ident { $($f:ident : $v:expr),* $(,)? }) => {
        RegCmd::write(&regs::$reg::REG, regs::$reg::REG.pack(&[$((regs::$reg::$f, ($v) as u64)),*])?)
    };
}

impl MatmulProgram {
    fn check(&self) -> Result<(), RegcmdError> {
        let bad = |why| Err(RegcmdError::Shape { mc: self.mc, k: self.k, n: self.n, s: self.dst_stride, why });
        if self.mc == 0 || self.k == 0 || self.n == 0 {
            return bad("empty program");
        }
        if self.k % 32 != 0 || self.n % 32 != 0 {
            return bad("K and N must be multiples of 32");
        }
        if self.dst_stride < self.n || self.dst_stride % NOTCH_ELEMS_INT32 != 0 {
            return bad("row stride s must be ≥ N and a multiple of 4");
        }
        if self.a.0 % 16 != 0 || self.b.0 % 16 != 0 || self.c.0 % 16 != 0 {
            return bad("A, B and C addresses must be 16-byte aligned");
        }
        Ok(())
    }

    /// The 108 body entries (rknpu-facts §2.2 rows 0–107, in capture order).
    pub fn body(&self) -> Result<Vec<RegCmd>, RegcmdError> {
        self.check()?;
        let (mc, k, n, s) = (self.mc, self.k, self.n, self.dst_stride);
        let cbuf = w!(CNA_CBUF_CON0 { WEIGHT_BANK: self.sched.weight_banks, DATA_BANK: self.sched.data_banks });
        let conv_con1 = w!(CNA_CONV_CON1 { GROUP_LINE_OFF: 1, PROC_PRECISION: 0, IN_PRECISION: 0, CONV_MODE: 0 });
        let dcomp_ctrl = w!(CNA_DCOMP_CTRL {});
        let dcomp_regnum = w!(CNA_DCOMP_REGNUM {});
        let cvt_unit = [
            w!(CNA_CVT_CON1 { CVT_SCALE0: 1 }),
            w!(CNA_CVT_CON2 { CVT_SCALE1: 1 }),
            w!(CNA_CVT_CON3 { CVT_SCALE2: 1 }),
            w!(CNA_CVT_CON4 { CVT_SCALE3: 1 }),
        ];
        let mut e = Vec::with_capacity(PROGRAM_ENTRIES);
        // --- CNA: feature/weight geometry (rows 0–52)
        e.push(cbuf);
        e.push(dcomp_regnum);
        e.push(dcomp_ctrl);
        e.push(conv_con1);
        e.push(w!(DPU_S_POINTER { POINTER_PP_EN: 1, EXECUTER_PP_EN: 1, POINTER_PP_MODE: 1 }));
        e.push(conv_con1);
        e.push(w!(CNA_CONV_CON2 { FEATURE_GRAINS: self.sched.feature_grains }));
        e.push(w!(CNA_CONV_CON3 { CONV_X_STRIDE: 1, CONV_Y_STRIDE: 1 }));
        e.push(w!(CNA_DATA_SIZE0 { DATAIN_WIDTH: 1, DATAIN_HEIGHT: mc }));
        e.push(w!(CNA_DATA_SIZE1 { DATAIN_CHANNEL_REAL: k, DATAIN_CHANNEL: k }));
        e.push(w!(CNA_DATA_SIZE2 { DATAOUT_WIDTH: 1 }));
        e.push(w!(CNA_DATA_SIZE3 { DATAOUT_ATOMICS: mc }));
        e.push(w!(CNA_WEIGHT_SIZE0 { WEIGHT_BYTES: u64::from(k) * u64::from(n) }));
        e.push(w!(CNA_WEIGHT_SIZE1 { WEIGHT_BYTES_PER_KERNEL: k }));
        e.push(w!(CNA_WEIGHT_SIZE2 { WEIGHT_WIDTH: 1, WEIGHT_HEIGHT: 1, WEIGHT_KERNELS: n }));
        e.push(cbuf);
        e.push(w!(CNA_CBUF_CON1 { DATA_ENTRIES: k.div_ceil(CBUF_ENTRY_CHANNELS_INT8) }));
        e.push(w!(CNA_CVT_CON0 { DATA_SIGN: 1, CVT_TYPE: 1, CVT_BYPASS: 1 }));
        e.extend_from_slice(&cvt_unit);
        e.push(w!(CNA_FC_CON0 {}));
        e.push(w!(CNA_FC_CON1 {}));
        e.push(w!(CNA_PAD_CON0 {}));
        e.push(w!(CNA_FEATURE_DATA_ADDR { FEATURE_BASE_ADDR: self.a.0 }));
        e.push(w!(CNA_FC_CON2 {}));
        e.push(w!(CNA_DMA_CON0 { WEIGHT_BURST_LEN: BURST_LEN_MAX, DATA_BURST_LEN: BURST_LEN_MAX }));
        e.push(w!(CNA_DMA_CON1 { LINE_STRIDE: k / 16 }));
        e.push(w!(CNA_DMA_CON2 { SURF_STRIDE: 0 }));
        e.push(w!(CNA_FC_DATA_SIZE0 { DMA_WIDTH: 1, DMA_HEIGHT: mc }));
        e.push(w!(CNA_FC_DATA_SIZE1 { DMA_CHANNEL: k }));
        e.push(dcomp_ctrl);
        e.push(dcomp_regnum);
        e.push(w!(CNA_DCOMP_ADDR0 { DECOMPRESS_ADDR0: self.b.0 }));
        e.extend_from_slice(&[
            w!(CNA_DCOMP_AMOUNT0 {}), w!(CNA_DCOMP_AMOUNT1 {}), w!(CNA_DCOMP_AMOUNT2 {}), w!(CNA_DCOMP_AMOUNT3 {}),
            w!(CNA_DCOMP_AMOUNT4 {}), w!(CNA_DCOMP_AMOUNT5 {}), w!(CNA_DCOMP_AMOUNT6 {}), w!(CNA_DCOMP_AMOUNT7 {}),
            w!(CNA_DCOMP_AMOUNT8 {}), w!(CNA_DCOMP_AMOUNT9 {}), w!(CNA_DCOMP_AMOUNT10 {}), w!(CNA_DCOMP_AMOUNT11 {}),
            w!(CNA_DCOMP_AMOUNT12 {}), w!(CNA_DCOMP_AMOUNT13 {}), w!(CNA_DCOMP_AMOUNT14 {}), w!(CNA_DCOMP_AMOUNT15 {}),
        ]);
        e.push(w!(CNA_CVT_CON5 {}));
        e.push(w!(CNA_PAD_CON1 {}));
        // --- CORE (rows 53–57)
        e.push(w!(CORE_MISC_CFG { QD_EN: 1, PROC_PRECISION: 0 }));
        e.push(w!(CORE_DATAOUT_SIZE_0 { DATAOUT_HEIGHT: mc, DATAOUT_WIDTH: 1 }));
        e.push(w!(CORE_DATAOUT_SIZE_1 { DATAOUT_CHANNEL: n }));
        e.push(w!(CORE_CLIP_TRUNCATE {}));
        e.push(w!(CORE_UNK_3030 {}));
        // --- DPU: output stage, BS/BN/EW bypassed, identity OUT_CVT (rows 58–107)
        e.push(w!(DPU_FEATURE_MODE_CFG { BURST_LEN: BURST_LEN_MAX, OUTPUT_MODE: DPU_OUTPUT_MODE_CAPTURE }));
        e.push(w!(DPU_DATA_FORMAT { OUT_PRECISION: PRECISION_INT32, IN_PRECISION: 0, PROC_PRECISION: 0 }));
        e.push(w!(DPU_OFFSET_PEND {}));
        e.push(w!(DPU_DST_BASE_ADDR { DST_BASE_ADDR: self.c.0 }));
        e.push(w!(DPU_DST_SURF_STRIDE { DST_SURF_STRIDE: 1 }));
        e.push(w!(DPU_DATA_CUBE_WIDTH { WIDTH: 1 }));
        e.push(w!(DPU_DATA_CUBE_HEIGHT { HEIGHT: mc }));
        e.push(w!(DPU_DATA_CUBE_NOTCH_ADDR { NOTCH_ADDR_1: s / NOTCH_ELEMS_INT32, NOTCH_ADDR_0: n / NOTCH_ELEMS_INT32 }));
        e.push(w!(DPU_DATA_CUBE_CHANNEL { ORIG_CHANNEL: s, CHANNEL: n }));
        e.push(w!(DPU_BS_CFG { BS_RELU_BYPASS: 1, BS_MUL_BYPASS: 1, BS_ALU_BYPASS: 1, BS_BYPASS: 1 }));
        e.push(w!(DPU_BS_ALU_CFG {}));
        e.push(w!(DPU_BS_MUL_CFG {}));
        e.push(w!(DPU_BS_RELUX_CMP_VALUE {}));
        e.push(w!(DPU_BS_OW_CFG { SIZE_E_2: OW_SIZE_E_INT32, SIZE_E_1: OW_SIZE_E_INT32, SIZE_E_0: OW_SIZE_E_INT32 }));
        e.push(w!(DPU_BS_OW_OP {}));
        e.push(w!(DPU_WDMA_SIZE_0 { CHANNEL_WDMA: n }));
        e.push(w!(DPU_WDMA_SIZE_1 { HEIGHT_WDMA: mc, WIDTH_WDMA: 1 }));
        e.push(w!(DPU_BN_CFG { BN_RELU_BYPASS: 1, BN_MUL_BYPASS: 1, BN_ALU_BYPASS: 1, BN_BYPASS: 1 }));
        e.push(w!(DPU_BN_ALU_CFG {}));
        e.push(w!(DPU_BN_MUL_CFG {}));
        e.push(w!(DPU_BN_RELUX_CMP_VALUE {}));
        e.push(w!(DPU_EW_CFG {
            EW_RELU_BYPASS: 1, EW_OP_CVT_BYPASS: 1, EW_LUT_BYPASS: 1, EW_OP_BYPASS: 1, EW_BYPASS: 1,
        }));
        e.push(w!(DPU_EW_CVT_OFFSET_VALUE {}));
        e.push(w!(DPU_EW_CVT_SCALE_VALUE { EW_OP_CVT_SCALE: 1 }));
        e.push(w!(DPU_EW_RELUX_CMP_VALUE {}));
        e.push(w!(DPU_OUT_CVT_OFFSET {}));
        e.push(w!(DPU_OUT_CVT_SCALE { OUT_CVT_SCALE: 1 }));
        e.push(w!(DPU_OUT_CVT_SHIFT {}));
        e.extend_from_slice(&[
            w!(DPU_EW_OP_VALUE_0 {}), w!(DPU_EW_OP_VALUE_1 {}), w!(DPU_EW_OP_VALUE_2 {}), w!(DPU_EW_OP_VALUE_3 {}),
            w!(DPU_EW_OP_VALUE_4 {}), w!(DPU_EW_OP_VALUE_5 {}), w!(DPU_EW_OP_VALUE_6 {}), w!(DPU_EW_OP_VALUE_7 {}),
        ]);
        e.push(w!(DPU_SURFACE_ADD { SURF_ADD: SURF_ADD_INT32 }));
        e.push(w!(DPU_UNK_40C4 {}));
        e.extend_from_slice(&[
            w!(DPU_LUT_ACCESS_CFG {}), w!(DPU_LUT_ACCESS_DATA {}), w!(DPU_LUT_CFG {}), w!(DPU_LUT_INFO {}),
            w!(DPU_LUT_LE_START {}), w!(DPU_LUT_LE_END {}), w!(DPU_LUT_LO_START {}), w!(DPU_LUT_LO_END {}),
            w!(DPU_LUT_LE_SLOPE_SCALE {}), w!(DPU_LUT_LE_SLOPE_SHIFT {}), w!(DPU_LUT_LO_SLOPE_SCALE {}),
            w!(DPU_LUT_LO_SLOPE_SHIFT {}),
        ]);
        debug_assert_eq!(e.len(), BODY_ENTRIES);
        Ok(e)
    }

    /// The whole 112-entry program. `next` = the chained successor (its regcmd IOVA) or `None`
    /// for the last program of a submit (rknpu-facts §2.4).
    pub fn program(&self, next: Option<Iova>, amount_scale: u32) -> Result<Vec<RegCmd>, RegcmdError> {
        let mut e = self.body()?;
        e.extend_from_slice(&trailer(next, amount_scale)?);
        Ok(e)
    }
}

/// PC_REGISTER_AMOUNTS for a program of `body_entries`: `ceil((body + 4) / scale) - 1`
/// (the kernel's formula, rknpu-facts §1.5; 55 = 0x37 for 108 entries at scale 2).
pub fn register_amounts(body_entries: u32, amount_scale: u32) -> u32 {
    (body_entries + TRAILER_ENTRIES as u32).div_ceil(amount_scale) - 1
}

/// The 4 trailer entries: chain link (or NOP), REGISTER_AMOUNTS (0x37 or 0), 0x0041 word, kick.
pub fn trailer(next: Option<Iova>, amount_scale: u32) -> Result<[RegCmd; TRAILER_ENTRIES], RegcmdError> {
    let (link, amount) = match next {
        Some(iova) => (
            w!(PC_BASE_ADDRESS { PC_SOURCE_ADDR: iova.0 }),
            register_amounts(BODY_ENTRIES as u32, amount_scale),
        ),
        None => (RegCmd::NOP, 0),
    };
    Ok([
        link,
        w!(PC_REGISTER_AMOUNTS { PC_DATA_AMOUNT: amount }),
        RegCmd::write(&regs::OP41_UNK_0000::REG, 0),
        RegCmd::write(&regs::PC_OPERATION_ENABLE::REG, OP_ENABLE_MATMUL),
    ])
}

/// PC-chains `programs` laid out back to back from `base` (program i at base + i·896): every
/// program but the last links to its successor (rknpu-facts §2.4). Returns all entries.
pub fn chain(programs: &[MatmulProgram], base: Iova, amount_scale: u32) -> Result<Vec<RegCmd>, RegcmdError> {
    let mut out = Vec::with_capacity(programs.len() * PROGRAM_ENTRIES);
    for (i, p) in programs.iter().enumerate() {
        let next = (i + 1 < programs.len()).then(|| Iova(base.0 + ((i + 1) * PROGRAM_BYTES) as u32));
        out.extend(p.program(next, amount_scale)?);
    }
    Ok(out)
}

/// Little-endian bytes of a regcmd stream, as the PC fetches it.
pub fn to_bytes(entries: &[RegCmd]) -> Vec<u8> {
    entries.iter().flat_map(|e| e.0.to_le_bytes()).collect()
}

/// Parses little-endian u64 entries (trailing partial word ignored).
pub fn from_bytes(bytes: &[u8]) -> Vec<RegCmd> {
    bytes.chunks_exact(8).map(|c| RegCmd(u64::from_le_bytes(c.try_into().unwrap()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_matches_bank_interpretation() {
        // rknpu-facts §2.3: value = (12 - data)<<4 | data with data = ceil(roundup(mc,64)·K/32768).
        for k in (1..=8u32).map(|s| 512 * s) {
            for mc in 1..=1024u32 {
                let data = (mc.div_ceil(64) * 64 * k).div_ceil(32768);
                match Schedule::scheduler(mc, k) {
                    Some(s) => {
                        assert_eq!(s.data_banks, data, "K={k} mc={mc}");
                        assert_eq!(s.weight_banks, 12 - data, "K={k} mc={mc}");
                    }
                    None => assert!(data > 11, "K={k} mc={mc} refused with data banks {data}"),
                }
            }
        }
    }

    #[test]
    fn register_amounts_of_template() {
        assert_eq!(register_amounts(108, 2), 55);
        assert_eq!(register_amounts(104, 2), 53);
    }
}
