//! Register table: every field of every register round-trips encode → regcmd entry → decode
//! (proptest), out-of-range values are refused, fields never overlap, (target, offset) keys
//! are unique, and the decoder names entries the way the pretty-printer promises.
use ggml_ork::npu::regs::{self, Enc, RegCmd, RegFile, REGISTERS};
use proptest::prelude::*;

fn max_natural(f: &regs::Field) -> u64 {
    let raw_max = if f.width() >= 64 { u64::MAX } else { (1u64 << f.width()) - 1 };
    match f.enc {
        Enc::Plain => raw_max,
        Enc::MinusOne => raw_max + 1,
        Enc::Shr(n) => raw_max << n,
    }
}

fn min_natural(f: &regs::Field) -> u64 {
    match f.enc {
        Enc::MinusOne => 1,
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn every_field_round_trips(ri in 0..REGISTERS.len(), fi in any::<prop::sample::Index>(), x in any::<u64>(), other in any::<u32>()) {
        let reg = REGISTERS[ri];
        let f = reg.fields[fi.index(reg.fields.len())];
        let (lo, hi) = (min_natural(&f), max_natural(&f));
        let mut v = lo + x % (hi - lo + 1);
        if let Enc::Shr(n) = f.enc { v &= !((1u64 << n) - 1); }
        let bits = f.encode(reg.name, v).unwrap();
        // Other fields' bits stay untouched by a write of this field.
        let word = (other & !f.mask()) | bits;
        let e = RegCmd::write(reg, word);
        prop_assert_eq!(e.target_op(), reg.block.target_op());
        prop_assert_eq!(e.offset(), reg.offset);
        prop_assert_eq!(e.value(), word);
        let back = e.reg().expect("decodes to a table register");
        prop_assert_eq!(back.name, reg.name);
        prop_assert_eq!(back.field(f.name).unwrap().decode(e.value()), v);
        let mut rf = RegFile::default();
        rf.apply(e);
        prop_assert_eq!(rf.field(reg, f), v);
        // The printed line carries the field.
        let text = e.to_string();
        let shown = if f.width() >= 16 && v > 0xffff { format!("{}={:#x}", f.name, v) } else { format!("{}={}", f.name, v) };
        prop_assert!(text.contains(&shown), "{} missing from {}", shown, text);
    }

    #[test]
    fn out_of_range_is_refused(ri in 0..REGISTERS.len(), fi in any::<prop::sample::Index>(), extra in 1u64..1000) {
        let reg = REGISTERS[ri];
        let f = reg.fields[fi.index(reg.fields.len())];
        if let Some(too_big) = max_natural(&f).checked_add(extra) {
            prop_assert!(f.encode(reg.name, too_big).is_err());
        }
        if f.enc == Enc::MinusOne { prop_assert!(f.encode(reg.name, 0).is_err()); }
    }
}

#[test]
fn fields_do_not_overlap_and_keys_are_unique() {
    let mut keys = std::collections::HashSet::new();
    for r in REGISTERS {
        assert!(keys.insert((r.block.target_op(), r.offset)), "duplicate register {}", r.name);
        assert_eq!(r.offset % 4, 0, "{} offset", r.name);
        let mut seen = 0u32;
        for f in r.fields {
            assert!(f.hi >= f.lo && f.hi < 32, "{}.{}", r.name, f.name);
            assert_eq!(seen & f.mask(), 0, "{}.{} overlaps", r.name, f.name);
            seen |= f.mask();
        }
        assert!(r.name.starts_with(r.block.name()) || matches!(r.block, regs::Block::OpEnable | regs::Block::Op41));
    }
}

#[test]
fn pretty_printer_example_and_nop() {
    let e = RegCmd::write(&regs::CNA_DATA_SIZE0::REG, (1 << 16) | 4);
    assert_eq!(e.to_string(), "CNA_DATA_SIZE0 DATAIN_WIDTH=1 DATAIN_HEIGHT=4");
    assert_eq!(RegCmd::NOP.to_string(), "NOP");
    assert!(RegCmd::raw(0x0201, 0x10fc, 5).to_string().starts_with("UNKNOWN"));
    assert!(RegCmd::write(&regs::CNA_DATA_SIZE0::REG, 1 << 31).to_string().contains("RESERVED_BITS=0x80000000"));
    // Packing a field of another register is refused.
    assert!(regs::CNA_DATA_SIZE0::REG.pack(&[(regs::CNA_DATA_SIZE1::DATAIN_CHANNEL, 1)]).is_err());
}
