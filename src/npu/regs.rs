//! The register table: every NPU register an int8 matmul program writes, declared once.
//!
//! This module owns the bit positions. Each register is declared with its block (the regcmd
//! *target*), its offset in the core's MMIO window, the hardware name as Mesa rocket's
//! `registers.xml` spells it (block prefix + register name, e.g. `CNA_CBUF_CON0`,
//! `DPU_DST_BASE_ADDR`), and its named bit fields with an encoding (`minus_one`, `shr(n)`), so
//! callers pass natural units (`DATAOUT_HEIGHT = mc`, not `mc - 1`).
//!
//! Three consumers derive from this one table, so the driver and the model can disagree only
//! about arithmetic, never about bit positions:
//! 1. the regcmd encoder ([`RegCmd::write`], used by [`crate::npu::regcmd`]);
//! 2. the decoder / pretty-printer ([`decode`], [`RegCmd`]'s `Display`), used by logs, the golden
//!    tests and `ork-regdump`;
//! 3. the simulator's register file ([`RegFile`], used by [`crate::npu::kif::sim`]).
//!
//! Decisions:
//! * Entry encoding (rknpu-facts §2.1, confirmed by Mesa S7 and mtx512 S9): one little-endian
//!   u64, bits [15:0] register offset, [47:16] 32-bit value, [63:48] target | op. Register writes
//!   use op 0x01 on the block's target id (PC 0x0100, CNA 0x0200, CORE 0x0800, DPU 0x1000,
//!   DPU_RDMA 0x2000; Mesa `enum target`).
//! * Two special entries are modelled as pseudo-blocks: the operation-enable kick (target|op
//!   0x0081, reg 0x0008) whose value bits follow Mesa's GLOBAL OPERATION_ENABLE layout
//!   (bit0 CNA, bit2 CORE, bit3 DPU, bit4 DPU_RDMA, bit5 PPU, bit6 PPU_RDMA — rknpu-facts
//!   conflict 3 relabels ork's names), and the undocumented 0x0041 word (reg 0, value 0) that
//!   Mesa says must precede the kick (§2.1).
//! * Registers absent from Mesa's XML are named by offset (`CORE_UNK_3030`, `DPU_UNK_40C4`);
//!   reserved bits are not declared as fields, and the decoder reports any set reserved bit.
//! * An all-zero entry is a no-op (§2.1).
//!
//! Sources: rknpu-facts §2.1 (encoding), §2.2 (which registers the program writes), Mesa
//! `registers.xml` (S6) for names and field ranges.
#![allow(non_snake_case)]

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

/// A register block (regcmd target), or one of the two special pseudo-blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    Pc,
    Cna,
    Core,
    Dpu,
    DpuRdma,
    /// The operation-enable kick entry (target|op 0x0081).
    OpEnable,
    /// The undocumented 0x0041 entry that precedes the kick.
    Op41,
}

/// Op bits of the regcmd target field: 0x01 = register write (rknpu-facts §2.1).
pub const OP_WRITE: u16 = 0x0001;
/// Target|op of the operation-enable kick (rknpu-facts §2.1, Mesa S7).
pub const TARGET_OP_ENABLE: u16 = 0x0081;
/// Target|op of the undocumented word preceding the kick (rknpu-facts §2.1, Mesa S7).
pub const TARGET_OP_41: u16 = 0x0041;

impl Block {
    /// The 16-bit target|op field of a write to this block.
    pub const fn target_op(self) -> u16 {
        match self {
            Block::Pc => 0x0100 | OP_WRITE,
            Block::Cna => 0x0200 | OP_WRITE,
            Block::Core => 0x0800 | OP_WRITE,
            Block::Dpu => 0x1000 | OP_WRITE,
            Block::DpuRdma => 0x2000 | OP_WRITE,
            Block::OpEnable => TARGET_OP_ENABLE,
            Block::Op41 => TARGET_OP_41,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Block::Pc => "PC",
            Block::Cna => "CNA",
            Block::Core => "CORE",
            Block::Dpu => "DPU",
            Block::DpuRdma => "DPU_RDMA",
            Block::OpEnable => "OP_EN",
            Block::Op41 => "OP41",
        }
    }
}

/// How a field's raw bits relate to the natural value callers pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enc {
    /// raw = value.
    Plain,
    /// raw = value - 1 (sizes stored minus one); value 0 is not encodable.
    MinusOne,
    /// raw = value >> n; the low n bits of value must be zero (e.g. 16-byte aligned addresses).
    Shr(u8),
}

/// One named bit field `[hi:lo]` of a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub hi: u8,
    pub lo: u8,
    pub enc: Enc,
}

/// Errors of field encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegError {
    #[error("{reg}.{field}: value {value} does not fit [{hi}:{lo}] ({enc:?})")]
    Range { reg: &'static str, field: &'static str, value: u64, hi: u8, lo: u8, enc: Enc },
    #[error("{reg}: field {field} does not belong to this register")]
    Foreign { reg: &'static str, field: &'static str },
}

impl Field {
    pub const fn width(&self) -> u32 {
        (self.hi - self.lo + 1) as u32
    }

    /// Mask of the field's bits in place.
    pub const fn mask(&self) -> u32 {
        let w = self.width();
        let ones = if w >= 32 { u32::MAX } else { (1u32 << w) - 1 };
        ones << self.lo
    }

    /// Encodes a natural value into the field's bits (already shifted into place).
    pub fn encode(&self, reg: &'static str, value: u64) -> Result<u32, RegError> {
        let err = || RegError::Range { reg, field: self.name, value, hi: self.hi, lo: self.lo, enc: self.enc };
        let raw = match self.enc {
            Enc::Plain => value,
            Enc::MinusOne => value.checked_sub(1).ok_or_else(err)?,
            Enc::Shr(n) => {
                if value & ((1u64 << n) - 1) != 0 {
                    return Err(err());
                }
                value >> n
            }
        };
        let w = self.width();
        if w < 64 && raw >> w != 0 {
            return Err(err());
        }
        Ok((raw as u32) << self.lo)
    }

    /// The raw bits of this field in a register value.
    pub const fn raw(&self, reg_value: u32) -> u32 {
        (reg_value & self.mask()) >> self.lo
    }

    /// The natural value of this field in a register value.
    pub fn decode(&self, reg_value: u32) -> u64 {
        let raw = self.raw(reg_value) as u64;
        match self.enc {
            Enc::Plain => raw,
            Enc::MinusOne => raw + 1,
            Enc::Shr(n) => raw << n,
        }
    }
}

/// One register: block, offset, hardware name, fields.
#[derive(Debug, PartialEq, Eq)]
pub struct RegDef {
    pub name: &'static str,
    pub block: Block,
    pub offset: u16,
    pub fields: &'static [Field],
}

impl RegDef {
    /// Bits not covered by any declared field (reserved or unknown).
    pub fn reserved_mask(&self) -> u32 {
        !self.fields.iter().fold(0u32, |m, f| m | f.mask())
    }

    /// Packs `(field, natural value)` pairs into a register value; fields not named are 0.
    pub fn pack(&self, vals: &[(Field, u64)]) -> Result<u32, RegError> {
        let mut v = 0u32;
        for (f, x) in vals {
            if !self.fields.iter().any(|g| g == f) {
                return Err(RegError::Foreign { reg: self.name, field: f.name });
            }
            v |= f.encode(self.name, *x)?;
        }
        Ok(v)
    }

    /// Looks a field up by name.
    pub fn field(&self, name: &str) -> Option<Field> {
        self.fields.iter().copied().find(|f| f.name == name)
    }

    /// "NAME FIELD=v FIELD=v" for a register value (natural units; hex for wide fields).
    pub fn format_value(&self, value: u32) -> String {
        let mut s = String::from(self.name);
        for f in self.fields {
            let v = f.decode(value);
            if f.width() >= 16 && v > 0xffff {
                s += &format!(" {}={:#x}", f.name, v);
            } else {
                s += &format!(" {}={}", f.name, v);
            }
        }
        let rsv = value & self.reserved_mask();
        if rsv != 0 {
            s += &format!(" RESERVED_BITS={rsv:#x}");
        }
        s
    }
}

macro_rules! enc {
    () => { Enc::Plain };
    (minus_one) => { Enc::MinusOne };
    (shr($n:literal)) => { Enc::Shr($n) };
}

macro_rules! registers {
    ($( $(#[$doc:meta])* $name:ident = $blk:ident @ $off:literal {
        $( $fname:ident [$hi:literal : $lo:literal] $( $enc:ident $( ($arg:literal) )? )? ),* $(,)?
    } )*) => {
        $(
            $(#[$doc])*
            pub mod $name {
                use super::*;
                $( pub const $fname: Field = Field { name: stringify!($fname), hi: $hi, lo: $lo, enc: enc!($( $enc $( ($arg) )? )?) }; )*
                pub const REG: RegDef = RegDef { name: stringify!($name), block: Block::$blk, offset: $off, fields: &[$($fname),*] };
            }
        )*
        /// Every register in the table, in declaration order.
        pub static REGISTERS: &[&RegDef] = &[$( &$name::REG ),*];
    };
}

registers! {
    // ---------------------------------------------------------------- PC (target 0x0100)
    /// PC_BASE_ADDRESS: IOVA of the next program's regcmd (chain link, rknpu-facts §2.4).
    PC_BASE_ADDRESS = Pc @ 0x0010 { PC_SOURCE_ADDR[31:4] shr(4), PC_SEL[0:0] }
    /// PC_REGISTER_AMOUNTS: fetch amount of the next program in 128-bit words minus one.
    PC_REGISTER_AMOUNTS = Pc @ 0x0014 { PC_DATA_AMOUNT[15:0] }
    /// The kick: op 0x0081 on reg 0x0008. Bits as Mesa's GLOBAL OPERATION_ENABLE (conflict 3).
    PC_OPERATION_ENABLE = OpEnable @ 0x0008 {
        PPU_RDMA_OP_EN[6:6], PPU_OP_EN[5:5], DPU_RDMA_OP_EN[4:4], DPU_OP_EN[3:3], CORE_OP_EN[2:2], CNA_OP_EN[0:0],
    }
    /// The undocumented 0x0041 word (reg 0, value 0) that must precede the kick (Mesa S7).
    OP41_UNK_0000 = Op41 @ 0x0000 { VALUE[31:0] }

    // ---------------------------------------------------------------- CNA (target 0x0200)
    CNA_CONV_CON1 = Cna @ 0x100c {
        NONALIGN_DMA[30:30], GROUP_LINE_OFF[29:29], DECONV[16:16], ARGB_IN[15:12],
        PROC_PRECISION[9:7], IN_PRECISION[6:4], CONV_MODE[3:0],
    }
    CNA_CONV_CON2 = Cna @ 0x1010 {
        KERNEL_GROUP[23:16], FEATURE_GRAINS[13:4], CSC_WO_EN[2:2], CSC_DO_EN[1:1], CMD_FIFO_SRST[0:0],
    }
    CNA_CONV_CON3 = Cna @ 0x1014 {
        NN_MODE[30:28], ATROUS_Y_DILATION[25:21], ATROUS_X_DILATION[20:16], DECONV_Y_STRIDE[13:11],
        DECONV_X_STRIDE[10:8], CONV_Y_STRIDE[5:3], CONV_X_STRIDE[2:0],
    }
    CNA_DATA_SIZE0 = Cna @ 0x1020 { DATAIN_WIDTH[26:16], DATAIN_HEIGHT[10:0] }
    CNA_DATA_SIZE1 = Cna @ 0x1024 { DATAIN_CHANNEL_REAL[29:16] minus_one, DATAIN_CHANNEL[15:0] }
    CNA_DATA_SIZE2 = Cna @ 0x1028 { DATAOUT_WIDTH[10:0] }
    CNA_DATA_SIZE3 = Cna @ 0x102c { SURF_MODE[23:22], DATAOUT_ATOMICS[21:0] }
    CNA_WEIGHT_SIZE0 = Cna @ 0x1030 { WEIGHT_BYTES[31:0] }
    CNA_WEIGHT_SIZE1 = Cna @ 0x1034 { WEIGHT_BYTES_PER_KERNEL[18:0] }
    CNA_WEIGHT_SIZE2 = Cna @ 0x1038 { WEIGHT_WIDTH[28:24], WEIGHT_HEIGHT[20:16], WEIGHT_KERNELS[13:0] }
    CNA_CBUF_CON0 = Cna @ 0x1040 {
        WEIGHT_REUSE[13:13], DATA_REUSE[12:12], FC_DATA_BANK[10:8], WEIGHT_BANK[7:4], DATA_BANK[3:0],
    }
    CNA_CBUF_CON1 = Cna @ 0x1044 { DATA_ENTRIES[13:0] }
    CNA_CVT_CON0 = Cna @ 0x104c {
        CVT_TRUNCATE_3[27:22], CVT_TRUNCATE_2[21:16], CVT_TRUNCATE_1[15:10], CVT_TRUNCATE_0[9:4],
        DATA_SIGN[3:3], ROUND_TYPE[2:2], CVT_TYPE[1:1], CVT_BYPASS[0:0],
    }
    CNA_CVT_CON1 = Cna @ 0x1050 { CVT_SCALE0[31:16], CVT_OFFSET0[15:0] }
    CNA_CVT_CON2 = Cna @ 0x1054 { CVT_SCALE1[31:16], CVT_OFFSET1[15:0] }
    CNA_CVT_CON3 = Cna @ 0x1058 { CVT_SCALE2[31:16], CVT_OFFSET2[15:0] }
    CNA_CVT_CON4 = Cna @ 0x105c { CVT_SCALE3[31:16], CVT_OFFSET3[15:0] }
    CNA_FC_CON0 = Cna @ 0x1060 { FC_SKIP_DATA[31:16], FC_SKIP_EN[0:0] }
    CNA_FC_CON1 = Cna @ 0x1064 { DATA_OFFSET[16:0] }
    CNA_PAD_CON0 = Cna @ 0x1068 { PAD_LEFT[7:4], PAD_TOP[3:0] }
    CNA_FEATURE_DATA_ADDR = Cna @ 0x1070 { FEATURE_BASE_ADDR[31:0] }
    CNA_FC_CON2 = Cna @ 0x1074 { WEIGHT_OFFSET[16:0] }
    CNA_DMA_CON0 = Cna @ 0x1078 { OV4K_BYPASS[31:31], WEIGHT_BURST_LEN[19:16], DATA_BURST_LEN[3:0] }
    CNA_DMA_CON1 = Cna @ 0x107c { LINE_STRIDE[27:0] }
    CNA_DMA_CON2 = Cna @ 0x1080 { SURF_STRIDE[27:0] }
    CNA_FC_DATA_SIZE0 = Cna @ 0x1084 { DMA_WIDTH[29:16], DMA_HEIGHT[10:0] }
    CNA_FC_DATA_SIZE1 = Cna @ 0x1088 { DMA_CHANNEL[15:0] }
    CNA_DCOMP_CTRL = Cna @ 0x1100 { WT_DEC_BYPASS[3:3], DECOMP_CONTROL[2:0] }
    CNA_DCOMP_REGNUM = Cna @ 0x1104 { DCOMP_REGNUM[31:0] }
    /// Carries the plain weight base address (rknpu-facts §2.2 row 34).
    CNA_DCOMP_ADDR0 = Cna @ 0x1110 { DECOMPRESS_ADDR0[31:0] }
    CNA_DCOMP_AMOUNT0 = Cna @ 0x1140 { DCOMP_AMOUNT0[31:0] }
    CNA_DCOMP_AMOUNT1 = Cna @ 0x1144 { DCOMP_AMOUNT1[31:0] }
    CNA_DCOMP_AMOUNT2 = Cna @ 0x1148 { DCOMP_AMOUNT2[31:0] }
    CNA_DCOMP_AMOUNT3 = Cna @ 0x114c { DCOMP_AMOUNT3[31:0] }
    CNA_DCOMP_AMOUNT4 = Cna @ 0x1150 { DCOMP_AMOUNT4[31:0] }
    CNA_DCOMP_AMOUNT5 = Cna @ 0x1154 { DCOMP_AMOUNT5[31:0] }
    CNA_DCOMP_AMOUNT6 = Cna @ 0x1158 { DCOMP_AMOUNT6[31:0] }
    CNA_DCOMP_AMOUNT7 = Cna @ 0x115c { DCOMP_AMOUNT7[31:0] }
    CNA_DCOMP_AMOUNT8 = Cna @ 0x1160 { DCOMP_AMOUNT8[31:0] }
    CNA_DCOMP_AMOUNT9 = Cna @ 0x1164 { DCOMP_AMOUNT9[31:0] }
    CNA_DCOMP_AMOUNT10 = Cna @ 0x1168 { DCOMP_AMOUNT10[31:0] }
    CNA_DCOMP_AMOUNT11 = Cna @ 0x116c { DCOMP_AMOUNT11[31:0] }
    CNA_DCOMP_AMOUNT12 = Cna @ 0x1170 { DCOMP_AMOUNT12[31:0] }
    CNA_DCOMP_AMOUNT13 = Cna @ 0x1174 { DCOMP_AMOUNT13[31:0] }
    CNA_DCOMP_AMOUNT14 = Cna @ 0x1178 { DCOMP_AMOUNT14[31:0] }
    CNA_DCOMP_AMOUNT15 = Cna @ 0x117c { DCOMP_AMOUNT15[31:0] }
    CNA_CVT_CON5 = Cna @ 0x1180 { PER_CHANNEL_CVT_EN[31:0] }
    CNA_PAD_CON1 = Cna @ 0x1184 { PAD_VALUE[31:0] }

    // ---------------------------------------------------------------- CORE (target 0x0800)
    CORE_MISC_CFG = Core @ 0x3010 { SOFT_GATING[19:14], PROC_PRECISION[10:8], DW_EN[1:1], QD_EN[0:0] }
    CORE_DATAOUT_SIZE_0 = Core @ 0x3014 { DATAOUT_HEIGHT[31:16] minus_one, DATAOUT_WIDTH[15:0] minus_one }
    CORE_DATAOUT_SIZE_1 = Core @ 0x3018 { DATAOUT_CHANNEL[15:0] minus_one }
    CORE_CLIP_TRUNCATE = Core @ 0x301c { ROUND_TYPE[6:6], CLIP_TRUNCATE[4:0] }
    /// Undocumented (absent from Mesa's XML; emitted by Mesa S7 and mtx512 S9 with 0).
    CORE_UNK_3030 = Core @ 0x3030 { VALUE[31:0] }

    // ---------------------------------------------------------------- DPU (target 0x1000)
    DPU_S_POINTER = Dpu @ 0x4004 {
        EXECUTER[16:16], EXECUTER_PP_CLEAR[5:5], POINTER_PP_CLEAR[4:4], POINTER_PP_MODE[3:3],
        EXECUTER_PP_EN[2:2], POINTER_PP_EN[1:1], POINTER[0:0],
    }
    DPU_FEATURE_MODE_CFG = Dpu @ 0x400c {
        COMB_USE[31:31], TP_EN[30:30], RGP_TYPE[29:26], NONALIGN[25:25], SURF_LEN[24:9],
        BURST_LEN[8:5], CONV_MODE[4:3], OUTPUT_MODE[2:1], FLYING_MODE[0:0],
    }
    DPU_DATA_FORMAT = Dpu @ 0x4010 {
        OUT_PRECISION[31:29], IN_PRECISION[28:26], EW_TRUNCATE_NEG[25:16], BN_MUL_SHIFT_VALUE_NEG[15:10],
        BS_MUL_SHIFT_VALUE_NEG[9:4], MC_SURF_OUT[3:3], PROC_PRECISION[2:0],
    }
    DPU_OFFSET_PEND = Dpu @ 0x4014 { OFFSET_PEND[15:0] }
    DPU_DST_BASE_ADDR = Dpu @ 0x4020 { DST_BASE_ADDR[31:0] }
    DPU_DST_SURF_STRIDE = Dpu @ 0x4024 { DST_SURF_STRIDE[31:4] }
    DPU_DATA_CUBE_WIDTH = Dpu @ 0x4030 { WIDTH[12:0] minus_one }
    DPU_DATA_CUBE_HEIGHT = Dpu @ 0x4034 { MINMAX_CTL[24:22], HEIGHT[12:0] minus_one }
    /// Notch fields count 16-byte groups minus one (int32 output: 4 elements per group).
    DPU_DATA_CUBE_NOTCH_ADDR = Dpu @ 0x4038 { NOTCH_ADDR_1[28:16] minus_one, NOTCH_ADDR_0[12:0] minus_one }
    DPU_DATA_CUBE_CHANNEL = Dpu @ 0x403c { ORIG_CHANNEL[28:16] minus_one, CHANNEL[12:0] minus_one }
    DPU_BS_CFG = Dpu @ 0x4040 {
        BS_ALU_ALGO[19:16], BS_ALU_SRC[8:8], BS_RELUX_EN[7:7], BS_RELU_BYPASS[6:6], BS_MUL_PRELU[5:5],
        BS_MUL_BYPASS[4:4], BS_ALU_BYPASS[1:1], BS_BYPASS[0:0],
    }
    DPU_BS_ALU_CFG = Dpu @ 0x4044 { BS_ALU_OPERAND[31:0] }
    DPU_BS_MUL_CFG = Dpu @ 0x4048 {
        BS_MUL_OPERAND[31:16], BS_MUL_SHIFT_VALUE[13:8], BS_TRUNCATE_SRC[1:1], BS_MUL_SRC[0:0],
    }
    DPU_BS_RELUX_CMP_VALUE = Dpu @ 0x404c { BS_RELUX_CMP_DAT[31:0] }
    DPU_BS_OW_CFG = Dpu @ 0x4050 {
        RGP_CNTER[31:28], TP_ORG_EN[27:27], SIZE_E_2[10:8], SIZE_E_1[7:5], SIZE_E_0[4:2], OD_BYPASS[1:1], OW_SRC[0:0],
    }
    DPU_BS_OW_OP = Dpu @ 0x4054 { OW_OP[15:0] }
    DPU_WDMA_SIZE_0 = Dpu @ 0x4058 { TP_PRECISION[27:27], SIZE_C_WDMA[26:16], CHANNEL_WDMA[12:0] minus_one }
    DPU_WDMA_SIZE_1 = Dpu @ 0x405c { HEIGHT_WDMA[28:16] minus_one, WIDTH_WDMA[12:0] minus_one }
    DPU_BN_CFG = Dpu @ 0x4060 {
        BN_ALU_ALGO[19:16], BN_ALU_SRC[8:8], BN_RELUX_EN[7:7], BN_RELU_BYPASS[6:6], BN_MUL_PRELU[5:5],
        BN_MUL_BYPASS[4:4], BN_ALU_BYPASS[1:1], BN_BYPASS[0:0],
    }
    DPU_BN_ALU_CFG = Dpu @ 0x4064 { BN_ALU_OPERAND[31:0] }
    DPU_BN_MUL_CFG = Dpu @ 0x4068 {
        BN_MUL_OPERAND[31:16], BN_MUL_SHIFT_VALUE[13:8], BN_TRUNCATE_SRC[1:1], BN_MUL_SRC[0:0],
    }
    DPU_BN_RELUX_CMP_VALUE = Dpu @ 0x406c { BN_RELUX_CMP_DAT[31:0] }
    DPU_EW_CFG = Dpu @ 0x4070 {
        EW_CVT_TYPE[31:31], EW_CVT_ROUND[30:30], EW_DATA_MODE[29:28], EDATA_SIZE[23:22], EW_EQUAL_EN[21:21],
        EW_BINARY_EN[20:20], EW_ALU_ALGO[19:16], EW_RELUX_EN[10:10], EW_RELU_BYPASS[9:9],
        EW_OP_CVT_BYPASS[8:8], EW_LUT_BYPASS[7:7], EW_OP_SRC[6:6], EW_MUL_PRELU[5:5], EW_OP_TYPE[2:2],
        EW_OP_BYPASS[1:1], EW_BYPASS[0:0],
    }
    DPU_EW_CVT_OFFSET_VALUE = Dpu @ 0x4074 { EW_OP_CVT_OFFSET[31:0] }
    DPU_EW_CVT_SCALE_VALUE = Dpu @ 0x4078 { EW_TRUNCATE[31:22], EW_OP_CVT_SHIFT[21:16], EW_OP_CVT_SCALE[15:0] }
    DPU_EW_RELUX_CMP_VALUE = Dpu @ 0x407c { EW_RELUX_CMP_DAT[31:0] }
    DPU_OUT_CVT_OFFSET = Dpu @ 0x4080 { OUT_CVT_OFFSET[31:0] }
    DPU_OUT_CVT_SCALE = Dpu @ 0x4084 { FP32TOFP16_EN[16:16], OUT_CVT_SCALE[15:0] }
    DPU_OUT_CVT_SHIFT = Dpu @ 0x4088 { CVT_TYPE[31:31], CVT_ROUND[30:30], MINUS_EXP[19:12], OUT_CVT_SHIFT[11:0] }
    DPU_EW_OP_VALUE_0 = Dpu @ 0x4090 { EW_OPERAND_0[31:0] }
    DPU_EW_OP_VALUE_1 = Dpu @ 0x4094 { EW_OPERAND_1[31:0] }
    DPU_EW_OP_VALUE_2 = Dpu @ 0x4098 { EW_OPERAND_2[31:0] }
    DPU_EW_OP_VALUE_3 = Dpu @ 0x409c { EW_OPERAND_3[31:0] }
    DPU_EW_OP_VALUE_4 = Dpu @ 0x40a0 { EW_OPERAND_4[31:0] }
    DPU_EW_OP_VALUE_5 = Dpu @ 0x40a4 { EW_OPERAND_5[31:0] }
    DPU_EW_OP_VALUE_6 = Dpu @ 0x40a8 { EW_OPERAND_6[31:0] }
    DPU_EW_OP_VALUE_7 = Dpu @ 0x40ac { EW_OPERAND_7[31:0] }
    /// Surface adder; 0x80 (field 8) for int32 output. Not an address (rknpu-facts §2.2 row 94).
    DPU_SURFACE_ADD = Dpu @ 0x40c0 { SURF_ADD[31:4] }
    /// Undocumented (absent from Mesa's XML; emitted by Mesa S7 and mtx512 S9 with 0).
    DPU_UNK_40C4 = Dpu @ 0x40c4 { VALUE[31:0] }
    DPU_LUT_ACCESS_CFG = Dpu @ 0x4100 { LUT_ACCESS_TYPE[17:17], LUT_TABLE_ID[16:16], LUT_ADDR[9:0] }
    DPU_LUT_ACCESS_DATA = Dpu @ 0x4104 { LUT_ACCESS_DATA[15:0] }
    DPU_LUT_CFG = Dpu @ 0x4108 {
        LUT_CAL_SEL[7:7], LUT_HYBRID_PRIORITY[6:6], LUT_OFLOW_PRIORITY[5:5], LUT_UFLOW_PRIORITY[4:4],
        LUT_LO_LE_MUX[3:2], LUT_EXPAND_EN[1:1], LUT_ROAD_SEL[0:0],
    }
    DPU_LUT_INFO = Dpu @ 0x410c { LUT_LO_INDEX_SELECT[23:16], LUT_LE_INDEX_SELECT[15:8] }
    DPU_LUT_LE_START = Dpu @ 0x4110 { LUT_LE_START[31:0] }
    DPU_LUT_LE_END = Dpu @ 0x4114 { LUT_LE_END[31:0] }
    DPU_LUT_LO_START = Dpu @ 0x4118 { LUT_LO_START[31:0] }
    DPU_LUT_LO_END = Dpu @ 0x411c { LUT_LO_END[31:0] }
    DPU_LUT_LE_SLOPE_SCALE = Dpu @ 0x4120 { LUT_LE_SLOPE_OFLOW_SCALE[31:16], LUT_LE_SLOPE_UFLOW_SCALE[15:0] }
    DPU_LUT_LE_SLOPE_SHIFT = Dpu @ 0x4124 { LUT_LE_SLOPE_OFLOW_SHIFT[9:5], LUT_LE_SLOPE_UFLOW_SHIFT[4:0] }
    DPU_LUT_LO_SLOPE_SCALE = Dpu @ 0x4128 { LUT_LO_SLOPE_OFLOW_SCALE[31:16], LUT_LO_SLOPE_UFLOW_SCALE[15:0] }
    DPU_LUT_LO_SLOPE_SHIFT = Dpu @ 0x412c { LUT_LO_SLOPE_OFLOW_SHIFT[9:5], LUT_LO_SLOPE_UFLOW_SHIFT[4:0] }

    // ---------------------------------------------------------------- DPU_RDMA (target 0x2000)
    /// Re-armed by Mesa's emitter (S7); not part of ork's int8 template, kept for decoding.
    DPU_RDMA_RDMA_S_POINTER = DpuRdma @ 0x5004 {
        EXECUTER[16:16], EXECUTER_PP_CLEAR[5:5], POINTER_PP_CLEAR[4:4], POINTER_PP_MODE[3:3],
        EXECUTER_PP_EN[2:2], POINTER_PP_EN[1:1], POINTER[0:0],
    }
}

fn key(target_op: u16, offset: u16) -> u32 {
    (u32::from(target_op) << 16) | u32::from(offset)
}

fn index() -> &'static HashMap<u32, usize> {
    static INDEX: OnceLock<HashMap<u32, usize>> = OnceLock::new();
    INDEX.get_or_init(|| {
        REGISTERS.iter().enumerate().map(|(i, r)| (key(r.block.target_op(), r.offset), i)).collect()
    })
}

/// Finds the register a (target|op, offset) pair writes, with its index in [`REGISTERS`].
pub fn lookup(target_op: u16, offset: u16) -> Option<(usize, &'static RegDef)> {
    index().get(&key(target_op, offset)).map(|&i| (i, REGISTERS[i]))
}

/// Index of a register in [`REGISTERS`] (panics only for a `RegDef` not from this table).
pub fn index_of(reg: &RegDef) -> usize {
    lookup(reg.block.target_op(), reg.offset).expect("register from the table").0
}

/// One 64-bit regcmd entry: [15:0] offset, [47:16] value, [63:48] target|op (rknpu-facts §2.1).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct RegCmd(pub u64);

impl RegCmd {
    /// The all-zero no-op entry.
    pub const NOP: RegCmd = RegCmd(0);

    pub const fn raw(target_op: u16, offset: u16, value: u32) -> RegCmd {
        RegCmd(((target_op as u64) << 48) | ((value as u64) << 16) | offset as u64)
    }

    /// A write of `value` to `reg`.
    pub const fn write(reg: &RegDef, value: u32) -> RegCmd {
        RegCmd::raw(reg.block.target_op(), reg.offset, value)
    }

    pub const fn target_op(self) -> u16 {
        (self.0 >> 48) as u16
    }
    pub const fn offset(self) -> u16 {
        self.0 as u16
    }
    pub const fn value(self) -> u32 {
        (self.0 >> 16) as u32
    }
    pub const fn is_nop(self) -> bool {
        self.0 == 0
    }
    /// Whether this entry is a write to `reg` (without a table look-up).
    pub const fn writes(self, reg: &RegDef) -> bool {
        self.target_op() == reg.block.target_op() && self.offset() == reg.offset
    }
    /// The register this entry writes, if it is in the table.
    pub fn reg(self) -> Option<&'static RegDef> {
        lookup(self.target_op(), self.offset()).map(|(_, r)| r)
    }
}

impl fmt::Debug for RegCmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegCmd({:#018x})", self.0)
    }
}

impl fmt::Display for RegCmd {
    /// `CNA_DATA_SIZE0 DATAIN_WIDTH=1 DATAIN_HEIGHT=4`, `NOP`, or `UNKNOWN target=.. reg=.. value=..`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_nop() {
            return f.write_str("NOP");
        }
        match self.reg() {
            Some(r) => f.write_str(&r.format_value(self.value())),
            None => write!(f, "UNKNOWN target_op={:#06x} reg={:#06x} value={:#010x}", self.target_op(), self.offset(), self.value()),
        }
    }
}

/// Decodes a stream of entries to text, one line per entry: `[idx] raw  NAME FIELD=v …`.
pub fn decode(entries: &[RegCmd]) -> String {
    let mut s = String::new();
    for (i, e) in entries.iter().enumerate() {
        s += &format!("[{i:3}] {:016x}  {e}\n", e.0);
    }
    s
}

/// A register file over the table: what the simulator latches as it executes a regcmd stream.
/// Writes to registers outside the table are refused (the caller reports them loudly).
#[derive(Clone, Debug)]
pub struct RegFile {
    vals: Vec<Option<u32>>,
}

impl Default for RegFile {
    fn default() -> Self {
        RegFile { vals: vec![None; REGISTERS.len()] }
    }
}

impl RegFile {
    /// Applies one entry. Returns the register written, or `None` for a NOP / unknown entry.
    pub fn apply(&mut self, e: RegCmd) -> Option<&'static RegDef> {
        if e.is_nop() {
            return None;
        }
        let (i, r) = lookup(e.target_op(), e.offset())?;
        self.vals[i] = Some(e.value());
        Some(r)
    }

    /// The last value written to `reg`, if any.
    pub fn get(&self, reg: &RegDef) -> Option<u32> {
        self.vals[index_of(reg)]
    }

    /// Natural value of `field` of `reg` (unwritten registers read as 0, like reset state).
    pub fn field(&self, reg: &RegDef, field: Field) -> u64 {
        field.decode(self.get(reg).unwrap_or(0))
    }

    pub fn clear(&mut self, reg: &RegDef) {
        let i = index_of(reg);
        self.vals[i] = None;
    }
}
