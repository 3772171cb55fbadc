// Side-by-side decode GEMV benchmark: the same MUL_MAT (M=1) graphs on two ggml backends loaded
// into one process, timed in interleaved rounds (median per shape), outputs cross-checked (NMSE).
// Built and run by bench-scripts/vk_side_by_side.sh; a benchmark, never a test.
//
//   vk_gemv_bench <rounds> <reps> <backend-dev-name>...      e.g. 9 32 Vulkan0 ORK
//
// Each graph holds <reps> independent MUL_MAT nodes on one weight [K, N] and one activation
// [K, 1] (what a decode step gives a backend: many GEMVs per graph_compute); <reps> = 1 times
// a lone GEMV, so the per-graph submit and wait dominate. Reported: us per GEMV for each backend
// and the ratio to the first backend.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shape { enum ggml_type type; int k, n; };

static const struct shape SHAPES[] = {
    {GGML_TYPE_Q8_0, 576, 576},  {GGML_TYPE_Q8_0, 576, 192},  {GGML_TYPE_Q8_0, 576, 1536},
    {GGML_TYPE_Q8_0, 1536, 576}, {GGML_TYPE_Q8_0, 2048, 2048},
    {GGML_TYPE_Q4_0, 576, 576},  {GGML_TYPE_Q4_0, 576, 192},  {GGML_TYPE_Q4_0, 576, 1536},
    {GGML_TYPE_Q4_0, 1536, 576}, {GGML_TYPE_Q4_0, 2048, 2048},
    // Q4_K needs K % 256 == 0 (SmolLM2's K=576 tensors are never Q4_K)
    {GGML_TYPE_Q4_K, 1536, 576}, {GGML_TYPE_Q4_K, 1536, 1536}, {GGML_TYPE_Q4_K, 2048, 2048},
};

#define MAXB 4

struct arm {
    ggml_backend_t be;
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_cgraph * gf;
    struct ggml_tensor * out0;
};

static double now_us(void) { return (double) ggml_time_us(); }

static int cmp_d(const void * a, const void * b) {
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { // uniform in [-1, 1)
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float) ((rng >> 40) * (1.0 / (1ull << 23))) - 1.0f;
}

static int build(struct arm * a, const struct shape * s, int reps, const void * wq, const float * x) {
    struct ggml_init_params p = {ggml_tensor_overhead() * (reps + 4) + ggml_graph_overhead_custom(reps + 4, false), NULL, true};
    a->ctx = ggml_init(p);
    struct ggml_tensor * w = ggml_new_tensor_2d(a->ctx, s->type, s->k, s->n);
    struct ggml_tensor * xa = ggml_new_tensor_2d(a->ctx, GGML_TYPE_F32, s->k, 1);
    a->gf = ggml_new_graph_custom(a->ctx, reps + 4, false);
    for (int i = 0; i < reps; i++) {
        struct ggml_tensor * o = ggml_mul_mat(a->ctx, w, xa);
        if (i == 0) a->out0 = o;
        ggml_build_forward_expand(a->gf, o);
    }
    a->buf = ggml_backend_alloc_ctx_tensors(a->ctx, a->be);
    if (!a->buf) return -1;
    ggml_backend_tensor_set(w, wq, 0, ggml_nbytes(w));
    ggml_backend_tensor_set(xa, x, 0, ggml_nbytes(xa));
    return 0;
}

static void teardown(struct arm * a) {
    ggml_backend_buffer_free(a->buf);
    ggml_free(a->ctx);
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <rounds> <reps> <dev>...\n", argv[0]);
        return 2;
    }
    const int rounds = atoi(argv[1]), reps = atoi(argv[2]);
    const int nb = argc - 3 > MAXB ? MAXB : argc - 3;
    ggml_backend_load_all();
    struct arm arms[MAXB];
    for (int b = 0; b < nb; b++) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(argv[3 + b]);
        if (!dev) { fprintf(stderr, "no device %s\n", argv[3 + b]); return 1; }
        arms[b].be = ggml_backend_dev_init(dev, NULL);
        if (!arms[b].be) { fprintf(stderr, "cannot init %s\n", argv[3 + b]); return 1; }
        fprintf(stderr, "device %s: %s\n", argv[3 + b], ggml_backend_dev_description(dev));
    }
    printf("| type | K | N | reps/graph |");
    for (int b = 0; b < nb; b++) printf(" %s us/GEMV |", argv[3 + b]);
    for (int b = 1; b < nb; b++) printf(" %s / %s |", argv[3 + b], argv[3]);
    printf(" NMSE vs %s |\n|---|---:|---:|---:|", argv[3]);
    for (int b = 0; b < 2 * nb; b++) printf("---:|");
    printf("\n");
    fflush(stdout);

    double * t = malloc(sizeof(double) * rounds * MAXB);
    for (size_t si = 0; si < sizeof(SHAPES) / sizeof(SHAPES[0]); si++) {
        const struct shape * s = &SHAPES[si];
        float * wf = malloc(sizeof(float) * s->k * s->n);
        float * x = malloc(sizeof(float) * s->k);
        for (long i = 0; i < (long) s->k * s->n; i++) wf[i] = frand() * 0.05f;
        for (int i = 0; i < s->k; i++) x[i] = frand();
        void * wq = malloc(ggml_row_size(s->type, s->k) * s->n);
        ggml_quantize_chunk(s->type, wf, wq, 0, s->n, s->k, NULL);
        float * y[MAXB];
        for (int b = 0; b < nb; b++) {
            if (build(&arms[b], s, reps, wq, x)) { fprintf(stderr, "alloc failed\n"); return 1; }
            // warm-up: pipeline compilation, weight import
            ggml_backend_graph_compute(arms[b].be, arms[b].gf);
            ggml_backend_synchronize(arms[b].be);
            y[b] = malloc(sizeof(float) * s->n);
            ggml_backend_tensor_get(arms[b].out0, y[b], 0, sizeof(float) * s->n);
        }
        for (int r = 0; r < rounds; r++) {
            for (int bi = 0; bi < nb; bi++) {
                const int b = (bi + r) % nb; // alternate the order between rounds
                const double t0 = now_us();
                enum ggml_status st = ggml_backend_graph_compute(arms[b].be, arms[b].gf);
                ggml_backend_synchronize(arms[b].be);
                const double t1 = now_us();
                if (st != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed on %s\n", argv[3 + b]); return 1; }
                t[b * rounds + r] = (t1 - t0) / reps;
            }
        }
        double med[MAXB];
        for (int b = 0; b < nb; b++) {
            qsort(t + b * rounds, rounds, sizeof(double), cmp_d);
            med[b] = t[b * rounds + rounds / 2];
        }
        printf("| %s | %d | %d | %d |", ggml_type_name(s->type), s->k, s->n, reps);
        for (int b = 0; b < nb; b++) printf(" %.1f |", med[b]);
        for (int b = 1; b < nb; b++) printf(" %.2f |", med[b] / med[0]);
        double worst = 0;
        for (int b = 1; b < nb; b++) {
            double e = 0, n = 0;
            for (int i = 0; i < s->n; i++) { e += (y[b][i] - y[0][i]) * (double) (y[b][i] - y[0][i]); n += y[0][i] * (double) y[0][i]; }
            if (n > 0 && e / n > worst) worst = e / n;
        }
        printf(" %.1e |\n", worst);
        fflush(stdout);
        for (int b = 0; b < nb; b++) { teardown(&arms[b]); free(y[b]); }
        free(wf); free(x); free(wq);
    }
    free(t);
    for (int b = 0; b < nb; b++) ggml_backend_free(arms[b].be);
    return 0;
}
