/* The libc entry points of the fake kernel (the kernel itself: fake-kernel/src/lib.rs).
 *
 * Why C: open/openat/ioctl are variadic, and stable Rust cannot define a variadic function;
 * reading the optional argument with va_arg is the only portable way. Why a separate object:
 * this file is what LD_PRELOAD names; it dlopen()s the Rust kernel RTLD_LOCAL, so the copy of
 * the ggml-ork library inside the kernel (and its `ggml_backend_init`) never enters the global
 * symbol scope that the real libggml-ork.so binds against.
 * Everything else (what the calls mean) is decided in Rust; this file filters by path prefix /
 * fd and forwards. The filters take no lock: the Rust side itself calls mmap/munmap/open while
 * holding its own locks, and those calls come back through here.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Rust side, resolved from the kernel library (ORK_FAKE_KERNEL_LIB) at the first watched open. */
static int (*fk_is_dev)(int fd);
static int (*fk_open)(const char *path, int flags);          /* fd, -errno, or NOT_OURS */
static const char *(*fk_redirect)(const char *path);        /* path in the fake tree, or NULL */
static int (*fk_ioctl)(int fd, unsigned long req, void *arg); /* >= 0 or -errno */
static void *(*fk_mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t off, int *err);
static void (*fk_munmap)(void *addr, size_t len);
static void (*fk_close)(int fd);
static void (*fk_report)(void);
static pthread_once_t fk_once = PTHREAD_ONCE_INIT;

#define NOT_OURS (-100000)

static void fk_load_once(void) {
    const char *lib = getenv("ORK_FAKE_KERNEL_LIB");
    void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h) {
        fprintf(stderr, "ork-fake-kernel: cannot load the kernel library (ORK_FAKE_KERNEL_LIB=%s): %s\n",
                lib ? lib : "(unset)", dlerror());
        abort();
    }
    fk_open = dlsym(h, "ork_fk_open");
    fk_redirect = dlsym(h, "ork_fk_redirect");
    fk_ioctl = dlsym(h, "ork_fk_ioctl");
    fk_mmap = dlsym(h, "ork_fk_mmap");
    fk_munmap = dlsym(h, "ork_fk_munmap");
    fk_close = dlsym(h, "ork_fk_close");
    fk_report = dlsym(h, "ork_fk_report");
    fk_is_dev = dlsym(h, "ork_fk_is_dev");
    if (!fk_open || !fk_redirect || !fk_ioctl || !fk_mmap || !fk_munmap || !fk_close || !fk_report || !fk_is_dev) {
        fprintf(stderr, "ork-fake-kernel: %s lacks an ork_fk_* entry point\n", lib);
        abort();
    }
}

static void fk_load(void) { pthread_once(&fk_once, fk_load_once); }

static int is_dev(int fd) { return fk_is_dev && fk_is_dev(fd); }

static int watched(const char *p) {
    return p && (strncmp(p, "/dev/dri/", 9) == 0 || strncmp(p, "/dev/accel/", 11) == 0 ||
                 strncmp(p, "/proc/device-tree/", 18) == 0 || strncmp(p, "/sys/", 5) == 0);
}

#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

static int open_common(const char *path, int flags, mode_t mode, open_fn real) {
    if (watched(path)) {
        fk_load();
        int r = fk_open(path, flags);
        if (r != NOT_OURS) {
            if (r < 0) { errno = -r; return -1; }
            return r;
        }
        const char *to = fk_redirect(path);
        if (to) path = to;
    }
    return real(path, flags, mode);
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    REAL(open, open_fn);
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return open_common(path, flags, m, real_open);
}

int open64(const char *path, int flags, ...) {
    REAL(open64, open_fn);
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return open_common(path, flags, m, real_open64);
}

static int openat_common(int dirfd, const char *path, int flags, mode_t mode, openat_fn real) {
    if (path && path[0] == '/' && watched(path)) {
        fk_load();
        int r = fk_open(path, flags);
        if (r != NOT_OURS) {
            if (r < 0) { errno = -r; return -1; }
            return r;
        }
        const char *to = fk_redirect(path);
        if (to) path = to;
    }
    return real(dirfd, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    REAL(openat, openat_fn);
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return openat_common(dirfd, path, flags, m, real_openat);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    REAL(openat64, openat_fn);
    va_list ap; va_start(ap, flags); mode_t m = mode_arg(flags, ap); va_end(ap);
    return openat_common(dirfd, path, flags, m, real_openat64);
}

typedef DIR *(*opendir_fn)(const char *);
DIR *opendir(const char *path) {
    REAL(opendir, opendir_fn);
    /* The node scan, and the NPU clock's devfreq listing (empty where the port has none). */
    if (strcmp(path, "/dev/dri") == 0 || strcmp(path, "/dev/accel") == 0 || strcmp(path, "/sys/class/devfreq") == 0) {
        fk_load();
        const char *to = fk_redirect(path);
        if (to) path = to;
    }
    return real_opendir(path);
}

typedef int (*ioctl_fn)(int, unsigned long, ...);
int ioctl(int fd, unsigned long req, ...) {
    REAL(ioctl, ioctl_fn);
    va_list ap; va_start(ap, req); void *arg = va_arg(ap, void *); va_end(ap);
    if (is_dev(fd)) {
        int r = fk_ioctl(fd, req, arg);
        if (r < 0) { errno = -r; return -1; }
        return r;
    }
    return real_ioctl(fd, req, arg);
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
static void *mmap_common(void *addr, size_t len, int prot, int flags, int fd, off_t off, mmap_fn real) {
    if (fd >= 0 && is_dev(fd)) {
        int err = 0;
        void *p = fk_mmap(addr, len, prot, flags, fd, off, &err);
        if (p == MAP_FAILED) errno = err;
        return p;
    }
    return real(addr, len, prot, flags, fd, off);
}
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    REAL(mmap, mmap_fn);
    return mmap_common(addr, len, prot, flags, fd, off, real_mmap);
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    REAL(mmap64, mmap_fn);
    return mmap_common(addr, len, prot, flags, fd, off, real_mmap64);
}

typedef int (*munmap_fn)(void *, size_t);
int munmap(void *addr, size_t len) {
    REAL(munmap, munmap_fn);
    if (fk_munmap) fk_munmap(addr, len);
    return real_munmap(addr, len);
}

typedef int (*close_fn)(int);
int close(int fd) {
    REAL(close, close_fn);
    if (is_dev(fd)) fk_close(fd);
    return real_close(fd);
}

__attribute__((destructor)) static void fk_fini(void) { if (fk_report) fk_report(); }
