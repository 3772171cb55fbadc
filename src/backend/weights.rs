//! Resident weights: one packed NPU copy per weight tensor, owned by the ORK buffer that holds the
//! tensor's GGUF bytes and keyed by the tensor's data address (which also works when ggml's RPC
//! server rebuilds tensor structs for every graph).
//!
//! A weight is packed when its bytes are written whole (`set_tensor` at load), or lazily at its
//! first MUL_MAT; any later write or memset over its bytes drops the packed copy.
//!
//! Packing goes through the `.orkpack` disk cache (`crate::cache`) when the device has one: a
//! valid entry is mapped and imported instead of packing (a *hit*); otherwise the weight is
//! packed and the entry (re)written. Cache trouble of any kind only costs a repack.

use super::Device;
use crate::cache::{self, CacheError};
use crate::npu::{Npu, NpuError, ResidentWeight};
use crate::quant;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The GGUF bytes of a weight `[N, K]` and a row dequantizer (ggml's `to_float` for its type).
pub struct WeightSource<'a> {
    /// The tensor's name (part of the cache key; may be empty).
    pub name: &'a str,
    pub ggml_type: u32,
    /// All N rows, `row_bytes` each.
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    /// Dequantizes one row's bytes into `[K] f32`.
    pub to_float: &'a (dyn Fn(&[u8], &mut [f32]) + Sync),
}

/// A weight made resident on the NPU: int8 per-channel, tiled, with its channel scales.
pub struct PackedWeight {
    pub n: usize,
    pub k: usize,
    pub ggml_type: u32,
    pub resident: Arc<ResidentWeight>,
    /// Per-output-channel dequantization scales, `[N] f32`.
    pub scales: Vec<f32>,
}

/// Per-output-channel int8 of a source weight: `(q: [N, K] i8, scales: [N] f32)`.
pub fn quantize_source(src: &WeightSource<'_>, n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    quant::quantize_weight(n, k, |r, out| {
        let row = &src.bytes[r * src.row_bytes..(r + 1) * src.row_bytes];
        (src.to_float)(row, out)
    })
}

/// Cold-pack progress on stderr (large models only).
static PROGRESS: cache::Progress = cache::Progress::new();

/// Makes one weight resident: from the `.orkpack` cache when it holds a valid entry (map →
/// validate → `Npu::upload_bytes`), else dequantize → per-channel int8 → tile → upload, then
/// write the entry. `src`: `[N, K]` weight of any supported ggml type.
pub fn pack(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize) -> Result<PackedWeight, NpuError> {
    let t0 = Instant::now();
    let id = dev
        .cache
        .as_ref()
        .map(|_| cache::identity(dev.npu.soc(), src.ggml_type, src.bytes, src.row_bytes, src.name, n, k));
    if let (Some(c), Some(id)) = (&dev.cache, &id) {
        match c.load(id) {
            Ok(hit) => match dev.npu.upload_bytes(n, k, hit.tiles()) {
                Ok(resident) => {
                    let scales = hit.scales();
                    dev.stats.cache_hits.fetch_add(1, Relaxed);
                    dev.stats.pack_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
                    return Ok(PackedWeight { n, k, ggml_type: src.ggml_type, resident, scales });
                }
                Err(e) => log::debug!("orkpack {}: import of {} failed ({e}); repacking", src.name, hit.path().display()),
            },
            Err(CacheError::Absent) => {}
            Err(e) => log::debug!("orkpack {}: {e}; repacking", src.name),
        }
    }
    let (q, scales) = quantize_source(src, n, k);
    let tiled = Npu::tile_weight(dev.npu.soc(), &q, n, k)?;
    let resident = dev.npu.upload(&tiled)?;
    if let (Some(c), Some(id)) = (&dev.cache, &id) {
        match c.store(id, &tiled.bytes, &scales) {
            Ok(_) => {
                dev.stats.cache_writes.fetch_add(1, Relaxed);
            }
            Err(e) => log::debug!("orkpack {}: not cached: {e}", src.name),
        }
    }
    dev.stats.packed.fetch_add(1, Relaxed);
    dev.stats.pack_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    PROGRESS.packed(src.bytes.len() as u64);
    Ok(PackedWeight { n, k, ggml_type: src.ggml_type, resident, scales })
}

struct Entry {
    range: Range<usize>,
    weight: Arc<PackedWeight>,
}

/// The packed weights of one ORK buffer, keyed by data address.
#[derive(Default)]
pub struct WeightStore {
    map: Mutex<HashMap<usize, Entry>>,
}

impl WeightStore {
    /// The packed weight at `addr`, packing it first if needed (or if the shape/type changed).
    pub fn get_or_pack(
        &self,
        dev: &Device,
        addr: usize,
        src: &WeightSource<'_>,
        n: usize,
        k: usize,
    ) -> Result<Arc<PackedWeight>, NpuError> {
        if let Some(e) = self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&addr) {
            let w = &e.weight;
            if w.n == n && w.k == k && w.ggml_type == src.ggml_type {
                return Ok(w.clone());
            }
        }
        let w = Arc::new(pack(dev, src, n, k)?);
        let range = addr..addr + src.bytes.len();
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, Entry { range, weight: w.clone() });
        Ok(w)
    }

    /// Drops every packed weight whose bytes overlap `lo..hi` (a write or memset happened there).
    pub fn invalidate(&self, lo: usize, hi: usize) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, e| e.range.end <= lo || e.range.start >= hi);
    }

    pub fn clear(&self) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
