// A tiny ggml host: the same libggml-ork.so inside the ggml of one prebuilt llama.cpp release
// (the PyPI wheels of llama-cpp-py-sync, unpacked by tests/setup-wheels.sh), without building
// that release. Driven by tests/e2e_wheels.py, which starts it under a newer glibc's loader.
//
//   release_harness <release, e.g. b11739> <dir with the release's libggml*.so> <libggml-ork.so>
//
// It dlopens the release's libggml-base / libggml-cpu / libggml (RTLD_GLOBAL: the plugin's
// undefined ggml symbols resolve against them), calls ggml_backend_load(plugin) and then:
//   - reports ggml_version(), the backend API of the host (the CPU registry's api_version) and
//     of the plugin's registry, whether a device named ORK registered, and the plugin's
//     `ork:` lines (stderr is captured in a file and echoed, so the harness can read them);
//   - if ORK registered: MUL_MAT graphs (weights K x N, activations M rows; F32 / F16 / Q8_0
//     weights) with the weight in ORK's buffer type and the activations in CPU memory, run by
//     ggml_backend_sched over [ORK, CPU], against the same graph run by the CPU backend alone:
//     NMSE per case, the backend the scheduler gave the MUL_MAT (ORK when M >= ORK_MINM and the
//     weight is not F32, which ORK declines; the CPU otherwise), and ORK's exit line (printed
//     when its backend is freed) for how many ran on the NPU and how many fell back.
// Last stdout line: `RESULT b<N> ggml <ver> API <n>: ... `; exit status 0 when everything
// asked held, 1 when a check failed, 2 when the release's libraries could not be loaded.
//
// No ggml header is included: the few functions are declared here, each with a signature that
// is the same in b10566, b11549 and (by the symbols' behaviour here) b11739. Objects are only
// handled through pointers; the one struct field read is a registry's first member,
// `int api_version`, which the ggml loader itself compares.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- the ggml subset (opaque handles, stable enums) ----
typedef void *ctx_t, *tensor_t, *graph_t, *backend_t, *dev_t_, *reg_t, *buft_t, *buffer_t, *sched_t;
struct ggml_init_params { size_t mem_size; void *mem_buffer; bool no_alloc; };
enum { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8 };

static const char *(*p_ggml_version)(void);
static ctx_t (*p_ggml_init)(struct ggml_init_params);
static void (*p_ggml_free)(ctx_t);
static size_t (*p_ggml_tensor_overhead)(void);
static size_t (*p_ggml_graph_overhead)(void);
static tensor_t (*p_ggml_new_tensor_2d)(ctx_t, int, int64_t, int64_t);
static tensor_t (*p_ggml_mul_mat)(ctx_t, tensor_t, tensor_t);
static graph_t (*p_ggml_new_graph)(ctx_t);
static void (*p_ggml_build_forward_expand)(graph_t, tensor_t);
static size_t (*p_ggml_nbytes)(tensor_t);
static size_t (*p_ggml_row_size)(int, int64_t);
static size_t (*p_ggml_quantize_chunk)(int, const float *, void *, int64_t, int64_t, int64_t, const float *);
static void (*p_ggml_fp32_to_fp16_row)(const float *, uint16_t *, int64_t);
static buffer_t (*p_alloc_ctx_tensors_from_buft)(ctx_t, buft_t);
static void (*p_buffer_free)(buffer_t);
static void (*p_buffer_set_usage)(buffer_t, int);
static void (*p_tensor_set)(tensor_t, const void *, size_t, size_t);
static void (*p_tensor_get)(tensor_t, void *, size_t, size_t);
static int (*p_graph_compute)(backend_t, graph_t);
static void (*p_backend_free)(backend_t);
static reg_t (*p_backend_load)(const char *);
static dev_t_ (*p_dev_by_name)(const char *);
static size_t (*p_dev_count)(void);
static dev_t_ (*p_dev_get)(size_t);
static const char *(*p_dev_name)(dev_t_);
static reg_t (*p_dev_backend_reg)(dev_t_);
static backend_t (*p_dev_init)(dev_t_, const char *);
static buft_t (*p_dev_buffer_type)(dev_t_);
static sched_t (*p_sched_new)(backend_t *, buft_t *, int, size_t, bool, bool);
static void (*p_sched_free)(sched_t);
static int (*p_sched_graph_compute)(sched_t, graph_t);
static void (*p_sched_reset)(sched_t);
static backend_t (*p_sched_get_tensor_backend)(sched_t, tensor_t);
static void (*p_cpu_set_n_threads)(backend_t, int);

static int missing;
static void *sym(const char *name, bool required) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p && required) {
        printf("missing symbol %s\n", name);
        missing++;
    }
    return p;
}
#define BIND(var, name) (*(void **)&(var) = sym(name, true))

// ---- stderr captured in a file, echoed to the real stderr ----
static int real_stderr = -1;
static char cap_path[] = "/tmp/ork-harness-stderr-XXXXXX";
static char *captured;  // everything written to fd 2 so far
static size_t cap_len;

static void capture_begin(void) {
    int fd = mkstemp(cap_path);
    if (fd < 0) return;
    fflush(stderr);
    real_stderr = dup(2);
    dup2(fd, 2);
    close(fd);
}

// Reads what was written since the last call, echoes it, appends it to `captured`.
static void capture_poll(void) {
    if (real_stderr < 0) return;
    fflush(stderr);
    FILE *f = fopen(cap_path, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    if (n > (long)cap_len) {
        captured = realloc(captured, (size_t)n + 1);
        fseek(f, (long)cap_len, SEEK_SET);
        size_t got = fread(captured + cap_len, 1, (size_t)n - cap_len, f);
        if (write(real_stderr, captured + cap_len, got) < 0) { /* echo only */ }
        cap_len += got;
        captured[cap_len] = 0;
    }
    fclose(f);
}

static void capture_end(void) {
    capture_poll();
    if (real_stderr >= 0) {
        dup2(real_stderr, 2);
        close(real_stderr);
        unlink(cap_path);
        real_stderr = -1;
    }
}

// Copies the captured line that holds position `at` into `out` (cut to outsz - 1 bytes).
static void copy_line_at(const char *at, char *out, size_t outsz) {
    while (at > captured && at[-1] != '\n') at--;
    size_t n = strcspn(at, "\n");
    if (n >= outsz) n = outsz - 1;
    memcpy(out, at, n);
    out[n] = 0;
}

// The first captured line containing `needle` (copied into `out`), or false.
static bool captured_line(const char *needle, char *out, size_t outsz) {
    const char *s = captured ? strstr(captured, needle) : NULL;
    if (!s) return false;
    copy_line_at(s, out, outsz);
    return true;
}

// The captured text from the last occurrence of `needle` on (several lines; cut to outsz - 1 bytes).
static bool captured_last_from(const char *needle, char *out, size_t outsz) {
    const char *s = captured, *last = NULL;
    while (s && (s = strstr(s, needle))) last = s++;
    if (!last) return false;
    size_t n = strlen(last);
    if (n >= outsz) n = outsz - 1;
    memcpy(out, last, n);
    out[n] = 0;
    return true;
}

static int count_lines_starting(const char *prefix) {
    int n = 0;
    const char *s = captured;
    size_t pl = strlen(prefix);
    while (s && *s) {
        if (strncmp(s, prefix, pl) == 0) n++;
        s = strchr(s, '\n');
        if (s) s++;
    }
    return n;
}

// ---- loading the release ----
static bool exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static void *open_lib(const char *dir, const char *const *names, char *which, size_t wsz) {
    char p[4096];
    for (int i = 0; names[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!exists(p)) continue;
        void *h = dlopen(p, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            printf("dlopen %s: %s\n", p, dlerror());
            return NULL;
        }
        if (which) snprintf(which, wsz, "%s", names[i]);
        return h;
    }
    return NULL;
}

// ---- data ----
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {  // uniform in [-1, 1)
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 52) - 1.0);
}
static float nrand(void) {  // roughly normal: sum of 4 uniforms
    return (frand() + frand() + frand() + frand()) * 0.8660254f;
}

static double nmse(const float *a, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? e / r : (e > 0 ? INFINITY : 0);
}

static const char *type_name(int t) { return t == T_F32 ? "F32" : t == T_F16 ? "F16" : "Q8_0"; }

// Bytes of an N x K weight of `type` from f32 values.
static void *weight_bytes(int type, const float *w, int64_t k, int64_t n, size_t *size) {
    *size = p_ggml_row_size(type, k) * (size_t)n;
    void *b = malloc(*size);
    if (type == T_F32) memcpy(b, w, *size);
    else if (type == T_F16) p_ggml_fp32_to_fp16_row(w, b, k * n);
    else p_ggml_quantize_chunk(type, w, b, 0, n, k, NULL);
    return b;
}

// The MUL_MAT of an N x K weight (in `wbuft`) and M x K activations (in `xbuft`): the result
// (M x N floats) into `out`. With `sched`, the graph runs through it; otherwise on `backend`.
// `where` gets the backend the scheduler gave the MUL_MAT (NULL without a scheduler).
static int mul_mat(int type, const void *wb, size_t wsize, const float *x, int64_t k, int64_t n, int64_t m,
                   buft_t wbuft, buft_t xbuft, sched_t sched, backend_t backend, float *out, backend_t *where) {
    struct ggml_init_params ip = { 4 * p_ggml_tensor_overhead() + p_ggml_graph_overhead() + 4096, NULL, true };
    ctx_t cw = p_ggml_init(ip), cx = p_ggml_init(ip), cg = p_ggml_init(ip);
    tensor_t w = p_ggml_new_tensor_2d(cw, type, k, n);
    tensor_t a = p_ggml_new_tensor_2d(cx, T_F32, k, m);
    buffer_t bw = p_alloc_ctx_tensors_from_buft(cw, wbuft);
    buffer_t bx = p_alloc_ctx_tensors_from_buft(cx, xbuft);
    int st = -2;
    if (bw && bx) {
        p_buffer_set_usage(bw, 1);  // GGML_BACKEND_BUFFER_USAGE_WEIGHTS, as llama.cpp marks its weights
        p_tensor_set(w, wb, 0, wsize);
        p_tensor_set(a, x, 0, (size_t)(k * m) * sizeof(float));
        tensor_t o = p_ggml_mul_mat(cg, w, a);
        graph_t g = p_ggml_new_graph(cg);
        p_ggml_build_forward_expand(g, o);
        if (sched) {
            p_sched_reset(sched);
            st = p_sched_graph_compute(sched, g);
            if (where) *where = p_sched_get_tensor_backend(sched, o);
        } else {
            // the CPU alone: the result needs memory of its own
            ctx_t co = cg;
            buffer_t bo = p_alloc_ctx_tensors_from_buft(co, xbuft);
            st = bo ? p_graph_compute(backend, g) : -2;
            if (st == 0) p_tensor_get(o, out, 0, (size_t)(m * n) * sizeof(float));
            if (bo) p_buffer_free(bo);
            goto done;
        }
        if (st == 0) p_tensor_get(o, out, 0, (size_t)(m * n) * sizeof(float));
        if (sched) p_sched_reset(sched);
    }
done:
    if (bw) p_buffer_free(bw);
    if (bx) p_buffer_free(bx);
    p_ggml_free(cg);
    p_ggml_free(cx);
    p_ggml_free(cw);
    return st;
}

static double env_double(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <release> <release lib dir> <libggml-ork.so>\n", argv[0]);
        return 2;
    }
    const char *rel = argv[1], *dir = argv[2], *plugin = argv[3];
    setvbuf(stdout, NULL, _IOLBF, 0);
    capture_begin();

    static const char *const base_names[] = { "libggml-base.so", "libggml-base.so.0", NULL };
    static const char *const cpu_names[] = { "libggml-cpu.so", "libggml-cpu.so.0", NULL };
    static const char *const ggml_names[] = { "libggml.so", "libggml.so.0", NULL };
    char cpu_lib[256] = "";
    if (!open_lib(dir, base_names, NULL, 0)) {
        capture_end();
        printf("RESULT %s: cannot load libggml-base from %s\n", rel, dir);
        return 2;
    }
    // A build without GGML_BACKEND_DL links the CPU backend into libggml-cpu (loaded here,
    // registered by libggml); with it, libggml-cpu-<variant>.so are loaded by ggml itself.
    void *hcpu = open_lib(dir, cpu_names, cpu_lib, sizeof cpu_lib);
    if (!open_lib(dir, ggml_names, NULL, 0)) {
        capture_end();
        printf("RESULT %s: cannot load libggml from %s\n", rel, dir);
        return 2;
    }
    BIND(p_ggml_version, "ggml_version");
    BIND(p_ggml_init, "ggml_init");
    BIND(p_ggml_free, "ggml_free");
    BIND(p_ggml_tensor_overhead, "ggml_tensor_overhead");
    BIND(p_ggml_graph_overhead, "ggml_graph_overhead");
    BIND(p_ggml_new_tensor_2d, "ggml_new_tensor_2d");
    BIND(p_ggml_mul_mat, "ggml_mul_mat");
    BIND(p_ggml_new_graph, "ggml_new_graph");
    BIND(p_ggml_build_forward_expand, "ggml_build_forward_expand");
    BIND(p_ggml_nbytes, "ggml_nbytes");
    BIND(p_ggml_row_size, "ggml_row_size");
    BIND(p_ggml_quantize_chunk, "ggml_quantize_chunk");
    BIND(p_ggml_fp32_to_fp16_row, "ggml_fp32_to_fp16_row");
    BIND(p_alloc_ctx_tensors_from_buft, "ggml_backend_alloc_ctx_tensors_from_buft");
    BIND(p_buffer_free, "ggml_backend_buffer_free");
    BIND(p_buffer_set_usage, "ggml_backend_buffer_set_usage");
    BIND(p_tensor_set, "ggml_backend_tensor_set");
    BIND(p_tensor_get, "ggml_backend_tensor_get");
    BIND(p_graph_compute, "ggml_backend_graph_compute");
    BIND(p_backend_free, "ggml_backend_free");
    BIND(p_backend_load, "ggml_backend_load");
    BIND(p_dev_by_name, "ggml_backend_dev_by_name");
    BIND(p_dev_count, "ggml_backend_dev_count");
    BIND(p_dev_get, "ggml_backend_dev_get");
    BIND(p_dev_name, "ggml_backend_dev_name");
    BIND(p_dev_backend_reg, "ggml_backend_dev_backend_reg");
    BIND(p_dev_init, "ggml_backend_dev_init");
    BIND(p_dev_buffer_type, "ggml_backend_dev_buffer_type");
    BIND(p_sched_new, "ggml_backend_sched_new");
    BIND(p_sched_free, "ggml_backend_sched_free");
    BIND(p_sched_graph_compute, "ggml_backend_sched_graph_compute");
    BIND(p_sched_reset, "ggml_backend_sched_reset");
    BIND(p_sched_get_tensor_backend, "ggml_backend_sched_get_tensor_backend");
    *(void **)&p_cpu_set_n_threads = sym("ggml_backend_cpu_set_n_threads", false);
    if (missing) {
        capture_end();
        printf("RESULT %s: %d ggml symbols missing\n", rel, missing);
        return 2;
    }
    const char *ver = p_ggml_version();

    if (!hcpu) {  // GGML_BACKEND_DL: the CPU variants are backends of their own
        char p[4096];
        snprintf(p, sizeof p, "%s/libggml-cpu-x64.so", dir);
        if (exists(p)) p_backend_load(p);
        snprintf(cpu_lib, sizeof cpu_lib, "libggml-cpu-x64.so (ggml_backend_load)");
    }
    dev_t_ cpu_dev = p_dev_by_name("CPU");
    if (!cpu_dev) {
        capture_end();
        printf("RESULT %s ggml %s: no CPU device\n", rel, ver);
        return 2;
    }
    int host_api = *(const int *)p_dev_backend_reg(cpu_dev);
    printf("host: %s ggml %s, backend API %d (from the CPU registry), CPU backend in %s, %zu devices before the plugin\n",
           rel, ver, host_api, cpu_lib, p_dev_count());

    // ---- the plugin ----
    reg_t reg = p_backend_load(plugin);
    capture_poll();
    dev_t_ ork = p_dev_by_name("ORK");
    int ork_lines = count_lines_starting("ork: ");
    if (!ork) {
        char why[1024] = "";
        const char *s = captured;
        // the plugin's own line(s): `ork: ...`
        while (s && *s) {
            if (strncmp(s, "ork: ", 5) == 0) {
                size_t n = strcspn(s, "\n");
                snprintf(why, sizeof why, "%.*s", (int)(n > 900 ? 900 : n), s);
                break;
            }
            s = strchr(s, '\n');
            if (s) s++;
        }
        capture_end();
        printf("no device: reg %s, %d `ork:` line(s)%s%s\n", reg ? "returned" : "NULL", ork_lines,
               why[0] ? ": " : "", why);
        printf("RESULT %s ggml %s API %d: no device (%s) ; %d ork lines ; no crash\n", rel, ver, host_api,
               why[0] ? why : "no ork: line", ork_lines);
        return 0;
    }
    int plugin_api = reg ? *(const int *)reg : -1;
    char layout[512] = "?";
    {
        char line[1024];
        if (captured_line("host: llama.cpp ", line, sizeof line)) {
            const char *s = strstr(line, "host: llama.cpp ") + 16;
            snprintf(layout, sizeof layout, "%s", s);
        }
    }
    printf("ORK registered: plugin registry API %d, layout %s\n", plugin_api, layout);

    // ---- MUL_MAT graphs: ORK + CPU through the scheduler vs the CPU alone ----
    backend_t be_ork = p_dev_init(ork, NULL);
    backend_t be_cpu = p_dev_init(cpu_dev, NULL);
    if (!be_ork || !be_cpu) {
        capture_end();
        printf("RESULT %s ggml %s API %d: registered as %s ; backend init failed (ORK %p, CPU %p)\n", rel, ver,
               host_api, layout, be_ork, be_cpu);
        return 1;
    }
    int threads = (int)env_double("ORK_HARNESS_THREADS", 2);
    if (p_cpu_set_n_threads) p_cpu_set_n_threads(be_cpu, threads);
    backend_t bes[2] = { be_ork, be_cpu };
    sched_t sched = p_sched_new(bes, NULL, 2, 2048, false, false);
    buft_t ork_buft = p_dev_buffer_type(ork), cpu_buft = p_dev_buffer_type(cpu_dev);

    const char *minm_s = getenv("ORK_MINM");
    int minm = minm_s && *minm_s ? atoi(minm_s) : 32;
    if (minm < 1) minm = 1;
    // NMSE bounds vs the release's CPU (tests/e2e_wheels.py states them; env overrides).
    double bound[9] = { 0 };
    bound[T_F32] = env_double("ORK_HARNESS_BOUND_F32", 1e-6);
    bound[T_F16] = env_double("ORK_HARNESS_BOUND_F16", 1e-6);
    bound[T_Q8_0] = env_double("ORK_HARNESS_BOUND_Q8_0", 1e-3);
    const char *quick = getenv("ORK_HARNESS_QUICK");  // "1": the first shape only
    static const int64_t shapes[][2] = { { 256, 128 }, { 576, 1536 } };  // K, N
    static const int64_t ms[] = { 1, 7, 64, 100 };
    static const int types[] = { T_F32, T_F16, T_Q8_0 };
    int nshapes = quick && *quick == '1' ? 1 : 2;
    int cases = 0, ok_cases = 0, on_ork = 0, want_ork = 0, placed_ok = 0;
    double worst[9] = { 0 };
    for (int si = 0; si < nshapes; si++) {
        int64_t k = shapes[si][0], n = shapes[si][1];
        float *w = malloc(sizeof(float) * (size_t)(k * n));
        for (int64_t i = 0; i < k * n; i++) w[i] = nrand() * 0.05f;
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
            int type = types[ti];
            size_t wsize;
            void *wb = weight_bytes(type, w, k, n, &wsize);
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                int64_t m = ms[mi];
                float *x = malloc(sizeof(float) * (size_t)(k * m));
                for (int64_t i = 0; i < k * m; i++) x[i] = nrand();
                float *yo = calloc((size_t)(m * n), sizeof(float)), *yc = calloc((size_t)(m * n), sizeof(float));
                backend_t where = NULL;
                int so = mul_mat(type, wb, wsize, x, k, n, m, ork_buft, cpu_buft, sched, NULL, yo, &where);
                int sc = mul_mat(type, wb, wsize, x, k, n, m, cpu_buft, cpu_buft, NULL, be_cpu, yc, NULL);
                double e = so == 0 && sc == 0 ? nmse(yo, yc, (size_t)(m * n)) : INFINITY;
                // ORK declines F32 weights (its weight types are F16 and the quantized ones)
                bool expect_ork = m >= minm && type != T_F32;
                bool placed = (where == be_ork) == expect_ork;
                bool ok = so == 0 && sc == 0 && e < bound[type] && placed;
                cases++;
                ok_cases += ok;
                on_ork += where == be_ork;
                want_ork += expect_ork;
                placed_ok += placed;
                if (e > worst[type]) worst[type] = e;
                printf("case K=%ld N=%ld M=%ld %s: sched status %d, CPU status %d, MUL_MAT on %s (want %s), "
                       "NMSE vs CPU %.3e (bound %.0e) %s\n",
                       (long)k, (long)n, (long)m, type_name(type), so, sc,
                       where == be_ork ? "ORK" : where == be_cpu ? "CPU" : "?", expect_ork ? "ORK" : "CPU", e,
                       bound[type], ok ? "ok" : "FAIL");
                free(x);
                free(yo);
                free(yc);
            }
            free(wb);
        }
        free(w);
    }
    p_sched_free(sched);
    p_backend_free(be_ork);  // ORK's exit line
    capture_poll();
    char exitl[2048] = "";
    long npu = -1, fell = -1, left = -1;
    // ORK's exit summary (src/backend/report.rs): "ORK ran: npu N MUL_MAT (...)", then the lines
    // "  gpu: ...; cpu: N MUL_MAT left at graph split" and "  fallbacks: N after NPU errors ...".
    if (captured_last_from("ORK ran: npu ", exitl, sizeof exitl)) {
        npu = strtol(exitl + strlen("ORK ran: npu "), NULL, 10);
        const char *l = strstr(exitl, "; cpu: ");
        if (l) left = strtol(l + strlen("; cpu: "), NULL, 10);
        const char *f = strstr(exitl, "  fallbacks: ");
        if (f) fell = strtol(f + strlen("  fallbacks: "), NULL, 10);
    }
    p_backend_free(be_cpu);
    capture_end();
    bool npu_ok = npu == want_ork && fell == 0;
    bool all = ok_cases == cases && npu_ok;
    printf("worst NMSE vs CPU: F32 %.3e, F16 %.3e, Q8_0 %.3e\n", worst[T_F32], worst[T_F16], worst[T_Q8_0]);
    printf("RESULT %s ggml %s API %d: registered as %s ; MUL_MAT %d/%d cases within bound (%d on ORK, want %d; "
           "ORK_MINM %d) ; exit line: NPU ran %ld, %ld fell back, %ld left to the CPU ; worst NMSE F32 %.1e F16 %.1e "
           "Q8_0 %.1e ; %s\n",
           rel, ver, host_api, layout, ok_cases, cases, on_ork, want_ork, minm, npu, fell, left, worst[T_F32],
           worst[T_F16], worst[T_Q8_0], all ? "ok" : "FAIL");
    (void)placed_ok;
    return all ? 0 : 1;
}
