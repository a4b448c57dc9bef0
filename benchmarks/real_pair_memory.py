"""Peak resident memory of loading the real pair (Qwen2.5-Coder 1.5B verifier, 0.5B drafter), per weight format.

    python benchmarks/real_pair_memory.py [--verifier /work/pair/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf]
        [--drafter /work/pair/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf] [--formats float32 bfloat16 int4 auto]
        [--loads verifier drafter pair]

Each cell is a fresh process (`sys.executable -c ...`) that loads the verifier, the drafter or both with
`load_model(path, dtype=FORMAT)`, runs one forward of an 8-token prompt through each (so the first step's
buffers count), and reports its peak resident set size (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) and
the wall time of its loads. A GGUF of architecture qwen2 is read tensor by tensor (models/gguf_weights.py):
the peak is the kept weights plus one tensor's slices in flight, never the model in float32.
Any load_model names work (`--verifier verifier --drafter drafter`: the built-in pair, seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys

from harness.options import parser

VERIFIER = "/work/pair/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFTER = "/work/pair/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

CELL = """
import json, resource, sys, time
import torch
from relaxspec.models import load_model
torch.set_num_threads(2)
start, loaded = time.perf_counter(), []
for name in {names!r}:
    lm = load_model(name, dtype={fmt!r})
    loaded.append(lm)
seconds = time.perf_counter() - start
for lm in loaded:
    ids = torch.arange(8)[None] + 100
    lm.forward(ids, lm.new_cache(), None, torch.arange(8)[None])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (kilobytes on Linux)
print(json.dumps({{"peak": peak, "seconds": seconds, "formats": [lm.weight_format for lm in loaded]}}))
"""


def measure(names: list[str], fmt: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CELL.format(names=names, fmt=fmt)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--verifier", default=VERIFIER)
    ap.add_argument("--drafter", default=DRAFTER)
    ap.add_argument("--formats", nargs="*", default=["float32", "bfloat16", "int4", "auto"])
    ap.add_argument("--loads", nargs="*", default=["verifier", "drafter", "pair"], choices=["verifier", "drafter",
                                                                                          "pair"])
    args = ap.parse_args()
    every = {"verifier": [args.verifier], "drafter": [args.drafter], "pair": [args.verifier, args.drafter]}
    rows = {label: every[label] for label in args.loads}
    print(f"verifier {args.verifier}\ndrafter  {args.drafter}\n")
    print("| load | " + " | ".join(f"{f}: peak RSS GB (load s)" for f in args.formats) + " |")
    print("|---|" + "---|" * len(args.formats))
    for label, names in rows.items():
        cells = []
        for fmt in args.formats:
            r = measure(names, fmt)
            cells.append(r["error"] if "error" in r else f"{r['peak'] / 1e9:.2f} ({r['seconds']:.0f})")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
