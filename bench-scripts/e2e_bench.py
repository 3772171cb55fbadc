#!/usr/bin/env python3
"""End-to-end benchmark: llama-bench arms on one model, llama-perplexity ORK vs CPU, a markdown
table and a PNG chart. Called by bench-scripts/e2e_bench.sh (here) and onboard-kit.sh (board).

Arms (same binaries, same model; only the environment differs):
  cpu  ORK_OFF=1                      ggml-cpu alone
  ork  (default)                      prefill (M >= ORK_MINM) on the NPU, decode on the CPU
  npu  ORK_MINM=1                     every MUL_MAT on the NPU, decode included
  gpu  ORK_DECODE=gpu ORK_VK_DEVICE=  decode MUL_MATs on the GPU (Vulkan); first probed with a short
                                      generation: if the ORK profile shows no GPU matmul, the arm is
                                      reported "not available" (route not wired in this build).

Env: LLAMA_BIN, BENCH_MODEL, ORK_LIB, ORK_CORPUS (required); BENCH_OUT (output folder),
BENCH_THREADS (2), BENCH_P (64), BENCH_N (16), BENCH_R (1), BENCH_PPL_CHUNKS (4),
BENCH_TASKSET ("" or e.g. "taskset -c 4-7"), BENCH_BOARD (0 = simulator + lavapipe, 1 = real NPU),
BENCH_VK_DEVICE (llvmpipe here, Mali on a board), BENCH_ARMS (comma list, default all),
BENCH_ROUNDS (3: the arms run in turn, round after round, and each figure is the median over
rounds — the machine here is shared and noisy), BENCH_NO_PPL=1 to skip perplexity, BENCH_PYTHON_CHART (python with matplotlib; default: this one).
"""
import json, os, re, shlex, statistics, subprocess, sys, time

BIN, MODEL, LIB = os.environ["LLAMA_BIN"], os.environ["BENCH_MODEL"], os.environ["ORK_LIB"]
CORPUS = os.environ.get("ORK_CORPUS", "")
OUT = os.environ.get("BENCH_OUT", os.path.join(os.environ.get("ORK_ENV", "/tmp"), "bench"))
THREADS = os.environ.get("BENCH_THREADS", "2")
P, N, R = os.environ.get("BENCH_P", "64"), os.environ.get("BENCH_N", "16"), os.environ.get("BENCH_R", "1")
CHUNKS = os.environ.get("BENCH_PPL_CHUNKS", "4")
TASKSET = shlex.split(os.environ.get("BENCH_TASKSET", ""))
BOARD = os.environ.get("BENCH_BOARD", "0") == "1"
VK = os.environ.get("BENCH_VK_DEVICE", "Mali" if BOARD else "llvmpipe")
ROUNDS = max(1, int(os.environ.get("BENCH_ROUNDS", "3")))
ARMS_WANTED = set(filter(None, os.environ.get("BENCH_ARMS", "cpu,ork,npu,gpu").split(",")))
LABEL = ("real NPU + Mali GPU (board)" if BOARD
         else "simulated NPU (ORK_NPU=sim) + lavapipe (llvmpipe): NOT board numbers")
os.makedirs(OUT, exist_ok=True)

NPU_ENV = {} if BOARD else {"ORK_NPU": "sim"}
ARMS = [
    ("cpu", "CPU (ORK_OFF=1)", {"ORK_OFF": "1"}),
    ("ork", "ORK default (prefill on NPU)", dict(NPU_ENV)),
    ("npu", "all-NPU (ORK_MINM=1)", dict(NPU_ENV, ORK_MINM="1")),
    ("gpu", "GPU decode (ORK_DECODE=gpu)", dict(NPU_ENV, ORK_DECODE="gpu", ORK_VK_DEVICE=VK)),
]


def run(args, extra, timeout=3600):
    env = dict(os.environ)
    for k in ("ORK_NPU", "ORK_OFF", "ORK_MINM", "ORK_DECODE", "ORK_VK_DEVICE", "ORK_PROFILE"):
        env.pop(k, None)
    env.update({"GGML_BACKEND_PATH": LIB}, **extra)
    t0 = time.time()
    try:
        p = subprocess.run(TASKSET + args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.time() - t0
    return p, time.time() - t0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def gpu_probe(extra):
    """Returns (available, why): a short generation with ORK_PROFILE=1 must show GPU matmuls."""
    p, _ = run([f"{BIN}/llama-completion", "-m", MODEL, "-p", "Hello", "-n", "4", "--temp", "0",
                "-no-cnv", "-t", THREADS, "--no-warmup"], dict(extra, ORK_PROFILE="1"), timeout=900)
    if p is None or p.returncode != 0:
        return False, "probe run failed"
    # llama.cpp's logger may prefix a timestamp, so "ork:" is searched, not anchored
    prof = [l for l in p.stderr.splitlines() if "ork: " in l and "on the GPU" in l]
    last = prof[-1] if prof else ""
    m = re.search(r"(\d+)\s+(?:MUL_MAT\s+)?(?:\w+\s+){0,3}(?:on|to) the (?:GPU|Mali|Vulkan)", last, re.I) or \
        re.search(r"gpu\w*[ =:]+(\d+)", last, re.I)
    if m and int(m.group(1)) > 0:
        return True, ""
    return False, "no GPU matmul in the ORK profile (GPU decode route not wired in this build)"


def bench(extra):
    p, dt = run([f"{BIN}/llama-bench", "-m", MODEL, "-p", P, "-n", N, "-r", R, "-t", THREADS, "-o", "json"], extra)
    if p is None:
        return None, "timed out"
    if p.returncode != 0:
        return None, f"llama-bench rc {p.returncode}: {p.stderr.strip().splitlines()[-1:] }"
    try:
        rows = json.loads(p.stdout)
    except json.JSONDecodeError:
        return None, "unreadable llama-bench output"
    res = {"wall_s": dt}
    for r in rows:
        if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            res["pp"] = r["avg_ts"]
        elif r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            res["tg"] = r["avg_ts"]
    ran = re.findall(r"ORK ran (\d+) MUL_MAT on the NPU", p.stderr)
    res["npu_matmuls"] = int(ran[-1]) if ran else 0
    return res, ""


def ppl(extra):
    p, dt = run([f"{BIN}/llama-perplexity", "-m", MODEL, "-f", CORPUS, "-c", "128", "-b", "128",
                 "--chunks", CHUNKS, "-t", THREADS], extra)
    if p is None or p.returncode != 0:
        return None, dt
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout + p.stderr)
    return (float(m.group(1)) if m else None), dt


results = {"label": LABEL, "model": os.path.basename(MODEL), "threads": THREADS, "p": P, "n": N, "r": R,
           "rounds": ROUNDS, "taskset": " ".join(TASKSET), "arms": []}
arms, samples = [], {}
for key, name, extra in ARMS:
    if key not in ARMS_WANTED:
        continue
    arm = {"key": key, "name": name, "env": " ".join(f"{k}={v}" for k, v in extra.items()), "extra": extra}
    if key == "gpu":
        ok, why = gpu_probe(extra)
        if not ok:
            arm["na"] = why
            log(f"[e2e] {name}: not available ({why})")
    arms.append(arm)
    samples[key] = []
for rnd in range(ROUNDS):
    for arm in arms:
        if "na" in arm:
            continue
        log(f"[e2e] round {rnd + 1}/{ROUNDS}: llama-bench {arm['name']} ...")
        res, why = bench(arm["extra"])
        log(f"[e2e]   {res or why}")
        if res is not None:
            samples[arm["key"]].append(res)
        elif not samples[arm["key"]]:
            arm["fail"] = why
for arm in arms:
    got = samples[arm["key"]]
    if "na" not in arm and not got:
        arm["na"] = f"failed: {arm.get('fail', '?')}"
    for k in ("pp", "tg", "npu_matmuls"):
        vals = [r[k] for r in got if k in r]
        if vals:
            arm[k] = statistics.median(vals)
    arm["samples"] = got
    del arm["extra"]
    results["arms"].append(arm)

if os.environ.get("BENCH_NO_PPL") != "1" and CORPUS:
    log(f"[e2e] llama-perplexity ORK vs CPU, {CHUNKS} chunks x 128 ...")
    po, dto = ppl(dict(NPU_ENV))
    pc, dtc = ppl({"ORK_OFF": "1"})
    results["ppl"] = {"ork": po, "cpu": pc, "chunks": CHUNKS, "ork_s": dto, "cpu_s": dtc}

with open(os.path.join(OUT, "e2e-bench.json"), "w") as f:
    json.dump(results, f, indent=1)

# ---- markdown
cpu = next((a for a in results["arms"] if a["key"] == "cpu" and "na" not in a), None)


def fmt(a, k):
    if "na" in a:
        return "not available" if a["na"].startswith("no GPU") else a["na"]
    v = a.get(k)
    if v is None:
        return "-"
    s = f"{v:.2f}"
    if cpu and cpu is not a and cpu.get(k):
        s += f" ({v / cpu[k]:.2f}× CPU)"
    return s


lines = [f"**{LABEL}** — {results['model']}, llama-bench `-p {P} -n {N} -r {R} -t {THREADS}`, median of {ROUNDS} rounds"
         + (f", `{results['taskset']}`" if TASKSET else ""),
         "", f"| arm | environment | pp{P} t/s | tg{N} t/s | NPU MUL_MATs |", "|---|---|---:|---:|---:|"]
for a in results["arms"]:
    nm = int(a["npu_matmuls"]) if "na" not in a and "npu_matmuls" in a else "-"
    lines.append(f"| {a['name']} | `{a['env']}` | {fmt(a, 'pp')} | {fmt(a, 'tg')} | {nm} |")
if "ppl" in results:
    pp = results["ppl"]
    if pp["ork"] and pp["cpu"]:
        rel = abs(pp["ork"] - pp["cpu"]) / pp["cpu"] * 100
        lines += ["", f"llama-perplexity ({pp['chunks']} chunks × 128 tokens): ORK {pp['ork']:.4f}, "
                  f"CPU {pp['cpu']:.4f}, |ΔPPL| {rel:.3f} % ({pp['ork_s']:.0f} s vs {pp['cpu_s']:.0f} s)"]
    else:
        lines += ["", f"llama-perplexity: failed (ORK {pp['ork']}, CPU {pp['cpu']})"]
md = "\n".join(lines) + "\n"
with open(os.path.join(OUT, "e2e-bench.md"), "w") as f:
    f.write(md)
print(md)

# ---- chart (matplotlib; BENCH_PYTHON_CHART may name another interpreter that has it)
chart = os.path.join(OUT, "e2e-bench.png")
py = os.environ.get("BENCH_PYTHON_CHART", sys.executable)
rc = subprocess.run([py, os.path.join(os.path.dirname(os.path.abspath(__file__)), "chart.py"),
                     os.path.join(OUT, "e2e-bench.json"), chart]).returncode
print(f"chart: {chart}" if rc == 0 else "chart: not written (matplotlib missing?)")
