//! Readers: a `ggml_tensor` turned into the plain values of `crate::backend` (no decisions).

use super::abi::*;
use super::api;
use crate::backend::buffer::{Name, Tensor, ToFloat, WeightData};
use std::ffi::c_void;
use std::sync::OnceLock;

/// `t`'s name field.
pub(super) fn name(t: &ggml_tensor) -> Name<'_> {
    Name(bytemuck::cast_slice(&t.name[..]))
}

/// `t` as plain values.
///
/// # Safety
/// `t` is a live ggml tensor.
pub(super) unsafe fn tensor(t: &ggml_tensor) -> Tensor<'_> {
    Tensor {
        addr: t.data as usize,
        ggml_type: t.type_,
        ne: t.ne,
        // SAFETY: ggml helper on a live tensor.
        contiguous: api::get().is_ok_and(|api| unsafe { (api.is_contiguous)(t) }),
        is_view: !t.view_src.is_null(),
        name: name(t),
    }
}

/// ggml's row dequantizer for type `ty` (None: ggml has none, or no ggml in the process). Looked
/// up once per type from ggml's static type-traits table.
pub(super) fn to_float(ty: ggml_type) -> Option<ToFloat> {
    static TABLE: OnceLock<Vec<Option<ToFloat>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let Ok(api) = api::get() else { return Vec::new() };
        (0..GGML_TYPE_COUNT)
            .map(|ty| {
                // SAFETY: `ggml_get_type_traits` returns a pointer into a static table for ids
                // below GGML_TYPE_COUNT (or NULL).
                let tr = unsafe { (api.get_type_traits)(ty).as_ref() }?;
                let tf = tr.to_float?;
                let (blck, size) = (tr.blck_size.max(1) as usize, tr.type_size);
                let f = move |row: &[u8], out: &mut [f32]| {
                    assert!(out.len() % blck == 0 && row.len() >= out.len() / blck * size, "to_float: a row of {} bytes is not {} elements", row.len(), out.len());
                    // SAFETY: `row` holds `out.len()` elements of this type (checked above) and
                    // `out` has room for them.
                    unsafe { tf(row.as_ptr() as *const c_void, out.as_mut_ptr(), out.len() as i64) }
                };
                Some(&*Box::leak(Box::new(f)) as ToFloat)
            })
            .collect()
    });
    table.get(ty as usize).copied().flatten()
}

/// Weight `w`'s bytes as ggml lays them out, read at `data` (its own, or the bytes ggml is
/// writing into it), and its type's dequantizer.
///
/// # Safety
/// `w` is a live ggml tensor; `data` is NULL or holds ggml_nbytes(w) bytes that nothing writes
/// while the result lives.
pub(super) unsafe fn weight_data_at<'a>(w: &ggml_tensor, data: *const u8) -> Option<WeightData<'a>> {
    let api = api::get().ok()?;
    if data.is_null() {
        return None;
    }
    // SAFETY: ggml helpers on a live tensor.
    let (row_bytes, nbytes) = unsafe { ((api.row_size)(w.type_, w.ne[0]), (api.nbytes)(w)) };
    // SAFETY: `data` holds that many bytes, unchanged while the result lives (caller).
    let bytes = unsafe { std::slice::from_raw_parts(data, nbytes) };
    Some(WeightData { bytes, row_bytes, to_float: to_float(w.type_) })
}

/// The activations (src1) and output of MUL_MAT `op` when both are allocated, contiguous f32.
///
/// # Safety
/// `op` is a live MUL_MAT node of a graph being computed, alive for `'g`; while the slices live,
/// nothing else reads or writes the output and nothing writes the activations (ggml never lets
/// a MUL_MAT's output overlap its inputs).
pub(super) unsafe fn mul_mat_io<'g>(op: *mut ggml_tensor) -> Option<(&'g [f32], &'g mut [f32])> {
    let api = api::get().ok()?;
    // SAFETY: a live node (caller), and a non-NULL source of it is a live tensor.
    let (t, x) = unsafe { (op.as_ref()?, (*op).src[1].as_ref()?) };
    // SAFETY: ggml helper on a live tensor.
    let f32_contiguous = |t: &ggml_tensor| !t.data.is_null() && t.type_ == GGML_TYPE_F32 && unsafe { (api.is_contiguous)(t) };
    if !f32_contiguous(x) || !f32_contiguous(t) {
        return None;
    }
    let elements = |t: &ggml_tensor| t.ne.iter().map(|&d| d.max(0) as usize).product::<usize>();
    let (xp, xn, dp, dn) = (x.data as *const f32, elements(x), t.data as *mut f32, elements(t));
    // SAFETY: contiguous f32 tensors of that many elements, alive for the graph computation;
    // exclusive access to the output as the caller guarantees.
    unsafe { Some((std::slice::from_raw_parts(xp, xn), std::slice::from_raw_parts_mut(dp, dn))) }
}
