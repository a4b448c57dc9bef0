"""The int4 block kernel (models/int4_block.py) against aten's `_weight_int4pack_mm_for_cpu` on SmolLM2-135M's
linear layers (30 x [qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536] + the LM head 49152x576, random
weights quantized to int4 in groups of 32), for blocks of 1, 4, 6 and 9 rows (a prompt: --rows 150).

    python benchmarks/int4_block_speed.py [--threads 1 2] [--rows 1 4 6 9] [--rounds 7]

The kernels take turns within each round (load changes hit them alike); ms is the median over rounds of one
pass over all the layers. Printed per kernel: ms, the block's cost over one row's (c_block of the linears),
bytes read per pass (codes, scales and zeros) over the time (GB/s), and 2 * rows * weights over the time
(GFLOP/s). On a CPU with AVX-512 VNNI the block kernel runs its VNNI path, and its bf16 path (the one of CPUs
without VNNI) is timed beside it: "bf16 ms" and "block / bf16"; on a CPU with AVX2 but no AVX-512 the block kernel
is the VNNI path's AVX2 code (int4_block_avx2.c), and there is no bf16 path to time.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import parser
from harness.output import header
from relaxspec.models import int4_block
from relaxspec.models.quant import Linear, quantize_int4

LAYERS = 30
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LM_HEAD = (49152, 576)


def weights(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    distinct = [torch.randn(shape, generator=g) * 0.05 for shape in SHAPES]
    return [w for _ in range(LAYERS) for w in distinct] + [torch.randn(LM_HEAD, generator=g) * 0.05]


def bf16_path(w: torch.Tensor):
    """x -> x @ W^T by the block kernel's bf16 path."""
    packed = int4_block.pack(*quantize_int4(w), "bf16")
    return lambda x: int4_block.block_mm(x, *packed, "bf16")


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 6, 9])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if int4_block.kernel() is None:
        raise SystemExit("the int4 block kernel is unavailable here (see the warning above)")
    mats = weights()
    # 30 layers share 4 distinct matrices (each layer its own Linear would be 30x the memory for the same reads:
    # the codes of one layer (~2.2 MB) do not stay in this CPU's 2 MB L2 between layers either way).
    kernels = {impl: {id(w): Linear(w, "int4", int4_impl=impl) for w in mats} for impl in ("aten", "block")}
    if int4_block.path() != "bf16" and int4_block.has_bf16():  # the bf16 path on the same codes
        kernels["bf16"] = {id(w): bf16_path(w) for w in mats}
    n_weights = sum(w.numel() for w in mats)
    nbytes = sum(kernels["block"][id(w)].nbytes for w in mats)
    print(f"SmolLM2-135M linears: {n_weights / 1e6:.1f} M weights, {nbytes / 1e6:.1f} MB read per pass (int4 codes "
          f"+ bfloat16 scales and zeros)")
    bf16 = "bf16" in kernels
    print(*header("threads", "rows", "aten ms", "block ms", "block / aten", "aten c_block", "block c_block",
                  "aten GB/s", "block GB/s", "aten GFLOP/s", "block GFLOP/s",
                  *(("bf16 ms", "block / bf16") if bf16 else ())), sep="\n")
    previous = torch.get_num_threads()
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = {(impl, m): [] for impl in kernels for m in args.rows}
        inputs = {m: {i: torch.randn(m, i) for i in (576, 1536)} for m in args.rows}
        for _ in range(args.rounds + 1):  # the first round warms up, untimed
            for m in args.rows:
                for impl, layer in kernels.items():
                    start = time.perf_counter()
                    for w in mats:
                        layer[id(w)](inputs[m][w.shape[1]])
                    times[impl, m].append(time.perf_counter() - start)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        for m in args.rows:
            a, b = med["aten", m], med["block", m]
            one = (med["aten", 1], med["block", 1]) if 1 in args.rows else (float("nan"),) * 2
            print(f"| {threads} | {m} | {a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.2f} | {a / one[0]:.2f} | "
                  f"{b / one[1]:.2f} | {nbytes / a / 1e9:.1f} | {nbytes / b / 1e9:.1f} | "
                  f"{2 * m * n_weights / a / 1e9:.0f} | {2 * m * n_weights / b / 1e9:.0f} |"
                  + (f" {med['bf16', m] * 1e3:.1f} | {b / med['bf16', m]:.2f} |" if bf16 else ""))
    torch.set_num_threads(previous)


if __name__ == "__main__":
    main()
