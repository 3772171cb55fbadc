"""Shared pieces of the end-to-end scripts (tests/e2e.py, tests/e2e_serving.py): the paths from
the set-up, the PASS/FAIL bookkeeping and the environments of the ORK and CPU runs."""
import os

BIN = os.environ["LLAMA_BIN"]
MODELS = os.environ["ORK_MODELS"]
LIB = os.environ["ORK_LIB"]
ONLY = set(filter(None, os.environ.get("ORK_E2E_ONLY", "").split(",")))

# Variables a caller's shell may set that would change what a check measures.
_CLEARED = ("ORK_NPU", "ORK_OFF", "ORK_MINM", "ORK_DECODE", "ORK_NPU_LOCK", "ORK_LOCK_DIR", "GGML_BACKEND_PATH")

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
