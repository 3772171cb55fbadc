//! The planner: from (M, K, N, SoC, core budget) to the programs and submits `mm.rs` executes.
//!
//! This is where the hardware knowledge that callers must never embed lives (design: mechanism
//! vs policy). The caller only sets a [`crate::npu::Budget`] (max cores).
//!
//! Decisions, with sources:
//! * **Path** (rknpu-facts §4 "K-split vs full-K policy"):
//!   - one K-slice (K ≤ 1024): every program is full-K over the K-slice tiles;
//!   - M = 1 and a full-K companion exists (K ≤ 10752): one full-K program per core and
//!     N-slice (the decode path), template schedule 0xb1 / 0x20;
//!   - M > 1, companion present, K % 512 == 0 and K ≤ 4096: full-K M-tiles under ork's
//!     M-scheduler (the envelope where its 0x1040 formula is valid), M-tile cap
//!     `mg_max · 64` (704, 320, 128, 64 rows for K = 512 … 4096);
//!   - otherwise K-split: one program per (N-slice, M-tile, K-slice); the host sums the int32
//!     partials (the NPU has no accumulate-into-output mode, §3.3);
//!   - a weight tiled with one set (`layout::TileSets`, chosen by [`tile_sets`] from the
//!     smallest M it runs with) runs every M on the set it has.
//! * **M-tile caps** (§4): K-slices of 512 / 1024 run the scheduler with `4·R` rows (512 / 256);
//!   other K use the template's single data bank: `bank_bytes / K` rows.
//! * **Cores** (§5): `nc = min(budget, cores, NN)` with NN = N/32 N-blocks, then decremented while
//!   `NN < 2·nc` (every core gets ≥ 2 N-blocks). Within each N-slice core i owns the N-blocks
//!   `[i·NNs/nc, (i+1)·NNs/nc)`; its weights start at `tile + t0·Kp·32` (§3.2).
//! * **Submits**: each core's programs are PC-chained (§2.4) into submits of at most
//!   `min(1024, max_submit_tasks)` programs (ork's chain cap: 1 MiB regcmd / task buffer), and
//!   at most [`ACT_SUBMIT_CAP_BYTES`] / [`OUT_SUBMIT_CAP_BYTES`] of activation / output scratch
//!   (a single larger program still gets its own submit).

use std::collections::HashMap;

use crate::npu::kif::Iova;
use crate::npu::layout::{ABlock, Tile, TileSets, WeightGeometry, BLOCK};
use crate::npu::regcmd::{chain, MatmulProgram, RegcmdError, Schedule};
use crate::npu::regs::RegCmd;
use crate::npu::soc::SocDesc;

/// Programs per PC chain (ork caps a chain at 1024: 1 MiB regcmd, rknpu-facts §2.4).
pub const MAX_CHAIN_PROGRAMS: usize = 1024;
/// Activation scratch a submit may fill before a new submit starts.
pub const ACT_SUBMIT_CAP_BYTES: usize = 4 << 20;
/// Output scratch a submit may fill before a new submit starts.
pub const OUT_SUBMIT_CAP_BYTES: usize = 16 << 20;
/// Largest DATAIN_HEIGHT / DMA_HEIGHT (11-bit fields, rknpu-facts §4).
pub const MAX_ROWS_PER_PROGRAM: usize = 2047;

/// Which slicing the plan uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// Every program contracts all of K.
    FullK,
    /// Programs contract K-slices; the host sums the partials.
    KSplit,
}

/// One program of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedProgram {
    /// Rows `[m0, m0+mc)`, K range `[k0, k0+kp)`, columns (core-local) `[col0, col0+nc)`.
    pub m0: usize,
    pub mc: usize,
    pub k0: usize,
    pub kp: usize,
    pub col0: usize,
    pub nc: usize,
    /// Byte offset of this program's weights in the weight blob.
    pub weight_offset: usize,
    /// Index of its activation block in the submit's `a_blocks`, and byte offsets in scratch.
    pub a_block: usize,
    pub out_offset: usize,
    pub sched: Schedule,
}

impl PlannedProgram {
    /// Byte offset, in the output scratch, of the last int32 this program writes: row `mc − 1`,
    /// column `nc − 1` of its dense `[mc][nc]` block (row stride `nc`, as
    /// [`PlannedSubmit::regcmd_at`] programs it). The matmul writes it last (rknpu-facts §2.5),
    /// so `mm.rs` puts its never-ran sentinel there.
    pub fn last_out_word(&self) -> usize {
        self.out_offset + (self.mc * self.nc - 1) * 4
    }
}

/// One submit: the activation blocks to pack, and the PC-chained programs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlannedSubmit {
    /// Activation blocks with their byte offsets in the activation scratch.
    pub a_blocks: Vec<(ABlock, usize)>,
    pub programs: Vec<PlannedProgram>,
    pub act_bytes: usize,
    pub out_bytes: usize,
}

/// Where a submit's buffers sit in the device's address space: the bases its programs' byte
/// offsets are relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubmitIovas {
    /// Activation scratch (the offsets of `a_blocks`).
    pub act: Iova,
    /// The weight blob (`weight_offset`).
    pub weights: Iova,
    /// Output scratch (`out_offset`).
    pub out: Iova,
    /// The regcmd buffer the programs are PC-chained in.
    pub regcmd: Iova,
}

impl PlannedSubmit {
    /// The submit's PC-chained regcmd stream with its buffers at `at`, each activation block at
    /// `a_offset(block)` bytes past `at.act` (the NPU core's activation image, `mm.rs`; its
    /// scratch offset in `a_blocks` for `ork-regdump --synth` and the golden tests) — the one
    /// mapping from planned programs to [`MatmulProgram`]s. One program per `PROGRAM_ENTRIES`
    /// entries, in `programs` order.
    pub fn regcmd_at(&self, at: &SubmitIovas, amount_scale: u32, a_offset: impl Fn(&ABlock) -> usize) -> Result<Vec<RegCmd>, RegcmdError> {
        let progs: Vec<MatmulProgram> = self
            .programs
            .iter()
            .map(|p| MatmulProgram {
                mc: p.mc as u32,
                k: p.kp as u32,
                n: p.nc as u32,
                dst_stride: p.nc as u32,
                a: Iova(at.act.0 + a_offset(&self.a_blocks[p.a_block].0) as u32),
                b: Iova(at.weights.0 + p.weight_offset as u32),
                c: Iova(at.out.0 + p.out_offset as u32),
                sched: p.sched,
            })
            .collect();
        chain(&progs, at.regcmd, amount_scale)
    }
}

/// A column segment a core owns: global columns `[n0, n0+nc)` at core-local column `col0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColSeg {
    pub n0: usize,
    pub nc: usize,
    pub col0: usize,
}

/// Everything one NPU core does for a matmul.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorePlan {
    pub core: u32,
    pub segs: Vec<ColSeg>,
    /// Columns this core owns in total (its local result is `[M][ncols]`).
    pub ncols: usize,
    pub submits: Vec<PlannedSubmit>,
}

/// A plan for one `C[M, N] = A[M, K] · Wᵀ`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub path: PathKind,
    pub cores: Vec<CorePlan>,
}

impl Plan {
    pub fn programs(&self) -> usize {
        self.cores.iter().flat_map(|c| &c.submits).map(|s| s.programs.len()).sum()
    }
    pub fn submits(&self) -> usize {
        self.cores.iter().map(|c| c.submits.len()).sum()
    }
}

/// Number of cores for N (§5): min(budget, cores, NN), each core ≥ 2 N-blocks.
pub fn core_count(soc: &SocDesc, n: usize, max_cores: u32) -> u32 {
    let nn = (n / BLOCK) as u32;
    let mut nc = max_cores.max(1).min(soc.cores).min(nn.max(1));
    while nc > 1 && nn < 2 * nc {
        nc -= 1;
    }
    nc
}

/// Rows per program, and the schedule of a program (from its M offset and row count).
type RowSchedule = (usize, fn(usize, usize) -> Schedule);

/// Rows per program and schedule for a program contracting `kp` (K-slice or full-K).
fn tile_rows(soc: &SocDesc, kp: usize, path: PathKind, m: usize) -> RowSchedule {
    let bank = soc.cbuf_bank_bytes as usize;
    let template = |mc: usize, _k: usize| Schedule::template(mc as u32);
    let sched = |mc: usize, k: usize| Schedule::scheduler(mc as u32, k as u32).expect("mc within the scheduler cap");
    if path == PathKind::FullK && m == 1 && kp > soc.k_slice as usize {
        // M = 1 full-K decode: template 0xb1 / 0x20 (rknpu-facts §4).
        return (1, template);
    }
    let sched_ok = kp % 512 == 0 && kp <= 4096 && (path == PathKind::FullK || kp == 512 || kp == 1024);
    if sched_ok {
        // Largest mc the scheduler formula accepts, capped by 4·R for K-slices (§4).
        let mut cap = (1..=MAX_ROWS_PER_PROGRAM).rev().step_by(1).find(|&mc| mc % 64 == 0 && Schedule::scheduler(mc as u32, kp as u32).is_some()).unwrap_or(64);
        if path == PathKind::KSplit || kp <= soc.k_slice as usize {
            let r = 1usize << (31 - ((crate::npu::regcmd::SCHED_ROW_BUDGET_BYTES as usize / kp) as u32).leading_zeros());
            cap = cap.min(4 * r);
        }
        return (cap, sched);
    }
    ((bank / kp).clamp(1, MAX_ROWS_PER_PROGRAM), template)
}

/// Whether the plan of `m` rows contracts all of K at once when the weight has both tile sets
/// (rknpu-facts §4: M = 1 decode, and ork's M-scheduler envelope K % 512 == 0, K ≤ 4096).
fn prefers_fullk(k: usize, m: usize) -> bool {
    m == 1 || (k % 512 == 0 && k <= 4096)
}

/// The tile sets an `[N, K]` weight needs on `soc` when it runs with every M ≥ `smallest_m`
/// (the layout's `TileSets`), from the path [`plan_at`] takes for each M:
/// * one K-slice, or K above the full-K ceiling: there is one set anyway (`Both`);
/// * K in ork's M-scheduler envelope (K % 512 == 0, K ≤ 4096): every M runs full-K, the
///   K-slice tiles are never read: `FullK`;
/// * otherwise M > 1 runs K-split and only M = 1 runs full-K: `Both` when M = 1 reaches the
///   NPU (`smallest_m ≤ 1`; prefill and decode then truly need both), else `KSplit`.
///
/// A weight holding one set still runs every M (the plan takes the set it has), with the same
/// int32 results.
pub fn tile_sets(soc: &SocDesc, n: usize, k: usize, smallest_m: usize) -> TileSets {
    let _ = n;
    let sk = k.div_ceil((soc.k_slice as usize).max(1));
    if sk <= 1 || k > soc.fullk_ceiling as usize {
        TileSets::Both
    } else if prefers_fullk(k, 2) {
        TileSets::FullK
    } else if smallest_m <= 1 {
        TileSets::Both
    } else {
        TileSets::KSplit
    }
}

/// The path a plan of `m` rows takes with `geom` (a blob with one tile set runs every M on the
/// set it has): [`plan_at`]'s decision, shared with [`pipeline_rows`].
fn path_for(geom: &WeightGeometry, m: usize) -> PathKind {
    let fullk_ok = geom.sk == 1 || (geom.fullk_tile(0).is_some() && (prefers_fullk(geom.k, m) || !geom.has_ksplit()));
    if fullk_ok {
        PathKind::FullK
    } else {
        PathKind::KSplit
    }
}

/// The tiles N-slice `ns` contracts on `path`: its full-K tile, or its K-slice tiles.
fn ktiles(geom: &WeightGeometry, ns: usize, path: PathKind) -> Vec<&Tile> {
    match path {
        PathKind::FullK => vec![geom.fullk_tile(ns).expect("full-K tile")],
        PathKind::KSplit => (0..geom.sk).map(|ks| geom.tile(ns, ks)).collect(),
    }
}

/// Rows per M-tile over `tiles` (the smallest cap of their programs) and each tile's schedule.
fn m_tile(soc: &SocDesc, tiles: &[&Tile], path: PathKind, m: usize) -> (usize, Vec<RowSchedule>) {
    let rows_of: Vec<RowSchedule> = tiles.iter().map(|t| tile_rows(soc, t.kp, path, m)).collect();
    (rows_of.iter().map(|r| r.0).min().unwrap_or(1).max(1), rows_of)
}

/// Most pieces [`pipeline_rows`] cuts an M into.
pub const MAX_PIECES: usize = 4;
/// A piece's modelled time on each core, in submit floors, below which [`pipeline_rows`] does
/// not cut: under the floor a piece would cost the NPU the floor instead of its work, and pieces
/// of a few floors cost the host more in hand-offs than the overlap saves (SmolLM2-135M cut at
/// two floors: act-quant + dequant 173 → 225 µs per token at pp512, `prefill_host_table.sh`).
pub const PIECE_FLOORS: f64 = 4.0;

/// Rows per piece for a caller that pipelines its host work with the NPU (it prepares piece
/// i + 1 and finishes piece i − 1 while the NPU runs piece i): whole M-tiles of the plan, so the
/// pieces run the programs the whole M would (no extra weight feed, no extra submit where a
/// submit held one M-tile's programs), at most [`MAX_PIECES`] pieces, and only where each core's
/// share of a piece is modelled at ≥ [`PIECE_FLOORS`] submit floors (`SocDesc::timing`).
/// Returns `m` (one piece) otherwise. The int32 results are the same however M is cut.
/// A piece at an end of a cut M ([`pipeline_bounds`]) has the fewest rows, a multiple of
/// [`END_ALIGN`], whose program on each core is modelled at ≥ `END_FLOORS` submit floors: the
/// first piece's activation pass and the last piece's output pass are the host work no NPU run
/// covers, so they are cut short; under the floor the piece would cost the NPU the floor.
pub const END_FLOORS: f64 = 1.0;
/// Rows an end piece is a multiple of.
pub const END_ALIGN: usize = 16;

/// Which ends of a cut M [`pipeline_bounds`] cuts short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ends {
    /// The first piece (the caller's activation pass for it runs before any NPU work).
    pub first: bool,
    /// The last piece (its output pass runs after all NPU work).
    pub last: bool,
}

/// The row ranges a pipelining caller cuts an `m`-row matmul into: the pieces of
/// [`pipeline_rows`], with the first and last cut short as `ends` asks (an end piece of the
/// fewest rows whose program runs ≥ [`END_FLOORS`] floors, the rest of that piece after or
/// before it). A short end costs the NPU one more program (its M-tile's weight fed again); the
/// int32 results are the same however M is cut. One range `(0, m)` when it should not be cut.
pub fn pipeline_bounds(soc: &SocDesc, geom: &WeightGeometry, m: usize, max_cores: u32, ends: Ends) -> Vec<(usize, usize)> {
    let rows = pipeline_rows(soc, geom, m, max_cores).max(1);
    let mut b: Vec<(usize, usize)> = (0..m).step_by(rows).map(|r0| (r0, (r0 + rows).min(m))).collect();
    if b.len() < 2 {
        return vec![(0, m)];
    }
    let cores = core_count(soc, geom.n, max_cores.min(soc.cores));
    let n_core = geom.n.div_ceil(cores as usize) as u64;
    let floor = END_FLOORS * soc.timing.submit_floor_ns as f64;
    let end = (1..).map(|i| i * END_ALIGN).find(|&r| r >= rows || soc.timing.program_ns(r as u64, geom.k as u64, n_core, cores) >= floor).unwrap_or(rows);
    if ends.first && b[0].1 - b[0].0 > end {
        let r1 = b[0].1;
        b[0].1 = end;
        b.insert(1, (end, r1));
    }
    let last = b.len() - 1;
    if ends.last && b[last].1 - b[last].0 > end {
        let r0 = b[last].0;
        b[last].0 = m - end;
        b.insert(last, (r0, m - end));
    }
    b
}

/// Programs per N-slice and K-slice that `bounds` (consecutive row ranges of one matmul) run
/// beyond the uncut M's: each is one more feed of the weight. A short end that leaves its
/// neighbour's M-tiles as many as before (the last M-tile already partial) costs none.
pub fn extra_m_tiles(soc: &SocDesc, geom: &WeightGeometry, bounds: &[(usize, usize)]) -> usize {
    let tiles = |m: usize| {
        let path = path_for(geom, m);
        m.div_ceil(m_tile(soc, &ktiles(geom, 0, path), path, m).0)
    };
    let m = bounds.last().map_or(0, |b| b.1);
    bounds.iter().map(|&(r0, r1)| tiles(r1 - r0)).sum::<usize>().saturating_sub(tiles(m))
}

pub fn pipeline_rows(soc: &SocDesc, geom: &WeightGeometry, m: usize, max_cores: u32) -> usize {
    let (k, n) = (geom.k, geom.n);
    if m < 2 {
        return m;
    }
    let path = path_for(geom, m);
    let (mtile, _) = m_tile(soc, &ktiles(geom, 0, path), path, m);
    let cores = core_count(soc, n, max_cores.min(soc.cores));
    let n_core = n.div_ceil(cores as usize) as u64;
    for pieces in (2..=MAX_PIECES).rev() {
        let rows = m.div_ceil(pieces).div_ceil(mtile) * mtile;
        if rows >= m {
            continue;
        }
        if soc.timing.program_ns(rows as u64, k as u64, n_core, cores) >= PIECE_FLOORS * soc.timing.submit_floor_ns as f64 {
            return rows;
        }
    }
    m
}

/// Builds the plan. `geom` is the weight's geometry; `max_cores` the caller's budget.
pub fn plan(soc: &SocDesc, geom: &WeightGeometry, m: usize, max_cores: u32) -> Plan {
    plan_at(soc, geom, m, max_cores, 0)
}

/// [`plan`] on cores `first_core..`: the caller (an arbiter partitioning the cores between
/// concurrent matmuls) leases a contiguous range; `max_cores` is clamped to fit it.
pub fn plan_at(soc: &SocDesc, geom: &WeightGeometry, m: usize, max_cores: u32, first_core: u32) -> Plan {
    let first_core = first_core.min(soc.cores.saturating_sub(1));
    let max_cores = max_cores.min(soc.cores - first_core);
    let (k, n) = (geom.k, geom.n);
    // A blob with only one tile set runs every M on the set it has.
    let path = path_for(geom, m);
    let ncores = core_count(soc, n, max_cores);
    let max_programs = MAX_CHAIN_PROGRAMS.min(soc.max_submit_tasks as usize).max(1);

    let mut cores = Vec::with_capacity(ncores as usize);
    for core in 0..ncores as usize {
        // Column segments of this core, one per N-slice.
        let mut segs = Vec::new();
        let mut ncols = 0;
        let mut work: Vec<(ColSeg, usize)> = Vec::new(); // (segment, first N-block in the slice)
        for ns in 0..geom.sn {
            let n0s = ns * geom.n_slice;
            let nns = geom.n_slice.min(n - n0s) / BLOCK;
            let (t0, t1) = (core * nns / ncores as usize, (core + 1) * nns / ncores as usize);
            if t1 > t0 {
                let seg = ColSeg { n0: n0s + t0 * BLOCK, nc: (t1 - t0) * BLOCK, col0: ncols };
                ncols += seg.nc;
                segs.push(seg);
                work.push((seg, t0));
            }
        }
        // Programs in order: N-slice, M-tile, K-slice.
        let mut submits: Vec<PlannedSubmit> = Vec::new();
        let mut cur = PlannedSubmit::default();
        let mut index: HashMap<ABlock, usize> = HashMap::new();
        for (seg, t0) in &work {
            let ns = seg.n0 / geom.n_slice;
            let ktiles = ktiles(geom, ns, path);
            let (mtile, rows_of) = m_tile(soc, &ktiles, path, m);
            let mut m0 = 0;
            while m0 < m {
                let mc = mtile.min(m - m0);
                for (t, (_, sched)) in ktiles.iter().zip(&rows_of) {
                    let ab = ABlock { m0, mc, k0: t.k0, kp: t.kp };
                    let out_bytes = mc * seg.nc * 4;
                    let new_a = !index.contains_key(&ab);
                    let full = cur.programs.len() >= max_programs
                        || (!cur.programs.is_empty()
                            && ((new_a && cur.act_bytes + ab.bytes() > ACT_SUBMIT_CAP_BYTES)
                                || cur.out_bytes + out_bytes > OUT_SUBMIT_CAP_BYTES));
                    if full {
                        submits.push(std::mem::take(&mut cur));
                        index.clear();
                    }
                    let a_block = *index.entry(ab).or_insert_with(|| {
                        cur.a_blocks.push((ab, cur.act_bytes));
                        cur.act_bytes += ab.bytes().div_ceil(64) * 64;
                        cur.a_blocks.len() - 1
                    });
                    cur.programs.push(PlannedProgram {
                        m0,
                        mc,
                        k0: t.k0,
                        kp: t.kp,
                        col0: seg.col0,
                        nc: seg.nc,
                        weight_offset: t.block_offset(*t0),
                        a_block,
                        out_offset: cur.out_bytes,
                        sched: sched(mc, t.kp),
                    });
                    cur.out_bytes += out_bytes.div_ceil(64) * 64;
                }
                m0 += mc;
            }
        }
        if !cur.programs.is_empty() {
            submits.push(cur);
        }
        cores.push(CorePlan { core: first_core + core as u32, segs, ncols, submits });
    }
    Plan { m, k, n, path, cores }
}

/// The blob byte ranges `(offset, len)` each of `ncores` cores reads in every plan of
/// [`plan_at`] on `ncores` cores from core 0, whatever M and path: core `i` owns the N-blocks
/// `[i·NNs/nc, (i+1)·NNs/nc)` of every N-slice, and an N-block of a tile is `Kp·32` contiguous
/// bytes (`layout`), so its share of each tile (K-slice and full-K) is one range. Per core, in
/// blob order; the tiles' zero padding belongs to no core. Where the kernel interface gives each
/// core its own address space (`KernelInterface::per_core_spaces`), a weight is placed as one
/// part per core holding these ranges (`Npu::place`).
pub fn core_parts(geom: &WeightGeometry, ncores: usize) -> Vec<Vec<(usize, usize)>> {
    let ncores = ncores.max(1);
    (0..ncores)
        .map(|core| {
            geom.tiles
                .iter()
                .chain(&geom.fullk)
                .filter_map(|t| {
                    let nns = t.nc / BLOCK;
                    let (t0, t1) = (core * nns / ncores, (core + 1) * nns / ncores);
                    (t1 > t0).then(|| (t.block_offset(t0), (t1 - t0) * t.kp * BLOCK))
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npu::soc::SocId;

    /// A cut M: consecutive ranges covering it; without short ends the pieces of
    /// `pipeline_rows` (whole M-tiles, no program beyond the uncut M's); short ends of the fewest
    /// aligned rows whose program runs ≥ `END_FLOORS` floors, each one more program.
    #[test]
    fn pipeline_bounds_cut_whole_m_tiles_and_short_ends() {
        let soc = SocDesc::get(SocId::Rk3588);
        let none = Ends { first: false, last: false };
        // M = 0 (a MUL_MAT of no rows): one empty range, never an empty list.
        assert_eq!(pipeline_bounds(&soc, &WeightGeometry::new(&soc, 2048, 2048), 0, 3, Ends { first: true, last: true }), vec![(0, 0)]);
        for (n, k, m) in [(2048, 2048, 512), (1024, 2048, 512), (6144, 2048, 512), (2048, 6144, 512), (2048, 2048, 300), (576, 576, 512), (2048, 2048, 1)] {
            let geom = WeightGeometry::new(&soc, n, k);
            let rows = pipeline_rows(&soc, &geom, m, 3);
            let plain = pipeline_bounds(&soc, &geom, m, 3, none);
            let want: Vec<(usize, usize)> = (0..m).step_by(rows.max(1)).map(|r0| (r0, (r0 + rows).min(m))).collect();
            assert_eq!(plain, want, "{n}x{k} M={m}");
            assert_eq!(extra_m_tiles(&soc, &geom, &plain), 0, "{n}x{k} M={m}: whole M-tiles");
            for ends in [Ends { first: true, last: true }, Ends { first: false, last: true }, Ends { first: true, last: false }] {
                let b = pipeline_bounds(&soc, &geom, m, 3, ends);
                assert_eq!((b[0].0, b[b.len() - 1].1), (0, m), "{n}x{k} M={m} {ends:?}: {b:?}");
                assert!(b.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1), "{b:?}");
                if plain.len() < 2 {
                    assert_eq!(b, plain, "uncut stays uncut");
                    continue;
                }
                let cut = usize::from(ends.first) + usize::from(ends.last);
                assert_eq!(b.len(), plain.len() + cut, "{n}x{k} M={m} {ends:?}: {b:?}");
                assert_eq!(extra_m_tiles(&soc, &geom, &b), cut, "{n}x{k} M={m} {ends:?}: {b:?}");
                let cores = core_count(&soc, n, 3);
                let short = |r: usize| {
                    assert_eq!(r % END_ALIGN, 0, "{r}");
                    let t = |r: usize| soc.timing.program_ns(r as u64, k as u64, n.div_ceil(cores as usize) as u64, cores);
                    let floor = END_FLOORS * soc.timing.submit_floor_ns as f64;
                    assert!(t(r) >= floor && (r == END_ALIGN || t(r - END_ALIGN) < floor), "{n}x{k}: an end of {r} rows is not the shortest at the floor");
                };
                if ends.first {
                    short(b[0].1);
                }
                if ends.last {
                    short(m - b[b.len() - 1].0);
                }
            }
        }
    }

    /// Every program a core runs reads inside that core's part, the parts are disjoint, and
    /// together they hold every tile's payload once (no padding): a weight split this way is
    /// held 1.0× and runs every M on the cores its parts live with.
    #[test]
    fn core_parts_hold_what_each_core_reads_once() {
        let soc = SocDesc::get(SocId::Rk3588);
        for (n, k) in [(576, 576), (1536, 576), (64, 2048), (96, 3072), (8192 + 96, 1024), (2048, 5120), (256, 12288)] {
            for sets in [TileSets::Both, TileSets::KSplit, TileSets::FullK] {
                let geom = WeightGeometry::with_sets(&soc, n, k, sets);
                for cores in 1..=3u32 {
                    let nc = core_count(&soc, n, cores) as usize;
                    let parts = core_parts(&geom, nc);
                    let mut all: Vec<(usize, usize)> = parts.iter().flatten().copied().collect();
                    all.sort_unstable();
                    assert!(all.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "parts overlap: N={n} K={k}");
                    let payload: usize = geom.tiles.iter().chain(&geom.fullk).map(|t| t.kp * t.nc).sum();
                    assert_eq!(all.iter().map(|r| r.1).sum::<usize>(), payload, "N={n} K={k} {sets:?} on {nc} cores");
                    for m in [1, 7, 64, 300] {
                        let p = plan_at(&soc, &geom, m, cores, 0);
                        assert_eq!(p.cores.len(), nc);
                        for cp in &p.cores {
                            for prog in cp.submits.iter().flat_map(|s| &s.programs) {
                                let (s, e) = (prog.weight_offset, prog.weight_offset + prog.nc * prog.kp);
                                assert!(
                                    parts[cp.core as usize].iter().any(|&(o, l)| o <= s && e <= o + l),
                                    "N={n} K={k} M={m}: core {} reads {s}..{e} outside its part",
                                    cp.core
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
