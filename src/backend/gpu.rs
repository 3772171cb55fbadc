//! Decode matmuls on the GPU (`crate::vk`): the weight's GPU copy and one batched GEMV per group
//! of independent MUL_MATs (one submit and one wait).
//!
//! Weights of type Q4_0 and Q4_K are uploaded as the GGUF's own blocks and read natively by the
//! shaders (f32 activations, no requantization). Every other type goes through the weight's own
//! precision, the one its NPU copy has (`route::precision::Precision`: per-channel int8 over the
//! rotation of K, or the column equalisation where it is unrotated, one or two weight terms), and
//! the activations — rotated, or scaled by the columns — through the two-term int8 split (`x ≈ s_hi·q_hi + r`): the GPU runs `[s_hi·q_hi ; r]` as 2M rows (its
//! kernel requantizes each row exactly to `q_hi` and to the residual's int8) and the two halves
//! are added; a weight with a second int8 term adds `W_lo · (s_hi·q_hi)` from one more GEMV in
//! the same submit.

use crate::pack::{quantize_residual, quantize_source, WeightSource};
use super::Device;
use crate::quant;
use crate::quant::rotate::Rotation;
use crate::route::precision::Precision;
use crate::vk::{VkError, VkWeight, VkWeightData};
use std::sync::Arc;

/// What an int8 GPU weight's activations go through before the split: the weight's rotation
/// of K, or its column equalisation.
pub enum XPrep {
    Rotate(Arc<Rotation>),
    Columns(Vec<f32>),
}

/// A weight's GPU copy.
pub struct GpuWeight {
    pub n: usize,
    pub k: usize,
    pub ggml_type: u32,
    pub vk: Arc<VkWeight>,
    /// `Some` for the int8 path (what the activations go through); `None` for native 4-bit
    /// blocks.
    pub prep: Option<XPrep>,
    /// Second int8 weight term (int8 path, where the weight's precision has two).
    pub lo: Option<Arc<VkWeight>>,
    /// Its calibrated direction and its int8 terms' error on it, where its precision corrects
    /// rows and the calibration file has the weight (int8 path): each row corrected as on the
    /// NPU (`quant::mean::correct_along`).
    pub fix: Option<quant::mean::Direction>,
}

/// Uploads a weight `[N, K]` of precision `p` to the GPU; `fix` gives its calibrated direction
/// for int8 terms over the rotation it is passed (None where its rows are not corrected).
pub fn upload(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize, p: Precision, fix: impl FnOnce(Option<&Rotation>) -> Option<quant::mean::Direction>) -> Result<GpuWeight, VkError> {
    let vk = dev.vk.as_ref().ok_or(VkError::Shape { op: "gpu upload", detail: "no GPU engine".into() })?;
    let (data_w, col, lo, fix) = match src.ggml_type {
        quant::types::Q4_0 => (vk.upload(VkWeightData::Q4_0(src.bytes), n, k)?, None, None, None),
        quant::types::Q4_K => (vk.upload(VkWeightData::Q4K(src.bytes), n, k)?, None, None, None),
        _ => {
            let rot = if p.rotated { super::packed::rotation(k) } else { None };
            let (q, rs, col) = quantize_source(src, n, k, rot.as_deref());
            let hi = vk.upload(VkWeightData::I8 { w: &q, scale: &rs }, n, k)?;
            let lo = if p.terms.weight > 1 {
                let (ql, sl) = quantize_residual(src, n, k, rot.as_deref(), &col, &q, &rs);
                Some(vk.upload(VkWeightData::I8 { w: &ql, scale: &sl }, n, k)?)
            } else {
                None
            };
            let fix = fix(rot.as_deref());
            (hi, Some(rot.map_or(XPrep::Columns(col), XPrep::Rotate)), lo, fix)
        }
    };
    Ok(GpuWeight { n, k, ggml_type: src.ggml_type, vk: data_w, prep: col, lo, fix })
}

/// One decode MUL_MAT for the GPU: `dst: [M, N] = x: [M, K] · Wᵀ`.
pub struct GpuJob<'a> {
    pub w: Arc<GpuWeight>,
    pub x: &'a [f32],
    pub m: usize,
    pub dst: &'a mut [f32],
}

/// One GEMV of a batch: its job, whether it is the job's second weight term, its input rows and
/// their count.
type Gemv = (usize, bool, Vec<f32>, usize);

/// Runs independent GEMVs in one submit.
pub fn run_batch(dev: &Device, jobs: &mut [GpuJob<'_>]) -> Result<(), VkError> {
    let vk = dev.vk.as_ref().ok_or(VkError::Shape { op: "gpu gemv", detail: "no GPU engine".into() })?;
    // One GEMV per job (job index, second term?, input, rows: 2M for the int8 path), then one per
    // second weight term, on the rows s_hi·q_hi [M, K].
    let (mut gemvs, mut lo_gemvs): (Vec<Gemv>, Vec<Gemv>) = (Vec::new(), Vec::new());
    for (ji, j) in jobs.iter().enumerate() {
        let (k, m) = (j.w.k, j.m);
        let Some(prep) = &j.w.prep else {
            gemvs.push((ji, false, j.x.to_vec(), m));
            continue;
        };
        let x = match prep {
            XPrep::Columns(col) => quant::scale_columns(j.x, col),
            XPrep::Rotate(rot) => {
                let mut x = j.x.to_vec();
                x.chunks_exact_mut(k).for_each(|r| rot.apply_row(r));
                x
            }
        };
        let mut q = vec![0i8; m * k];
        let mut s = vec![0f32; m];
        quant::quantize_rows(&x, m, k, &mut q, &mut s);
        let mut stacked = vec![0f32; 2 * m * k];
        for r in 0..m {
            for c in 0..k {
                let hi = s[r] * q[r * k + c] as f32;
                stacked[r * k + c] = hi;
                stacked[(m + r) * k + c] = x[r * k + c] - hi;
            }
        }
        if j.w.lo.is_some() {
            lo_gemvs.push((ji, true, stacked[..m * k].to_vec(), m));
        }
        gemvs.push((ji, false, stacked, 2 * m));
    }
    gemvs.append(&mut lo_gemvs);
    let mut ys: Vec<Vec<f32>> = gemvs.iter().map(|&(ji, _, _, rows)| vec![0f32; rows * jobs[ji].w.n]).collect();
    let mut batch: Vec<(&VkWeight, &[f32], usize, &mut [f32])> = Vec::with_capacity(gemvs.len());
    for ((ji, lo, x, rows), y) in gemvs.iter().zip(ys.iter_mut()) {
        let w = &jobs[*ji].w;
        let weight = if *lo { w.lo.as_deref().expect("a second term") } else { &*w.vk };
        batch.push((weight, &x[..], *rows, &mut y[..]));
    }
    vk.gemv_batch(&mut batch)?;
    drop(batch);
    // The two halves of the int8 path added, then the second weight term's product.
    for (&(ji, lo, _, rows), y) in gemvs.iter().zip(&ys) {
        let j = &mut jobs[ji];
        if lo {
            j.dst.iter_mut().zip(y).for_each(|(d, &v)| *d += v);
        } else if rows == j.m {
            j.dst.copy_from_slice(y);
        } else {
            let (hi, lo) = y.split_at(j.m * j.w.n);
            for ((d, &a), &b) in j.dst.iter_mut().zip(hi).zip(lo) {
                *d = a + b;
            }
        }
    }
    // Each row along its weight's calibrated direction, from its own values (as on the NPU).
    for j in jobs.iter_mut() {
        if let Some(d) = &j.w.fix {
            let t = std::time::Instant::now();
            quant::mean::correct_along(j.dst, j.x, j.m, j.w.k, j.w.n, d);
            dev.stats.mean_ns.fetch_add(t.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
            dev.stats.mean_corrected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    Ok(())
}
