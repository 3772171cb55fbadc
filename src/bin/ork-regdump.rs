//! ork-regdump: prints a regcmd stream as named registers and fields.
//!
//! Usage:
//!   ork-regdump FILE                       little-endian u64 entries (e.g. a captured buffer)
//!   ork-regdump --synth M K N [--cores C] [--soc rk3588|rk3576]
//!                                          plan and synthesise a matmul with fixed IOVAs
//!
//! Every line is `[index] raw-hex  NAME FIELD=value …` in natural units (sizes stored minus one
//! are shown as sizes), from the one register table in `ggml_ork::npu::regs`.
use std::process::ExitCode;

use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::{plan, regcmd, regs};

fn usage() -> ExitCode {
    eprintln!("usage: ork-regdump FILE | ork-regdump --synth M K N [--cores C] [--soc rk3588|rk3576]");
    ExitCode::from(2)
}

/// Largest M, K or N `--synth` accepts (the planner's own limits are far below).
const MAX_SYNTH: usize = 1 << 20;
/// Largest regcmd file decoded (a 1024-program chain is under 1 MiB).
const MAX_FILE_BYTES: u64 = 64 << 20;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "-h" || args[0] == "--help" {
        return usage();
    }
    if args[0] == "--synth" {
        let num = |i: usize| args.get(i).and_then(|s| s.parse::<usize>().ok());
        let (Some(m), Some(k), Some(n)) = (num(1), num(2), num(3)) else { return usage() };
        let mut cores = 3u32;
        let mut soc = SocId::Rk3588;
        let mut i = 4;
        while i < args.len() {
            match (args[i].as_str(), args.get(i + 1)) {
                ("--cores", Some(v)) => match v.parse::<u32>() {
                    Ok(c) if (1..=3).contains(&c) => cores = c,
                    _ => return usage(),
                },
                ("--soc", Some(v)) => match SocId::parse(v) {
                    Some(s) => soc = s,
                    None => return usage(),
                },
                _ => return usage(),
            }
            i += 2;
        }
        if m == 0 || k == 0 || n == 0 || k % 32 != 0 || n % 32 != 0 || m > MAX_SYNTH || k > MAX_SYNTH || n > MAX_SYNTH {
            eprintln!("ork-regdump: need 1 ≤ M ≤ {MAX_SYNTH} and K, N positive multiples of 32 up to {MAX_SYNTH}");
            return ExitCode::from(2);
        }
        return match plan::synth_text(&SocDesc::get(soc), m, k, n, cores) {
            Ok(t) => {
                print!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ork-regdump: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match std::fs::metadata(&args[0]) {
        Ok(md) if !md.is_file() || md.len() > MAX_FILE_BYTES || md.len() % 8 != 0 => {
            eprintln!("ork-regdump: {}: not a regcmd buffer (a regular file of 64-bit entries, at most {MAX_FILE_BYTES} bytes)", args[0]);
            return ExitCode::from(2);
        }
        _ => {}
    }
    match std::fs::read(&args[0]) {
        Ok(bytes) => {
            print!("{}", regs::decode(&regcmd::from_bytes(&bytes)));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ork-regdump: {}: {e}", args[0]);
            ExitCode::FAILURE
        }
    }
}
