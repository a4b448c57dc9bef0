"""Where a verifier's decode step spends its time: one step of 1 token after `context` tokens (FastLlama, batch 1),
split into its parts, each part timed over every layer in turn, as a step runs it (one layer's weights are out of
the caches again when its turn comes back), and the step itself; all in interleaved rounds on one clock
(models.hf.measure_step_latencies), each figure the median over rounds.

Parts: the four linears by their shape (ms a step, MB read, GB/s), RMSNorm (two per layer and the final one), RoPE
with the cache write, attention over the context, the LM head; "rest": the step less its parts (the embedding row,
the residual adds, SiLU, Python and allocation between the calls). Beside them the machine's plain read bandwidth
(`plain_read_gbs`: a sum over a buffer larger than the caches) and the step's own bytes over its time, the roofline
a weight-bound step is held to.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from relaxspec.models.hf import CausalLM, measure_step_latencies

LINEARS = (("qkv", 1), ("o", 2), ("gate_up", 4), ("down", 5))  # (part, its index in a FastLlama layer's tuple)


@dataclass
class Part:
    name: str
    shape: str  # "[out, in] x layers", or "" (no weight)
    seconds: float  # a step's share: the part over every layer
    nbytes: int  # weight bytes it reads a step (0: none counted)

    @property
    def gbs(self) -> float | None:
        return self.nbytes / self.seconds / 1e9 if self.nbytes and self.seconds > 0 else None


def plain_read_gbs(megabytes: int = 512, rounds: int = 5) -> float:
    """GB/s of a sum over a float32 buffer of `megabytes` (larger than the caches) at the current thread count:
    the read bandwidth a weight-bound step can reach here (median over rounds, one warm-up)."""
    buf = torch.ones(megabytes * 2 ** 20 // 4, dtype=torch.float32, device="cpu")
    times = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return buf.numel() * 4 / statistics.median(times[1:]) / 1e9


def _timer(call):
    """A part as measure_step_latencies times it: `call()` once on its clock."""
    def timer(clock):
        start = clock()
        call()
        return clock() - start
    return timer


def step_parts(lm: CausalLM, context: int = 200, rounds: int = 20) -> tuple[float, list[Part]]:
    """(seconds of the whole step, its parts and "rest") of `lm`'s FastLlama on its device, at the current torch
    thread count. Raises ValueError for a model without the fast path."""
    fast = lm.fast
    if fast is None:
        raise ValueError(f"{lm.name}: no FastLlama path to break down (transformers' own forward)")
    device, dt, layers, n = fast.device, fast.dtype, fast.layers, fast.num_layers
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dt)

    cache = fast.new_cache()
    ids = torch.randint(0, lm.vocab_size, (1, context), generator=gen).to(device)
    with torch.inference_mode():
        fast.forward(ids, cache, None, torch.arange(context, device=device)[None], logits=False)
    rotation = fast._rotation(torch.full((1, 1), context, dtype=torch.long, device=device), context + 1)
    H = fast.embed.shape[1]
    qkv_out = layers[0][1].shape[0]
    qkvs = [rand(1, qkv_out) for _ in range(n)]

    def linear(index):
        x = rand(1, layers[0][index].shape[1])
        return lambda: [layer[index](x) for layer in layers]

    def norms():
        x = rand(1, H)
        for layer in layers:
            fast._rms_norm(x, layer[0])
            fast._rms_norm(x, layer[3])
        fast._rms_norm(x, fast.final_norm)

    def rope():
        for i in range(n):
            fast._rope_and_cache(qkvs[i], rotation, cache, i, context, 1, 1)

    written = [fast._rope_and_cache(qkvs[i], rotation, cache, i, context, 1, 1) for i in range(n)]

    def attention():
        for queries, kv in written:
            fast._attention(queries, kv, None, 1, 1)

    head_x = rand(1, H)
    parts = [(name, f"[{layers[0][i].shape[0]}, {layers[0][i].shape[1]}] x {n}", linear(i),
              sum(layer[i].nbytes for layer in layers)) for name, i in LINEARS]
    parts += [("RMSNorm", "", norms, 0), ("RoPE + cache write", "", rope, 0), (f"attention ({context} slots)", "",
                                                                                attention, 0),
              ("LM head", f"[{fast.lm_head.shape[0]}, {fast.lm_head.shape[1]}]", lambda: fast.lm_head(head_x),
               fast.lm_head.nbytes)]
    with torch.inference_mode():
        times = measure_step_latencies([(lm, 1)] + [_timer(call) for _, _, call, _ in parts], context, rounds)
    step = statistics.median(t[0] for t in times)
    out = [Part(name, shape, statistics.median(t[j + 1] for t in times), nbytes)
           for j, (name, shape, _, nbytes) in enumerate(parts)]
    out.append(Part("rest", "", step - sum(p.seconds for p in out), 0))
    return step, out


def breakdown_lines(label: str, step: float, parts: list[Part], read_gbs: float) -> list[str]:
    """A markdown table of `step_parts`' figures, then the step's bytes over its time against the plain read."""
    lines = [f"{label}: one decode step {step * 1e3:.2f} ms", "",
             "| part | weight | ms | share | MB read | GB/s |", "|---|---|---|---|---|---|"]
    for p in parts:
        gbs = "-" if p.gbs is None else f"{p.gbs:.1f}"
        mb = f"{p.nbytes / 1e6:.1f}" if p.nbytes else "-"
        lines.append(f"| {p.name} | {p.shape or '-'} | {p.seconds * 1e3:.2f} | {p.seconds / step:.0%} | {mb} | "
                     f"{gbs} |")
    total = sum(p.nbytes for p in parts)
    lines += ["", f"weights read a step {total / 1e6:.0f} MB: {total / step / 1e9:.1f} GB/s over the whole step, "
                  f"{total / sum(p.seconds for p in parts if p.nbytes) / 1e9:.1f} GB/s over its linears alone; "
                  f"plain read here {read_gbs:.1f} GB/s (the step at {total / step / 1e9 / read_gbs:.0%} of it)"]
    return lines
