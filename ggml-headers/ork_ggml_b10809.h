/*
 * The ggml ABI of llama.cpp b10809 (ggml 0.23.0, GGML_BACKEND_API_VERSION 2).
 * What all supported releases share is in ork_ggml_abi.h; this file adds what is particular to
 * this one. Checked against the b10809 tree by tests/abi_drift.rs. Facts: shared reference
 * "peer-facts.md" §5 and the b10809 headers.
 */
#ifndef ORK_GGML_B10809_H
#define ORK_GGML_B10809_H

#include "ork_ggml_abi.h"

/* How the plugin recognises this release in its host process (src/ffi/release.rs); the drift test
 * checks each against the release's tree: ggml_version() (ggml/CMakeLists.txt) and whether the
 * headers declare ggml_backend_buft_alloc_buffer_n and ggml_op_alloc_size_may_expand. */
#define ORK_LLAMA_BUILD 10809
#define ORK_GGML_VERSION "0.23.0"
#define ORK_HAS_BUFT_ALLOC_BUFFER_N 0
#define ORK_HAS_OP_ALLOC_SIZE_MAY_EXPAND 1

#ifndef ORK_ABI_CHECK
#define GGML_BACKEND_API_VERSION 2
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ORK_ABI_CHECK
/* MUL_MAT op_params slot [0] (int32); slots [1] and [3] are never set in this release. */
enum ggml_prec {
    GGML_PREC_DEFAULT = 0,
    GGML_PREC_F32 = 10,
};

#endif /* !ORK_ABI_CHECK */

/* 6 members (no alloc_buffer_n, no get_alloc_size_n): is_host is at byte 40. 48 bytes. */
struct ORK_TAG(ggml_backend_buffer_type_i) {
    const char * (*get_name)(ggml_backend_buffer_type_t buft);
    ggml_backend_buffer_t (*alloc_buffer)(ggml_backend_buffer_type_t buft, size_t size);
    size_t (*get_alignment)(ggml_backend_buffer_type_t buft);
    size_t (*get_max_size)(ggml_backend_buffer_type_t buft);
    size_t (*get_alloc_size)(ggml_backend_buffer_type_t buft, const struct ggml_tensor * tensor);
    bool (*is_host)(ggml_backend_buffer_type_t buft);
};

#ifndef ORK_ABI_CHECK
struct ggml_backend_buffer_type {
    struct ORK_TAG(ggml_backend_buffer_type_i) iface;
    ggml_backend_dev_t device;
    void * context;
};

struct ggml_backend_graph_optimize_params {
    void (*add_alloc_dep)(void * user_data, struct ggml_tensor * tensor, struct ggml_tensor * until);
    void * user_data;
};

#endif /* !ORK_ABI_CHECK */

/* 16 members, 128 bytes; graph_optimize takes the params struct. */
struct ORK_TAG(ggml_backend_i) {
    const char * (*get_name)(ggml_backend_t backend);
    void (*free)(ggml_backend_t backend);
    void (*set_tensor_async)(ggml_backend_t backend, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);
    void (*get_tensor_async)(ggml_backend_t backend, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
    void (*set_tensor_2d_async)(ggml_backend_t backend, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
    void (*get_tensor_2d_async)(ggml_backend_t backend, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
    bool (*cpy_tensor_async)(ggml_backend_t backend_src, ggml_backend_t backend_dst, const struct ggml_tensor * src, struct ggml_tensor * dst);
    void (*synchronize)(ggml_backend_t backend);
    ggml_backend_graph_plan_t (*graph_plan_create)(ggml_backend_t backend, const struct ggml_cgraph * cgraph);
    void (*graph_plan_free)(ggml_backend_t backend, ggml_backend_graph_plan_t plan);
    void (*graph_plan_update)(ggml_backend_t backend, ggml_backend_graph_plan_t plan, const struct ggml_cgraph * cgraph);
    enum ggml_status (*graph_plan_compute)(ggml_backend_t backend, ggml_backend_graph_plan_t plan);
    enum ggml_status (*graph_compute)(ggml_backend_t backend, struct ggml_cgraph * cgraph);
    void (*event_record)(ggml_backend_t backend, ggml_backend_event_t event);
    void (*event_wait)(ggml_backend_t backend, ggml_backend_event_t event);
    void (*graph_optimize)(ggml_backend_t backend, struct ggml_cgraph * cgraph, struct ggml_backend_graph_optimize_params * params);
};

#ifndef ORK_ABI_CHECK
struct ggml_backend {
    ggml_guid_t guid;
    struct ORK_TAG(ggml_backend_i) iface;
    ggml_backend_dev_t device;
    void * context;
};
#endif /* !ORK_ABI_CHECK */

#ifdef __cplusplus
}
#endif
#endif /* ORK_GGML_B10809_H */
