//! The reports of the counters (`counters`): the exit summary a backend prints when it is freed
//! (a few lines, in the manner of llama.cpp's `llama_perf_context_print`: what ran where, the
//! fallbacks, memory, time) and, with `ORK_PROFILE=1`, the full breakdown after it (one long
//! line) and the per-op-kind profile table. Nothing here decides: [`finish`], run when a backend
//! is freed, copies the NPU's health counts and the memory in before it prints, and flushes the
//! calibration store after.

use super::stream::Streamer;
use super::{Device, Memory, PhaseStats, Stats};
use crate::route::arbiter::Arbiter;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Lines the exit summary has at most, and characters per line (the logger's `ork: ` included).
pub const SUMMARY_LINES: usize = 6;
pub const SUMMARY_WIDTH: usize = 120;

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl Stats {
    /// The exit summary, one string per line (the logger prefixes each with `ork: `):
    ///
    /// ```text
    /// ORK ran: npu 207 MUL_MAT (621 submits, 10764 rows sent = 1.00x plain W8A8)
    ///   gpu: 0 MUL_MAT (0 submits, 0.0 ms); cpu: 4650 MUL_MAT left at graph split (M < ORK_MINM)
    ///   fallbacks: 0 after NPU errors (0 failed runs), 0 NPU busy; never-ran jobs: 0 (0 resubmitted)
    ///   memory (MiB): resident 201.8 (GGUF copy 0.0, int8 tiles 98.7 + 0.0), peak 201.8; GGUF mapped 136.4
    ///   weights: 207 cache hits, 0 packs (0 cache writes) in 1322 ms
    ///   time (ms): npu 475.3, act-quant 11.9, dequant 20.9, correction 0.3 for 207 MUL_MAT
    /// ```
    ///
    /// "npu N MUL_MAT" counts only MUL_MATs whose NPU runs all succeeded; "after NPU errors" the
    /// ones computed on the CPU after a failed NPU run, "NPU busy" those computed on the CPU while
    /// another process held the NPU; "never-ran jobs" the NPU jobs that reported done but did not
    /// run (detected, and resubmitted). "GGUF mapped": the GGUF bytes read in place from
    /// llama.cpp's mapping of the model file (file-backed), not in the resident total. Added
    /// only when there are any: the kernel interface's per-core copies (none on any interface
    /// today), the weights made streamed ones, and the budget's outcome (weights not made
    /// resident, kept to one int8 term). `m`: the memory now ([`Stats::memory`]); `streamed`:
    /// weights made streamed ones (`stream`).
    pub fn summary(&self, m: &Memory, streamed: u64) -> Vec<String> {
        let n = |a: &AtomicU64| a.load(Relaxed);
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let copies = if m.copies > 0 { format!(", per-core copies {:.1}", mib(m.copies)) } else { String::new() };
        let mut weights = format!(
            "  weights: {} cache hits, {} packs ({} cache writes) in {:.0} ms",
            n(&self.cache_hits), n(&self.packed), n(&self.cache_writes), ms(&self.pack_ns)
        );
        if streamed > 0 {
            weights += &format!(", {streamed} streamed");
        }
        match (n(&self.not_resident_weights), n(&self.one_term_for_budget)) {
            (0, 0) => {}
            (cpu, one) => weights += &format!("; budget: {cpu} not resident, {one} one int8 term"),
        }
        vec![
            format!(
                "ORK ran: npu {} MUL_MAT ({} submits, {} rows sent = {:.2}x plain W8A8)",
                n(&self.npu_matmuls), n(&self.submits), n(&self.npu_rows_sent), n(&self.npu_rows_sent) as f64 / n(&self.npu_rows).max(1) as f64,
            ),
            format!(
                "  gpu: {} MUL_MAT ({} submits, {:.1} ms); cpu: {} MUL_MAT left at graph split (M < ORK_MINM)",
                n(&self.gpu_matmuls), n(&self.gpu_submits), ms(&self.gpu_ns), n(&self.declined_small_m),
            ),
            format!(
                "  fallbacks: {} after NPU errors ({} failed runs), {} NPU busy; never-ran jobs: {} ({} resubmitted)",
                n(&self.npu_fallbacks), n(&self.npu_errors), self.busy_fallbacks(), n(&self.npu_never_ran), n(&self.npu_retries),
            ),
            format!(
                "  memory (MiB): resident {:.1} (GGUF copy {:.1}, int8 tiles {:.1} + {:.1}{copies}), peak {:.1}; GGUF mapped {:.1}",
                mib(m.total), mib(m.gguf), mib(m.tiles[0]), mib(m.tiles[1]), mib(m.peak), mib(m.gguf_mapped),
            ),
            weights,
            format!(
                "  time (ms): npu {:.1}, act-quant {:.1}, dequant {:.1}, correction {:.1} for {} MUL_MAT",
                ms(&self.npu_ns), ms(&self.quant_ns), ms(&self.dequant_ns), ms(&self.mean_ns), n(&self.mean_corrected),
            ),
        ]
    }
}

impl Memory {
    /// "resident 12.3 MiB (GGUF copy …, compute buffers …, int8 tiles … + … (terms 1 + 2),
    /// scales …, NPU scratch …, per-core copies …), peak … MiB; GGUF file-backed … MiB (…)".
    pub fn line(&self) -> String {
        format!(
            "resident {:.1} MiB (GGUF copy {:.1}, compute buffers {:.1}, int8 tiles {:.1} + {:.1} (terms 1 + 2), scales {:.1}, NPU scratch {:.1}, per-core copies {:.1}), peak {:.1} MiB; \
             GGUF file-backed {:.1} MiB (read in place from llama.cpp's mapping of the model file, not in the total)",
            mib(self.total), mib(self.gguf), mib(self.buffers), mib(self.tiles[0]), mib(self.tiles[1]),
            mib(self.scales), mib(self.scratch), mib(self.copies), mib(self.peak), mib(self.gguf_mapped),
        )
    }
}

impl PhaseStats {
    /// "synced N MiB (X× the bytes the submits read and write)".
    pub fn synced_words(&self) -> String {
        let (s, io) = (self.synced_bytes.load(Relaxed), self.io_bytes.load(Relaxed));
        format!("synced {:.1} MiB ({:.2}× the bytes the submits read and write)", mib(s), s as f64 / io.max(1) as f64)
    }
}

impl Stats {
    /// The full breakdown (`ORK_PROFILE=1`, after the summary), one line. "ORK ran N MUL_MAT on
    /// the NPU" counts only MUL_MATs whose results came from the NPU; the ones computed on the CPU
    /// instead are counted after it, by cause.
    pub fn breakdown(&self, m: &Memory, stream: &Streamer) -> String {
        let n = |a: &AtomicU64| a.load(Relaxed);
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let p = &self.phase[0];
        format!(
            "ORK ran {} MUL_MAT on the NPU ({} rows sent = {:.2}x plain W8A8, {} submits) and {} on the GPU ({} submits, {:.1} ms); {} MUL_MAT graph nodes were left to the CPU \
             (M < ORK_MINM) at graph split; {} MUL_MAT fell back to the CPU after NPU errors ({} failed NPU runs, {:.1} ms on the CPU) \
             and {} while another process held the NPU; NPU jobs that reported done but never ran: {} detected, {} resubmitted; weights: {} cache hits, {} packs \
             ({} cache writes), prepared in {:.0} ms (source hash {:.0} ms, cache open {:.0} ms, import + verify {:.0} ms; \
             packing {:.0} ms, upload {:.0} ms, cache write {:.0} ms){}; time: act-quant {:.1} ms, npu {:.1} ms, dequant {:.1} ms, \
             correction {:.1} ms on the host for {} MUL_MAT (each row along its weight's calibrated direction; its dots and adds \
             otherwise inside act-quant and dequant); \
             prefill MUL_MAT: host {:.1} ms on the critical path, NPU device {:.1} ms ({:.1} ms of host work: act-quant, submit, dequant, arbiter; \
             {} MUL_MAT in {} pieces, pipelined where cut), {}; decode MUL_MAT: {}; {}",
            n(&self.npu_matmuls), n(&self.npu_rows_sent), n(&self.npu_rows_sent) as f64 / n(&self.npu_rows).max(1) as f64, n(&self.submits),
            n(&self.gpu_matmuls), n(&self.gpu_submits), ms(&self.gpu_ns),
            n(&self.declined_small_m),
            n(&self.npu_fallbacks), n(&self.npu_errors), ms(&self.fallback_ns),
            self.busy_fallbacks(),
            n(&self.npu_never_ran), n(&self.npu_retries),
            n(&self.cache_hits), n(&self.packed), n(&self.cache_writes),
            ms(&self.pack_ns), ms(&self.cache_hash_ns), ms(&self.cache_read_ns), ms(&self.cache_import_ns),
            ms(&self.cold_pack_ns), ms(&self.cold_upload_ns), ms(&self.cache_store_ns),
            match (n(&self.one_term_for_budget), n(&self.not_resident_weights)) {
                (0, 0) => String::new(),
                (one, cpu) => format!(
                    "; {one} weights kept one int8 term for want of resident budget and {cpu} were not made resident (their MUL_MATs run on the CPU; \
                     budget: ORK_WCACHE_BUDGET_MB, default RAM - 1 GiB - ORK buffers)"
                ),
            } + &stream.line(),
            ms(&self.quant_ns), ms(&self.npu_ns), ms(&self.dequant_ns), ms(&self.mean_ns), n(&self.mean_corrected),
            ms(&p.critical_ns), ms(&p.wait_ns), ms(&p.quant_ns) + ms(&p.submit_ns) + ms(&p.dequant_ns) + ms(&p.arb_ns),
            n(&p.runs), n(&p.pieces), p.synced_words(),
            self.phase[1].synced_words(),
            m.line(),
        )
    }

    /// The `ORK_PROFILE=1` table: per op kind (prefill / decode MUL_MAT), which engine ran it, how
    /// many times, and the time split.
    pub fn profile(&self, m: &Memory, arb: Option<&Arbiter>) -> String {
        let n = |a: &AtomicU64| a.load(Relaxed);
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let mut out = format!("ORK profile (per op kind; {}):", m.line());
        for (i, name) in ["prefill", "decode"].iter().enumerate() {
            let p = &self.phase[i];
            out += &format!(
                "\n  {name:7} MUL_MAT: npu {} runs ({} rows sent = {:.2}x plain W8A8; act-quant {:.1} ms (the reuse check {:.1} ms), submit {:.1} ms (the cores' host work {:.1} ms, past the hardware time {:.1} ms), wait {:.1} ms, dequant {:.1} ms, arbiter {:.1} ms; \
                 host on the critical path {:.1} ms, {} pieces), \
                 {} fell back to the CPU after NPU errors, {} on the CPU while another process held the NPU, gpu {} runs, cpu {} runs in ORK's graph",
                n(&p.runs), n(&p.rows_sent), n(&p.rows_sent) as f64 / n(&p.rows).max(1) as f64,
                ms(&p.quant_ns), ms(&p.check_ns), ms(&p.submit_ns), ms(&p.core_host_ns), ms(&p.late_ns),
                ms(&p.wait_ns), ms(&p.dequant_ns), ms(&p.arb_ns), ms(&p.critical_ns), n(&p.pieces),
                n(&p.npu_failed), n(&p.fallback), n(&self.gpu_phase[i]), n(&self.cpu_mm[i]),
            );
        }
        out += &format!(
            "\n  NPU failures: {} failed NPU runs ({:.1} ms on the CPU instead); {} jobs reported done but never ran, {} resubmitted",
            n(&self.npu_errors), ms(&self.fallback_ns), n(&self.npu_never_ran), n(&self.npu_retries),
        );
        out += &format!(
            "\n  rotated activations quantized once for several weights: {} of {} NPU runs reused the previous run's int8 terms ({} vouched for by the graph walk, the rest by the activation's hash)",
            n(&self.act_reused),
            n(&self.npu_matmuls) + n(&self.npu_fallbacks) + self.busy_fallbacks(),
            n(&self.act_vouched)
        );
        out += &format!(
            "\n  decode  MUL_MAT left to ggml-cpu at graph split: {} nodes; other ops run by ORK on ggml-cpu: {} ({:.1} ms)",
            n(&self.declined_small_m), n(&self.cpu_ops), ms(&self.cpu_ns)
        );
        out += &format!(
            "\n  graph split: ORK answered the scheduler's supports_op {} times in {:.3} ms",
            n(&self.split_calls), ms(&self.split_ns)
        );
        for (i, name) in ["batches", "single-row"].iter().enumerate() {
            let g = &self.graph[i];
            let (wall, eng, prep, qdq, arb) = (ms(&g.wall_ns), ms(&g.engine_ns), ms(&g.prep_ns), ms(&g.qdq_ns), ms(&g.arb_ns));
            let host = (wall - eng - prep).max(0.0);
            out += &format!(
                "\n  graph_compute {name}: {} calls, wall {wall:.2} ms; engines {eng:.2} ms; weight preparation {prep:.2} ms; \
                 host {host:.3} ms = act-quant + dequant {qdq:.3} ms + arbiter {arb:.3} ms + bookkeeping {:.3} ms",
                n(&g.calls), (host - qdq - arb).max(0.0),
            );
        }
        if let Some(a) = arb {
            out += &format!("\n  {}", a.summary());
        }
        out
    }
}

impl Device {
    /// The exit summary ([`Stats::summary`]), one string per line.
    pub fn summary(&self) -> Vec<String> {
        self.stats.summary(&self.memory(), self.stream.weights.load(Relaxed))
    }

    /// The full breakdown ([`Stats::breakdown`]).
    pub fn breakdown(&self) -> String {
        self.stats.breakdown(&self.memory(), &self.stream)
    }

    /// The `ORK_PROFILE=1` table ([`Stats::profile`]).
    pub fn profile(&self) -> String {
        self.stats.profile(&self.memory(), Some(self.arbiter()))
    }
}

/// A backend (stream) is freed: the summary, and with `ORK_PROFILE=1` the full breakdown and the
/// profile table.
pub fn finish(dev: &Device) {
    let s = &dev.stats;
    // Whenever there is something to report: NPU work, or weights prepared (packed, loaded from
    // the cache, or left on the CPU) even if no ubatch reached ORK_MINM.
    let weights = s.packed.load(Relaxed) + s.cache_hits.load(Relaxed) + s.not_resident_weights.load(Relaxed);
    s.absorb_health(dev.npu.health());
    dev.note_memory();
    let fell = s.npu_fallbacks.load(Relaxed) + s.busy_fallbacks() + s.npu_never_ran.load(Relaxed);
    // The breakdown holds every figure the summary does: a backend freed after another with
    // nothing new to report prints nothing.
    let full = dev.breakdown();
    let mut last = s.reported.lock().unwrap_or_else(|p| p.into_inner());
    let new = *last != full;
    if new && (s.npu_matmuls.load(Relaxed) > 0 || fell > 0 || dev.cfg.profile || weights > 0) {
        log::info!("{}", dev.summary().join("\n"));
        if dev.cfg.profile {
            log::info!("{full}");
        }
        *last = full;
        if let Some(line) = dev.npu.fault_report() {
            log::info!("{line}");
        }
    }
    if dev.cfg.profile && new {
        log::info!("{}", dev.profile());
    }
    drop(last);
    if let Some(c) = &dev.calib {
        match c.flush() {
            Ok(0) => {}
            Ok(n) => log::info!("calibration: the activation rows of {n} weights written to {}", c.path().display()),
            Err(e) => log::warn!("calibration: {} not written: {e}", c.path().display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Placement;
    use super::*;

    /// Where a counter is in [`Stats`].
    type At = dyn Fn(&Stats) -> &AtomicU64;

    /// Stats with `(counter, value)` set.
    fn stats_with(set: &[(&At, u64)]) -> Stats {
        let s = Stats::default();
        for (at, v) in set {
            at(&s).store(*v, Relaxed);
        }
        s
    }

    const MIB: u64 = 1 << 20;

    /// The exit summary from known counters: its exact lines, at most six, none over 120
    /// characters with the logger's `ork: `; the budget's and the stream's parts only when there
    /// are any, and still within the width with a long run's figures.
    #[test]
    fn summary_is_six_short_lines_with_the_counters() {
        let s = stats_with(&[
            (&|s| &s.npu_matmuls, 207),
            (&|s| &s.submits, 621),
            (&|s| &s.npu_rows, 10_764),
            (&|s| &s.npu_rows_sent, 12_486),
            (&|s| &s.gpu_matmuls, 30),
            (&|s| &s.gpu_submits, 3),
            (&|s| &s.declined_small_m, 4650),
            (&|s| &s.npu_fallbacks, 2),
            (&|s| &s.npu_errors, 4),
            (&|s| &s.phase[0].fallback, 5),
            (&|s| &s.phase[1].fallback, 1),
            (&|s| &s.npu_never_ran, 7),
            (&|s| &s.npu_retries, 8),
            (&|s| &s.cache_hits, 200),
            (&|s| &s.packed, 9),
            (&|s| &s.cache_writes, 6),
            (&|s| &s.pack_ns, 1_322_400_000),
            (&|s| &s.npu_ns, 475_340_000),
            (&|s| &s.gpu_ns, 12_000_000),
            (&|s| &s.quant_ns, 11_900_000),
            (&|s| &s.dequant_ns, 20_940_000),
            (&|s| &s.mean_ns, 310_000),
            (&|s| &s.mean_corrected, 205),
        ]);
        let m = Memory {
            gguf: 3 * MIB / 2,
            gguf_mapped: 136 * MIB + 2 * MIB / 5,
            buffers: 97 * MIB,
            tiles: [98 * MIB + 7 * MIB / 10, 2 * MIB],
            copies: MIB / 10,
            total: 201 * MIB + 8 * MIB / 10,
            peak: 250 * MIB,
            ..Memory::default()
        };
        let lines = s.summary(&m, 0);
        assert_eq!(
            lines,
            [
                "ORK ran: npu 207 MUL_MAT (621 submits, 12486 rows sent = 1.16x plain W8A8)",
                "  gpu: 30 MUL_MAT (3 submits, 12.0 ms); cpu: 4650 MUL_MAT left at graph split (M < ORK_MINM)",
                "  fallbacks: 2 after NPU errors (4 failed runs), 6 NPU busy; never-ran jobs: 7 (8 resubmitted)",
                "  memory (MiB): resident 201.8 (GGUF copy 1.5, int8 tiles 98.7 + 2.0, per-core copies 0.1), peak 250.0; GGUF mapped 136.4",
                "  weights: 200 cache hits, 9 packs (6 cache writes) in 1322 ms",
                "  time (ms): npu 475.3, act-quant 11.9, dequant 20.9, correction 0.3 for 205 MUL_MAT",
            ]
        );
        // the budget's outcome and the streamed weights, when there are any; no per-core copies
        s.not_resident_weights.store(31, Relaxed);
        s.one_term_for_budget.store(2, Relaxed);
        let lines = s.summary(&Memory { copies: 0, ..m }, 131);
        assert_eq!(lines[3], "  memory (MiB): resident 201.8 (GGUF copy 1.5, int8 tiles 98.7 + 2.0), peak 250.0; GGUF mapped 136.4");
        assert_eq!(lines[4], "  weights: 200 cache hits, 9 packs (6 cache writes) in 1322 ms, 131 streamed; budget: 31 not resident, 2 one int8 term");
        // a long run on a 16 GiB board: seven-digit counts, hours of NPU time, a 14 GiB model
        let big = stats_with(&[
            (&|s| &s.npu_matmuls, 9_999_999),
            (&|s| &s.submits, 29_999_999),
            (&|s| &s.npu_rows, 899_999_999),
            (&|s| &s.npu_rows_sent, 999_999_999),
            (&|s| &s.gpu_matmuls, 9_999_999),
            (&|s| &s.gpu_submits, 999_999),
            (&|s| &s.gpu_ns, 999_999 * 1_000_000),
            (&|s| &s.declined_small_m, 9_999_999),
            (&|s| &s.npu_fallbacks, 99_999),
            (&|s| &s.npu_errors, 99_999),
            (&|s| &s.phase[0].fallback, 99_999),
            (&|s| &s.npu_never_ran, 99_999),
            (&|s| &s.npu_retries, 99_999),
            (&|s| &s.not_resident_weights, 999),
            (&|s| &s.one_term_for_budget, 999),
            (&|s| &s.cache_hits, 999),
            (&|s| &s.packed, 999),
            (&|s| &s.cache_writes, 999),
            (&|s| &s.pack_ns, 999_999 * 1_000_000),
            (&|s| &s.npu_ns, 9_999_999 * 1_000_000),
            (&|s| &s.quant_ns, 999_999 * 1_000_000),
            (&|s| &s.dequant_ns, 999_999 * 1_000_000),
            (&|s| &s.mean_ns, 99_999 * 1_000_000),
            (&|s| &s.mean_corrected, 9_999_999),
        ]);
        let m = Memory { gguf: 14 << 30, tiles: [14 << 30, 1 << 30], total: 16 << 30, peak: 16 << 30, ..Memory::default() };
        let mapped = Memory { gguf: 0, gguf_mapped: 14 << 30, ..m };
        let fits = |lines: Vec<String>| {
            assert!(lines.len() <= SUMMARY_LINES, "{lines:#?}");
            for l in &lines {
                assert!("ork: ".len() + l.len() <= SUMMARY_WIDTH, "{} characters: {l}", "ork: ".len() + l.len());
            }
        };
        // the budget's outcome without streaming (ORK_STREAM=0), and streamed weights (none
        // left out of the budget then: a weight is resident whole or streamed)
        fits(big.summary(&m, 0));
        big.not_resident_weights.store(0, Relaxed);
        big.one_term_for_budget.store(0, Relaxed);
        fits(big.summary(&mapped, 999));
    }

    #[test]
    fn profile_reports_graph_host_time_without_engine_time() {
        let s = Stats::default();
        let ms = |v: u64| v * 1_000_000;
        let add = |a: &AtomicU64, v: u64| a.fetch_add(v, Relaxed);
        // a single-row graph: 2 NPU runs of M = 1, 20 ms wall, 12 ms NPU, 3 ms ggml-cpu,
        // 1 ms act-quant + 0.5 ms dequant, 2 ms first-use packing
        let b = s.graph_snap();
        add(&s.npu_matmuls, 2);
        add(&s.npu_rows, 2);
        add(&s.npu_run_ns, ms(12));
        add(&s.cpu_ns, ms(3));
        add(&s.quant_ns, ms(1));
        add(&s.dequant_ns, 500_000);
        add(&s.pack_ns, ms(2));
        add(&s.arb_ns, 250_000);
        s.record_graph(b, ms(20));
        // a batch graph: one NPU run of M = 5, 10 ms wall, 8 ms NPU
        let b = s.graph_snap();
        add(&s.npu_matmuls, 1);
        add(&s.npu_rows, 5);
        add(&s.npu_run_ns, ms(8));
        s.record_graph(b, ms(10));
        let p = s.profile(&s.memory(&Placement::default()), None);
        let line = |k: &str| p.lines().find(|l| l.contains(k)).expect(k).trim().to_string();
        assert_eq!(
            line("graph_compute single-row:"),
            "graph_compute single-row: 1 calls, wall 20.00 ms; engines 15.00 ms; weight preparation 2.00 ms; \
             host 3.000 ms = act-quant + dequant 1.500 ms + arbiter 0.250 ms + bookkeeping 1.250 ms"
        );
        assert_eq!(
            line("graph_compute batches:"),
            "graph_compute batches: 1 calls, wall 10.00 ms; engines 8.00 ms; weight preparation 0.00 ms; \
             host 2.000 ms = act-quant + dequant 0.000 ms + arbiter 0.000 ms + bookkeeping 2.000 ms"
        );
    }
}
