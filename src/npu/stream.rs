//! A ring of fixed NPU buffers for weights that are not resident (streamed prefill).
//!
//! Past the residency budget a weight is not kept in NPU memory; for a prefill MUL_MAT its tiles
//! are copied into one slot of a [`StreamRing`] (from the `.orkpack` mapping, or packed from the
//! GGUF bytes by the caller), the slot is cleaned to memory, and the slot runs like a resident
//! weight ([`Npu::mm_run`]). Dropping the [`ResidentWeight`] a slot was filled as hands the slot
//! back to the ring; [`StreamRing::fill`] waits for a free slot, so a caller that fills ahead
//! (prefetch) is bounded by the slots.
//!
//! Decisions:
//! * Slots are buffers kept for the life of the ring and grown (never shrunk) to the largest
//!   weight seen, like the scratch buffers of [`mm`]: no allocation per weight. Weights are
//!   inputs, so the cold-output-buffer quirk (rknpu-facts §2.6) does not apply to a fresh slot;
//!   the feature-address caching of §2.6 concerns activations, and the simulator checks that no
//!   program reuses CBUF weights from the previous one (`WEIGHT_REUSE` = 0), so a slot refilled
//!   at the same address is read afresh by the next program.
//! * A slot lives in the domain that has IOVA room for it ([`DomainSet::reserve_unbudgeted`]):
//!   it counts against the per-domain windows but not against the residency budget, which bounds
//!   the resident weights; the ring's bytes are reported apart ([`StreamRing::bytes`]).
//! * Interfaces where every core has its own address space (`rocket`: each core's file
//!   descriptor holds the part of a weight it computes) would need a slot per core and a fill
//!   split into parts: the ring refuses them ([`Npu::stream_ring`] returns `None`).
//!
//! [`DomainSet::reserve_unbudgeted`]: super::domain::DomainSet::reserve_unbudgeted

use std::sync::{Arc, Condvar, Mutex};

use super::kif::{mem_flags, page_round, SyncDir};
use super::layout::{self, WeightGeometry};
use super::mm::{Shared, WeightInner};
use super::slots::{RingInner, Slot};
use super::{Npu, NpuError, ResidentWeight};

/// A fixed set of NPU buffers that weights are streamed through.
pub struct StreamRing {
    shared: Arc<Shared>,
    inner: Arc<RingInner>,
}

impl Npu {
    /// A ring of `slots` buffers for streamed weights; None where the cores do not share one
    /// address space, or the kernel interface keeps several copies of each weight (see the
    /// module notes).
    pub fn stream_ring(&self, slots: usize) -> Option<StreamRing> {
        if self.shared.kif.per_core_spaces() || self.weight_copies() > 1 || slots == 0 {
            return None;
        }
        let free = (0..slots).map(|_| Slot { bo: None }).collect();
        let inner = Arc::new(RingInner { free: Mutex::new(free), ready: Condvar::new(), bytes: Mutex::new(0), closed: Default::default() });
        Some(StreamRing { shared: self.shared.clone(), inner })
    }
}

impl StreamRing {
    /// The SoC it runs on (the tile layout of what is filled).
    pub fn soc(&self) -> &super::soc::SocDesc {
        &self.shared.soc
    }

    /// Bytes of the slots' buffers (what the ring holds in memory besides the resident weights).
    pub fn bytes(&self) -> u64 {
        *self.inner.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fills a free slot (waiting for one) with the tiles of an `[N, K]` weight holding the tile
    /// sets `sets`: `write` gets the slot's first `total` bytes to write the tiled blob into
    /// (the layout of [`layout::tile_weight`]); the slot is then cleaned to memory. The returned
    /// weight runs like a resident one; dropping it hands the slot back.
    pub fn fill(&self, n: usize, k: usize, sets: layout::TileSets, write: &mut dyn FnMut(&mut [u8]) -> Result<(), NpuError>) -> Result<Arc<ResidentWeight>, NpuError> {
        super::check_shape_soc(&self.shared.soc, n, k)?;
        let geom = WeightGeometry::with_sets(&self.shared.soc, n, k, sets);
        let total = geom.total_bytes;
        let mut slot = {
            let mut free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(s) = free.pop() {
                    break s;
                }
                free = self.inner.ready.wait(free).unwrap_or_else(|p| p.into_inner());
            }
        };
        // From here on an error hands the slot back.
        let r = self.fill_slot(&mut slot, n, k, total, write);
        match r {
            Ok(()) => {
                let (bo, domain) = slot.bo.take().expect("a filled slot");
                let inner = WeightInner { n, k, geom, bo: Some(bo), parts: Vec::new(), domain, reserved_bytes: 0, shared: self.shared.clone(), ring: Some(self.inner.clone()) };
                Ok(ResidentWeight::from_inner(inner))
            }
            Err(e) => {
                // The ring is alive (`self`): the slot is kept.
                let _ = self.inner.give_back(slot);
                Err(e)
            }
        }
    }

    fn fill_slot(&self, slot: &mut Slot, n: usize, k: usize, total: usize, write: &mut dyn FnMut(&mut [u8]) -> Result<(), NpuError>) -> Result<(), NpuError> {
        let kif = &*self.shared.kif;
        if slot.bo.as_ref().is_some_and(|(bo, _)| bo.size_bytes < total) {
            let (bo, d) = slot.bo.take().expect("checked");
            let size = bo.size_bytes as u64;
            kif.mem_destroy(bo)?;
            self.shared.domains().release_unbudgeted(d, size);
            *self.inner.bytes.lock().unwrap_or_else(|p| p.into_inner()) -= size;
        }
        if slot.bo.is_none() {
            let size = page_round(total);
            let d = self.shared.domains().reserve_unbudgeted(size as u64).map_err(|e| NpuError::NoRoom { op: "stream", n, k, bytes: size as u64, why: format!("{e:?}") })?;
            let made = super::mm::ensure_scratch(&self.shared, d, self.shared.cores.len() as u32).and_then(|_| kif.mem_create(size, mem_flags::DATA, d));
            match made {
                Ok(bo) => {
                    slot.bo = Some((bo, d));
                    *self.inner.bytes.lock().unwrap_or_else(|p| p.into_inner()) += size as u64;
                }
                Err(e) => {
                    self.shared.domains().release_unbudgeted(d, size as u64);
                    return Err(e.into());
                }
            }
        }
        let (bo, _) = slot.bo.as_mut().expect("a slot buffer");
        write(&mut bo.bytes_mut()[..total])?;
        kif.mem_sync(bo, SyncDir::ToDevice, 0, total)?;
        Ok(())
    }
}

impl Drop for StreamRing {
    fn drop(&mut self) {
        // Slots still out come back to `inner` and are freed with the last weight (`WeightInner`).
        let slots = {
            let mut free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.closed.store(true, std::sync::atomic::Ordering::Relaxed);
            std::mem::take(&mut *free)
        };
        for (bo, d) in slots.into_iter().filter_map(|s| s.bo) {
            self.shared.free_slot(bo, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::soc::SocId;
    use super::super::{layout, Budget, Npu, NpuConfig, NpuKind};
    use std::sync::Arc;

    fn sim(budget: Option<u64>) -> Arc<Npu> {
        Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), wcache_budget_bytes: budget, ..NpuConfig::default() }).expect("simulator opens")
    }

    fn ramp(len: usize, seed: u32) -> Vec<i8> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 24) as i8).collect()
    }

    /// A weight streamed through a ring slot computes the same int32 bits as the same tiles
    /// uploaded resident, for both plans (K-split and full-K) and several M; the slot is reused
    /// for a second weight of another shape (grown) and the ring's bytes stay off the budget.
    #[test]
    fn a_streamed_weight_equals_the_resident_one() {
        let npu = sim(Some(1 << 20));
        let ring = npu.stream_ring(1).expect("a ring on the simulator");
        for (n, k) in [(64, 96), (96, 2048)] {
            let w = ramp(n * k, n as u32);
            let tiled = layout::tile_weight(npu.soc(), &w, n, k).unwrap();
            let other = sim(None);
            let res = other.upload(&tiled).unwrap();
            let streamed = ring
                .fill(n, k, layout::TileSets::Both, &mut |dst| {
                    dst.copy_from_slice(&tiled.bytes);
                    Ok(())
                })
                .unwrap();
            assert!(streamed.is_streamed() && !res.is_streamed());
            for m in [1, 33, 200] {
                let a = ramp(m * k, 7);
                let (mut c_res, mut c_str) = (vec![0i32; m * n], vec![1i32; m * n]);
                other.mm_run(&res, &a, m, &mut c_res, Budget::default()).unwrap();
                npu.mm_run(&streamed, &a, m, &mut c_str, Budget::default()).unwrap();
                assert_eq!(c_str, c_res, "M={m} K={k} N={n}");
                assert_eq!(c_str, super::super::reference_mm(&a, &w, m, k, n));
            }
            // The only slot comes back when the weight is dropped; the next fill waits for it.
            drop(streamed);
        }
        assert_eq!(npu.resident_bytes(), 0, "slots are not charged to the residency budget");
        assert!(ring.bytes() >= layout::WeightGeometry::new(npu.soc(), 96, 2048).total_bytes as u64);
        assert!(npu.domain_usage()[0] >= ring.bytes(), "slots take IOVA room");
        drop(ring);
        assert_eq!(npu.domain_usage()[0], 0, "a dropped ring gives its IOVA room back");
    }

    /// A fill that fails (the writer errs) hands its slot back: the next fill gets it.
    #[test]
    fn a_failed_fill_keeps_the_slot() {
        let npu = sim(None);
        let ring = npu.stream_ring(1).unwrap();
        let e = ring.fill(32, 32, layout::TileSets::Both, &mut |_| Err(super::NpuError::NoDevice("writer".into())));
        assert!(e.is_err());
        let w = ring.fill(32, 32, layout::TileSets::Both, &mut |d| {
            d.fill(1);
            Ok(())
        });
        assert!(w.is_ok());
    }
}
