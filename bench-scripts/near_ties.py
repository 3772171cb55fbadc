#!/usr/bin/env python3
"""Near-ties of greedy text on the CPU: for each prompt and model, the margin between the first and
the second most likely token (log-probability difference, nats) at each of the first N greedy
tokens, from llama-server's n_probs on ggml-cpu alone (ORK_OFF=1). A greedy-parity check compares
two arithmetics token by token; a prompt whose margin falls near zero within its N tokens compares
rounding, not accuracy (a near-tie flips with any change of arithmetic, ggml-cpu's own types among
them).

    python3 bench-scripts/near_ties.py [N] [PROMPT ...]     # default: the demo's prompt, N = 16

Environment as for the tests (source tests/common.sh): LLAMA_BIN, ORK_MODELS, ORK_LIB.
Prints one row per prompt and model: the smallest margin, where it is, and the greedy text.
"""
import json, os, subprocess, sys, time, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from e2e_common import BIN, DEMO_PROMPT, MODELS, cpu, env_with, free_port  # noqa: E402


def margins(port, prompt, n):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "n_probs": 2, "cache_prompt": False,
            "post_sampling_probs": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    steps = out.get("completion_probabilities", [])
    ms = [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"] for s in steps]
    return ms, out["content"], out.get("tokens_evaluated")


def main():
    args = sys.argv[1:]
    n = int(args.pop(0)) if args and args[0].isdigit() else 16
    prompts = args or [DEMO_PROMPT]
    models = os.environ.get("NEAR_TIE_MODELS", "smollm2-135m-Q8_0 smollm2-135m-F16 smollm2-135m-Q4_K_M").split()
    print("| model | prompt | smallest margin (nats) in the first %d tokens | at token | text |" % n)
    print("|---|---|---:|---:|---|")
    for m in models:
        port = free_port()
        p = subprocess.Popen([f"{BIN}/llama-server", "-m", os.path.join(MODELS, f"{m}.gguf"), "--host", "127.0.0.1",
                              "--port", str(port), "-t", "2", "--no-warmup", "-c", "2048"],
                             env=env_with(cpu()), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(240):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except Exception:
                    time.sleep(0.5)
            for pr in prompts:
                ms, text, ntok = margins(port, pr, n)
                i = min(range(len(ms)), key=ms.__getitem__)
                print(f"| {m} | {pr[:40]!r}… ({ntok} tokens) | {ms[i]:.3f} | {i} | {text!r} |", flush=True)
        finally:
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
