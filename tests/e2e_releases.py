#!/usr/bin/env python3
"""The same libggml-ork.so (one file, one sha256) inside several llama.cpp releases.

For each supported release -- the pinned b11549 (backend API 3) and b10809 / b10566 (API 2),
built by tests/setup-releases.sh into $ORK_RELEASES/b<N>/build/bin -- with that release's own,
unmodified tools: `--list-devices` lists ORK; 16 greedy tokens on SmolLM2-135M Q8_0 equal that
release's CPU output (and the NPU ran matmuls); `test-backend-ops -b ORK -o MUL_MAT` passes; the
perplexity (a few chunks) is within the pinned release's bound of that release's CPU figure (for
the pinned release itself that is tests/e2e.py's perplexity/Q8_0; ORK_RELEASES_PINNED_PPL=1 runs
it here too).
Then a ggml outside the verified releases: a faked newer ggml_version() in b11549 (registers with
one warning line; ORK_UNVERIFIED_GGML=refuse refuses it), and b10809 with an extra API-3 symbol
(refused): exit code 0, one line naming the host's version and the verified releases.
Then Ollama's way (releases/ollama/*): b10809's llama-server (API 2, as Ollama 0.34.x's b10969)
started as Ollama starts it -- discovery by `llama-server --list-devices --offline`, parsed with
Ollama's pattern, where ORK must report non-zero memory (Ollama drops a 0 MiB device); then the
runner with Ollama's arguments and only GGML_BACKEND_PATH added to the environment: 16 greedy
tokens equal that release's CPU tokens (step 2), ORK's NPU live (its exit line); the server log
lines naming ORK are recorded.
Prints one line per check and "N passed, M failed"; exit status 1 on any failure.
Environment: LLAMA_BIN, ORK_RELEASES, ORK_MODELS, ORK_CORPUS, ORK_LIB (tests/run-all.sh sets them).
Writes the figures to $ORK_ENV/e2e-releases-results.md.
"""
import json, os, re, subprocess, sys, tempfile, time, urllib.request

from e2e_common import (stop_process, BIN, DEMO_PROMPT, LIB, MODELS, check, cpu, env_with, exit_counters, figures, file_sha256,
                        free_port, npu_live, npu_words, ork, summary, want, write_figures)

CORPUS = os.environ["ORK_CORPUS"]
OUT = os.path.join(os.environ.get("ORK_ENV", "/tmp"), "e2e-releases-results.md")
RELEASES_DIR = os.environ["ORK_RELEASES"]
CHUNKS = os.environ.get("ORK_RELEASES_PPL_CHUNKS", "8")  # 4 chunks: ORK-CPU 1.2% on b11549, above the bound
PPL_BOUND = 0.01      # |dPPL| / PPL on Q8_0, as tests/e2e.py bounds the pinned release
MODEL = os.path.join(MODELS, "smollm2-135m-Q8_0.gguf")
# (release, its tools' directory, the ggml version and backend API version the plugin should see)
RELEASES = [("b11549", BIN, "0.26.0", 3),
            ("b10809", os.path.join(RELEASES_DIR, "b10809/build/bin"), "0.23.0", 2),
            ("b10566", os.path.join(RELEASES_DIR, "b10566/build/bin"), "0.21.0", 2)]
SUPPORTED = [r[0] for r in RELEASES]


def run(args, env_extra, timeout=900):
    t0 = time.time()
    p = subprocess.run(args, env=env_with(env_extra), capture_output=True, text=True, timeout=timeout)
    return p, time.time() - t0


def generate(bin_dir, n, env):
    p, dt = run([f"{bin_dir}/llama-completion", "-m", MODEL, "-p", DEMO_PROMPT, "-n", str(n), "--temp", "0",
                 "-no-cnv", "-t", "2", "--no-warmup", "--seed", "1"], env)
    if p.returncode != 0:
        return None, p.stderr[-600:], dt
    text = p.stdout
    return (text[len(DEMO_PROMPT):] if text.startswith(DEMO_PROMPT) else text), p.stderr, dt


def ppl(bin_dir, env):
    p, dt = run([f"{bin_dir}/llama-perplexity", "-m", MODEL, "-f", CORPUS, "-c", "128", "-b", "128",
                 "--chunks", CHUNKS, "-t", "2"], env)
    mt = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout + p.stderr)
    return (float(mt.group(1)) if mt else None), dt, p


def version_of(bin_dir):
    p, _ = run([f"{bin_dir}/llama-completion", "--version"], {})
    m = re.search(r"build (\d+)", p.stdout + p.stderr)
    return f"b{m.group(1)}" if m else "?"


sha = file_sha256(LIB)
print(f"plugin: {LIB}, sha256 {sha}", flush=True)
figures.append(f"| plugin | {os.path.basename(LIB)} sha256 {sha} |")

cpu_text = {}  # release -> its CPU's 16 greedy tokens
for rel, bin_dir, ggml_v, api in RELEASES:
    if not want(f"releases/{rel}"):
        continue
    if not os.path.exists(f"{bin_dir}/llama-completion"):
        check(f"releases/{rel}/set-up", False, f"no tools in {bin_dir} (tests/setup-releases.sh)")
        continue
    built = version_of(bin_dir)
    check(f"releases/{rel}/tools", built == rel, f"{bin_dir}: llama-completion --version says {built}")

    # 1. the device is listed, in this release's layout
    p, _ = run([f"{bin_dir}/llama-completion", "--list-devices"], ork(ORK_LOG="debug"))
    layout = re.search(r"host: llama\.cpp (b\d+) layout \(ggml (\S+), backend API (\d+)\)", p.stderr)
    seen = (layout.group(1), layout.group(2), int(layout.group(3))) if layout else None
    listed = re.search(r"^\s+ORK: ", p.stdout, re.M) is not None
    check(f"releases/{rel}/devices", p.returncode == 0 and listed and seen == (rel, ggml_v, api),
          f"rc {p.returncode}, ORK {'listed' if listed else 'NOT listed'}, plugin saw {seen}")

    # 2. greedy parity with this release's CPU
    a, ea, dta = generate(bin_dir, 16, ork())
    b, eb, dtb = generate(bin_dir, 16, cpu())
    cpu_text[rel] = b
    ran = exit_counters(ea)
    ok = a is not None and b is not None and a == b and ran is not None and ran["npu"] > 0
    check(f"releases/{rel}/greedy", ok, f"ORK {a!r} vs CPU {b!r}; NPU matmuls: {ran['npu'] if ran else 'none'}"
                                        + ("" if a is not None else f"; ORK stderr ends {ea!r}"))

    # 3. test-backend-ops MUL_MAT against this release's CPU backend
    p, dt = run([f"{bin_dir}/test-backend-ops", "-b", "ORK", "-o", "MUL_MAT"], ork())
    mt = re.search(r"(\d+)/(\d+) tests passed", p.stdout)
    passed, total = (int(mt.group(1)), int(mt.group(2))) if mt else (0, -1)
    ok = p.returncode == 0 and mt is not None and passed == total and total > 0 and "FAIL" not in p.stdout
    check(f"releases/{rel}/test-backend-ops", ok, f"{passed}/{total} MUL_MAT cases passed, rc {p.returncode}, {dt:.0f}s"
                                                   + ("" if mt else f"; output ends {(p.stdout + p.stderr)[-400:]!r}"))
    figures.append(f"| {rel} test-backend-ops -b ORK -o MUL_MAT | {passed}/{total} passed, {dt:.0f}s |")

    # 4. perplexity within the pinned release's bound of this release's CPU figure. The pinned
    # release's is tests/e2e.py's perplexity/Q8_0 (same model and bound, 12 chunks): not run twice
    # in the test command unless ORK_RELEASES_PINNED_PPL=1.
    if rel == RELEASES[0][0] and os.environ.get("ORK_RELEASES_PINNED_PPL") != "1":
        figures.append(f"| {rel} (ggml {ggml_v}, API {api}) | greedy 16 tokens {'equal' if a == b and a else 'DIFFER'}; "
                       f"perplexity: tests/e2e.py perplexity/Q8_0 |")
        continue
    po, dto, pr = ppl(bin_dir, ork())
    pc, dtc, _ = ppl(bin_dir, cpu())
    ok = po is not None and pc is not None and abs(po - pc) / pc <= PPL_BOUND and exit_counters(pr.stderr) is not None
    rel_d = abs(po - pc) / pc * 100 if po and pc else float("nan")
    check(f"releases/{rel}/perplexity", ok, f"ORK {po} vs CPU {pc} (|dPPL| {rel_d:.3f}% <= {PPL_BOUND*100:.0f}%), "
                                            f"{CHUNKS}x128 tokens, {dto:.0f}s vs {dtc:.0f}s"
                                            + ("" if po else f"; ORK output ends {(pr.stdout + pr.stderr)[-400:]!r}"))
    figures.append(f"| {rel} (ggml {ggml_v}, API {api}) | greedy 16 tokens {'equal' if a == b and a else 'DIFFER'}; "
                   f"PPL ORK {po}, CPU {pc}, |dPPL| {rel_d:.3f}% ({CHUNKS} chunks x 128) |")

# 5. a ggml outside the verified releases: fake what the host exports with an LD_PRELOAD library.
# A version newer than every verified release, with the newest layout's marks: registers with one
# warning line naming the newest verified release, and ORK_UNVERIFIED_GGML=refuse refuses it (one
# line, no device). b10809 with an API-3 symbol added (the b11549 layout's marks at a version
# below that layout's range): refused by default, one line naming the verified releases.
NEWER = 'const char * ggml_version(void) { return "0.99.0"; }'
API3_SYMBOL = "void * ggml_backend_buft_alloc_buffer_n(void * b, void ** t, int n) { (void)b; (void)t; (void)n; return 0; }"
UNKNOWN = [  # (name, release whose tools run, preloaded C source, extra env, ORK listed?, words the line holds)
    ("unverified/newer-registers", RELEASES[0], NEWER, {}, True, ["ggml 0.99.0 ", "is newer than", "ORK_UNVERIFIED_GGML=refuse"]),
    ("unverified/newer-refused", RELEASES[0], NEWER, {"ORK_UNVERIFIED_GGML": "refuse"}, False,
     ["ggml 0.99.0 ", "ORK registers no device", "ORK_UNVERIFIED_GGML=register"]),
    ("unverified/api3-symbol-in-b10809", RELEASES[1], API3_SYMBOL, {}, False, ["ggml 0.23.0 ", "ORK registers no device", "b11352..b11739", "b10809..b11327", "b10566..b10603"]),
]
with tempfile.TemporaryDirectory() as d:
    for name, (rel, bin_dir, _, _), src, extra, listed, words in UNKNOWN:
        if not want(f"releases/{name}") or not os.path.exists(f"{bin_dir}/llama-completion"):
            continue
        c, so = os.path.join(d, "shim.c"), os.path.join(d, f"{name.replace('/', '-')}.so")
        open(c, "w").write(src + "\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", so, c], check=True)
        p, _ = run([f"{bin_dir}/llama-completion", "--list-devices"], ork(LD_PRELOAD=so, **extra))
        lines = [l for l in p.stderr.splitlines() if l.startswith("ork: ") and "verified" in l]
        line = lines[0] if lines else ""
        ok = (p.returncode == 0 and ("ORK" in p.stdout) == listed and len(lines) == 1 and all(w in line for w in words))
        check(f"releases/{name}", ok, f"{rel} tools{''.join(f' {k}={v}' for k, v in extra.items())}: rc {p.returncode}, "
                                      f"ORK {'listed' if 'ORK' in p.stdout else 'not listed'}, {len(lines)} line(s) on the ggml: {lines}")

# 6. Ollama's way. Ollama (since its llama-server runner) finds devices by running
# `llama-server --list-devices --offline` and keeps the lines that match the pattern below with a
# total above 0 MiB; it then starts the runner with the arguments below, its whole environment,
# LD_LIBRARY_PATH = llama-server's own directory first, and LLAMA_MEDIA_MARKER. GGML_BACKEND_PATH
# is the one variable the user adds (ollama's service environment).
OLLAMA_DEVICE_LINE = re.compile(r"^\s+(.+?):\s+(.+?)\s+\((\d+)\s+MiB,\s+(\d+)\s+MiB\s+free\)")
rel, bin_dir = RELEASES[1][0], RELEASES[1][1]
server = f"{bin_dir}/llama-server"
if want("releases/ollama"):
    if not os.path.exists(server):
        check("releases/ollama/set-up", False, f"no {server} (tests/setup-releases.sh builds it for b10809)")
    else:
        env = ork(LD_LIBRARY_PATH=bin_dir, LLAMA_MEDIA_MARKER="<__ollama_media_0__>")
        p, _ = run([server, "--list-devices", "--offline"], env, timeout=120)
        devs = [m.groups() for m in map(OLLAMA_DEVICE_LINE.match, p.stdout.splitlines()) if m]
        mine = [d for d in devs if d[0] == "ORK"]
        ok = p.returncode == 0 and len(mine) == 1 and int(mine[0][2]) > 0 and int(mine[0][3]) > 0
        check("releases/ollama/discovery", ok, f"{rel} llama-server --list-devices --offline: rc {p.returncode}, devices as "
                                               f"Ollama parses them {devs}" + ("" if devs else f"; stdout {p.stdout[-300:]!r}"))
        figures.append(f"| Ollama discovery ({rel} llama-server --list-devices --offline) | {devs} |")
        port = free_port()
        args = [server, "--model", MODEL, "--port", str(port), "--host", "127.0.0.1", "--no-webui", "--offline",
                "-c", "4096", "-np", "1", "--log-verbosity", "4", "--no-log-prefix", "--no-log-timestamps",
                "--flash-attn", "auto"]
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(args, env=env_with(env), stdout=log, stderr=subprocess.STDOUT)
        text, err = None, ""
        try:
            t0 = time.time()
            while time.time() - t0 < 180 and proc.poll() is None and text is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if r.status == 200:
                            body = {"prompt": DEMO_PROMPT, "n_predict": 16, "temperature": 0, "top_k": 1, "seed": 1}
                            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                                         headers={"Content-Type": "application/json"})
                            with urllib.request.urlopen(req, timeout=300) as r2:
                                text = json.loads(r2.read())["content"]
                except Exception as e:  # noqa: BLE001 - not up yet, or reported below
                    err = str(e)
                    time.sleep(0.5)
        finally:
            stop_process(proc, grace=30)
            log.seek(0)
            out = log.read()
            log.close()
        c = exit_counters(out)
        named = [l.strip() for l in out.splitlines() if re.search(r"\bORK\b", l) and not l.startswith("ork: ")]
        ref = cpu_text.get(rel)  # llama-completion's greedy tokens on this release's CPU (step 2)
        if ref is not None and text is not None:  # llama-completion ends its output with blank lines
            ref, text = ref.rstrip("\n"), text.rstrip("\n")
        check("releases/ollama/runner", bool(text) and npu_live(c) and (ref is None or text == ref),
              f"{rel} llama-server with Ollama's arguments: completion {text!r}"
              f"{'' if ref is None else (' equal to' if text == ref else ' DIFFERS from') + ' the CPU greedy tokens'}; {npu_words(c)}"
              + ("" if text else f"; last error {err!r}; log ends {out[-600:]!r}"))
        figures.append(f"| Ollama runner ({rel} llama-server, Ollama's arguments) | completion {text!r}; {npu_words(c)}; "
                       f"log lines naming ORK: {named[:6]} |")
        print("  server log lines naming ORK:\n    " + "\n    ".join(named[:8]), flush=True)

check("releases/same-file", file_sha256(LIB) == sha, f"sha256 {sha} before and after")
npass, nfail = summary()
write_figures(OUT)
print(f"e2e-releases: {npass} passed, {nfail} failed")
sys.exit(1 if nfail else 0)
