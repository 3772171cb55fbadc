/*
 * ggml-ork's own declaration of the subset of the ggml dynamic-backend ABI it uses: the part that
 * is the SAME in every supported llama.cpp release. Each supported layout has its own header,
 * which includes this one and adds what differs (the backend API version, the buffer-type and
 * backend interface tables, the precision enum):
 *
 *   ork_ggml_b11549.h  llama.cpp b11549, ggml 0.26.0, GGML_BACKEND_API_VERSION 3 (pinned)
 *   ork_ggml_b10809.h  llama.cpp b10809, ggml 0.23.0, GGML_BACKEND_API_VERSION 2
 *   ork_ggml_b10566.h  llama.cpp b10566, ggml 0.21.0, GGML_BACKEND_API_VERSION 2
 *
 * Written from the ABI facts (shared reference "ggml-backend-abi.md" §0, "peer-facts.md" §5) and
 * checked against each release's own headers by tests/abi_drift.rs, which compiles
 * tests/abi_probe.c once against a layout header and once against that release's ggml.h +
 * ggml-backend-impl.h + ggml-impl.h and compares sizes, field offsets and enum values; a
 * second compile (ORK_ABI_CHECK) puts the layout's interface tables, renamed by ORK_TAG, and
 * every function declared here next to upstream's headers, so a member or prototype whose type
 * differs, or a function the release lacks, is a compile error. Any drift fails the test suite.
 *
 * Only what the plugin touches is declared. Struct and enum tags are upstream's so the same probe
 * source compiles against both.
 */
#ifndef ORK_GGML_ABI_H
#define ORK_GGML_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ORK_TAG
#define ORK_TAG(tag) tag
#endif

/* The op and type enums, every id in order: what ggml_op_name(id) / ggml_type_name(id) return
 * (GGML_OP_NAME and the type traits' type_name in ggml.c), '|'-separated; 101 ops
 * (GGML_OP_COUNT), 43 types (GGML_TYPE_COUNT). The same in every supported release. The plugin
 * reads the host's names for every id listed here at load (src/ffi/release.rs); tests/abi_drift.rs
 * checks both lists against each release's ggml.c and ggml.h. */
#define ORK_OP_COUNT 101
#define ORK_TYPE_COUNT 43
#define ORK_OP_NAMES "NONE|DUP|ADD|ADD_ID|ADD1|ACC|SUB|MUL|DIV|SQR|SQRT|LOG|SIN|COS|SUM|SUM_ROWS|CUMSUM|MEAN|ARGMAX|COUNT_EQUAL|REPEAT|REPEAT_BACK|CONCAT|SILU_BACK|NORM|RMS_NORM|RMS_NORM_BACK|GROUP_NORM|L2_NORM|MUL_MAT|MUL_MAT_ID|OUT_PROD|SCALE|SET|CPY|CONT|RESHAPE|VIEW|PERMUTE|TRANSPOSE|GET_ROWS|GET_ROWS_BACK|SET_ROWS|DIAG|DIAG_MASK_INF|DIAG_MASK_ZERO|SOFT_MAX|SOFT_MAX_BACK|ROPE|ROPE_BACK|CLAMP|CONV_TRANSPOSE_1D|IM2COL|IM2COL_BACK|IM2COL_3D|COL2IM_1D|CONV_2D|CONV_3D|CONV_2D_DW|CONV_TRANSPOSE_2D|POOL_1D|POOL_2D|POOL_2D_BACK|UPSCALE|PAD|PAD_REFLECT_1D|ROLL|ARANGE|TIMESTEP_EMBEDDING|ARGSORT|TOP_K|LEAKY_RELU|TRI|FILL|FLASH_ATTN_EXT|FLASH_ATTN_BACK|SSM_CONV|SSM_SCAN|WIN_PART|WIN_UNPART|GET_REL_POS|ADD_REL_POS|RWKV_WKV6|GATED_LINEAR_ATTN|RWKV_WKV7|SOLVE_TRI|GATED_DELTA_NET|LIGHTNING_INDEXER|DSV4_HC_COMB|DSV4_HC_PRE|DSV4_HC_POST|UNARY|MAP_CUSTOM1|MAP_CUSTOM2|MAP_CUSTOM3|CUSTOM|CROSS_ENTROPY_LOSS|CROSS_ENTROPY_LOSS_BACK|OPT_STEP_ADAMW|OPT_STEP_SGD|GLU"
#define ORK_TYPE_NAMES "f32|f16|q4_0|q4_1|DEPRECATED|DEPRECATED|q5_0|q5_1|q8_0|q8_1|q2_K|q3_K|q4_K|q5_K|q6_K|q8_K|iq2_xxs|iq2_xs|iq3_xxs|iq1_s|iq4_nl|iq3_s|iq2_s|iq4_xs|i8|i16|i32|i64|f64|iq1_m|bf16|TYPE_Q4_0_4_4 REMOVED, use Q4_0 with runtime repacking|TYPE_Q4_0_4_8 REMOVED, use Q4_0 with runtime repacking|TYPE_Q4_0_8_8 REMOVED, use Q4_0 with runtime repacking|tq1_0|tq2_0|TYPE_IQ4_NL_4_4 REMOVED, use IQ4_NL with runtime repacking|TYPE_IQ4_NL_4_8 REMOVED, use IQ4_NL with runtime repacking|TYPE_IQ4_NL_8_8 REMOVED, use IQ4_NL with runtime repacking|mxfp4|nvfp4|q1_0|q2_0"

#ifndef ORK_ABI_CHECK

#define GGML_MAX_DIMS 4
#define GGML_MAX_SRC 10
#define GGML_MAX_NAME 64
#define GGML_MAX_OP_PARAMS 64

enum ggml_status {
    GGML_STATUS_ALLOC_FAILED = -2,
    GGML_STATUS_FAILED = -1,
    GGML_STATUS_SUCCESS = 0,
    GGML_STATUS_ABORTED = 1,
};

/* Tensor element types: the ids that occur in GGUF files and that the plugin reasons about. */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_COUNT = 43,
};

/* Graph ops: only those the plugin names. */
enum ggml_op {
    GGML_OP_NONE = 0,
    GGML_OP_ADD = 2,
    GGML_OP_MUL = 7,
    GGML_OP_RMS_NORM = 25,
    GGML_OP_MUL_MAT = 29,
    GGML_OP_MUL_MAT_ID = 30,
    GGML_OP_CPY = 34,
    GGML_OP_CONT = 35,
    GGML_OP_RESHAPE = 36,
    GGML_OP_VIEW = 37,
    GGML_OP_PERMUTE = 38,
    GGML_OP_TRANSPOSE = 39,
    GGML_OP_GET_ROWS = 40,
    GGML_OP_COUNT = 101,
};

enum ggml_tensor_flag {
    GGML_TENSOR_FLAG_INPUT = 1,
    GGML_TENSOR_FLAG_OUTPUT = 2,
    GGML_TENSOR_FLAG_PARAM = 4,
    GGML_TENSOR_FLAG_LOSS = 8,
};

enum ggml_log_level {
    GGML_LOG_LEVEL_NONE = 0,
    GGML_LOG_LEVEL_DEBUG = 1,
    GGML_LOG_LEVEL_INFO = 2,
    GGML_LOG_LEVEL_WARN = 3,
    GGML_LOG_LEVEL_ERROR = 4,
    GGML_LOG_LEVEL_CONT = 5,
};

enum ggml_backend_buffer_usage {
    GGML_BACKEND_BUFFER_USAGE_ANY = 0,
    GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1,
    GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2,
};

enum ggml_backend_dev_type {
    GGML_BACKEND_DEVICE_TYPE_CPU = 0,
    GGML_BACKEND_DEVICE_TYPE_GPU = 1,
    GGML_BACKEND_DEVICE_TYPE_IGPU = 2,
    GGML_BACKEND_DEVICE_TYPE_ACCEL = 3,
};

struct ggml_backend_buffer;
/* ggml-impl.h (internal, b11549): the graph struct, needed by value for ggml_graph_view, which
 * whole-graph mode (ggml-rpc-server) uses to hand runs of non-matmul nodes to ggml-cpu. */
typedef uint32_t ggml_bitset_t;
struct ggml_hash_set {
    size_t size;
    ggml_bitset_t * used;
    struct ggml_tensor ** keys;
};
enum ggml_cgraph_eval_order {
    GGML_CGRAPH_EVAL_ORDER_LEFT_TO_RIGHT = 0,
    GGML_CGRAPH_EVAL_ORDER_RIGHT_TO_LEFT,
    GGML_CGRAPH_EVAL_ORDER_COUNT
};
struct ggml_cgraph {
    int size;
    int n_nodes;
    int n_leafs;
    struct ggml_tensor ** nodes;
    struct ggml_tensor ** grads;
    struct ggml_tensor ** grad_accs;
    struct ggml_tensor ** leafs;
    int32_t * use_counts;
    struct ggml_hash_set visited_hash_set;
    enum ggml_cgraph_eval_order order;
    uint64_t uid;
};

/* 336 bytes on LP64. */
struct ggml_tensor {
    enum ggml_type type;
    struct ggml_backend_buffer * buffer;
    int64_t ne[GGML_MAX_DIMS]; /* elements per dim, ne[0] fastest */
    size_t nb[GGML_MAX_DIMS];  /* stride in bytes per dim */
    enum ggml_op op;
    int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)];
    int32_t flags;
    struct ggml_tensor * src[GGML_MAX_SRC];
    struct ggml_tensor * view_src;
    size_t view_offs;
    void * data;
    char name[GGML_MAX_NAME];
    void * extra;
    char padding[8];
};

typedef void (*ggml_to_float_t)(const void * x, float * y, int64_t k);
typedef void (*ggml_from_float_t)(const float * x, void * y, int64_t k);

/* 56 bytes. */
struct ggml_type_traits {
    const char * type_name;
    int64_t blck_size;
    int64_t blck_size_interleave;
    size_t type_size;
    bool is_quantized;
    ggml_to_float_t to_float;
    ggml_from_float_t from_float_ref;
};

typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;
typedef struct ggml_backend_buffer * ggml_backend_buffer_t;
typedef struct ggml_backend_event * ggml_backend_event_t;
typedef struct ggml_backend * ggml_backend_t;
typedef void * ggml_backend_graph_plan_t;
typedef struct ggml_backend_reg * ggml_backend_reg_t;
typedef struct ggml_backend_device * ggml_backend_dev_t;
typedef uint8_t ggml_guid[16];
typedef ggml_guid * ggml_guid_t;

/* 5 bools in v3 (mmap_support added). */
struct ggml_backend_dev_caps {
    bool async;
    bool host_buffer;
    bool buffer_from_host_ptr;
    bool events;
    bool mmap_support;
};

/* 56 bytes. */
struct ggml_backend_dev_props {
    const char * name;
    const char * description;
    size_t memory_free;
    size_t memory_total;
    enum ggml_backend_dev_type type;
    const char * device_id;
    struct ggml_backend_dev_caps caps;
};

#endif /* !ORK_ABI_CHECK */

/* ---- the interface tables (vtables); ORK_TAG renames their tags when the drift test compiles
 * them next to upstream's to compare every member's type ---- */
/* 11 members, 88 bytes. */
struct ORK_TAG(ggml_backend_buffer_i) {
    void (*free_buffer)(ggml_backend_buffer_t buffer);
    void * (*get_base)(ggml_backend_buffer_t buffer);
    enum ggml_status (*init_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor);
    void (*memset_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, uint8_t value, size_t offset, size_t size);
    void (*set_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);
    void (*get_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
    void (*set_tensor_2d)(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
    void (*get_tensor_2d)(ggml_backend_buffer_t buffer, const struct ggml_tensor * tensor, void * data, size_t offset, size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
    bool (*cpy_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor * src, struct ggml_tensor * dst);
    void (*clear)(ggml_backend_buffer_t buffer, uint8_t value);
    void (*reset)(ggml_backend_buffer_t buffer);
};

/* 15 members, 120 bytes. */
struct ORK_TAG(ggml_backend_device_i) {
    const char * (*get_name)(ggml_backend_dev_t dev);
    const char * (*get_description)(ggml_backend_dev_t dev);
    void (*get_memory)(ggml_backend_dev_t dev, size_t * free, size_t * total);
    enum ggml_backend_dev_type (*get_type)(ggml_backend_dev_t dev);
    void (*get_props)(ggml_backend_dev_t dev, struct ggml_backend_dev_props * props);
    ggml_backend_t (*init_backend)(ggml_backend_dev_t dev, const char * params);
    ggml_backend_buffer_type_t (*get_buffer_type)(ggml_backend_dev_t dev);
    ggml_backend_buffer_type_t (*get_host_buffer_type)(ggml_backend_dev_t dev);
    ggml_backend_buffer_t (*buffer_from_host_ptr)(ggml_backend_dev_t dev, void * ptr, size_t size, size_t max_tensor_size);
    bool (*supports_op)(ggml_backend_dev_t dev, const struct ggml_tensor * op);
    bool (*supports_buft)(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft);
    bool (*offload_op)(ggml_backend_dev_t dev, const struct ggml_tensor * op);
    ggml_backend_event_t (*event_new)(ggml_backend_dev_t dev);
    void (*event_free)(ggml_backend_dev_t dev, ggml_backend_event_t event);
    void (*event_synchronize)(ggml_backend_dev_t dev, ggml_backend_event_t event);
};

/* 4 members, 32 bytes. */
struct ORK_TAG(ggml_backend_reg_i) {
    const char * (*get_name)(ggml_backend_reg_t reg);
    size_t (*get_device_count)(ggml_backend_reg_t reg);
    ggml_backend_dev_t (*get_device)(ggml_backend_reg_t reg, size_t index);
    void * (*get_proc_address)(ggml_backend_reg_t reg, const char * name);
};

#ifndef ORK_ABI_CHECK

/* 120 bytes, no trailing binding pointer in v3. */
struct ggml_backend_buffer {
    struct ORK_TAG(ggml_backend_buffer_i) iface;
    ggml_backend_buffer_type_t buft;
    void * context;
    size_t size;
    enum ggml_backend_buffer_usage usage;
};

struct ggml_backend_event {
    struct ggml_backend_device * device;
    void * context;
};

struct ggml_backend_device {
    struct ORK_TAG(ggml_backend_device_i) iface;
    ggml_backend_reg_t reg;
    void * context;
};

struct ggml_backend_reg {
    int api_version; /* must equal GGML_BACKEND_API_VERSION */
    struct ORK_TAG(ggml_backend_reg_i) iface;
    void * context;
};

typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
typedef bool (*ggml_backend_set_n_threads_t)(ggml_backend_t backend, int n_threads);

#endif /* !ORK_ABI_CHECK */

/* ---- functions exported by libggml-base.so.0 that the plugin calls (same prototype in every
 * supported release) ---- */
ggml_backend_buffer_t ggml_backend_buffer_init(ggml_backend_buffer_type_t buft, struct ggml_backend_buffer_i iface, void * context, size_t size);
bool ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft);
const struct ggml_type_traits * ggml_get_type_traits(enum ggml_type type);
size_t ggml_nbytes(const struct ggml_tensor * tensor);
size_t ggml_row_size(enum ggml_type type, int64_t ne);
bool ggml_is_contiguous(const struct ggml_tensor * tensor);
const char * ggml_op_name(enum ggml_op op);
const char * ggml_type_name(enum ggml_type type);
int ggml_graph_n_nodes(struct ggml_cgraph * cgraph);
struct ggml_tensor * ggml_graph_node(struct ggml_cgraph * cgraph, int i);
struct ggml_cgraph ggml_graph_view(struct ggml_cgraph * cgraph, int i0, int i1);
ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);
ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params);
ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
enum ggml_status ggml_backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph);
void ggml_backend_free(ggml_backend_t backend);
const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size);
bool ggml_backend_dev_supports_op(ggml_backend_dev_t device, const struct ggml_tensor * op);
size_t ggml_backend_dev_count(void);
ggml_backend_dev_t ggml_backend_dev_get(size_t index);
enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_buffer_type_t ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device);
void ggml_log_get(ggml_log_callback * log_callback, void ** user_data);
void ggml_fp16_to_fp32_row(const uint16_t * x, float * y, int64_t n);
const char * ggml_version(void);

#ifdef __cplusplus
}
#endif
#endif /* ORK_GGML_ABI_H */
