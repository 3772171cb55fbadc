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

use clap::{ArgAction, Parser};
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::{regcmd, regs};

mod synth;

/// Largest M, K or N `--synth` accepts (the planner's own limits are far below).
const MAX_SYNTH: usize = 1 << 20;
/// Largest regcmd file decoded (a 1024-program chain is under 1 MiB).
const MAX_FILE_BYTES: u64 = 64 << 20;

#[derive(Parser)]
#[command(
    name = "ork-regdump",
    about = "Prints a regcmd stream as named registers and fields",
    override_usage = "ork-regdump FILE\n       ork-regdump --synth M K N [--cores C] [--soc rk3588|rk3576]"
)]
struct Args {
    /// A regcmd buffer: little-endian u64 entries (e.g. a captured buffer).
    #[arg(value_name = "FILE", required_unless_present = "synth", conflicts_with = "synth")]
    file: Option<String>,
    /// Plan and synthesise the matmul [M,K]×[N,K]ᵀ with fixed IOVAs instead.
    #[arg(long, num_args = 3, value_names = ["M", "K", "N"], action = ArgAction::Set)]
    synth: Option<Vec<usize>>,
    /// NPU cores the plan may use, 1..=3.
    #[arg(long, value_name = "C", default_value = "3", value_parser = clap::value_parser!(u32).range(1..=3), requires = "synth")]
    cores: u32,
    /// The SoC to plan for.
    #[arg(long, value_name = "rk3588|rk3576", default_value = "rk3588", value_parser = soc, requires = "synth")]
    soc: SocId,
}

fn soc(v: &str) -> Result<SocId, String> {
    SocId::parse(v).ok_or_else(|| format!("bad value {v:?}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(synth) = args.synth.as_deref() {
        let &[m, k, n] = synth else { unreachable!("clap gives --synth three values") };
        let (cores, soc) = (args.cores, args.soc);
        if m == 0 || k == 0 || n == 0 || k % 32 != 0 || n % 32 != 0 || m > MAX_SYNTH || k > MAX_SYNTH || n > MAX_SYNTH {
            eprintln!("ork-regdump: need 1 ≤ M ≤ {MAX_SYNTH} and K, N positive multiples of 32 up to {MAX_SYNTH}");
            return ExitCode::from(2);
        }
        return match synth::synth_text(&SocDesc::get(soc), m, k, n, cores) {
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
    let Some(path) = args.file.as_deref() else { unreachable!("clap requires FILE without --synth") };
    match std::fs::metadata(path) {
        Ok(md) if !md.is_file() || md.len() > MAX_FILE_BYTES || md.len() % 8 != 0 => {
            eprintln!("ork-regdump: {path}: not a regcmd buffer (a regular file of 64-bit entries, at most {MAX_FILE_BYTES} bytes)");
            return ExitCode::from(2);
        }
        _ => {}
    }
    match std::fs::read(path) {
        Ok(bytes) => {
            print!("{}", regs::decode(&regcmd::from_bytes(&bytes)));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ork-regdump: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
