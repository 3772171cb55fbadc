//! One ORK weight buffer in safe terms, and ggml tensors as the plain values the backend reads.
//!
//! `crate::ffi` owns the buffer's host memory and turns each `ggml_tensor` it is handed into a
//! [`Tensor`] (and, where the bytes are needed, a [`WeightData`]); what happens to the tensor —
//! counting the resident bytes a model will need, packing a weight as it is loaded, dropping
//! stale packed copies — is decided here.
//!
//! A buffer either owns its host memory (ggml allocated it and copies the GGUF bytes in with
//! `set_tensor`) or lies over llama.cpp's read-only mapping of the model file
//! ([`Buffer::mapped`], ggml's `buffer_from_host_ptr`): then ggml only places the weights at
//! their offsets (`init_tensor`), nothing is written, and each weight is packed at its first
//! NPU MUL_MAT (`graph::compute`), once every weight of the model has been announced.

use super::{Device, WeightSource, WeightStore};
use crate::npu::NpuError;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A tensor name: the bytes of ggml's fixed-size, NUL-padded `name` field.
#[derive(Clone, Copy, Debug)]
pub struct Name<'a>(pub &'a [u8]);

impl<'a> Name<'a> {
    /// The name's bytes up to its NUL.
    pub fn bytes(&self) -> &'a [u8] {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(self.0.len());
        &self.0[..end]
    }

    /// The name as text (invalid UTF-8 replaced; borrowed when valid).
    pub fn to_str(&self) -> Cow<'a, str> {
        String::from_utf8_lossy(self.bytes())
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_str())
    }
}

/// A ggml tensor reduced to plain values.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    /// Its data address: the key of its packed copies.
    pub addr: usize,
    pub ggml_type: u32,
    pub ne: [i64; 4],
    pub contiguous: bool,
    /// A view of another tensor's memory.
    pub is_view: bool,
    pub name: Name<'a>,
}

/// ggml's row dequantizer for one type: one row's bytes → `[K] f32`.
pub type ToFloat = &'static (dyn Fn(&[u8], &mut [f32]) + Sync);

/// A weight tensor's bytes, as ggml lays them out, and the dequantizer of its type.
#[derive(Clone, Copy)]
pub struct WeightData<'a> {
    /// All its rows, `row_bytes` each.
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    /// None when ggml cannot dequantize the type.
    pub to_float: Option<ToFloat>,
}

impl<'a> WeightData<'a> {
    /// The packing source of weight `t` under `name`.
    pub fn source<'s>(&'s self, t: &Tensor<'_>, name: &'s str) -> Result<WeightSource<'s>, String> {
        let to_float = self.to_float.ok_or_else(|| format!("no to_float for ggml type {}", t.ggml_type))?;
        Ok(WeightSource { name, ggml_type: t.ggml_type, bytes: self.bytes, row_bytes: self.row_bytes, to_float })
    }
}

/// `(N, K)` of `t` when it looks like a MUL_MAT weight ORK can hold: 2-D with at least two
/// rows, contiguous, of a type ORK packs, of a shape the NPU takes. The test of loading-time
/// packing and of the weight count in [`Buffer::init_tensor`].
pub fn holdable_weight_shape(dev: &Device, t: &Tensor<'_>) -> Option<(usize, usize)> {
    if t.ne[2] != 1 || t.ne[3] != 1 || t.ne[1] < 2 || !t.contiguous {
        return None;
    }
    let (k, n) = (t.ne[0] as usize, t.ne[1] as usize);
    let packs = crate::quant::types::weight_type(t.ggml_type).is_some();
    (packs && dev.npu.check_shape(n, k).is_ok()).then_some((n, k))
}

/// The packed form of weight `t` in `store` (packing it now if needed). Only weights of buffers
/// ggml marks as a model's weights (`model_weight`) use the `.orkpack` cache (test-backend-ops'
/// random weights would fill it with entries that never hit).
pub fn packed_weight(dev: &Device, store: &WeightStore, t: &Tensor<'_>, data: &WeightData<'_>, model_weight: bool) -> Result<super::weights::Placed, NpuError> {
    let (k, n) = (t.ne[0] as usize, t.ne[1] as usize);
    let name = t.name.to_str();
    let src = data.source(t, &name).map_err(|why| NpuError::BadArg { op: "pack", m: 0, k, n, why })?;
    store.get_or_place(dev, t.addr, &src, n, k, model_weight)
}

/// A model weight could not be made resident (its MUL_MATs stay on the CPU): one warning per
/// process, the rest at debug level, all counted in the summary line.
pub fn not_resident(dev: &Device, t: &Tensor<'_>, e: &NpuError) {
    crate::logging::warn_first(
        dev.stats.not_resident_weights.fetch_add(1, Relaxed) == 0,
        &format!("weight {} stays on the CPU: {e}", t.name),
        " (further weights that stay on the CPU: debug log, count at exit)",
    );
}

/// One ORK buffer: its packed weights and what it adds to the device's accounting (its host
/// bytes lower the default residency budget; the weights ggml places in it announce the resident
/// bytes they will need). Dropping it takes both back.
pub struct Buffer {
    dev: Option<&'static Device>,
    host_bytes: usize,
    pub weights: WeightStore,
    /// This buffer's share of `Placement::expected_term_bytes`.
    expected_term_bytes: AtomicU64,
    /// This buffer's share of `Placement::announced` (weights per precision role).
    announced: [AtomicU64; crate::route::precision::ROLES],
    /// ggml wrote model weights into it (`GGML_BACKEND_BUFFER_USAGE_WEIGHTS`): its bytes count
    /// in `Stats::weight_buffer_bytes`, the GGUF copy.
    holds_weights: std::sync::atomic::AtomicBool,
    /// Lies over llama.cpp's mapping of the model file: its bytes are `Stats::mapped_buffer_bytes`.
    mapped: bool,
    /// A `CPU_REPACK` buffer of ggml-cpu's that ORK watches ([`Buffer::repacked`]).
    repacked: bool,
}

impl Buffer {
    /// A buffer of `host_bytes` on `dev` (None: no ORK device, nothing is accounted).
    pub fn new(dev: Option<&'static Device>, host_bytes: usize) -> Buffer {
        Buffer::with(dev, host_bytes, false, false)
    }

    /// ORK's view of one of ggml-cpu's `CPU_REPACK` buffers of `host_bytes` (docs/design.md):
    /// ggml-cpu owns the memory and re-lays each weight out as it is written; ORK packs its
    /// tiles from the GGUF bytes handed to that write ([`Buffer::tensor_set`]) and never reads
    /// the buffer. A weight past the residency budget streams only from the `.orkpack` cache
    /// (else it stays on the CPU), and a weight's calibrated direction is computed as it is
    /// packed. Accounted like an ORK buffer holding the GGUF copy.
    pub fn repacked(dev: Option<&'static Device>, host_bytes: usize) -> Buffer {
        Buffer::with(dev, host_bytes, false, true)
    }

    fn with(dev: Option<&'static Device>, host_bytes: usize, mapped: bool, repacked: bool) -> Buffer {
        if let Some(dev) = dev {
            // The file-backed share first: the peak sampled by the next call must not count it.
            if mapped {
                dev.placement.mapped_buffer_bytes.fetch_add(host_bytes as u64, Relaxed);
            }
            dev.host_buffers_changed(host_bytes as i64);
        }
        Buffer {
            dev,
            host_bytes,
            weights: if repacked { WeightStore::resident_only() } else { WeightStore::default() },
            expected_term_bytes: AtomicU64::new(0),
            announced: Default::default(),
            holds_weights: Default::default(),
            mapped,
            repacked,
        }
    }

    /// A buffer over `host_bytes` of llama.cpp's mapping of the model file (ggml's
    /// `buffer_from_host_ptr`): model weights read in place. Its bytes lower the default
    /// residency budget like any ORK buffer's (the pages share the board's RAM while the CPU
    /// decodes from them), and the memory report counts them as file-backed GGUF bytes, not as
    /// ORK's memory.
    pub fn mapped(dev: Option<&'static Device>, host_bytes: usize) -> Buffer {
        Buffer::with(dev, host_bytes, true, false)
    }

    /// Whether the buffer lies over the model file's mapping ([`Buffer::mapped`]).
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// ggml wrote model weights into this buffer (`set_tensor`, or its own read of the file into
    /// it, seen when a MUL_MAT first names one of them): its bytes are (part of) the GGUF copy in
    /// the memory report, not a compute buffer. Idempotent; nothing for a [`Buffer::mapped`]
    /// one, whose bytes are file-backed.
    pub fn mark_weights(&self) {
        if self.mapped || self.holds_weights.load(Relaxed) {
            return;
        }
        if let Some(dev) = self.dev {
            if !self.holds_weights.swap(true, Relaxed) {
                dev.placement.weight_buffer_bytes.fetch_add(self.host_bytes as u64, Relaxed);
            }
        }
    }

    /// ggml initialises every tensor placed in the buffer before loading any: a tensor that looks
    /// like a MUL_MAT weight ORK can hold (named `*.weight`, not a view,
    /// [`holdable_weight_shape`]) adds one int8 term's resident bytes to
    /// `Stats::expected_term_bytes`, which the second-term rule of the residency budget reads.
    /// Graph tensors of compute buffers come here too, at every graph allocation: the name is
    /// tested first, without allocating.
    pub fn init_tensor(&self, t: &Tensor<'_>) {
        let Some(dev) = self.dev else { return };
        if !t.name.bytes().ends_with(b".weight") || t.is_view {
            return;
        }
        if let Some((n, k)) = holdable_weight_shape(dev, t) {
            let bytes = dev.npu.term_bytes(n, k);
            self.expected_term_bytes.fetch_add(bytes, Relaxed);
            dev.placement.expected_term_bytes.fetch_add(bytes, Relaxed);
            let role = crate::route::precision::Role::of(&t.name.to_str()).index();
            let work = (n * k) as u64;
            self.announced[role].fetch_add(work, Relaxed);
            dev.placement.announced[role].fetch_add(work, Relaxed);
        }
    }

    /// Host bytes `range` were overwritten (a write, memset or copy): packed copies made from
    /// them are stale.
    pub fn written(&self, range: Range<usize>) {
        self.weights.invalidate(range.start, range.end);
    }

    /// ggml wrote `range` of tensor `t` from byte `offset` of it (`data`: the tensor's bytes
    /// after the write); `model_weights`: the buffer holds a model's weights. A weight written
    /// whole at load time is packed right away.
    pub fn tensor_set(&self, t: &Tensor<'_>, data: Option<&WeightData<'_>>, offset: usize, range: Range<usize>, model_weights: bool) {
        self.written(range);
        if model_weights {
            self.mark_weights();
        }
        if let (0, true, Some(data)) = (offset, model_weights, data) {
            self.prepack(t, data);
        }
    }

    /// Packs a weight that was just written, if it looks like a MUL_MAT weight ORK can run.
    fn prepack(&self, t: &Tensor<'_>, data: &WeightData<'_>) {
        let Some(dev) = self.dev else { return };
        if holdable_weight_shape(dev, t).is_none() {
            return;
        }
        match packed_weight(dev, &self.weights, t, data, true) {
            // The bytes of a repacked buffer are gone after this write: the weight's calibrated
            // direction, which reads them, is computed now rather than at its first MUL_MAT.
            Ok(placed) if self.repacked => {
                let Some(store) = dev.calib.as_ref().filter(|s| !s.recording()) else { return };
                let name = t.name.to_str();
                let Ok(src) = data.source(t, &name) else { return };
                match placed {
                    super::weights::Placed::Resident(pw) => {
                        if let Some(key) = pw.calib_key {
                            pw.fix.get_or_init(|| dev.fixed_direction(&pw, &src, store, key));
                        }
                    }
                    // What its first corrected run would compute for the ring slot's copy.
                    super::weights::Placed::Streamed(ss) => {
                        if let Some(key) = ss.calib_key {
                            let two = ss.precision.terms.weight > 1;
                            ss.fix.get_or_init(|| dev.calibrated_direction(&src, ss.n, ss.k, ss.rot.as_deref(), two, store, key));
                        }
                    }
                }
            }
            Ok(_) => {}
            Err(e) => not_resident(dev, t, &e),
        }
    }

    /// The whole buffer was set to one value.
    pub fn cleared(&self) {
        self.weights.clear();
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.weights.clear();
        if let Some(dev) = self.dev {
            if self.holds_weights.load(Relaxed) {
                dev.placement.weight_buffer_bytes.fetch_sub(self.host_bytes as u64, Relaxed);
            }
            dev.host_buffers_changed(-(self.host_bytes as i64));
            if self.mapped {
                dev.placement.mapped_buffer_bytes.fetch_sub(self.host_bytes as u64, Relaxed);
            }
            dev.placement.expected_term_bytes.fetch_sub(self.expected_term_bytes.load(Relaxed), Relaxed);
            for (d, mine) in dev.placement.announced.iter().zip(&self.announced) {
                d.fetch_sub(mine.load(Relaxed), Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stop_at_their_nul() {
        let mut field = [0u8; 16];
        field[..12].copy_from_slice(b"blk.0.weight");
        let n = Name(&field);
        assert_eq!(n.bytes(), b"blk.0.weight");
        assert_eq!(n.to_string(), "blk.0.weight");
        assert_eq!(Name(b"full").to_str(), "full", "no NUL: the whole field");
        assert_eq!(Name(b"a\xffb\0c").to_str(), "a\u{fffd}b", "lossy like CStr::to_string_lossy");
    }
}
