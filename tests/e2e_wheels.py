#!/usr/bin/env python3
"""The same libggml-ork.so inside the ggml of many llama.cpp releases, none of them built here.

The releases' libraries come from the PyPI wheels of llama-cpp-py-sync (tests/setup-wheels.sh:
sha256-pinned, unpacked into $ORK_ENV/wheels/b<N>; they need glibc 2.38, so each run starts
under Debian 13's loader from $ORK_ENV/wheels/trixie-root). The host is tests/release_harness.c:
it dlopens the release's libggml-base / libggml-cpu / libggml, calls ggml_backend_load on the
plugin and, when a device named ORK registers, runs MUL_MAT graphs through ggml_backend_sched
over [ORK, CPU] (weights in ORK's buffer type, activations in CPU memory) against the same graph
on the release's CPU backend alone.

Per release:
  wheels/b<N>/host       the release's ggml_version() and backend API are the table's
  wheels/b<N>/register   a device named ORK registered (the expectation below), or, where none
                         is expected, none did, the process exited 0 and the plugin printed one
                         `ork:` line naming the host's ggml version
  wheels/b<N>/mul_mat    ORK_MINM=1: 24 cases (K x N 256x128 and 576x1536; M 1, 7, 64, 100; F32,
                         F16, Q8_0 weights), each within its NMSE bound of the CPU; the 16 F16 /
                         Q8_0 ones on ORK, the 8 F32 ones on the CPU (ORK declines F32 weights);
                         ORK's exit line: the NPU ran 16, 0 fell back
  wheels/b<N>/routing    default ORK_MINM (32), the first shape: F16 / Q8_0 at M 64 and 100 on
                         ORK (4), the rest on the CPU; the NPU ran 4, 0 fell back
NMSE bounds vs the release's CPU, measured on b11548 (W8A8 with two terms on the simulated NPU):
F16 worst 5.1e-8 -> bound 1e-6; Q8_0 worst 2.4e-4 (M = 1; 1.2e-4..1.5e-4 at M >= 7) -> bound 1e-3;
F32 runs on the CPU in both graphs (0) -> bound 1e-6.

EXPECT: what the plugin should do per release. The default is the intended behaviour, every
release registers; ORK_WHEELS_EXPECT=today checks against the plugin before dbc735d instead (it
recognised version strings: only ggml 0.26.0 / 0.23.0 / 0.21.0 registered); the exit status follows the chosen one. ORK_WHEEL_BUILDS="11548 11739" runs a subset.
Environment: ORK_LIB (default target/release/libggml-ork.so, else libggml_ork.so), ORK_ENV.
Writes the table to $ORK_ENV/e2e-wheels-results.md.
"""
import atexit, os, re, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORK_ENV = os.environ.get("ORK_ENV", os.path.expanduser("~/.cache/ggml-ork-env"))
if not os.environ.get("ORK_LIB"):
    for name in ("libggml-ork.so", "libggml_ork.so"):
        if os.path.exists(os.path.join(ROOT, "target/release", name)):
            os.environ["ORK_LIB"] = os.path.join(ROOT, "target/release", name)
            break
# e2e_common reads the set-up's paths at import; this script needs none but the plugin.
for k in ("LLAMA_BIN", "ORK_MODELS"):
    os.environ.setdefault(k, "")
os.environ.setdefault("ORK_LIB", os.path.join(ROOT, "target/release/libggml-ork.so"))
from e2e_common import LIB, check, env_with, file_sha256, summary  # noqa: E402

OUT = os.path.join(ORK_ENV, "e2e-wheels-results.md")
BOUNDS = {"ORK_HARNESS_BOUND_F32": "1e-6", "ORK_HARNESS_BOUND_F16": "1e-6", "ORK_HARNESS_BOUND_Q8_0": "1e-3"}
# the harness's case counts, and how many of them ORK takes: all cases, ORK_MINM=1; first shape, ORK_MINM 32
CASES, ON_ORK, QUICK_CASES, QUICK_ON_ORK = 24, 16, 12, 4

# (build, ggml_version(), backend API, did the plugin before dbc735d register?) The intended
# behaviour: every release registers. Before dbc735d: only the ggml versions it was written for.
RELEASES = [
    ("b10603", "0.21.0", 2, True),
    ("b10837", "0.23.0", 2, True),
    ("b10952", "0.23.0", 2, True),
    ("b11067", "0.24.0", 2, False),
    ("b11227", "0.25.3", 2, False),
    ("b11327", "0.25.3", 2, False),   # the last API 2 wheel: same ggml version as b11352 (API 3)
    ("b11352", "0.25.3", 3, False),
    ("b11391", "0.25.3", 3, False),
    ("b11413", "0.25.3", 3, False),
    ("b11548", "0.26.0", 3, True),
    ("b11739", "0.27.0", 3, False),
]
MODE = os.environ.get("ORK_WHEELS_EXPECT", "new")
if MODE not in ("new", "today"):
    sys.exit(f"ORK_WHEELS_EXPECT={MODE}: new or today")
only = set(os.environ.get("ORK_WHEEL_BUILDS", "").split())

# the set-up (idempotent; well under a second when done)
t0 = time.time()
env_lines = subprocess.run(["bash", os.path.join(ROOT, "tests/setup-wheels.sh"), "--print-env"],
                           check=True, capture_output=True, text=True,
                           env=dict(os.environ, ORK_WHEEL_BUILDS=" ".join(sorted(
                               r[0][1:] for r in RELEASES if not only or r[0][1:] in only))))
setup_s = time.time() - t0
paths = dict(re.findall(r"^export (\w+)=\"?([^\"\n]*)\"?$", env_lines.stdout, re.M))
WHEELS, TROOT, HARNESS = paths["ORK_WHEELS"], paths["ORK_TRIXIE_ROOT"], paths["ORK_RELEASE_HARNESS"]
LIBDIR = os.path.join(TROOT, "usr/lib/x86_64-linux-gnu")
LOADER = os.path.join(LIBDIR, "ld-linux-x86-64.so.2")

sha = file_sha256(LIB)
print(f"plugin: {LIB}, sha256 {sha}; set-up {setup_s:.1f}s; expectation: {MODE}", flush=True)
tmp = tempfile.mkdtemp(prefix="ork-wheels-")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)


def harness(rel, extra, timeout=600):
    """The harness for release `rel` under the trixie loader: (rc, stdout, stderr, seconds)."""
    d = os.path.join(WHEELS, rel)
    env = env_with(dict({"ORK_NPU": "sim", "ORK_LOG": "debug", "ORK_CACHE": "0",
                         "ORK_CALIBRATION": os.path.join(tmp, "none.orkcal")}, **BOUNDS, **extra))
    args = [LOADER, "--library-path", f"{LIBDIR}:{d}", HARNESS, rel, d, LIB]
    t = time.time()
    try:
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out, f"[timed out after {timeout}s]", time.time() - t


def result_line(out):
    m = re.findall(r"^RESULT (.*)$", out, re.M)
    return m[-1] if m else None


rows, today_verdicts, lines = [], [], []
for rel, ggml_v, api, today in RELEASES:
    if only and rel[1:] not in only:
        continue
    expect_reg = True if MODE == "new" else today
    rc, out, err, dt = harness(rel, {"ORK_MINM": "1"})
    res = result_line(out) or f"no RESULT line; rc {rc}; stdout ends {out[-300:]!r}; stderr ends {err[-300:]!r}"
    lines.append(f"{rel}: {res} [{dt:.1f}s]")
    host = re.search(r"^host: \S+ ggml (\S+), backend API (\d+)", out, re.M)
    seen = (host.group(1), int(host.group(2))) if host else None
    check(f"wheels/{rel}/host", seen == (ggml_v, api), f"ggml_version() and backend API {seen}, table says {(ggml_v, api)}")

    registered = "ORK registered:" in out
    ork_lines = [l for l in err.splitlines() if l.startswith("ork: ")]
    layout = re.search(r"ORK registered: plugin registry API (-?\d+), layout (.*)$", out, re.M)
    if registered:
        lay = f"{layout.group(2)} (registry API {layout.group(1)})" if layout else "?"
    else:
        why = re.search(r"RESULT .*?: no device \((.*)\) ; \d+ ork lines", out)
        lay = f"none: {why.group(1) if why else res}"
    today_ok = registered == today
    today_verdicts.append((rel, today, registered, today_ok))
    if expect_reg:
        check(f"wheels/{rel}/register", registered and rc in (0, 1), f"rc {rc}; {lay}")
    else:
        one = len(ork_lines) == 1 and f"ggml {ggml_v}" in ork_lines[0]
        check(f"wheels/{rel}/register", not registered and rc == 0 and one,
              f"no device expected: rc {rc}, {'REGISTERED' if registered else 'none'}, {len(ork_lines)} ork line(s): {ork_lines[:2]}")

    mm = "-"
    if registered:
        r = re.search(r"MUL_MAT (\d+)/(\d+) cases within bound \((\d+) on ORK, want (\d+);.*NPU ran (-?\d+), (-?\d+) fell back", res)
        worst = re.search(r"worst NMSE F32 (\S+) F16 (\S+) Q8_0 (\S+)", res)
        good = (rc == 0 and r is not None and int(r.group(1)) == int(r.group(2)) == CASES
                and int(r.group(3)) == int(r.group(4)) == int(r.group(5)) == ON_ORK and int(r.group(6)) == 0)
        fails = [l for l in out.splitlines() if l.startswith("case ") and not l.endswith(" ok")]
        check(f"wheels/{rel}/mul_mat", good, (f"{r.group(1)}/{r.group(2)} cases within bound, {r.group(3)} on ORK (want {r.group(4)}), NPU ran {r.group(5)}, "
                                              f"{r.group(6)} fell back; worst NMSE {worst.groups() if worst else '?'}"
                                              if r else res) + (f"; {fails[:3]}" if fails else "") + f"; {dt:.1f}s")
        rc2, out2, err2, dt2 = harness(rel, {"ORK_HARNESS_QUICK": "1"})
        res2 = result_line(out2) or f"no RESULT line; rc {rc2}; stderr ends {err2[-300:]!r}"
        r2 = re.search(r"MUL_MAT (\d+)/(\d+) cases within bound \((\d+) on ORK, want (\d+);.*NPU ran (-?\d+), (-?\d+) fell back, (-?\d+) left", res2)
        good2 = (rc2 == 0 and r2 is not None and int(r2.group(1)) == int(r2.group(2)) == QUICK_CASES
                 and int(r2.group(3)) == int(r2.group(4)) == int(r2.group(5)) == QUICK_ON_ORK and int(r2.group(6)) == 0)
        check(f"wheels/{rel}/routing", good2,
              (f"ORK_MINM 32: {r2.group(3)} of {r2.group(2)} on ORK (want {r2.group(4)}), NPU ran {r2.group(5)}, "
               f"{r2.group(6)} fell back, {r2.group(7)} left to the CPU at split" if r2 else res2) + f"; {dt2:.1f}s")
        mm = (f"{r.group(1)}/{r.group(2)} within bound (NPU ran {r.group(5)}, {r.group(6)} fell back); worst NMSE "
              f"F32 {worst.group(1)}, F16 {worst.group(2)}, Q8_0 {worst.group(3)}; routing at ORK_MINM 32 "
              f"{'ok' if good2 else 'FAIL'}" if r and worst else res)
    rows.append(f"| {rel} | {seen[0] if seen else '?'} | {seen[1] if seen else '?'} | {lay.replace('|', '/')} | "
                f"{mm.replace('|', '/')} | {sha} |")

check("wheels/same-file", file_sha256(LIB) == sha, f"sha256 {sha} before and after")
npass, nfail = summary()
print("\nper release:\n  " + "\n  ".join(lines))
print(f"\nregistered: {sum(g for _, _, g, _ in today_verdicts)}/{len(today_verdicts)} "
      f"(the plugin before dbc735d, recognising version strings, registered {sum(t for _, t, _, _ in today_verdicts)} of these)")
with open(OUT, "w") as f:
    f.write(f"Same libggml-ork.so in the ggml of prebuilt llama.cpp releases (PyPI llama-cpp-py-sync wheels, "
            f"tests/e2e_wheels.py; expectation: {MODE}; NMSE bounds {BOUNDS})\n\n"
            "| release | ggml | API | layout ORK recognised | MUL_MAT graphs vs the release's CPU | sha256 of libggml-ork.so |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
print(f"e2e-wheels: {npass} passed, {nfail} failed; table in {OUT}")
sys.exit(1 if nfail else 0)
