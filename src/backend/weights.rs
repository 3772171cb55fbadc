//! Resident weights: one packed NPU copy per weight tensor, owned by the ORK buffer that holds the
//! tensor's GGUF bytes and keyed by the tensor's data address (which also works when ggml's RPC
//! server rebuilds tensor structs for every graph).
//!
//! A weight is packed when its bytes are written whole (`set_tensor` at load, into a buffer ORK
//! allocated), or lazily at its first NPU MUL_MAT (a buffer over llama.cpp's mapping of the model
//! file, or one ggml read the file into); any later write or memset over its bytes drops the
//! packed copy.
//!
//! Packing goes through the `.orkpack` disk cache (`crate::cache`) when the device has one: a
//! valid entry is mapped and imported instead of packing (a *hit*); otherwise the weight is
//! packed and the entry (re)written. Cache trouble of any kind only costs a repack.

use super::gpu::GpuWeight;
use super::packed::{rotation, PackedWeight, WeightDesc};
use super::stream::{StreamSrc, Tiles};
use super::Device;
use crate::cache::{self, CacheError};
use crate::npu::layout::TileSets;
use crate::npu::{NpuError, ResidentWeight};
use crate::pack::{pack_source_sets, PackedSource, WeightSource};
use crate::quant::rotate::Rotation;
use crate::route::precision::{self, Role};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Whether a weight's second int8 term may become resident now, `new_bytes` being what is about
/// to be placed with it (the second term, plus the first when that is not resident yet). It must
/// leave room for one term of every weight not placed yet, so that a model too large for two
/// terms everywhere keeps one term everywhere (second terms where room is left) instead of two
/// terms on its first layers and none on its last. That rest is known exactly when ORK's
/// buffers announced their weights (`Placement::expected_term_bytes`, from ggml's tensor
/// initialisation); otherwise it is estimated from the ORK buffer bytes not packed yet, on the
/// safe side: this weight's parameters per source byte, the larger of two resident bytes per
/// parameter (K-split layout plus a full-K copy) and the ratio seen so far, and 1/32 for padding.
fn second_term_fits(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, new_bytes: usize) -> bool {
    let s = &dev.placement;
    if dev.stream.active(dev) {
        // The rest streams: a weight is resident whole or not at all (`pack_with`).
        return dev.npu.resident_bytes() + new_bytes as u64 <= dev.npu.residency_budget();
    }
    let expected = s.expected_term_bytes.load(Relaxed);
    let rest_resident = if expected > 0 {
        expected.saturating_sub(s.placed_term_bytes.load(Relaxed))
    } else {
        let placed_src = s.placed_src_bytes.load(Relaxed).max(1);
        let rest_src = s.host_buffer_bytes.load(Relaxed).saturating_sub(placed_src) as f64;
        let seen = s.placed_term_bytes.load(Relaxed) as f64 / placed_src as f64;
        let bound = 2.0 * (n * k) as f64 / src.bytes.len().max(1) as f64;
        (rest_src * seen.max(bound) * 33.0 / 32.0) as u64
    };
    dev.npu.resident_bytes() + new_bytes as u64 + rest_resident <= dev.npu.residency_budget()
}

/// A weight keeps one int8 term for want of budget: one warning per process, then debug lines
/// (the count is in the exit line).
fn note_one_term(dev: &Device, name: &str, why: &str) {
    crate::logging::warn_first(
        dev.stats.one_term_for_budget.fetch_add(1, Relaxed) == 0,
        &format!("weight {name}: second int8 term not resident ({why}); one term"),
        " (further such weights: debug log, count at exit)",
    );
}

/// A cache hit's weight: resident hi term, optional lo term with its row scales, row scales,
/// column scales.
type Imported = (Arc<ResidentWeight>, Option<(Arc<ResidentWeight>, Vec<f32>)>, Vec<f32>, Vec<f32>);

/// Imports an opened cache entry (`terms` tile sets of `[N, K]`) and verifies its payload in the
/// same pass: every piece of tiles is hashed from its device copy right after the copy
/// (`KernelInterface::mem_import_observed`), then the scales from the mapping. Only when the
/// hash equals the header's are the buffers kept; otherwise they are dropped (freed) and the
/// reason returned, and the caller repacks.
fn import_entry(dev: &Device, entry: cache::Unverified, src: &WeightSource<'_>, n: usize, k: usize, sets: TileSets, terms: usize) -> Result<Imported, String> {
    let scale_count = (entry.header().scales_bytes / 4) as usize;
    let tiles = entry.tiles();
    if scale_count != n + k + (terms - 1) * n || tiles.len() % terms != 0 {
        return Err(format!("payload sizes do not match {terms} term(s)"));
    }
    let one = tiles.len() / terms;
    let fail = |e: NpuError| format!("import of {} failed ({e})", entry.path().display());
    // Imports `bytes` hashing the device copy from byte `skip` on (a retry in another domain
    // observes from offset 0 again and starts over).
    let import = |bytes: &[u8], skip: usize| -> Result<(Arc<ResidentWeight>, cache::format::StreamHash), NpuError> {
        let mut hash = cache::format::StreamHash::new();
        let r = dev.npu.upload_bytes_observed(n, k, sets, bytes, &mut |off, piece| {
            if off == 0 {
                hash = cache::format::StreamHash::new();
            }
            if off + piece.len() > skip {
                hash.update(&piece[skip.saturating_sub(off)..]);
            }
        })?;
        Ok((r, hash))
    };
    // The two terms go into device memory at once (page allocation, copy and checksum of one
    // overlap the other's). The payload checksum runs over hi ++ lo ++ tail in 1 MiB chunks:
    // the lo term's hash starts at its first chunk boundary, and the chunk that straddles the
    // two terms is completed from the mapped file after both imports.
    let straddle = (cache::format::HASH_CHUNK_BYTES - one % cache::format::HASH_CHUNK_BYTES) % cache::format::HASH_CHUNK_BYTES;
    let want_lo = terms == 2 && second_term_fits(dev, src, n, k, 2 * one * dev.npu.weight_copies() as usize);
    let (hi, lo) = if want_lo {
        let (hi, lo) = rayon::join(|| import(&tiles[..one], 0), || import(&tiles[one..], straddle.min(one)));
        (hi, Some(lo))
    } else {
        (import(&tiles[..one], 0), None)
    };
    let (hi, mut hash) = hi.map_err(fail)?;
    let lo = match lo {
        Some(Ok((lo, lo_hash))) => {
            hash.update(&tiles[one..one + straddle.min(one)]);
            if hash.len() % cache::format::HASH_CHUNK_BYTES == 0 {
                hash.append(lo_hash);
            } else {
                // lo ends inside the straddling chunk: it was all hashed from the file just now.
                debug_assert!(lo_hash.is_empty());
            }
            Some(lo)
        }
        Some(Err(e)) if !matches!(e, NpuError::NoRoom { .. }) => return Err(fail(e)),
        // No room for the second term (by the budget rule or the domains): the weight keeps its
        // first term; the second is still checksummed, from the mapping.
        Some(Err(_)) | None if terms == 2 => {
            hash.update(&tiles[one..]);
            note_one_term(dev, src.name, "resident budget");
            None
        }
        _ => None,
    };
    hash.update(entry.tail());
    let hit = entry.accept(hash.finish()).map_err(|e| e.to_string())?;
    let f = hit.scales();
    let lo = lo.map(|r| (r, f[n + k..].to_vec()));
    Ok((hi, lo, f[..n].to_vec(), f[n..n + k].to_vec()))
}

/// What packing a weight decides before touching its bytes: its precision (int8 terms,
/// rotation, correction: [`precision_of`]), the rotation itself, tile sets, cache identity
/// (`with_cache`) and calibration key.
struct Prep {
    precision: precision::Precision,
    rot: Option<Arc<Rotation>>,
    sets: TileSets,
    id: Option<cache::Identity>,
    calib_key: Option<u64>,
}

/// The precision of weight `src` (`[N, K]`) on this device: the one decision
/// (`precision::decide`) for its role, source type and K, under the work ORK's buffers announced.
pub fn precision_of(dev: &Device, src: &WeightSource<'_>, k: usize) -> precision::Precision {
    let work = dev.placement.announced.each_ref().map(|c| c.load(Relaxed));
    precision::decide(dev.cfg, Role::of(src.name), crate::quant::types::is_float(src.ggml_type), &work, k)
}

fn prep(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, with_cache: bool) -> Prep {
    let plan = precision_of(dev, src, k);
    let rot = if plan.rotated { rotation(k) } else { None };
    // The tile sets the plans of this device's M read (`npu::plan::tile_sets`); the cache key
    // names them (an entry holds one layout).
    let sets = dev.npu.tile_sets(n, k);
    let id = with_cache.then(|| cache::Identity {
        layout_fp: cache::layout_fingerprint_sets(dev.npu.soc(), sets),
        ..cache::identity(dev.npu.soc(), src.ggml_type, src.bytes, src.row_bytes, src.name, n, k, plan.terms.weight as u32, rot.as_deref())
    });
    // The calibration key reuses the cache identity's hash of the source bytes.
    let calib_key = calib_key(dev, src, n, k, &plan, id.as_ref().map(|i| i.src_hash));
    Prep { precision: plan, rot, sets, id, calib_key }
}

/// The key of weight `src` (`[N, K]`) in the device's calibration file, where the device has one
/// and the weight's precision corrects its rows; `src_hash`: the source bytes' hash where it is
/// known already (the cache identity's), else taken here.
fn calib_key(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, p: &precision::Precision, src_hash: Option<u128>) -> Option<u64> {
    if dev.calib.is_none() || !p.mean_correct {
        return None;
    }
    let h = src_hash.unwrap_or_else(|| cache::format::par_hash(src.bytes));
    Some(cache::calib::key(src.name, src.ggml_type, n, k, h))
}

/// The description of weight `src` (`[N, K]`) placed with `p`'s decisions and these scales.
fn describe(src: &WeightSource<'_>, n: usize, k: usize, p: &Prep, scales: Vec<f32>, col_scale: Vec<f32>) -> Arc<WeightDesc> {
    let (precision, rot, calib_key) = (p.precision, p.rot.clone(), p.calib_key);
    Arc::new(WeightDesc { n, k, ggml_type: src.ggml_type, precision, scales, col_scale, rot, act_seen: Default::default(), calib_key, fix: Default::default() })
}

/// Writes the `.orkpack` entry of a packed weight. Its payload: tiles = every term's tiles, one
/// after the other (resident or not: a later start imports what its budget allows, without
/// repacking); scales = row scales [N] ++ column scales [K] [++ second term's row scales [N]].
fn store_entry(c: &cache::PackCache, id: &cache::Identity, p: &PackedSource) -> Result<std::path::PathBuf, CacheError> {
    let tiles: Vec<&[u8]> = p.tiles.iter().map(|t| &t.bytes[..]).collect();
    c.store(id, &tiles.concat(), &[&p.scales[..], &p.col_scale, &p.lo_scales].concat())
}

/// Makes a weight that does not fit the residency budget a streamed one (`super::stream`): its
/// scales in memory, its tiles in its `.orkpack` entry (written now if absent: packed once) or,
/// without a cache, packed again at every use.
///
/// `cached_only`: the GGUF bytes are gone after this call (a repacked buffer's): the tiles must
/// come from, or go to, the cache, else it fails (the weight stays on the CPU).
pub fn stream_source(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, use_cache: bool, cached_only: bool) -> Result<StreamSrc, NpuError> {
    dev.npu.check_shape(n, k)?;
    let cache = if use_cache { dev.cache.as_ref() } else { None };
    let t0 = Instant::now();
    let p = prep(dev, src, n, k, cache.is_some());
    let terms = p.precision.terms.weight;
    let one = crate::npu::layout::WeightGeometry::with_sets(dev.npu.soc(), n, k, p.sets).total_bytes;
    let hit = match (cache, &p.id) {
        (Some(c), Some(id)) => match c.load(id) {
            Ok(l) if l.tiles().len() == terms * one && l.scales().len() == n + k + (terms - 1) * n => Some(l),
            Ok(_) => {
                log::debug!("orkpack {}: entry sizes do not match; repacking", src.name);
                None
            }
            Err(CacheError::Absent) => None,
            Err(e) => {
                log::debug!("orkpack {}: {e}; repacking", src.name);
                None
            }
        },
        _ => None,
    };
    let (tiles, f) = match hit {
        Some(l) => {
            dev.stats.cache_hits.fetch_add(1, Relaxed);
            let f = l.scales();
            (Tiles::Cache(Box::new(l)), f)
        }
        None => {
            let packed = pack_source_sets(dev.npu.soc(), src, n, k, p.sets, terms, p.rot.as_deref())?;
            dev.stats.packed.fetch_add(1, Relaxed);
            let mut tiles = Tiles::Gguf;
            if let (Some(c), Some(id)) = (cache, &p.id) {
                match store_entry(c, id, &packed).and_then(|_| c.load(id)) {
                    Ok(l) => {
                        dev.stats.cache_writes.fetch_add(1, Relaxed);
                        tiles = Tiles::Cache(Box::new(l));
                    }
                    Err(e) => log::debug!("orkpack {}: not cached ({e}); streamed from the GGUF bytes", src.name),
                }
            }
            if cached_only && matches!(tiles, Tiles::Gguf) {
                return Err(NpuError::NoDevice("past the residency budget, and its tiles could not be cached to stream from (its GGUF bytes are ggml-cpu's repacked layout after the load)".into()));
            }
            (tiles, [packed.scales, packed.col_scale, packed.lo_scales].concat())
        }
    };
    dev.stats.pack_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    dev.stream.weights.fetch_add(1, Relaxed);
    let desc = describe(src, n, k, &p, f[..n].to_vec(), f[n..n + k].to_vec());
    Ok(StreamSrc { desc, sets: p.sets, term_tile_bytes: one, tiles, lo_scales: f[n + k..].to_vec() })
}

/// Cold-pack progress on stderr (large models only).
static PROGRESS: cache::Progress = cache::Progress::new();

/// Makes one weight resident: from the `.orkpack` cache when it holds a valid entry (map →
/// validate → `Npu::upload_bytes_observed`), else dequantize → per-channel int8 → tile → upload, then
/// write the entry. `src`: `[N, K]` weight of any supported ggml type.
pub fn pack(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize) -> Result<PackedWeight, NpuError> {
    pack_with(dev, src, n, k, true)
}

/// [`pack`]; `use_cache == false` neither reads nor writes the `.orkpack` cache (weights that are
/// not a model's, e.g. test-backend-ops' random ones, which would only fill it with entries
/// that never hit).
pub fn pack_with(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, use_cache: bool) -> Result<PackedWeight, NpuError> {
    let cache = if use_cache { dev.cache.as_ref() } else { None };
    let t0 = Instant::now();
    let term_bytes = dev.npu.term_bytes(n, k);
    dev.placement.placed_src_bytes.fetch_add(src.bytes.len() as u64, Relaxed);
    dev.placement.placed_term_bytes.fetch_add(term_bytes, Relaxed);
    let p = prep(dev, src, n, k, cache.is_some());
    let terms = p.precision.terms.weight;
    // Not even one term fits the residency budget: the weight stays on the CPU, without
    // opening its cache entry or packing it for nothing. With streaming on, a weight is
    // resident whole (every term) or streamed (`super::stream`), so that both run the same
    // arithmetic.
    let (resident, budget) = (dev.npu.resident_bytes(), dev.npu.residency_budget());
    let need = if dev.stream.active(dev) { term_bytes * terms as u64 } else { term_bytes };
    if resident + need > budget {
        let why = format!("residency budget: {} of {} MiB in use", resident >> 20, budget >> 20);
        return Err(NpuError::NoRoom { op: "pack", n, k, bytes: need, why });
    }
    let t_hashed = Instant::now();
    dev.stats.cache_hash_ns.fetch_add((t_hashed - t0).as_nanos() as u64, Relaxed);
    if let (Some(c), Some(id)) = (cache, &p.id) {
        let opened = c.open(id);
        let t_read = Instant::now();
        dev.stats.cache_read_ns.fetch_add((t_read - t_hashed).as_nanos() as u64, Relaxed);
        match opened {
            Ok(entry) => {
                let hit = import_entry(dev, entry, src, n, k, p.sets, terms);
                dev.stats.cache_import_ns.fetch_add(t_read.elapsed().as_nanos() as u64, Relaxed);
                match hit {
                    Ok(imported) => {
                        dev.stats.cache_hits.fetch_add(1, Relaxed);
                        dev.stats.pack_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
                        return Ok(resident_weight(dev, src, n, k, &p, imported));
                    }
                    Err(why) => log::debug!("orkpack {}: {why}; repacking", src.name),
                }
            }
            Err(CacheError::Absent) => {}
            Err(e) => log::debug!("orkpack {}: {e}; repacking", src.name),
        }
    }
    let t_pack = Instant::now();
    let packed = pack_source_sets(dev.npu.soc(), src, n, k, p.sets, terms, p.rot.as_deref())?;
    let t_packed = Instant::now();
    dev.stats.cold_pack_ns.fetch_add((t_packed - t_pack).as_nanos() as u64, Relaxed);
    let resident = dev.npu.upload(&packed.tiles[0])?;
    let lo = match packed.tiles.get(1) {
        // Out of resident budget: the weight keeps one term (less precise, still on the NPU).
        Some(tl) if !second_term_fits(dev, src, n, k, tl.bytes.len() * dev.npu.weight_copies() as usize) => {
            note_one_term(dev, src.name, "resident budget");
            None
        }
        Some(tl) => match dev.npu.upload(tl) {
            Ok(r) => Some(r),
            Err(e @ NpuError::NoRoom { .. }) => {
                note_one_term(dev, src.name, &e.to_string());
                None
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let t_uploaded = Instant::now();
    dev.stats.cold_upload_ns.fetch_add((t_uploaded - t_packed).as_nanos() as u64, Relaxed);
    let mut cached = false;
    if let (Some(c), Some(id)) = (cache, &p.id) {
        match store_entry(c, id, &packed) {
            Ok(_) => {
                dev.stats.cache_writes.fetch_add(1, Relaxed);
                cached = true;
            }
            Err(e) => log::debug!("orkpack {}: not cached: {e}", src.name),
        }
    }
    let PackedSource { scales, col_scale, lo_scales, .. } = packed;
    dev.stats.cache_store_ns.fetch_add(t_uploaded.elapsed().as_nanos() as u64, Relaxed);
    dev.stats.packed.fetch_add(1, Relaxed);
    dev.stats.pack_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    PROGRESS.packed(src.bytes.len() as u64, cached);
    Ok(resident_weight(dev, src, n, k, &p, (resident, lo.map(|r| (r, lo_scales)), scales, col_scale)))
}

/// The resident weight made of `imported` (tiles, second term, row and column scales), booked
/// in the memory ledger; its precision as resident: the second term only where it was placed.
fn resident_weight(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, p: &Prep, imported: Imported) -> PackedWeight {
    let (resident, lo, scales, col_scale) = imported;
    let lo_tiles = lo.as_ref().map_or(0, |(r, _)| r.resident_bytes());
    let f32s = scales.len() + col_scale.len() + lo.as_ref().map_or(0, |(_, s)| s.len());
    let held = super::Held::new(&dev.stats.mem, [resident.resident_bytes(), lo_tiles], 4 * f32s as u64);
    dev.note_memory();
    let terms = precision::Terms { weight: 1 + usize::from(lo.is_some()), ..p.precision.terms };
    let precision = precision::Precision { terms, ..p.precision };
    PackedWeight { desc: describe(src, n, k, p, scales, col_scale), resident, lo, precision, held }
}

/// One weight of a buffer (keyed by its data address): its source bytes and where it lives.
struct Slot {
    /// Its source bytes in the buffer (invalidation).
    range: Range<usize>,
    /// On the NPU: resident or streamed (`super::stream`), or why it could not be made resident
    /// (ORK declines its MUL_MATs so ggml-cpu runs them in place, and does not retry packing
    /// every graph).
    npu: Option<Result<Placed, String>>,
    /// Its GPU copy for decode, when the GPU engine is in use.
    gpu: Option<Arc<GpuWeight>>,
}

/// The weights of one ORK buffer, keyed by data address.
#[derive(Default)]
pub struct WeightStore {
    slots: Mutex<HashMap<usize, Slot>>,
    /// The store of a buffer whose bytes ORK reads only while they are loaded (ggml-cpu's
    /// `CPU_REPACK`): a weight past the budget streams only from the `.orkpack` cache, else it
    /// stays on the CPU.
    resident_only: bool,
}

/// Where a weight the NPU runs lives.
#[derive(Clone)]
pub enum Placed {
    Resident(Arc<PackedWeight>),
    Streamed(Arc<StreamSrc>),
}

impl Placed {
    /// Whether it was made from an `[N, K]` weight of `ggml_type`.
    fn made_from(&self, n: usize, k: usize, ggml_type: u32) -> bool {
        let d: &WeightDesc = match self {
            Placed::Resident(w) => &w.desc,
            Placed::Streamed(s) => &s.desc,
        };
        (d.n, d.k, d.ggml_type) == (n, k, ggml_type)
    }
}

impl WeightStore {
    /// A store whose weights are resident, streamed from the `.orkpack` cache, or left on the CPU.
    pub fn resident_only() -> WeightStore {
        WeightStore { resident_only: true, ..Default::default() }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets (with `f`) where the weight at `addr` (`len` source bytes) lives.
    fn put(&self, addr: usize, len: usize, f: impl FnOnce(&mut Slot)) {
        let mut slots = self.slots();
        let slot = slots.entry(addr).or_insert_with(|| Slot { range: addr..addr, npu: None, gpu: None });
        slot.range.end = slot.range.end.max(addr + len);
        f(slot);
    }

    /// The NPU placement at `addr`, made from an `[N, K]` weight of `ggml_type`.
    pub fn placed(&self, addr: usize, n: usize, k: usize, ggml_type: u32) -> Option<Placed> {
        match self.slots().get(&addr)?.npu.as_ref()? {
            Ok(p) if p.made_from(n, k, ggml_type) => Some(p.clone()),
            _ => None,
        }
    }

    /// The weight at `addr` on the NPU, made resident first if needed (or if the shape/type
    /// changed), or a streamed one where it is past the residency budget and the device streams
    /// (`super::stream`). `use_cache`: whether the weight may come from / go to the `.orkpack`
    /// cache ([`pack_with`]).
    pub fn get_or_place(&self, dev: &Device, addr: usize, src: &WeightSource<'_>, n: usize, k: usize, use_cache: bool) -> Result<Placed, NpuError> {
        if let Some(Some(Err(why))) = self.slots().get(&addr).map(|s| &s.npu) {
            return Err(NpuError::NoDevice(format!("not resident: {why}")));
        }
        if let Some(p) = self.placed(addr, n, k, src.ggml_type) {
            return Ok(p);
        }
        let mut r = pack_with(dev, src, n, k, use_cache).map(|w| Placed::Resident(Arc::new(w)));
        if let Err(NpuError::NoRoom { op: "pack", .. }) = &r {
            // A resident-only store's weights stream where their tiles go to the `.orkpack`
            // cache (a fill reads them there; the GGUF bytes are gone after the load).
            if dev.stream.active(dev) && (!self.resident_only || (use_cache && dev.cache.is_some())) {
                r = stream_source(dev, src, n, k, use_cache, self.resident_only).map(|s| Placed::Streamed(Arc::new(s)));
            }
        }
        let npu = r.as_ref().map(Placed::clone).map_err(|e| e.to_string());
        self.put(addr, src.bytes.len(), |s| s.npu = Some(npu));
        r
    }

    /// Whether the weight at `addr` failed to become resident (its MUL_MATs stay on the CPU).
    pub fn is_failed(&self, addr: usize) -> bool {
        matches!(self.slots().get(&addr).map(|s| &s.npu), Some(Some(Err(_))))
    }

    /// The GPU copy of the weight at `addr`, uploading it first if needed.
    pub fn get_or_upload_gpu(&self, dev: &Device, addr: usize, src: &WeightSource<'_>, n: usize, k: usize) -> Result<Arc<GpuWeight>, crate::vk::VkError> {
        let gpu = self.slots().get(&addr).and_then(|s| s.gpu.clone());
        if let Some(g) = gpu.filter(|g| (g.n, g.k, g.ggml_type) == (n, k, src.ggml_type)) {
            return Ok(g);
        }
        // The weight's one precision and calibration key: its NPU copy's (resident or streamed)
        // where it has one, else decided now.
        let placed = self.placed(addr, n, k, src.ggml_type);
        let (p, key) = match &placed {
            Some(Placed::Resident(pw)) => (pw.precision, pw.calib_key),
            Some(Placed::Streamed(ss)) => (ss.precision, ss.calib_key),
            None => {
                let p = precision_of(dev, src, k);
                (p, calib_key(dev, src, n, k, &p, None))
            }
        };
        // Its calibrated direction: the resident copy's (the same int8 terms), computed once
        // for both; else for the GPU copy's terms.
        let fix = |rot: Option<&Rotation>| match (&dev.calib, key) {
            (Some(store), Some(key)) if !store.recording() => match &placed {
                Some(Placed::Resident(pw)) => pw.fix.get_or_init(|| dev.fixed_direction(pw, src, store, key)).clone(),
                _ => dev.calibrated_direction(src, n, k, rot, p.terms.weight > 1, store, key),
            },
            _ => None,
        };
        let g = Arc::new(super::gpu::upload(dev, src, n, k, p, fix)?);
        self.put(addr, src.bytes.len(), |s| s.gpu = Some(g.clone()));
        Ok(g)
    }

    /// Drops every weight copy whose bytes overlap `lo..hi` (a write or memset happened there).
    pub fn invalidate(&self, lo: usize, hi: usize) {
        self.slots().retain(|_, s| s.range.end <= lo || s.range.start >= hi);
    }

    pub fn clear(&self) {
        self.slots().clear();
    }
}
