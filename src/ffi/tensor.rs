//! Readers: a `ggml_tensor` turned into the plain values of `crate::backend` (no decisions).

use super::abi::*;
use super::api;
use super::buffer::BufferCtx;
use super::registry::built;
use super::repack;
use crate::backend::buffer::{Buffer, Name, Tensor, ToFloat, WeightData};
use crate::backend::graph::{MulMatNode, Node, Weight, MAX_SRC};
use crate::backend::MatMulShape;
use std::ffi::c_void;
use std::sync::OnceLock;

const _: () = assert!(GGML_MAX_SRC as usize == MAX_SRC);

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

/// The tensor that owns `t`'s memory: `t` itself, or the tensor it is a view of.
///
/// # Safety
/// `t` is a live ggml tensor.
unsafe fn base_of(t: &ggml_tensor) -> &ggml_tensor {
    // SAFETY: view_src is a live tensor when non-NULL.
    unsafe { t.view_src.as_ref() }.unwrap_or(t)
}

/// Where a tensor's memory is, as far as ORK is concerned.
enum Home<'a> {
    /// An ORK buffer (directly or as a view), with its context when it has one (llama's
    /// weight-placement probe attaches a zero-size buffer of ORK's type with none).
    Ork(Option<&'a BufferCtx>),
    /// A CPU_REPACK buffer of ggml-cpu's that ORK watches (`repack`).
    Repack(&'a Buffer),
    Elsewhere,
}

/// `t`'s [`Home`].
///
/// # Safety
/// `t` is a live ggml tensor.
unsafe fn home(t: &ggml_tensor) -> Home<'_> {
    // SAFETY: a live tensor (caller).
    let base = unsafe { base_of(t) };
    if base.buffer.is_null() {
        return Home::Elsewhere;
    }
    // SAFETY: a non-NULL buffer pointer of a live tensor is a live buffer.
    if built().is_some_and(|r| unsafe { (*base.buffer).buft } == r.buft) {
        // SAFETY: as above.
        return Home::Ork(unsafe { BufferCtx::of(base.buffer) });
    }
    repack::watched(base.buffer).map_or(Home::Elsewhere, Home::Repack)
}

/// `node` as the graph walk sees it.
///
/// # Safety
/// `node` is a live ggml tensor whose sources are live or NULL.
pub(super) unsafe fn node(node: &ggml_tensor) -> Node<'_> {
    match node.op {
        GGML_OP_NONE | GGML_OP_RESHAPE | GGML_OP_VIEW | GGML_OP_PERMUTE | GGML_OP_TRANSPOSE => Node::View,
        // SAFETY: forwarded contract.
        GGML_OP_MUL_MAT => Node::MulMat(unsafe { mul_mat(node) }),
        _ => Node::Other,
    }
}

/// A MUL_MAT node: its shape and weight (when both sources are there) and its sources.
///
/// # Safety
/// As [`node`].
unsafe fn mul_mat(op: &ggml_tensor) -> MulMatNode<'_> {
    let mut srcs = [(0, 0); MAX_SRC];
    for (d, &s) in srcs.iter_mut().zip(op.src.iter()) {
        // SAFETY: non-NULL sources are live tensors.
        if let Some(st) = unsafe { s.as_ref() } {
            *d = (s as usize, st.view_src as usize);
        }
    }
    let mut mm = MulMatNode { addr: op as *const ggml_tensor as usize, name: name(op), shape: None, weight: None, srcs };
    let Ok(api) = api::get() else { return mm };
    // SAFETY: non-NULL sources of a live node are live tensors.
    let (Some(w), Some(x)) = (unsafe { op.src[0].as_ref() }, unsafe { op.src[1].as_ref() }) else { return mm };
    // SAFETY: live tensors.
    let (wt, home) = unsafe { (tensor(w), home(w)) };
    // SAFETY: a live node with a live weight.
    let cpu_repacks = matches!(home, Home::Ork(None)) && unsafe { repack::first_taker_is_repack(op) };
    mm.shape = Some(MatMulShape {
        weight_type: wt.ggml_type,
        k: w.ne[0].max(0) as usize,
        n: w.ne[1].max(0) as usize,
        weight_is_2d: w.ne[2] == 1 && w.ne[3] == 1,
        weight_contiguous: wt.contiguous,
        weight_in_ork_buffer: !matches!(home, Home::Elsewhere),
        weight_unallocated_leaf: w.buffer.is_null()
            && w.view_src.is_null()
            && w.op == GGML_OP_NONE
            && (w.flags as u32) & GGML_TENSOR_FLAG_INPUT == 0,
        weight_cpu_repacks: cpu_repacks,
        weight_has_to_float: to_float(w.type_).is_some(),
        act_is_f32: x.type_ == GGML_TYPE_F32,
        // SAFETY: ggml helper on a live tensor.
        act_contiguous: unsafe { (api.is_contiguous)(x) },
        m: (x.ne[1] * x.ne[2] * x.ne[3]).max(0) as usize,
        dst_is_f32: op.type_ == GGML_TYPE_F32,
        // SAFETY: ggml helper on a live tensor.
        dst_contiguous: unsafe { (api.is_contiguous)(op) },
        hadamard_hint: op.op_params[1] == 1,
        act_min_prec: op.op_params[3],
    });
    // SAFETY: a live tensor's non-NULL buffer pointer points to a live buffer.
    let model_weight = unsafe { w.buffer.as_ref() }.is_some_and(|b| b.usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    if model_weight && matches!(home, Home::Elsewhere) {
        // SAFETY: a live node with a live weight.
        unsafe { repack::note_left_unrepacked(op) };
    }
    let (buf, repacked) = match home {
        Home::Ork(ctx) => (ctx.map(|c| &c.buf), false),
        Home::Repack(b) => (Some(b), true),
        Home::Elsewhere => (None, false),
    };
    if model_weight {
        // With --no-mmap (`-lm none`) ggml reads the file straight into ORK's host buffer, with
        // no set_tensor: the first MUL_MAT naming one of its weights tells it holds the GGUF copy.
        if let Some(b) = buf {
            b.mark_weights();
        }
    }
    mm.weight = Some(Weight { tensor: wt, store: buf.map(|b| &b.weights), model_weight, repacked });
    mm
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

/// The bytes of weight `w` (ggml_nbytes of them from its data) and its type's dequantizer.
///
/// # Safety
/// `w` is a live ggml tensor; while the result lives nothing writes its memory.
/// None where its bytes are ggml-cpu's repacked layout, not the GGUF's.
pub(super) unsafe fn weight_data(w: &ggml_tensor) -> Option<WeightData<'_>> {
    // SAFETY: a live tensor (caller).
    if matches!(unsafe { home(w) }, Home::Repack(_)) {
        return None;
    }
    // SAFETY: forwarded contract.
    unsafe { weight_data_at(w, w.data as *const u8) }
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
