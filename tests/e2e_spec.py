#!/usr/bin/env python3
"""Speculative decoding and parallel slots with one engine, inside the pinned llama.cpp tools.

Every MUL_MAT of every step on the simulated NPU (ORK_MINM=1 ORK_DECODE=npu: single-token steps,
verify batches and the draft model's steps alike), three prompts (one repetitive), 32 greedy
tokens each:
1. llama-server: the speculative text equals the plain greedy text token for token, with drafts
   made and accepted (the response's timings.draft_n and draft_n_accepted), and the exit line
   shows every MUL_MAT on a live NPU (none left at the graph split, nothing fell back): n-gram
   lookup in the request's own tokens (`--spec-type ngram-simple`) on SmolLM2-135M Q8_0, a draft
   model (`--spec-type draft-simple -md`) on SmolLM2-135M Q8_0 drafted by its Q4_0 and on
   Gemma-3-270M Q8_0 drafted by its Q4_K_M.
2. llama-cli (non-interactive: the three prompts as three turns of one conversation on stdin,
   the answers written with -o), SmolLM2 with both: the same, the draft counts from its log's
   "draft acceptance" lines.
3. llama-server --parallel 4 (the plain SmolLM2 server of 1): four clients decoding at once,
   each text equal to its request alone.
Prints PASS/FAIL lines and "N passed, M failed"; exit 1 on failure. Environment: LLAMA_BIN,
ORK_MODELS, ORK_LIB (set by tests/run-all.sh). Writes the figures to $ORK_ENV/e2e-spec-results.md.
"""
import os, re, subprocess, sys, tempfile, time

from e2e_common import (BIN, DEMO_PROMPT, MODELS, check, env_with, exit_counters, figures, free_port, npu_live,
                        npu_words, ork, stop_process, summary, want, write_figures)
from e2e_serving import post, run_clients, wait_healthy

OUT = os.path.join(os.environ.get("ORK_ENV", "/tmp"), "e2e-spec-results.md")
ONE_ENGINE = ork(ORK_MINM=1, ORK_DECODE="npu")
N_PREDICT = 32
# (name, target, draft): the draft model of `--spec-type draft-simple`.
PAIRS = (("smollm2-135m", "smollm2-135m-Q8_0", "smollm2-135m-Q4_0"),
         ("gemma3-270m", "gemma3-270m-Q8_0", "gemma3-270m-Q4_K_M"))
# Which speculation each tool runs, per pair. Every token here is a step of the simulated NPU,
# the slow part of this script, so Gemma-3-270M runs in llama-server only.
SERVER_SPECS = {"smollm2-135m": ("ngram-simple", "draft-simple"), "gemma3-270m": ("draft-simple",)}
CLI_SPECS = {"smollm2-135m": ("ngram-simple", "draft-simple")}
# The first repeats itself (n-gram drafts need repetition), the second half does, the third is
# the demo's prose. One line each: llama-cli reads one turn per line.
PROMPTS = ["Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. " * 3 + "Monday, Tuesday,",
           "The cat sat on the mat. The dog sat on the log. The frog sat on the",
           DEMO_PROMPT]
# The parallel check's fourth request.
FOURTH = "Name three rivers of France and say where each one flows."
# n-gram lookup of 4 tokens, up to 12 drafted: verify batches of 2 to 13 rows. draft-simple
# drafts its default 3 (verify batches of up to 4 rows).
SPECS = {"ngram-simple": lambda draft: ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                                        "--spec-ngram-simple-size-m", "12"],
         "draft-simple": lambda draft: ["--spec-type", "draft-simple", "-md", os.path.join(MODELS, f"{draft}.gguf")]}
# llama-cli's in-process server logs each finished turn's drafts (-lv 3).
CLI_DRAFTS = re.compile(r"draft acceptance = [0-9.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def one_engine(c):
    """The exit counters show every MUL_MAT on a live NPU: none left to the CPU at the split."""
    return npu_live(c) and c["left"] == 0


def engine_words(c):
    return npu_words(c) + (f", {c['left']} left at the graph split" if c else "")


def completion(port, prompt):
    """(token ids, text, drafted, accepted) of one greedy request."""
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1, "seed": 1,
            "cache_prompt": False, "return_tokens": True}
    r = post(port, "/completion", body, timeout=900)
    t = r.get("timings", {})
    return r.get("tokens"), r["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0)


def server(target, extra, requests):
    """Runs `requests(port)` against a llama-server of `target` with one engine and `extra`
    arguments: (its result or None, the exit counters)."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    args = [f"{BIN}/llama-server", "-m", os.path.join(MODELS, f"{target}.gguf"), "--host", "127.0.0.1",
            "--port", str(port), "--parallel", "4", "-c", "4096", "-t", "2", "--no-warmup", "--temp", "0", *extra]
    proc = subprocess.Popen(args, env=env_with(ONE_ENGINE), stdout=log, stderr=subprocess.STDOUT)
    got = None
    try:
        if wait_healthy(port, proc):
            try:
                got = requests(port)
            except Exception as e:  # noqa: BLE001 - the checks that needed it fail
                print(f"  llama-server {' '.join(extra)}: a request failed: {e}", flush=True)
        else:
            log.seek(0)
            print(f"  llama-server {' '.join(extra)}: exit status {proc.poll()}; log ends: {log.read()[-800:]}", flush=True)
    finally:
        stop_process(proc)
        log.seek(0)
        c = exit_counters(log.read())
        log.close()
    return got, c


def parallel4(port, solo):
    """The four requests from four clients at once: how many equal their request alone."""
    prompts = PROMPTS + [FOURTH]
    solo = solo + [completion(port, FOURTH)]
    got = {}

    def client(i):
        got[i] = completion(port, prompts[i])

    t0 = time.time()
    errors = run_clients(4, client, timeout=1800)
    same = [i for i in range(4) if i in got and got[i][:2] == solo[i][:2]]
    return same, errors, time.time() - t0


def server_checks(name, target, draft):
    specs = [s for s in SERVER_SPECS.get(name, ()) if want(f"spec/server/{name}/{s}")]
    with_parallel = name == "smollm2-135m" and want("spec/parallel4-one-engine")
    if not specs and not with_parallel:
        return

    def plain_requests(port):
        solo = [completion(port, p) for p in PROMPTS]
        return solo, (parallel4(port, solo) if with_parallel else None)

    got, c_plain = server(target, [], plain_requests)
    plain, par = got or (None, None)
    if with_parallel:
        same, errors, dt = par or ([], ["the plain server did not serve"], 0.0)
        check("spec/parallel4-one-engine", len(same) == 4 and not errors and one_engine(c_plain),
              f"{target}, llama-server --parallel 4, 4 clients decoding at once: {len(same)}/4 texts equal their "
              f"request alone {errors[:1]}; {engine_words(c_plain)}")
        figures.append(f"| llama-server --parallel 4, one engine, {target} | {len(same)}/4 equal alone, {dt:.0f} s |")
    for spec in specs:
        check_name = f"spec/server/{name}/{spec}"
        got, c = server(target, SPECS[spec](draft), lambda port: [completion(port, p) for p in PROMPTS])
        equal = [i for i in range(len(PROMPTS)) if plain and got and got[i][:2] == plain[i][:2]]
        drafted, accepted = (sum(g[2] for g in got), sum(g[3] for g in got)) if got else (0, 0)
        ok = plain is not None and len(equal) == len(PROMPTS) and drafted > 0 and accepted > 0 and one_engine(c) and one_engine(c_plain)
        first = next((i for i in range(len(PROMPTS)) if i not in equal), None)
        check(check_name, ok,
              f"llama-server {target}: {len(equal)}/{len(PROMPTS)} speculative texts equal the plain ones token for token, "
              f"{drafted} drafted / {accepted} accepted (per prompt {[g[2:] for g in got] if got else None}); {engine_words(c)}"
              + (f"; plain server: {engine_words(c_plain)}" if not one_engine(c_plain) else "")
              + (f"; first diff, prompt {first}: {got[first][1]!r} vs {plain[first][1]!r}" if got and plain and first is not None else ""))
        figures.append(f"| llama-server {spec}, {target} | {len(equal)}/{len(PROMPTS)} equal plain, {drafted} drafted, {accepted} accepted |")


def cli(target, extra):
    """llama-cli with the prompts as turns on stdin: (the conversation it wrote, drafted,
    accepted, exit counters); the conversation None when the run failed."""
    with tempfile.TemporaryDirectory() as d:
        out, lines = os.path.join(d, "out.txt"), os.path.join(d, "turns.txt")
        with open(lines, "w") as f:
            f.write("\n".join(PROMPTS) + "\n")
        args = [f"{BIN}/llama-cli", "-m", os.path.join(MODELS, f"{target}.gguf"), "-n", str(N_PREDICT), "--temp", "0",
                "-c", "4096", "-t", "2", "--no-warmup", "--seed", "1", "--simple-io", "-lv", "3", "-o", out, *extra]
        with open(lines) as stdin:
            try:
                p = subprocess.run(args, env=env_with(ONE_ENGINE), stdin=stdin, capture_output=True, text=True, timeout=1800)
            except subprocess.TimeoutExpired:
                print(f"  llama-cli {' '.join(extra)}: timed out", flush=True)
                return None, 0, 0, None
        if p.returncode != 0:
            print(f"  llama-cli failed: exit status {p.returncode}; stderr ends:\n    "
                  + "\n    ".join(p.stderr[-1200:].splitlines()), flush=True)
        text = open(out).read() if p.returncode == 0 and os.path.exists(out) else None
    counts = [(int(a), int(g)) for a, g in CLI_DRAFTS.findall(p.stderr)]
    return text, sum(g for _, g in counts), sum(a for a, _ in counts), exit_counters(p.stderr)


def turns(text):
    """The assistant's answers in llama-cli's -o file."""
    return re.findall(r"^Assistant:\n(.*?)\n\n(?=User:\n|\Z)", text or "", re.S | re.M)


def cli_checks(name, target, draft):
    specs = [s for s in CLI_SPECS.get(name, ()) if want(f"spec/cli/{name}/{s}")]
    if not specs:
        return
    plain, _, _, c_plain = cli(target, [])
    for spec in specs:
        check_name = f"spec/cli/{name}/{spec}"
        text, drafted, accepted, c = cli(target, SPECS[spec](draft))
        a, b = turns(text), turns(plain)
        equal = [i for i in range(len(PROMPTS)) if len(a) == len(b) == len(PROMPTS) and a[i] == b[i]]
        ok = (plain is not None and text == plain and len(equal) == len(PROMPTS) and drafted > 0 and accepted > 0
              and one_engine(c) and one_engine(c_plain))
        first = next((i for i in range(len(PROMPTS)) if i not in equal), None)
        check(check_name, ok,
              f"llama-cli {target}, three turns: {len(equal)}/{len(PROMPTS)} speculative answers equal the plain ones, "
              f"{drafted} drafted / {accepted} accepted; {engine_words(c)}"
              + (f"; plain run: {engine_words(c_plain)}" if not one_engine(c_plain) else "")
              + (f"; first diff, turn {first}: {a[first] if first < len(a) else None!r} vs "
                 f"{b[first] if first < len(b) else None!r}" if first is not None else ""))
        figures.append(f"| llama-cli {spec}, {target} | {len(equal)}/{len(PROMPTS)} equal plain, {drafted} drafted, {accepted} accepted |")


if __name__ == "__main__":
    t_start = time.time()
    for name, target, draft in PAIRS:
        server_checks(name, target, draft)
        cli_checks(name, target, draft)
    npass, nfail = summary()
    write_figures(OUT)
    print(f"e2e-spec: {npass} passed, {nfail} failed ({time.time() - t_start:.0f}s)")
    sys.exit(1 if nfail else 0)
