//! A weight as the NPU runs it: what it is ([`WeightDesc`], made once when it is placed: shape,
//! type, precision, rotation, scales, calibration) and its resident int8 tiles ([`PackedWeight`]),
//! whether they stay resident (`weights`) or are filled into stream slots for one prefill MUL_MAT
//! (`stream`), and the rotations of K that weights and their activations go through
//! ([`rotation`], shared by the NPU and GPU copies of a weight).

use crate::npu::ResidentWeight;
use crate::quant::rotate::Rotation;
use crate::route::activation::Seen;
use crate::route::precision;
use std::sync::{Arc, Mutex, OnceLock};

/// One weight placed on the NPU, resident or streamed: what every residence of it reads.
pub struct WeightDesc {
    pub n: usize,
    pub k: usize,
    pub ggml_type: u32,
    /// Its precision (`route::precision::decide`, once, when it was placed): int8 terms, rotation
    /// (`rot` is that rotation), correction. A resident copy may hold fewer weight terms
    /// ([`PackedWeight::precision`]).
    pub precision: precision::Precision,
    /// Per-output-channel dequantization scales, `[N] f32`.
    pub scales: Vec<f32>,
    /// Per-input-channel equalisation, `[K] f32`: activations are multiplied by it before
    /// quantization (the weight was divided by it).
    pub col_scale: Vec<f32>,
    /// The rotation of K both operands go through (`quant::rotate`); None: unrotated, with the
    /// column equalisation `col_scale`.
    pub rot: Option<Arc<Rotation>>,
    /// Whether the activations it reads were read again by the MUL_MAT after it, where the
    /// graph does not tell (`route::activation::Seen`), kept across a streamed weight's fills.
    pub act_seen: Arc<Seen>,
    /// The weight's key in the calibration file (`cache::calib::key`), where the device has one
    /// and the weight's precision corrects its rows.
    pub calib_key: Option<u64>,
    /// Its calibrated direction and the NPU's error on it, computed at the first corrected
    /// MUL_MAT (`Device::run_mul_mat`) and kept for a streamed weight's later fills; None inside:
    /// the file has no entry for it.
    pub fix: OnceLock<Option<crate::quant::mean::Direction>>,
}

/// A weight's int8 tiles in NPU memory (resident, or a stream fill's slots) with its description.
pub struct PackedWeight {
    /// What it is (shared by a streamed weight's fills); its fields read through `Deref`.
    pub desc: Arc<WeightDesc>,
    pub resident: Arc<ResidentWeight>,
    /// Second int8 term (`W ≈ q·s + q_lo·s_lo`), where the precision plan gives the weight one:
    /// the residual of the first term, resident beside it, with its own per-channel scales.
    pub lo: Option<(Arc<ResidentWeight>, Vec<f32>)>,
    /// Its precision as placed: `terms.weight` 1 where the budget left no room for the second
    /// term. The NPU run and the GPU copy read it.
    pub precision: precision::Precision,
    /// Its tiles and scales in the device's memory ledger (`Stats::mem`), given back on drop.
    pub held: super::Held,
}

impl std::ops::Deref for PackedWeight {
    type Target = WeightDesc;

    fn deref(&self) -> &WeightDesc {
        &self.desc
    }
}

/// The shared rotation of width `k` (one per K in the process), or None where K has none.
pub(super) fn rotation(k: usize) -> Option<Arc<Rotation>> {
    static ROTS: Mutex<Vec<(usize, Option<Arc<Rotation>>)>> = Mutex::new(Vec::new());
    let mut rots = ROTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = rots.iter().find(|(rk, _)| *rk == k) {
        return r.clone();
    }
    let r = Rotation::new(k).map(Arc::new);
    rots.push((k, r.clone()));
    r
}
