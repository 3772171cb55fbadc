#!/usr/bin/env python3
"""Decode with ORK loaded against ggml-cpu alone: the runs and the tables of
bench-scripts/decode_repack.sh (which sets the environment below and says what is measured).

Env: LLAMA_BIN, ORK_LIB, ORK_ENV, ORK_CORPUS; DR_MODELS (the models' paths, space-separated),
DR_DECODE_MODELS (those of them part (b) runs on); PAIRS (default 3), BENCH_TOKENS (default 64),
BENCH_THREADS (default 2), PROMPT_CHARS (default 2200: about 500 tokens), DECODE_SIM_TIMING
(ORK_SIM_TIMING of part (b)'s ORK arm, default board), BENCH_OMP_WAIT (OMP_WAIT_POLICY for every
run; unset by default: llama.cpp's own default), DR_OUT (where the logs and results go).
"""
import json, os, re, statistics, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from e2e_common import env_with, exit_counters, npu_live  # noqa: E402

BIN, LIB, CORPUS = os.environ["LLAMA_BIN"], os.environ["ORK_LIB"], os.environ["ORK_CORPUS"]
MODELS = os.environ["DR_MODELS"].split()
DECODE_MODELS = os.environ.get("DR_DECODE_MODELS", "").split()
PAIRS = int(os.environ.get("PAIRS", "3"))
NTOK = os.environ.get("BENCH_TOKENS", "64")
THREADS = os.environ.get("BENCH_THREADS", "2")
PROMPT_CHARS = int(os.environ.get("PROMPT_CHARS", "2200"))
SIM_TIMING = os.environ.get("DECODE_SIM_TIMING", "board")
OMP_WAIT = os.environ.get("BENCH_OMP_WAIT", "")
OUT = os.environ["DR_OUT"]
LOGS = os.path.join(OUT, "logs")
os.makedirs(LOGS, exist_ok=True)

REPACK = re.compile(r"CPU_REPACK model buffer size\s*=\s*([0-9.]+) MiB")
BUFFERS = re.compile(r"load_tensors:\s+(\S+) model buffer size\s*=\s*([0-9.]+) MiB")
EVAL = re.compile(r"(?<!prompt )eval time =\s*([0-9.]+) ms /\s*(\d+) runs")
PROMPT_EVAL = re.compile(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens")


def name(m):
    return os.path.basename(m)[:-len(".gguf")] if m.endswith(".gguf") else os.path.basename(m)


def arm_env(arm, m, timed=False):
    """The environment of one arm: ORK on the simulator, or the same plugin switched off."""
    e = {"GGML_BACKEND_PATH": LIB}
    if arm == "cpu":
        e["ORK_OFF"] = "1"
    else:
        e["ORK_NPU"] = "sim"
        # the synthetic models' prefill is not computed bit-exactly (minutes); part (b) is timed
        if timed or name(m).startswith("synth-"):
            e["ORK_SIM_TIMING"] = SIM_TIMING if timed else "board"
    if OMP_WAIT:
        e["OMP_WAIT_POLICY"] = OMP_WAIT
    return env_with(e)


def run(args, env, log):
    t0 = time.time()
    p = subprocess.run(args, env=env, capture_output=True, text=True, errors="replace", timeout=3600)
    with open(os.path.join(LOGS, log), "w") as f:
        f.write(f"$ {' '.join(args)}\n# {time.time() - t0:.1f} s, exit status {p.returncode}\n{p.stderr}\n--- stdout\n{p.stdout}")
    if p.returncode != 0:
        sys.exit(f"decode_repack: {os.path.basename(args[0])} failed (exit status {p.returncode}; log {LOGS}/{log}):\n"
                 + p.stderr[-1500:])
    return p


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(xs, f="{:.2f}"):
    return ", ".join(f.format(x) for x in xs)


def mib(r):
    return " + ".join(f"{x:.2f}" for x in r) if r else "none"


lines, record = [], {"pairs": PAIRS, "tokens": NTOK, "threads": THREADS, "omp_wait_policy": OMP_WAIT or None}


def say(s=""):
    print(s, flush=True)
    lines.append(s)


load = open('/proc/loadavg').read().split()[:3]
say(f"load average at start: {load}")
if not OMP_WAIT and float(load[0]) > 1.0:
    # llama.cpp's OpenMP threads spin between graphs by default; on shared, busy cores that
    # spinning swamps what is measured (seen here: 100 t/s idle, 5 t/s at load 3)
    say("warning: OMP_WAIT_POLICY unset on a loaded host: the figures below are mostly the other load's; "
        "measure on an idle host, or with BENCH_OMP_WAIT=passive")

# (a) llama-bench decode, ORK loaded vs ggml-cpu alone, alternating which goes first
say()
say(f"## (a) llama-bench -p 0 -n {NTOK} -r 1 -t {THREADS}: decode t/s, ORK loaded (ORK_NPU=sim) vs CPU alone "
    f"(ORK_OFF=1), {PAIRS} pair(s), OMP_WAIT_POLICY {OMP_WAIT or 'unset (llama.cpp default)'}")
say()
say("| model | CPU alone t/s (each pair) | ORK loaded t/s (each pair) | ratio ORK/CPU per pair | median ratio |")
say("|---|---|---|---|---:|")
record["bench"] = {}
for m in MODELS:
    ts = {"ork": [], "cpu": []}
    for i in range(PAIRS):
        for arm in (("ork", "cpu") if i % 2 == 0 else ("cpu", "ork")):
            p = run([f"{BIN}/llama-bench", "-m", m, "-p", "0", "-n", NTOK, "-r", "1", "-t", THREADS, "-o", "json"],
                    arm_env(arm, m), f"bench-{name(m)}-{arm}-{i}.log")
            rows = [r for r in json.loads(p.stdout) if r.get("n_gen") == int(NTOK)]
            if not rows:
                sys.exit(f"decode_repack: no tg{NTOK} row in llama-bench's output ({LOGS})")
            ts[arm].append(float(rows[-1]["avg_ts"]))
    ratios = [o / c for o, c in zip(ts["ork"], ts["cpu"])]
    record["bench"][name(m)] = {"cpu_ts": ts["cpu"], "ork_ts": ts["ork"], "ratios": ratios, "median_ratio": med(ratios)}
    say(f"| {name(m)} | {fmt(ts['cpu'])} | {fmt(ts['ork'])} | {fmt(ratios, '{:.3f}')} | {med(ratios):.3f} |")

# (b) decode after an NPU prefill: llama-completion, a ~500-token prompt, greedy, eval ms/token
if DECODE_MODELS:
    text = " ".join(open(CORPUS, encoding="utf-8", errors="replace").read(200000)[20000:].split())
    prompt = text[:PROMPT_CHARS].rsplit(" ", 1)[0]
    pfile = os.path.join(OUT, "prompt.txt")
    with open(pfile, "w") as f:
        f.write(prompt)
    say()
    say(f"## (b) llama-completion, {len(prompt)}-character prompt from the corpus, -n {NTOK} --ignore-eos greedy, "
        f"-t {THREADS}, --no-warmup: eval ms per token, ORK (ORK_NPU=sim ORK_SIM_TIMING={SIM_TIMING}: prefill on "
        f"the timed simulated NPU) vs CPU alone (ORK_OFF=1), {PAIRS} pair(s); target ratio <= 1.02")
    say()
    say("| model | prompt tokens | CPU alone ms/token (each pair) | ORK ms/token (each pair) | ratio ORK/CPU per pair "
        "| median ratio | prompt eval ms ORK / CPU (median) | NPU MUL_MATs (ORK run, all live) |")
    say("|---|---:|---|---|---|---:|---|---|")
    record["decode"] = {}
    for m in DECODE_MODELS:
        ms = {"ork": [], "cpu": []}
        pe = {"ork": [], "cpu": []}
        npu, live, ntok_prompt = [], True, None
        for i in range(PAIRS):
            for arm in (("ork", "cpu") if i % 2 == 0 else ("cpu", "ork")):
                p = run([f"{BIN}/llama-completion", "-m", m, "-f", pfile, "-n", NTOK, "--temp", "0", "--ignore-eos",
                         "-no-cnv", "-t", THREADS, "--no-warmup", "--seed", "1"],
                        arm_env(arm, m, timed=True), f"decode-{name(m)}-{arm}-{i}.log")
                ev, pv = EVAL.findall(p.stderr), PROMPT_EVAL.findall(p.stderr)
                if not ev or not pv:
                    sys.exit(f"decode_repack: no eval time line ({LOGS}/decode-{name(m)}-{arm}-{i}.log)")
                ms[arm].append(float(ev[-1][0]) / max(int(ev[-1][1]), 1))
                pe[arm].append(float(pv[-1][0]))
                ntok_prompt = int(pv[-1][1])
                if arm == "ork":
                    c = exit_counters(p.stderr)
                    npu.append(c["npu"] if c else 0)
                    live = live and npu_live(c)
        ratios = [o / c for o, c in zip(ms["ork"], ms["cpu"])]
        record["decode"][name(m)] = {"prompt_tokens": ntok_prompt, "cpu_ms_per_token": ms["cpu"],
                                     "ork_ms_per_token": ms["ork"], "ratios": ratios, "median_ratio": med(ratios),
                                     "prompt_eval_ms": pe, "npu_mul_mat": npu, "npu_live": live}
        say(f"| {name(m)} | {ntok_prompt} | {fmt(ms['cpu'])} | {fmt(ms['ork'])} | {fmt(ratios, '{:.3f}')} | "
            f"{med(ratios):.3f} | {med(pe['ork']):.0f} / {med(pe['cpu']):.0f} | {fmt(npu, '{}')} "
            f"({'live' if live else 'NOT LIVE: fell back or none ran'}) |")

# (c) the model buffers llama.cpp reports at load (-lv 4), one ORK and one CPU-alone run each
say()
say("## (c) llama.cpp's model buffers at load (llama-completion -lv 4, one run each): CPU_REPACK with ORK must "
    "equal the CPU alone's")
say()
say("| model | CPU_REPACK MiB, ORK loaded | CPU_REPACK MiB, CPU alone | equal | model buffers, ORK loaded (MiB) "
    "| model buffers, CPU alone (MiB) |")
say("|---|---:|---:|---|---|---|")
record["buffers"] = {}
for m in MODELS:
    got = {}
    for arm in ("ork", "cpu"):
        p = run([f"{BIN}/llama-completion", "-m", m, "-p", "Hello", "-n", "1", "--temp", "0", "-no-cnv",
                 "-t", THREADS, "--no-warmup", "-lv", "4"], arm_env(arm, m), f"buffers-{name(m)}-{arm}.log")
        got[arm] = ([float(x) for x in REPACK.findall(p.stderr)],
                    ", ".join(f"{b} {s}" for b, s in BUFFERS.findall(p.stderr)))
    eq = got["ork"][0] == got["cpu"][0] and sum(got["cpu"][0]) > 0
    record["buffers"][name(m)] = {"cpu_repack_ork": got["ork"][0], "cpu_repack_cpu": got["cpu"][0],
                                  "buffers_ork": got["ork"][1], "buffers_cpu": got["cpu"][1]}
    say(f"| {name(m)} | {mib(got['ork'][0])} | {mib(got['cpu'][0])} | "
        f"{'yes' if eq else ('no CPU_REPACK on this CPU' if not got['cpu'][0] else 'NO')} | {got['ork'][1]} | {got['cpu'][1]} |")

say()
say(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
with open(os.path.join(OUT, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
with open(os.path.join(OUT, "results.json"), "w") as f:
    json.dump(record, f, indent=1)
print(f"\nwritten: {OUT}/results.md, results.json, logs/", flush=True)
