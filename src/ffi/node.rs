//! A graph node as the walk sees it (`crate::backend::graph::Node`), and a weight's bytes: where
//! a tensor's memory is (an ORK buffer, a CPU_REPACK buffer ORK watches, elsewhere) decides what
//! ORK may read of it. The plain readers are `tensor`'s.

use super::abi::*;
use super::api;
use super::buffer::BufferCtx;
use super::registry::built;
use super::repack;
use super::tensor::{name, tensor, to_float, weight_data_at};
use crate::backend::buffer::{Buffer, WeightData};
use crate::backend::graph::{MulMatNode, Node, Weight, MAX_SRC};
use crate::backend::MatMulShape;

const _: () = assert!(GGML_MAX_SRC as usize == MAX_SRC);

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
        // SAFETY: forwarded contract.
        _ => Node::Other(unsafe { base_of(node) } as *const ggml_tensor as usize),
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

/// The bytes of weight `w` (ggml_nbytes of them from its data) and its type's dequantizer; None
/// where its bytes are ggml-cpu's repacked layout, not the GGUF's.
///
/// # Safety
/// `w` is a live ggml tensor; while the result lives nothing writes its memory.
pub(super) unsafe fn weight_data(w: &ggml_tensor) -> Option<WeightData<'_>> {
    // SAFETY: a live tensor (caller).
    if matches!(unsafe { home(w) }, Home::Repack(_)) {
        return None;
    }
    // SAFETY: forwarded contract.
    unsafe { weight_data_at(w, w.data as *const u8) }
}
