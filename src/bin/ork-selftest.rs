//! `ork-selftest`: the on-board self-test.
//!
//! Run it on the board before anything else; it answers "does this machine's NPU compute exactly
//! what the CPU reference computes?" in four steps, printing one line per finding:
//!
//! 1. **SoC** from the device tree (or `ORK_SOC`), with its NPU core count and whether its
//!    register-level facts are hardware-validated (RK3576's are not).
//! 2. **Host CPUs**: the big cluster NPU threads will be pinned to.
//! 3. **Kernel interface**: vendor `rknpu` (`/dev/dri/card*`) or mainline `rocket`
//!    (`/dev/accel/accel*`), opened for real, then a buffer life-cycle smoke test (create, write,
//!    sync both ways, read back, destroy; on rknpu also in IOMMU domain 1 where the port has more
//!    than one), after the line saying which port of the vendor interface answered (`kif::port`).
//! 4. **Bit-exact suite** through the NPU core's public API (`Npu::open`, `npu::layout::tile_weight`,
//!    `upload`, `mm_run`) against `reference_mm`, over shapes that exercise each planner path:
//!    the minimal 4×32×32 recipe, M = 1 full-K decode up to the 10752 ceiling and just past it,
//!    odd M, K-split prefill, N beyond the 8192-per-program limit, a prefill run as three
//!    pieces (`mm_run_pieces`: the cores run one piece while the next ones' rows are written),
//!    and worst-case magnitudes.
//!
//! Exit codes: 0 all passed · 1 a check failed · 2 no NPU device (the reason is printed as
//! "no NPU device found: <reason>"), or an argument it does not know (it takes none but
//! `--help` and `--version`).
//!
//! `ORK_LOG=error|warn|info|debug|trace` sets the log level (default warn). The other `ORK_*`
//! variables that concern the NPU (`ORK_SOC`, `ORK_NPU_CARD`, `ORK_NO_AFFINITY`,
//! `ORK_WCACHE_BUDGET_MB`, `ORK_MM_TIMEOUT`) apply as in the plugin; all are parsed by
//! `ggml_ork::config`.

use std::process::ExitCode;
use std::time::Instant;

use ggml_ork::config::Config;
use ggml_ork::npu::detect::{self, KifKind};
use ggml_ork::os::hostcpu;
use ggml_ork::npu::kif::{self, DomainId, KernelInterface, SyncDir};
use ggml_ork::npu::soc::{SocDesc, SocId};

use ggml_ork::npu::{reference_mm, Budget, Npu, NpuConfig, NpuKind};

const EXIT_OK: u8 = 0;
const EXIT_FAIL: u8 = 1;
const EXIT_NO_DEVICE: u8 = 2;


// ---------------------------------------------------------------------------------------------

struct StderrLogger(log::LevelFilter);

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.0
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("[{} {}] {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

/// The configuration from the environment, with this tool's default log level (warn), and the
/// logger at its level; bad values are logged once each.
fn config_and_logging() -> Config {
    let (cfg, bad) = Config::from_lookup(|k| match std::env::var(k).ok() {
        None if k == "ORK_LOG" => Some("warn".into()),
        v => v,
    });
    let logger: &'static StderrLogger = Box::leak(Box::new(StderrLogger(cfg.log_level)));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(cfg.log_level);
    }
    for b in bad {
        log::warn!("{b}");
    }
    cfg
}

/// Deterministic i8 data (xorshift64*), full range including -128.
fn rand_i8(seed: u64, len: usize) -> Vec<i8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8 as i8
        })
        .collect()
}

/// One bit-exact case: C[M, N] = A[M, K] · W[N, K]ᵀ.
struct Case {
    m: usize,
    k: usize,
    n: usize,
    what: &'static str,
    /// Fill A and W with -128 everywhere (largest accumulator magnitude).
    extreme: bool,
    /// Run M as this many pieces (`Npu::mm_run_pieces`, every piece's rows written before any
    /// result is read: the cores run one piece while the next ones' rows land); 1 = one run.
    pieces: usize,
}

fn cases(soc: &SocDesc) -> Vec<Case> {
    let ceil = soc.fullk_ceiling as usize;
    let nmax = soc.n_max_per_program as usize;
    let c = |m, k, n, what| Case { m, k, n, what, extreme: false, pieces: 1 };
    vec![
        c(4, 32, 32, "minimal recipe"),
        c(1, 32, 32, "M=1 minimal"),
        c(1, 2048, 2048, "decode, full-K"),
        c(1, ceil, 64, "decode at the full-K ceiling"),
        c(1, ceil + 512, 64, "decode past the ceiling (K-split)"),
        c(7, 1024, 96, "odd M"),
        c(64, 2048, 512, "prefill, full-K M-tiles"),
        c(130, 3072, 256, "prefill, K-split"),
        c(2, 512, nmax + 1024, "N beyond one program"),
        c(256, 2048, 1024, "larger prefill, multi-core"),
        Case { m: 384, k: 2048, n: 1024, what: "prefill in three pieces", extreme: false, pieces: 3 },
        Case { m: 1, k: ceil, n: 32, what: "worst-case magnitude", extreme: true, pieces: 1 },
    ]
}

/// Runs the bit-exact suite on the device through the NPU core. Returns the number of failed
/// cases, or why the suite could not start.
fn run_bit_exact_suite(config: &Config, kind: NpuKind, soc: Option<SocId>) -> Result<usize, String> {
    let cfg = NpuConfig {
        kind,
        soc,
        card: config.npu_card.as_ref().map(Into::into),
        max_cores: None,
        pin_cpus: hostcpu::big_cores_for_pinning(config.no_affinity),
        wcache_budget_bytes: config.wcache_budget_mb.map(|mb| mb << 20),
        timeout_ms: config.mm_timeout_ms,
        domain_cap_bytes: config.domain_cap_mb.map(|mb| mb << 20),
        sim_fault: None,
        sim_board_timing: false,
        smallest_m: 0,
    };
    let npu = Npu::open(&cfg).map_err(|e| format!("Npu::open: {e}"))?;
    let desc = npu.soc().clone();
    let mut failed = 0;
    for (i, cs) in cases(&desc).iter().enumerate() {
        let (m, k, n) = (cs.m, cs.k, cs.n);
        let (a, w) = if cs.extreme {
            (vec![-128i8; m * k], vec![-128i8; n * k])
        } else {
            (rand_i8(2 * i as u64 + 1, m * k), rand_i8(2 * i as u64 + 2, n * k))
        };
        let t0 = Instant::now();
        let run = || -> Result<Vec<i32>, String> {
            let tw = ggml_ork::npu::layout::tile_weight(&desc, &w, n, k).map_err(|e| format!("tile_weight: {e}"))?;
            let rw = npu.upload(&tw).map_err(|e| format!("upload: {e}"))?;
            let mut c = vec![0i32; m * n];
            if cs.pieces <= 1 {
                npu.mm_run(&rw, &a, m, &mut c, Budget::default()).map_err(|e| format!("mm_run: {e}"))?;
                return Ok(c);
            }
            let bounds: Vec<(usize, usize)> = (0..cs.pieces).map(|p| (p * m / cs.pieces, (p + 1) * m / cs.pieces)).collect();
            let mut pr = npu.mm_run_pieces(&rw, &bounds, Budget::default(), 0).map_err(|e| format!("mm_run_pieces: {e}"))?;
            for (i, &(r0, r1)) in bounds.iter().enumerate() {
                pr.fill(i, &a[r0 * k..r1 * k]).map_err(|e| format!("piece {i}: {e}"))?;
            }
            for (i, &(r0, r1)) in bounds.iter().enumerate() {
                let (sh, _) = pr.take(i).map_err(|e| format!("piece {i}: {e}"))?;
                sh.copy_to(&mut c[r0 * n..r1 * n]);
            }
            Ok(c)
        };
        let label = format!("M={m} K={k} N={n} ({})", cs.what);
        match run() {
            Ok(c) => {
                let dt = t0.elapsed();
                let want = reference_mm(&a, &w, m, k, n);
                match c.iter().zip(&want).position(|(x, y)| x != y) {
                    None => println!("  pass  {label}  {:.1} ms", dt.as_secs_f64() * 1e3),
                    Some(p) => {
                        let bad = c.iter().zip(&want).filter(|(x, y)| x != y).count();
                        println!(
                            "  FAIL  {label}: {bad} of {} differ; first at row {} col {}: got {} want {}",
                            c.len(),
                            p / n,
                            p % n,
                            c[p],
                            want[p]
                        );
                        failed += 1;
                    }
                }
            }
            Err(e) => {
                println!("  FAIL  {label}: {e}");
                failed += 1;
            }
        }
    }
    Ok(failed)
}

/// Buffer life cycle on the raw kernel interface: create, write, sync both ways, read back,
/// destroy. Touches DRAM only; submits nothing.
fn interface_smoke(dev: &dyn KernelInterface, domain: DomainId) -> Result<(), String> {
    const BYTES: usize = 64 * 1024;
    let mut bo = dev
        .mem_create(BYTES, kif::mem_flags::DATA, domain)
        .map_err(|e| format!("mem_create in domain {}: {e}", domain.0))?;
    let pattern = rand_i8(0x5eed + domain.0 as u64, BYTES);
    let result = (|| {
        if bo.size_bytes < BYTES || bo.iova.0 % 4096 != 0 {
            return Err(format!("unexpected buffer {bo:?}"));
        }
        bo.bytes_mut()[..BYTES].copy_from_slice(bytemuck::cast_slice(&pattern));
        dev.mem_sync_all(&bo, SyncDir::ToDevice).map_err(|e| format!("mem_sync(to device): {e}"))?;
        dev.mem_sync_all(&bo, SyncDir::FromDevice).map_err(|e| format!("mem_sync(from device): {e}"))?;
        if bo.bytes()[..BYTES] != *bytemuck::cast_slice::<i8, u8>(&pattern) {
            return Err("read-back differs from what was written".into());
        }
        Ok(format!("{bo:?}"))
    })();
    let destroyed = dev.mem_destroy(bo).map_err(|e| format!("mem_destroy: {e}"));
    let desc = result?;
    destroyed?;
    println!("  pass  buffer life cycle in domain {}: {desc}", domain.0);
    Ok(())
}

/// Command line: no flags of its own (`--help` says what it does); the settings are `ORK_*`
/// variables, as in the plugin.
#[derive(clap::Parser)]
#[command(
    name = "ork-selftest",
    version,
    about = "The on-board self-test: does this machine's NPU compute exactly what the CPU reference computes?",
    after_help = "Steps: SoC, host CPUs, kernel interface (a buffer life-cycle smoke test), the NPU core's bit-exact suite.\n\
                  Exit codes: 0 all passed, 1 a check failed, 2 no NPU device (or an unknown argument).\n\
                  Settings: ORK_LOG=error|warn|info|debug|trace (default warn), ORK_SOC, ORK_NPU_CARD, ORK_NO_AFFINITY, ORK_WCACHE_BUDGET_MB, ORK_MM_TIMEOUT."
)]
struct Args {}

fn main() -> ExitCode {
    let Args {} = clap::Parser::parse();
    let config = config_and_logging();
    println!("ork-selftest {}", env!("CARGO_PKG_VERSION"));

    // 1. SoC
    let soc = match detect::detect_soc(config.soc.as_deref()) {
        Ok(id) => {
            let d = SocDesc::get(id);
            println!(
                "soc: {} ({} NPU cores{})",
                id.name(),
                d.cores,
                if d.validated { "" } else { "; register-level facts NOT validated on hardware" }
            );
            Some(id)
        }
        Err(e) => {
            println!("soc: unknown ({e})");
            None
        }
    };

    // 2. Host CPUs
    let big = hostcpu::big_cores();
    let pin = hostcpu::big_cores_for_pinning(config.no_affinity);
    println!(
        "host cpus: online {:?}, big cluster {:?}{}",
        hostcpu::online_cpus(),
        big,
        if pin.is_empty() && !big.is_empty() { " (pinning disabled)" } else { "" }
    );

    // 3. Kernel interface
    let node = match detect::find_npu_node(config.npu_card.as_deref().map(std::path::Path::new)) {
        Ok(n) => n,
        Err(e) => {
            println!("no NPU device found: {e}");
            return ExitCode::from(EXIT_NO_DEVICE);
        }
    };
    println!("npu interface: {} at {}", node.kind.name(), node.path.display());
    let opened = match node.kind {
        KifKind::Rknpu => kif::rknpu::Rknpu::open_path(&node.path).map(|d| {
            // Which port of the vendor interface answered, and what it is trusted with.
            let (answers, caps) = d.caps();
            println!("  {}", caps.line(answers));
            Box::new(d) as Box<dyn KernelInterface>
        }),
        KifKind::Rocket => kif::rocket::Rocket::open_path(&node.path).map(|d| Box::new(d) as Box<dyn KernelInterface>),
    };
    let dev = match opened {
        Ok(d) => d,
        Err(e) => {
            println!("FAIL  {} present but unusable: {e}", node.kind.name());
            return ExitCode::from(EXIT_FAIL);
        }
    };
    println!("  {}", dev.describe());
    let mut domains = vec![DomainId(0)];
    if node.kind == KifKind::Rknpu && dev.max_domains() > 1 {
        domains.push(DomainId(1));
    }
    for d in domains {
        if let Err(e) = interface_smoke(dev.as_ref(), d) {
            println!("  FAIL  buffer life cycle: {e}");
            return ExitCode::from(EXIT_FAIL);
        }
    }
    drop(dev); // the NPU core opens its own connection.

    // 4. Bit-exact suite
    let kind = match node.kind {
        KifKind::Rknpu => NpuKind::Rknpu,
        KifKind::Rocket => NpuKind::Rocket,
    };
    println!("bit-exact suite ({}):", node.kind.name());
    match run_bit_exact_suite(&config, kind, soc) {
        Ok(0) => {
            println!("all checks passed");
            ExitCode::from(EXIT_OK)
        }
        Ok(n) => {
            println!("{n} case(s) FAILED");
            ExitCode::from(EXIT_FAIL)
        }
        Err(e) => {
            println!("FAIL  bit-exact suite could not start: {e}");
            ExitCode::from(EXIT_FAIL)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_mm_is_a_times_w_transposed() {
        // A = [[1, 2], [3, 4]], W = [[5, 6], [7, 8], [-1, 0]] → C = A·Wᵀ.
        let c = reference_mm(&[1, 2, 3, 4], &[5, 6, 7, 8, -1, 0], 2, 2, 3);
        assert_eq!(c, vec![17, 23, -1, 39, 53, -3]);
    }

    #[test]
    fn random_data_is_deterministic_and_full_range() {
        let a = rand_i8(1, 4096);
        assert_eq!(a, rand_i8(1, 4096));
        assert_ne!(a, rand_i8(2, 4096));
        assert!(a.contains(&-128) && a.contains(&127));
    }

    #[test]
    fn suite_shapes_respect_alignment() {
        for soc in [SocId::Rk3588, SocId::Rk3576] {
            let d = SocDesc::get(soc);
            for c in cases(&d) {
                assert_eq!(c.k % d.k_align as usize, 0, "{}", c.what);
                assert_eq!(c.n % d.n_align as usize, 0, "{}", c.what);
            }
        }
    }
}
