//! Golden regcmd streams for canonical shapes, compared as decoded text against
//! `tests/golden/*.txt` (regenerate with `ORK_BLESS=1 cargo test --test npu_golden`; see
//! tests/golden/README.md). The RKNN-capture shape is additionally checked word by word
//! against the template values of rknpu-facts §2.2 — an independent source.
#[path = "../src/bin/ork-regdump/synth.rs"]
mod synth;

use synth::{synth_fixed, synth_text};
use ggml_ork::npu::regcmd::{BODY_ENTRIES, PROGRAM_ENTRIES};
use ggml_ork::npu::regs::RegCmd;
use ggml_ork::npu::soc::{SocDesc, SocId};

fn golden(name: &str, m: usize, k: usize, n: usize, cores: u32) {
    let soc = SocDesc::get(SocId::Rk3588);
    let text = synth_text(&soc, m, k, n, cores).unwrap();
    let path = format!("{}/tests/golden/{name}.txt", env!("CARGO_MANIFEST_DIR"));
    if std::env::var("ORK_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e} (run with ORK_BLESS=1)"));
    if text != want {
        for (i, (a, b)) in text.lines().zip(want.lines()).enumerate() {
            if a != b {
                panic!("{name}: first difference at line {}:\n  got:  {a}\n  want: {b}", i + 1);
            }
        }
        panic!("{name}: line counts differ ({} vs {})", text.lines().count(), want.lines().count());
    }
}

#[test]
fn golden_m4_k32_n32_rknn_capture_shape() {
    golden("m4_k32_n32", 4, 32, 32, 1);
}

#[test]
fn golden_m1_k4096_n64_fullk_decode() {
    golden("m1_k4096_n64_fullk", 1, 4096, 64, 1);
}

#[test]
fn golden_m3_k2080_n32_chained_ksplit() {
    golden("m3_k2080_n32_ksplit_chain", 3, 2080, 32, 1);
}

#[test]
fn golden_m300_k512_n64_m_scheduler() {
    golden("m300_k512_n64_sched", 300, 512, 64, 1);
}

/// Every value of rknpu-facts §2.2 for mc=4, K=32, N=32 (s = N), addresses A/B/C at the synth
/// IOVAs, as (entry, target|op, register, value).
#[test]
fn capture_shape_matches_fact_sheet_values() {
    let soc = SocDesc::get(SocId::Rk3588);
    let subs = synth_fixed(&soc, 4, 32, 32, 1).unwrap();
    assert_eq!(subs.len(), 1);
    let e = &subs[0].2;
    assert_eq!(e.len(), PROGRAM_ENTRIES);
    let cna = 0x0201u16;
    let core = 0x0801u16;
    let dpu = 0x1001u16;
    let mut want: Vec<(usize, u16, u16, u32)> = vec![
        (0, cna, 0x1040, 0xb1), (1, cna, 0x1104, 0), (2, cna, 0x1100, 0), (3, cna, 0x100c, 0x2000_0000),
        (4, dpu, 0x4004, 0x0e), (5, cna, 0x100c, 0x2000_0000), (6, cna, 0x1010, 16 * 5), (7, cna, 0x1014, 9),
        (8, cna, 0x1020, 0x1_0004), (9, cna, 0x1024, (31 << 16) | 32), (10, cna, 0x1028, 1), (11, cna, 0x102c, 4),
        (12, cna, 0x1030, 32 * 32), (13, cna, 0x1034, 32), (14, cna, 0x1038, 0x0101_0000 | 32), (15, cna, 0x1040, 0xb1),
        (16, cna, 0x1044, 1), (17, cna, 0x104c, 0x0b), (18, cna, 0x1050, 0x1_0000), (19, cna, 0x1054, 0x1_0000),
        (20, cna, 0x1058, 0x1_0000), (21, cna, 0x105c, 0x1_0000), (22, cna, 0x1060, 0), (23, cna, 0x1064, 0),
        (24, cna, 0x1068, 0), (25, cna, 0x1070, 0x0100_0000), (26, cna, 0x1074, 0), (27, cna, 0x1078, 0x000f_000f),
        (28, cna, 0x107c, 32 / 16), (29, cna, 0x1080, 0), (30, cna, 0x1084, 0x1_0004), (31, cna, 0x1088, 32),
        (32, cna, 0x1100, 0), (33, cna, 0x1104, 0), (34, cna, 0x1110, 0x0200_0000),
        (51, cna, 0x1180, 0), (52, cna, 0x1184, 0),
        (53, core, 0x3010, 1), (54, core, 0x3014, 3 << 16), (55, core, 0x3018, 31), (56, core, 0x301c, 0), (57, core, 0x3030, 0),
        (58, dpu, 0x400c, 0x1e4), (59, dpu, 0x4010, 0x8000_0000), (60, dpu, 0x4014, 0), (61, dpu, 0x4020, 0x0300_0000),
        (62, dpu, 0x4024, 0x10), (63, dpu, 0x4030, 0), (64, dpu, 0x4034, 3), (65, dpu, 0x4038, (7 << 16) | 7),
        (66, dpu, 0x403c, (31 << 16) | 31), (67, dpu, 0x4040, 0x53), (68, dpu, 0x4044, 0), (69, dpu, 0x4048, 0),
        (70, dpu, 0x404c, 0), (71, dpu, 0x4050, 0x7fc), (72, dpu, 0x4054, 0), (73, dpu, 0x4058, 31),
        (74, dpu, 0x405c, 3 << 16), (75, dpu, 0x4060, 0x53), (79, dpu, 0x4070, 0x383), (80, dpu, 0x4074, 0),
        (81, dpu, 0x4078, 1), (82, dpu, 0x407c, 0), (83, dpu, 0x4080, 0), (84, dpu, 0x4084, 1), (85, dpu, 0x4088, 0),
        (94, dpu, 0x40c0, 0x80), (95, dpu, 0x40c4, 0),
        (109, 0x0101, 0x0014, 0), (110, 0x0041, 0, 0), (111, 0x0081, 0x0008, 0x0d),
    ];
    for i in 0..16 {
        want.push((35 + i, cna, 0x1140 + 4 * i as u16, 0));
    }
    for i in 0..8 {
        want.push((86 + i, dpu, 0x4090 + 4 * i as u16, 0));
    }
    for i in 0..12 {
        want.push((96 + i, dpu, 0x4100 + 4 * i as u16, 0));
    }
    for (i, t, r, v) in &want {
        assert_eq!(e[*i], RegCmd::raw(*t, *r, *v), "entry {i}: got {}", e[*i]);
    }
    assert_eq!(e[108], RegCmd::NOP, "single program: entry 108 is a NOP");
    let mut covered: Vec<usize> = want.iter().map(|w| w.0).collect();
    covered.extend([76, 77, 78, 108]);
    for (i, x) in e.iter().enumerate().take(BODY_ENTRIES) {
        if !covered.contains(&i) {
            // BN_ALU/BN_MUL/BN_RELUX (76–78) are zero in the capture too.
            panic!("entry {i} ({x}) not checked");
        }
    }
    assert!(e.len() > 78, "{} entries", e.len());
    for (i, x) in e.iter().enumerate().take(79).skip(76) {
        assert_eq!(x.value(), 0, "entry {i}");
    }
}

#[test]
fn chain_links_point_at_the_next_program() {
    let soc = SocDesc::get(SocId::Rk3588);
    let subs = synth_fixed(&soc, 3, 2080, 32, 1).unwrap();
    let e = &subs[0].2;
    let programs = e.len() / PROGRAM_ENTRIES;
    assert_eq!(programs, 3, "K=2080: slices 1024 + 1024 + 32");
    for p in 0..programs {
        let t = &e[p * PROGRAM_ENTRIES + BODY_ENTRIES..(p + 1) * PROGRAM_ENTRIES];
        if p + 1 < programs {
            let next = synth::SYNTH_REGCMD_IOVA + ((p + 1) * PROGRAM_ENTRIES * 8) as u32;
            assert_eq!(t[0], RegCmd::raw(0x0101, 0x0010, next), "program {p} link");
            assert_eq!(t[1], RegCmd::raw(0x0101, 0x0014, 0x37), "program {p} amount");
        } else {
            assert_eq!(t[0], RegCmd::NOP);
            assert_eq!(t[1], RegCmd::raw(0x0101, 0x0014, 0));
        }
    }
}
