#!/usr/bin/env python3
"""The product's observable behaviour in one block of text, to compare two builds of
libggml-ork.so (a refactor must leave it unchanged):

    ORK_LIB=/path/a/libggml-ork.so python3 bench-scripts/fingerprint.py > a.txt
    ORK_LIB=/path/b/libggml-ork.so python3 bench-scripts/fingerprint.py > b.txt
    diff a.txt b.txt

Prints greedy 16-token texts on the simulated NPU (Q8_0, F16, Q4_K_M, and Q8_0 / Q4_K_M with
GPU decode on lavapipe), perplexity to 4 decimals (Q8_0, F16, Q4_K_M; 4 chunks x 128), the
test-backend-ops MUL_MAT counts (ORK_MINM 32 and 1), the exit line's counters, and the sha256
set of the .orkpack entries a cold SmolLM2 Q8_0 run writes. Needs the set-up's environment
(run it through `bash -c 'source tests/common.sh; ...'` or export LLAMA_BIN, ORK_MODELS,
ORK_CORPUS)."""
import glob, hashlib, os, re, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from e2e_common import BIN, MODELS, env_with, ork  # noqa: E402

CORPUS = os.environ["ORK_CORPUS"]
PROMPT = re.search(r'^PROMPT=\$\{1:-"([^"]+)"\}',
                   open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "demo.sh")).read(), re.M).group(1)


def model(t):
    return os.path.join(MODELS, f"smollm2-135m-{t}.gguf")


def run(args, extra):
    return subprocess.run(args, env=env_with(extra), capture_output=True, text=True, timeout=1800)


def counters(err):
    # the full breakdown (ORK_PROFILE=1) without its timings (ms figures vary run to run)
    m = re.search(r"ork: ORK ran \d[^\n\r]*", err)
    line = m.group(0) if m else ""
    return re.sub(r"[0-9.]+ ?(ms|s|µs)\b", "<t>", line)


with tempfile.TemporaryDirectory() as cache:
    for t, extra in (("Q8_0", {}), ("F16", {}), ("Q4_K_M", {}),
                     ("Q8_0", {"ORK_DECODE": "gpu", "ORK_VK_DEVICE": "llvmpipe"}),
                     ("Q4_K_M", {"ORK_DECODE": "gpu", "ORK_VK_DEVICE": "llvmpipe"})):
        p = run([f"{BIN}/llama-completion", "-m", model(t), "-p", PROMPT, "-n", "16", "--temp", "0", "-no-cnv",
                 "-t", "2", "--no-warmup", "--seed", "1"], ork(ORK_CACHE_DIR=cache, ORK_PROFILE=1, **extra))
        text = p.stdout[len(PROMPT):] if p.stdout.startswith(PROMPT) else p.stdout
        tag = t + ("+gpu" if extra else "")
        print(f"greedy {tag}: rc {p.returncode} {text!r}")
        print(f"counters {tag}: {counters(p.stderr)}")
        if t == "Q8_0" and not extra:
            shas = sorted(hashlib.sha256(open(f, "rb").read()).hexdigest() for f in glob.glob(f"{cache}/**/*.orkpack", recursive=True))
            print(f"orkpack Q8_0: {len(shas)} entries, sha256 of the sorted list {hashlib.sha256(''.join(shas).encode()).hexdigest()}")
for t in ("Q8_0", "F16", "Q4_K_M"):
    p = run([f"{BIN}/llama-perplexity", "-m", model(t), "-f", CORPUS, "-c", "128", "-b", "128", "--chunks", "4", "-t", "2"],
            ork(ORK_CACHE="0"))
    m = re.search(r"Final estimate: PPL = ([0-9.]+ \+/- [0-9.]+)", p.stdout + p.stderr)
    print(f"perplexity {t}: {m.group(1) if m else 'none'}")
for minm in ("32", "1"):
    p = run([f"{BIN}/test-backend-ops", "-b", "ORK", "-o", "MUL_MAT"], ork(ORK_MINM=minm, ORK_CACHE="0"))
    m = re.search(r"(\d+)/(\d+) tests passed", p.stdout)
    print(f"test-backend-ops MUL_MAT ORK_MINM={minm}: {m.group(0) if m else 'none'}, rc {p.returncode}")
