//! Streamed prefill: weights past the residency budget run on the NPU through a ring of NPU
//! buffers (`npu::stream`) instead of going back to the CPU.
//!
//! A weight that does not fit the budget whole (every int8 term its precision plan gives it)
//! becomes a [`StreamSrc`] in its buffer's `WeightStore`: its scales stay in host memory, its
//! tiles on disk in the `.orkpack` entry (mapped, file-backed: the page cache holds them, not
//! ORK), or, without a cache, nowhere (packed from the GGUF bytes again at every use). For a
//! MUL_MAT whose M makes it pay (`route::stream_pays`, with `route::StreamCost`), the tiles are
//! copied into ring slots and the slots run like resident weights: the same tiles, scales and
//! host passes as the resident path, so the same bits.
//!
//! Prefetch: the graph walk (`graph.rs`) hands the fill of the next streamed MUL_MAT of the graph
//! to this module's worker thread while the NPU runs the current one; the ring has slots for two
//! weights of two terms, so at most one fill runs ahead. What the walk waits for a fill is the
//! exposed stream time in the full breakdown (`ORK_PROFILE=1`). A fill that fails leaves that
//! MUL_MAT to the CPU, counted (`stream_failed`).
//!
//! Not streamed: interfaces whose cores each have their own address space (`rocket`; the ring
//! is refused there, `npu::stream`), and `ORK_STREAM=0`.

use super::packed::{PackedWeight, WeightDesc};
use super::{Device, MemLedger};
use crate::cache;
use crate::npu::layout::TileSets;
use crate::npu::stream::StreamRing;
use crate::npu::{NpuError, ResidentWeight};
use crate::pack::WeightSource;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Ring slots: two weights (the one the NPU runs, the one being filled) of up to two terms.
pub const RING_SLOTS: usize = 4;

/// Where a streamed weight's tiles come from.
pub enum Tiles {
    /// The verified `.orkpack` entry, mapped: every term's tiles, one after the other.
    Cache(Box<cache::Loaded>),
    /// No entry: packed from the GGUF bytes at each use.
    Gguf,
}

/// A weight that is not resident: its description, and what a fill needs besides it.
pub struct StreamSrc {
    /// What it is (shared with its fills); its fields read through `Deref`.
    pub desc: Arc<WeightDesc>,
    pub sets: TileSets,
    /// Each int8 weight term's tiled bytes (`precision.terms.weight` terms, 1 or 2).
    pub term_tile_bytes: usize,
    pub tiles: Tiles,
    pub lo_scales: Vec<f32>,
}

impl std::ops::Deref for StreamSrc {
    type Target = WeightDesc;

    fn deref(&self) -> &WeightDesc {
        &self.desc
    }
}

impl StreamSrc {
    /// Tile bytes one fill copies (every term).
    pub fn fill_bytes(&self) -> u64 {
        (self.precision.terms.weight * self.term_tile_bytes) as u64
    }

    /// Whether a MUL_MAT of `m` rows of this weight runs on the NPU (the cost model).
    pub fn pays(&self, dev: &Device, m: usize) -> bool {
        let cached = matches!(self.tiles, Tiles::Cache(_));
        let fill = crate::route::StreamCost::MEASURED.fill_s(self.fill_bytes(), (self.n * self.k) as u64, cached);
        let mm = crate::route::MatMul { m, k: self.k, n: self.n, ggml_type: self.ggml_type };
        let terms = self.precision.terms;
        // Only fills from the cache run ahead (`Streamer::start`).
        crate::route::stream_pays(dev.cfg, dev.npu.soc(), &mm, terms, fill, cached)
    }
}

/// What a finished fill hands over: the weight in its slots, or why not; its bytes and time.
pub type Filled = Result<Arc<PackedWeight>, String>;

/// A fill handed to the worker; [`Ticket::wait`] takes its result and the worker's time on it.
pub struct Ticket(Receiver<(Filled, u64)>);

impl Ticket {
    /// Waits for the fill: its result and the worker's time on it.
    pub fn wait(self) -> (Filled, u64) {
        self.0.recv().unwrap_or_else(|_| (Err("the fill worker is gone".into()), 0))
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A device's streaming state: the ring and the fill worker, made at the first streamed weight.
#[derive(Default)]
pub struct Streamer {
    enabled: AtomicBool,
    ring: OnceLock<Option<Arc<StreamRing>>>,
    worker: Mutex<Option<Sender<Job>>>,
    /// The fill running ahead (weight address, ticket): for the next streamed MUL_MAT of the
    /// graph being walked, or, past its end, for the weight that followed the last one used
    /// the last time (ggml hands ORK one graph split at a time: the next split's weights are
    /// not visible from this one, but each ubatch uses the weights in the same order).
    pending: Mutex<Option<(usize, Ticket)>>,
    /// Streamed weight address → the streamed weight used after it last time, and the last
    /// streamed weight used.
    next_of: Mutex<std::collections::HashMap<usize, (usize, Arc<StreamSrc>)>>,
    last_used: Mutex<Option<usize>>,
    /// Weights made streamed, fills done (a weight's every term into slots), tile bytes copied or packed
    /// into slots, the fills' time, the part of it the walk waited for (exposed), the fills that
    /// failed (those MUL_MATs ran on the CPU) and MUL_MATs of streamed weights the cost model
    /// left to the CPU.
    pub weights: AtomicU64,
    pub fills: AtomicU64,
    pub bytes: AtomicU64,
    pub fill_ns: AtomicU64,
    pub exposed_ns: AtomicU64,
    pub failed: AtomicU64,
    pub declined: AtomicU64,
    /// Fills the walk took from the worker (run ahead) rather than making them when reached.
    pub ahead: AtomicU64,
}

impl Streamer {
    /// Turns streaming on (`ORK_STREAM`, set where the backend opens the device).
    pub fn enable(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    /// Whether weights past the budget stream here (on, and the interface takes a ring).
    pub fn active(&self, dev: &Device) -> bool {
        self.ring(dev).is_some()
    }

    /// The ring, made at first use (None: streaming is off or the interface refuses a ring).
    pub fn ring(&self, dev: &Device) -> Option<Arc<StreamRing>> {
        if !self.enabled.load(Relaxed) {
            return None;
        }
        self.ring.get_or_init(|| dev.npu.stream_ring(RING_SLOTS).map(Arc::new)).clone()
    }

    /// Bytes of the ring's slot buffers (0 before the first fill).
    pub fn ring_bytes(&self) -> u64 {
        self.ring.get().and_then(|r| r.as_ref()).map_or(0, |r| r.bytes())
    }

    /// The part of the full breakdown (`ORK_PROFILE=1`) on streaming ("" when nothing streamed).
    pub fn line(&self) -> String {
        let w = self.weights.load(Relaxed);
        if w == 0 {
            return String::new();
        }
        format!(
            ", streamed: {w} weights, {} fills ({} run ahead), {} MiB, fill {:.0} ms of which exposed {:.0} ms, {} failed, {} left to the CPU by cost",
            self.fills.load(Relaxed), self.ahead.load(Relaxed), self.bytes.load(Relaxed) >> 20,
            self.fill_ns.load(Relaxed) as f64 / 1e6, self.exposed_ns.load(Relaxed) as f64 / 1e6,
            self.failed.load(Relaxed), self.declined.load(Relaxed),
        )
    }

    /// Whether a fill runs ahead.
    pub fn has_pending(&self) -> bool {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Hands the fill of the streamed weight at `addr` to the worker (unless one runs ahead).
    pub fn prefetch(&self, dev: &Device, addr: usize, src: Arc<StreamSrc>) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_none() {
            *p = self.start(dev, src).map(|t| (addr, t));
        }
    }

    /// Prefetches the weight that followed the one at `addr` the last time.
    pub fn prefetch_successor(&self, dev: &Device, addr: usize) {
        let next = self.next_of.lock().unwrap_or_else(|p| p.into_inner()).get(&addr).cloned();
        if let Some((a, src)) = next {
            self.prefetch(dev, a, src);
        }
    }

    /// The streamed weight at `addr` (`src`) is used now: learns the order of use, and returns
    /// the fill for it (the one running ahead if it is for this weight, else one made now with
    /// `gguf`, its source bytes when it has no cache entry), booking its time and the part of
    /// it waited for.
    pub fn take(&self, dev: &Device, addr: usize, src: &Arc<StreamSrc>, gguf: Option<&WeightSource<'_>>) -> Filled {
        {
            let mut last = self.last_used.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(prev) = last.filter(|&p| p != addr) {
                self.next_of.lock().unwrap_or_else(|p| p.into_inner()).insert(prev, (addr, src.clone()));
            }
            *last = Some(addr);
        }
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take();
        match pending {
            Some((a, t)) if a == addr => {
                self.ahead.fetch_add(1, Relaxed);
                let t0 = Instant::now();
                let (r, ns) = t.wait();
                self.book(src, &r, ns, t0.elapsed().as_nanos() as u64);
                r
            }
            other => {
                // A fill for another weight is let go (its slots come back when it ends).
                drop(other);
                self.fill_now(dev, src, gguf)
            }
        }
    }

    /// Hands the fill of a cache-backed streamed weight to the worker thread.
    fn start(&self, dev: &Device, src: Arc<StreamSrc>) -> Option<Ticket> {
        let ring = self.ring(dev)?;
        if !matches!(src.tiles, Tiles::Cache(_)) {
            return None;
        }
        let (out, result) = channel();
        let ledger = dev.stats.mem.clone();
        let job: Job = Box::new(move || {
            let t0 = Instant::now();
            let r = fill(&ring, &ledger, &src, None).map(Arc::new).map_err(|e| e.to_string());
            let _ = out.send((r, t0.elapsed().as_nanos() as u64));
        });
        let mut w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            let (tx, rx) = channel::<Job>();
            std::thread::Builder::new().name("ork-stream".into()).spawn(move || rx.into_iter().for_each(|j| j())).ok()?;
            *w = Some(tx);
        }
        w.as_ref()?.send(job).ok()?;
        Some(Ticket(result))
    }

    /// Fills a streamed weight now (no fill ran ahead for it); `gguf`: its source bytes,
    /// needed when it has no cache entry. Counted like a prefetched fill, all of it exposed.
    pub fn fill_now(&self, dev: &Device, src: &StreamSrc, gguf: Option<&WeightSource<'_>>) -> Filled {
        let ring = self.ring(dev).ok_or("no stream ring")?;
        let t0 = Instant::now();
        let r = fill(&ring, &dev.stats.mem, src, gguf).map(Arc::new).map_err(|e| e.to_string());
        let ns = t0.elapsed().as_nanos() as u64;
        self.book(src, &r, ns, ns);
        r
    }

    /// Books a fill: `ns` its time, `exposed_ns` what the walk waited for it.
    pub fn book(&self, src: &StreamSrc, r: &Filled, ns: u64, exposed_ns: u64) {
        self.fill_ns.fetch_add(ns, Relaxed);
        self.exposed_ns.fetch_add(exposed_ns, Relaxed);
        match r {
            Ok(_) => {
                self.fills.fetch_add(1, Relaxed);
                self.bytes.fetch_add(src.fill_bytes(), Relaxed);
            }
            Err(e) => {
                crate::logging::warn_first(self.failed.fetch_add(1, Relaxed) == 0, &format!("streamed weight N={} K={}: fill failed ({e}); the MUL_MAT runs on the CPU", src.n, src.k), " (further failures: count at exit)");
            }
        }
    }
}

/// Copies (or packs) every term of `src` into ring slots: a weight that runs like a resident one.
fn fill(ring: &StreamRing, ledger: &Arc<MemLedger>, src: &StreamSrc, gguf: Option<&WeightSource<'_>>) -> Result<PackedWeight, NpuError> {
    let one = src.term_tile_bytes;
    let packed;
    let tiles: Vec<&[u8]> = match (&src.tiles, gguf) {
        (Tiles::Cache(l), _) => (0..src.precision.terms.weight).map(|t| &l.tiles()[t * one..(t + 1) * one]).collect(),
        (Tiles::Gguf, Some(g)) => {
            packed = crate::pack::pack_source_sets(ring.soc(), g, src.n, src.k, src.sets, src.precision.terms.weight, src.rot.as_deref())?;
            packed.tiles.iter().map(|t| &t.bytes[..]).collect()
        }
        (Tiles::Gguf, None) => return Err(NpuError::NoDevice("streamed weight without its source bytes".into())),
    };
    let copy = |t: &[u8]| {
        ring.fill(src.n, src.k, src.sets, &mut |dst| {
            if dst.len() != t.len() {
                return Err(NpuError::BadBlob { op: "stream", n: src.n, k: src.k, got: t.len(), expected: dst.len() });
            }
            dst.copy_from_slice(t);
            Ok(())
        })
    };
    let mut slots = tiles.into_iter().map(copy).collect::<Result<Vec<Arc<ResidentWeight>>, _>>()?.into_iter();
    let resident = slots.next().ok_or_else(|| NpuError::NoDevice("no term".into()))?;
    let lo = slots.next().map(|r| (r, src.lo_scales.clone()));
    Ok(PackedWeight { desc: src.desc.clone(), resident, lo, precision: src.precision, held: super::Held::new(ledger, [0, 0], 0) })
}
