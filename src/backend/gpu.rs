//! Decode matmuls on the GPU (`crate::vk`): the weight's GPU copy and one batched GEMV per group
//! of independent MUL_MATs (one submit and one wait).
//!
//! Weights of type Q4_0 and Q4_K are uploaded as the GGUF's own blocks and read natively by the
//! shaders (f32 activations, no requantization). Every other type goes through the same
//! column-equalised per-channel int8 as the NPU path, and the activations through the same
//! two-term int8 split (`x ≈ s_hi·q_hi + r`): the GPU runs `[s_hi·q_hi ; r]` as 2M rows (its
//! kernel requantizes each row exactly to `q_hi` and to the residual's int8) and the two halves
//! are added; a weight with a second int8 term adds `W_lo · (s_hi·q_hi)` from one more GEMV in
//! the same submit.

use crate::pack::{quantize_residual, quantize_source, WeightSource};
use super::Device;
use crate::quant;
use crate::vk::{VkError, VkWeight, VkWeightData};
use std::sync::Arc;

/// A weight's GPU copy.
pub struct GpuWeight {
    pub n: usize,
    pub k: usize,
    pub ggml_type: u32,
    pub vk: Arc<VkWeight>,
    /// `Some(col_scale)` for the int8 path; `None` for native 4-bit blocks.
    pub col_scale: Option<Vec<f32>>,
    /// Second int8 weight term (int8 path, types that get two terms on the NPU too).
    pub lo: Option<Arc<VkWeight>>,
}

/// Uploads a weight `[N, K]` to the GPU.
pub fn upload(dev: &Device, src: &WeightSource<'_>, n: usize, k: usize) -> Result<GpuWeight, VkError> {
    let vk = dev.vk.as_ref().ok_or(VkError::Shape { op: "gpu upload", detail: "no GPU engine".into() })?;
    let (data_w, col, lo) = match src.ggml_type {
        quant::types::Q4_0 => (vk.upload(VkWeightData::Q4_0(src.bytes), n, k)?, None, None),
        quant::types::Q4_K => (vk.upload(VkWeightData::Q4K(src.bytes), n, k)?, None, None),
        _ => {
            let (q, rs, col) = quantize_source(src, n, k, None);
            let hi = vk.upload(VkWeightData::I8 { w: &q, scale: &rs }, n, k)?;
            let two = dev.cfg.weight_terms() == 2;
            let lo = if two {
                let (ql, sl) = quantize_residual(src, n, k, None, &col, &q, &rs);
                Some(vk.upload(VkWeightData::I8 { w: &ql, scale: &sl }, n, k)?)
            } else {
                None
            };
            (hi, Some(col), lo)
        }
    };
    Ok(GpuWeight { n, k, ggml_type: src.ggml_type, vk: data_w, col_scale: col, lo })
}

/// One decode MUL_MAT for the GPU: `dst: [M, N] = x: [M, K] · Wᵀ`.
pub struct GpuJob<'a> {
    pub w: Arc<GpuWeight>,
    pub x: &'a [f32],
    pub m: usize,
    pub dst: &'a mut [f32],
}

/// Runs independent GEMVs in one submit.
pub fn run_batch(dev: &Device, jobs: &mut [GpuJob<'_>]) -> Result<(), VkError> {
    let vk = dev.vk.as_ref().ok_or(VkError::Shape { op: "gpu gemv", detail: "no GPU engine".into() })?;
    // Prepared inputs and outputs (2M rows for the int8 path).
    let mut xs: Vec<Vec<f32>> = Vec::with_capacity(jobs.len());
    let mut ys: Vec<Vec<f32>> = Vec::with_capacity(jobs.len());
    let mut rows: Vec<usize> = Vec::with_capacity(jobs.len());
    // Second-term GEMVs: (job index, input rows s_hi·q_hi [M, K]).
    let mut lo_x: Vec<(usize, Vec<f32>)> = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        let (k, n, m) = (j.w.k, j.w.n, j.m);
        match &j.w.col_scale {
            None => {
                xs.push(j.x.to_vec());
                rows.push(m);
            }
            Some(col) => {
                let x = quant::scale_columns(j.x, col);
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
                    lo_x.push((ji, stacked[..m * k].to_vec()));
                }
                xs.push(stacked);
                rows.push(2 * m);
            }
        }
        ys.push(vec![0f32; rows.last().unwrap() * n]);
    }
    let mut lo_y: Vec<Vec<f32>> = lo_x.iter().map(|&(ji, _)| vec![0f32; jobs[ji].m * jobs[ji].w.n]).collect();
    {
        let mut batch: Vec<(&VkWeight, &[f32], usize, &mut [f32])> = jobs
            .iter()
            .zip(xs.iter())
            .zip(rows.iter())
            .zip(ys.iter_mut())
            .map(|(((j, x), &r), y)| (&*j.w.vk, &x[..], r, &mut y[..]))
            .collect();
        for ((ji, x), y) in lo_x.iter().zip(lo_y.iter_mut()) {
            let j = &jobs[*ji];
            if let Some(lo) = &j.w.lo {
                batch.push((&**lo, &x[..], j.m, &mut y[..]));
            }
        }
        vk.gemv_batch(&mut batch)?;
    }
    for ((j, y), &r) in jobs.iter_mut().zip(ys.iter()).zip(rows.iter()) {
        let n = j.w.n;
        if r == j.m {
            j.dst.copy_from_slice(y);
        } else {
            let (hi, lo) = y.split_at(j.m * n);
            for ((d, &a), &b) in j.dst.iter_mut().zip(hi).zip(lo) {
                *d = a + b;
            }
        }
    }
    for ((ji, _), y) in lo_x.iter().zip(lo_y.iter()) {
        for (d, &v) in jobs[*ji].dst.iter_mut().zip(y) {
            *d += v;
        }
    }
    Ok(())
}
