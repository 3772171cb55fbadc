/* Prints the layout facts of the ggml ABI subset ggml-ork declares, one "name value" per line.
 * Compiled twice per supported release by tests/abi_drift.rs: against that release's layout
 * header in ggml-headers/ (ORK_LAYOUT_H, e.g. "ork_ggml_b10809.h") and against the release's own
 * upstream headers (UPSTREAM); the two outputs must be identical. ORK_BUILD (the llama.cpp build
 * number) selects the members that exist only in some releases. */
#include <stdio.h>
#include <stddef.h>
#ifdef UPSTREAM
#include "ggml.h"
#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include <stdlib.h>
/* ggml-impl.h's inline helpers reference ggml_abort; the probe links no ggml library. */
void ggml_abort(const char * file, int line, const char * fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
#else
#include ORK_LAYOUT_H
#endif
#ifndef ORK_BUILD
#error "ORK_BUILD (the llama.cpp build number of the layout) is required"
#endif

#define SZ(T) printf("sizeof %s %zu\n", #T, sizeof(T))
#define OFF(T, F) printf("offsetof %s.%s %zu\n", #T, #F, offsetof(T, F))
#define VAL(E) printf("value %s %lld\n", #E, (long long)(E))

int main(void) {
    VAL(GGML_BACKEND_API_VERSION);
    VAL(GGML_MAX_DIMS); VAL(GGML_MAX_SRC); VAL(GGML_MAX_NAME); VAL(GGML_MAX_OP_PARAMS);
    SZ(struct ggml_tensor);
    OFF(struct ggml_tensor, type); OFF(struct ggml_tensor, buffer); OFF(struct ggml_tensor, ne);
    OFF(struct ggml_tensor, nb); OFF(struct ggml_tensor, op); OFF(struct ggml_tensor, op_params);
    OFF(struct ggml_tensor, flags); OFF(struct ggml_tensor, src); OFF(struct ggml_tensor, view_src);
    OFF(struct ggml_tensor, view_offs); OFF(struct ggml_tensor, data); OFF(struct ggml_tensor, name);
    OFF(struct ggml_tensor, extra); OFF(struct ggml_tensor, padding);
    SZ(struct ggml_type_traits);
    OFF(struct ggml_type_traits, type_name); OFF(struct ggml_type_traits, blck_size);
    OFF(struct ggml_type_traits, blck_size_interleave); OFF(struct ggml_type_traits, type_size);
    OFF(struct ggml_type_traits, is_quantized); OFF(struct ggml_type_traits, to_float);
    OFF(struct ggml_type_traits, from_float_ref);
    SZ(struct ggml_backend_dev_caps); SZ(struct ggml_backend_dev_props);
    OFF(struct ggml_backend_dev_props, memory_free); OFF(struct ggml_backend_dev_props, type);
    OFF(struct ggml_backend_dev_props, device_id); OFF(struct ggml_backend_dev_props, caps);
    OFF(struct ggml_backend_dev_props, name); OFF(struct ggml_backend_dev_props, description);
    OFF(struct ggml_backend_dev_props, memory_total);
    OFF(struct ggml_backend_dev_caps, async); OFF(struct ggml_backend_dev_caps, host_buffer);
    OFF(struct ggml_backend_dev_caps, buffer_from_host_ptr); OFF(struct ggml_backend_dev_caps, events);
    OFF(struct ggml_backend_dev_caps, mmap_support);
    SZ(struct ggml_backend_buffer_type_i);
    OFF(struct ggml_backend_buffer_type_i, get_name); OFF(struct ggml_backend_buffer_type_i, alloc_buffer);
    OFF(struct ggml_backend_buffer_type_i, get_alignment); OFF(struct ggml_backend_buffer_type_i, get_max_size);
    OFF(struct ggml_backend_buffer_type_i, get_alloc_size); OFF(struct ggml_backend_buffer_type_i, is_host);
#if ORK_BUILD >= 11549 /* API 3 */
    OFF(struct ggml_backend_buffer_type_i, alloc_buffer_n); OFF(struct ggml_backend_buffer_type_i, get_alloc_size_n);
#endif
    OFF(struct ggml_backend_buffer_type, iface);
    SZ(struct ggml_backend_buffer_type);
    OFF(struct ggml_backend_buffer_type, device); OFF(struct ggml_backend_buffer_type, context);
    SZ(struct ggml_backend_buffer_i);
    OFF(struct ggml_backend_buffer_i, free_buffer); OFF(struct ggml_backend_buffer_i, get_base); OFF(struct ggml_backend_buffer_i, init_tensor);
    OFF(struct ggml_backend_buffer_i, memset_tensor); OFF(struct ggml_backend_buffer_i, set_tensor);
    OFF(struct ggml_backend_buffer_i, get_tensor); OFF(struct ggml_backend_buffer_i, set_tensor_2d);
    OFF(struct ggml_backend_buffer_i, get_tensor_2d); OFF(struct ggml_backend_buffer_i, cpy_tensor);
    OFF(struct ggml_backend_buffer_i, clear); OFF(struct ggml_backend_buffer_i, reset);
    SZ(struct ggml_backend_buffer);
    OFF(struct ggml_backend_buffer, iface); OFF(struct ggml_backend_buffer, buft); OFF(struct ggml_backend_buffer, context);
    OFF(struct ggml_backend_buffer, size); OFF(struct ggml_backend_buffer, usage);
    SZ(struct ggml_backend_i);
    OFF(struct ggml_backend_i, get_name); OFF(struct ggml_backend_i, free);
    OFF(struct ggml_backend_i, set_tensor_async); OFF(struct ggml_backend_i, get_tensor_async);
    OFF(struct ggml_backend_i, set_tensor_2d_async); OFF(struct ggml_backend_i, get_tensor_2d_async);
    OFF(struct ggml_backend_i, cpy_tensor_async); OFF(struct ggml_backend_i, synchronize);
    OFF(struct ggml_backend_i, graph_plan_create); OFF(struct ggml_backend_i, graph_plan_free);
    OFF(struct ggml_backend_i, graph_plan_update); OFF(struct ggml_backend_i, graph_plan_compute);
    OFF(struct ggml_backend_i, graph_compute); OFF(struct ggml_backend_i, event_record);
    OFF(struct ggml_backend_i, event_wait); OFF(struct ggml_backend_i, graph_optimize);
    SZ(struct ggml_backend);
    OFF(struct ggml_backend, guid); OFF(struct ggml_backend, iface); OFF(struct ggml_backend, device); OFF(struct ggml_backend, context);
    SZ(struct ggml_backend_event);
    OFF(struct ggml_backend_event, device); OFF(struct ggml_backend_event, context);
#if ORK_BUILD >= 10809 /* graph_optimize's params struct */
    SZ(struct ggml_backend_graph_optimize_params);
    OFF(struct ggml_backend_graph_optimize_params, add_alloc_dep); OFF(struct ggml_backend_graph_optimize_params, user_data);
#endif
    SZ(struct ggml_backend_device_i);
    OFF(struct ggml_backend_device_i, get_name); OFF(struct ggml_backend_device_i, get_description);
    OFF(struct ggml_backend_device_i, get_memory); OFF(struct ggml_backend_device_i, get_type);
    OFF(struct ggml_backend_device_i, get_props); OFF(struct ggml_backend_device_i, init_backend);
    OFF(struct ggml_backend_device_i, get_buffer_type); OFF(struct ggml_backend_device_i, get_host_buffer_type);
    OFF(struct ggml_backend_device_i, buffer_from_host_ptr); OFF(struct ggml_backend_device_i, supports_op);
    OFF(struct ggml_backend_device_i, supports_buft); OFF(struct ggml_backend_device_i, offload_op);
    OFF(struct ggml_backend_device_i, event_new); OFF(struct ggml_backend_device_i, event_free);
    OFF(struct ggml_backend_device_i, event_synchronize);
    SZ(struct ggml_backend_device);
    OFF(struct ggml_backend_device, iface); OFF(struct ggml_backend_device, reg); OFF(struct ggml_backend_device, context);
    SZ(struct ggml_backend_reg_i);
    OFF(struct ggml_backend_reg_i, get_name); OFF(struct ggml_backend_reg_i, get_device_count);
    OFF(struct ggml_backend_reg_i, get_device); OFF(struct ggml_backend_reg_i, get_proc_address);
    SZ(struct ggml_backend_reg);
    OFF(struct ggml_backend_reg, api_version); OFF(struct ggml_backend_reg, iface); OFF(struct ggml_backend_reg, context);
    VAL(GGML_STATUS_ALLOC_FAILED); VAL(GGML_STATUS_FAILED); VAL(GGML_STATUS_SUCCESS); VAL(GGML_STATUS_ABORTED);
    VAL(GGML_TYPE_F32); VAL(GGML_TYPE_F16); VAL(GGML_TYPE_Q4_0); VAL(GGML_TYPE_Q4_1); VAL(GGML_TYPE_Q5_0);
    VAL(GGML_TYPE_Q5_1); VAL(GGML_TYPE_Q8_0); VAL(GGML_TYPE_Q8_1); VAL(GGML_TYPE_Q2_K); VAL(GGML_TYPE_Q3_K);
    VAL(GGML_TYPE_Q4_K); VAL(GGML_TYPE_Q5_K); VAL(GGML_TYPE_Q6_K); VAL(GGML_TYPE_Q8_K); VAL(GGML_TYPE_IQ4_NL);
    VAL(GGML_TYPE_I8); VAL(GGML_TYPE_I16); VAL(GGML_TYPE_I32); VAL(GGML_TYPE_BF16); VAL(GGML_TYPE_MXFP4);
    VAL(GGML_TYPE_COUNT);
    VAL(GGML_OP_NONE); VAL(GGML_OP_ADD); VAL(GGML_OP_MUL); VAL(GGML_OP_RMS_NORM); VAL(GGML_OP_MUL_MAT);
    VAL(GGML_OP_MUL_MAT_ID); VAL(GGML_OP_CPY); VAL(GGML_OP_CONT); VAL(GGML_OP_RESHAPE); VAL(GGML_OP_VIEW);
    VAL(GGML_OP_PERMUTE); VAL(GGML_OP_TRANSPOSE); VAL(GGML_OP_GET_ROWS); VAL(GGML_OP_COUNT);
    VAL(GGML_TENSOR_FLAG_INPUT); VAL(GGML_TENSOR_FLAG_OUTPUT); VAL(GGML_TENSOR_FLAG_PARAM); VAL(GGML_TENSOR_FLAG_LOSS);
    VAL(GGML_PREC_DEFAULT); VAL(GGML_PREC_F32);
#if ORK_BUILD >= 11549 /* the precision API (op_params slots [0] and [3]) */
    VAL(GGML_PREC_UNDEFINED); VAL(GGML_PREC_BF16); VAL(GGML_PREC_F16); VAL(GGML_PREC_Q8); VAL(GGML_PREC_Q4);
#endif
    VAL(GGML_LOG_LEVEL_NONE); VAL(GGML_LOG_LEVEL_DEBUG); VAL(GGML_LOG_LEVEL_INFO); VAL(GGML_LOG_LEVEL_WARN);
    VAL(GGML_LOG_LEVEL_ERROR); VAL(GGML_LOG_LEVEL_CONT);
    VAL(GGML_BACKEND_BUFFER_USAGE_ANY); VAL(GGML_BACKEND_BUFFER_USAGE_WEIGHTS); VAL(GGML_BACKEND_BUFFER_USAGE_COMPUTE);
    VAL(GGML_BACKEND_DEVICE_TYPE_CPU); VAL(GGML_BACKEND_DEVICE_TYPE_GPU); VAL(GGML_BACKEND_DEVICE_TYPE_IGPU);
    VAL(GGML_BACKEND_DEVICE_TYPE_ACCEL);
    SZ(struct ggml_hash_set); OFF(struct ggml_hash_set, used); OFF(struct ggml_hash_set, keys);
    SZ(struct ggml_cgraph);
    OFF(struct ggml_cgraph, size); OFF(struct ggml_cgraph, n_nodes); OFF(struct ggml_cgraph, n_leafs);
    OFF(struct ggml_cgraph, nodes); OFF(struct ggml_cgraph, grads); OFF(struct ggml_cgraph, grad_accs);
    OFF(struct ggml_cgraph, leafs); OFF(struct ggml_cgraph, use_counts); OFF(struct ggml_cgraph, visited_hash_set);
    OFF(struct ggml_cgraph, order); OFF(struct ggml_cgraph, uid);
    VAL(GGML_CGRAPH_EVAL_ORDER_LEFT_TO_RIGHT); VAL(GGML_CGRAPH_EVAL_ORDER_COUNT);
    return 0;
}
