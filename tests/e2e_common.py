"""Shared pieces of the end-to-end scripts (tests/e2e.py, tests/e2e_serving.py): the paths from
the set-up, the PASS/FAIL bookkeeping, the environments of the ORK and CPU runs, running a tool (a failed
run always says its exit status and how its stderr ends) and reading ORK's exit line."""
import os, re, signal, socket, subprocess

BIN = os.environ["LLAMA_BIN"]
MODELS = os.environ["ORK_MODELS"]
LIB = os.environ["ORK_LIB"]
ONLY = set(filter(None, os.environ.get("ORK_E2E_ONLY", "").split(",")))

# Variables a caller's shell may set that would change what a check measures.
_CLEARED = ("ORK_NPU", "ORK_OFF", "ORK_MINM", "ORK_DECODE", "ORK_NPU_LOCK", "ORK_LOCK_DIR", "ORK_CALIBRATE", "GGML_BACKEND_PATH")

results, figures = [], []


def check(name, ok, detail):
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def want(name):
    return not ONLY or any(name.startswith(o) for o in ONLY)


def env_with(extra):
    """This process's environment without the ORK_* settings above, plus `extra`."""
    env = dict(os.environ)
    for k in _CLEARED:
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def ork(**kw):
    e = {"GGML_BACKEND_PATH": LIB, "ORK_NPU": "sim"}
    e.update({k: str(v) for k, v in kw.items()})
    return e


def cpu():
    return {"GGML_BACKEND_PATH": LIB, "ORK_OFF": "1"}


def summary():
    """(passed, failed) so far."""
    npass = sum(1 for _, ok in results if ok)
    return npass, len(results) - npass


def write_figures(path):
    with open(path, "w") as f:
        f.write("| check | figure |\n|---|---|\n" + "\n".join(figures) + "\n")


def say_failed(args, rc, stderr, tail=1200):
    """One diagnostic block for a tool run that failed: the tool, its exit status, its stderr's end."""
    tool = os.path.basename(args[0]) if args else "?"
    print(f"  {tool} failed: exit status {rc}; stderr ends:\n    "
          + "\n    ".join((stderr or "")[-tail:].splitlines()), flush=True)


def run_tool(args, env_extra, timeout=1800):
    """subprocess.run with the environment `env_with(env_extra)`, output captured. A run that
    exits non-zero or times out (exit status 124 then) is reported with `say_failed`."""
    try:
        p = subprocess.run(args, env=env_with(env_extra), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        p = subprocess.CompletedProcess(args, 124, out, err + f"\n[timed out after {timeout}s]")
    if p.returncode != 0:
        say_failed(args, p.returncode, p.stderr)
    return p


# ORK's exit summary (src/backend/report.rs Stats::summary): six lines, each prefixed "ork: ".
# "npu N MUL_MAT" counts only MUL_MATs whose results came from the NPU; the ones computed on the
# CPU instead are counted apart ("fallbacks"). Memory in MiB; the budget's outcome and the streamed
# weights only when there are any (0 here then). The full breakdown (ORK_PROFILE=1) follows it.
EXIT_LINE = re.compile(
    r"ORK ran: npu (?P<npu>\d+) MUL_MAT \((?P<submits>\d+) submits, (?P<rows_sent>\d+) rows sent = "
    r"(?P<ratio>[0-9.]+)x plain W8A8\)\n"
    r"ork:   gpu: (?P<gpu>\d+) MUL_MAT \((?P<gpu_submits>\d+) submits, [0-9.]+ ms\); "
    r"cpu: (?P<left>\d+) MUL_MAT left at graph split \(M < ORK_MINM\)\n"
    r"ork:   fallbacks: (?P<fell>\d+) after NPU errors \((?P<errors>\d+) failed runs\), (?P<busy>\d+) NPU busy; "
    r"never-ran jobs: (?P<never_ran>\d+) \((?P<retried>\d+) resubmitted\)\n"
    r"ork:   memory \(MiB\): resident (?P<resident>[0-9.]+) \(GGUF copy (?P<gguf_copy>[0-9.]+), "
    r"int8 tiles (?P<tiles>[0-9.]+) \+ (?P<tiles2>[0-9.]+)(?:, per-core copies (?P<copies>[0-9.]+))?\), "
    r"peak (?P<peak>[0-9.]+); GGUF mapped (?P<gguf_mapped>[0-9.]+)\n"
    r"ork:   weights: (?P<cache_hits>\d+) cache hits, (?P<packs>\d+) packs \((?P<cache_writes>\d+) cache writes\) "
    r"in [0-9.]+ ms(?:, (?P<streamed>\d+) streamed)?"
    r"(?:; budget: (?P<not_resident>\d+) not resident, (?P<one_term>\d+) one int8 term)?\n"
    r"ork:   time \(ms\): [^\n]*?correction [0-9.]+ for (?P<mean_corrected>\d+) MUL_MAT")
# The figures of the exit summary in MiB (floats); the others are counts (ints).
_MIB = {"resident", "gguf_copy", "tiles", "tiles2", "copies", "peak", "gguf_mapped"}
# The simulator's line on what ORK_SIM_FAULT injected.
INJECTED = re.compile(r"sim fault injection \(ORK_SIM_FAULT\): (?P<never_run>\d+) submits never ran, (?P<holes>\d+) holes, "
                      r"(?P<short>\d+) short task counts, (?P<timeouts>\d+) timeouts, (?P<resets>\d+) resets, "
                      r"(?P<sync_fails>\d+) failed syncs injected")


def _last(rx, text, conv):
    ms = list(rx.finditer(text or ""))
    return {k: conv(k, v) for k, v in ms[-1].groupdict().items()} if ms else None


def exit_counters(text):
    """The counters of the last exit summary in `text` (a dict of ints; `ratio` and the memory
    figures in MiB floats; a part the summary leaves out when there is none, 0), or None."""
    return _last(EXIT_LINE, text, lambda k, v: (0.0 if k in _MIB else 0) if v is None else float(v) if k == "ratio" or k in _MIB else int(v))


def injected(text):
    """What the simulator says it injected (a dict of ints), or None."""
    return _last(INJECTED, text, lambda _k, v: int(v))


def npu_live(c, allow_busy=False):
    """The exit counters `c` show a live NPU: MUL_MATs ran on it with submits > 0, and none fell
    back to the CPU (after an NPU error, or, unless `allow_busy`, because another process held
    the NPU)."""
    return (c is not None and c["npu"] > 0 and c["submits"] > 0 and c["fell"] == 0 and c["errors"] == 0
            and (allow_busy or c["busy"] == 0))


def npu_words(c):
    """The exit counters in words, for a check's detail."""
    if c is None:
        return "no exit line"
    return (f"NPU ran {c['npu']} MUL_MAT ({c['submits']} submits), {c['fell']} fell back after {c['errors']} NPU errors, "
            f"{c['busy']} while another process held the NPU, {c['never_ran']} never-ran jobs detected "
            f"({c['retried']} resubmitted)")


# ---- added for tests/e2e_releases.py (the same plugin in several llama.cpp releases) ----
import hashlib as _hashlib
import re as _re

# The demo's own prompt (tests/demo.sh), read from the script so the two cannot drift apart.
DEMO_PROMPT = _re.search(r'^PROMPT=\$\{1:-"([^"]+)"\}',
                         open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.sh")).read(),
                         _re.M).group(1)


def file_sha256(path):
    h = _hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    return h.hexdigest()


def free_port():
    """A TCP port on loopback that was free a moment ago."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stop_process(p, grace=20):
    """SIGTERM a server process still running, wait `grace` seconds, then kill it."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
