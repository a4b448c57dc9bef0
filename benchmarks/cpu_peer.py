"""relaxspec on a CPU in each weight format against the best CPU engine, llama.cpp, on the same GGUF file.

    python benchmarks/cpu_peer.py [--model smollm2] [--drafter smollm2-drafter] [--formats float32 bfloat16 int4]
        [--threads 1 2] [--draft-lengths 2 3 5] [--prompts 6] [--max-new-tokens 64] [--no-rss]
    python benchmarks/cpu_peer.py --quick      # reduced mode for CI: the built-in pair, no llama.cpp, ~30 s

Configurations, at every thread count, greedy, batch 1, the held-out chat prompts through the chat template:
* relaxspec in every format (`--dtype float32|bfloat16|int4`, models/quant.py): AR, strict with the drafter
  (`--drafter`, stored in the same format) and strict with `ngram` (prompt lookup), at every N;
* llama.cpp (`pip install 'relaxspec[llamacpp]'`, llama-cpp-python; skipped with a note when absent), on the
  GGUF file as shipped: AR, and its prompt lookup (`LlamaPromptLookupDecoding(num_pred_tokens=N)`) at every N.
Every configuration runs once per prompt, in an order rotated from prompt to prompt (a change in the machine's
load hits all alike); ms/token is the median over prompts of one call's wall time (prefill included) over its
tokens. "x own AR" divides by relaxspec AR in the same format, "x llama.cpp AR" by llama.cpp's AR. c_rel and
c_block are the bench's interleaved speed constants (`bench.cell.speed_constants`) in each format, c_block
also at 4, 6 and 9 tokens; modelled = tau / (c_block + N c_rel) (bench/speedup.py). Greedy divergences:
strict's tokens against AR's in the same format, with the top-2 logit gap of AR's verifier at the first
differing position (a near-tie when below the format's rounding). Peak RSS: each format loaded and run AR in a
fresh process (VmHWM), llama.cpp likewise. Every configuration runs once untimed first (4 tokens: llama.cpp
loads its model then).
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from relaxspec.acceptance import get_rule
from relaxspec.bench.speedup import block_aware_speedup
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.drafters import load_drafter
from relaxspec.models.gguf import is_gguf, split_gguf
from relaxspec.models.prompts import encode_prompts
from relaxspec.tasks import chat

NGRAM, LLAMACPP, OURS = "ngram", "llama.cpp", "relaxspec"
FORMATS = ("float32", "bfloat16", "int4")
BLOCKS = (4, 6, 9)  # c_block is reported at these block sizes in every format


@dataclass(frozen=True)
class Config:
    system: str  # OURS or LLAMACPP
    fmt: str  # a weight format; "gguf" for llama.cpp
    method: str  # "ar", "strict" or "prompt lookup"
    drafter: str  # "" for AR
    n: int
    threads: int


@dataclass(frozen=True)
class _Cell:  # what bench.runner.speed_constants reads of a grid cell
    verifier: str
    drafter: str
    draft_length: int
    method: str = "strict"


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def configurations(formats, drafter, threads, draft_lengths, with_llamacpp) -> list[Config]:
    out = []
    for th in threads:
        if with_llamacpp:
            out.append(Config(LLAMACPP, "gguf", "ar", "", 0, th))
            out += [Config(LLAMACPP, "gguf", "prompt lookup", NGRAM, n, th) for n in draft_lengths]
        for fmt in formats:
            out.append(Config(OURS, fmt, "ar", "", 0, th))
            for n in draft_lengths:
                out += [Config(OURS, fmt, "strict", d, n, th) for d in dict.fromkeys([drafter, NGRAM])]
    return out


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the GGUF file: one Llama per (threads, N) (N = 0: AR)."""

    def __init__(self, path: str, context: int):
        self.path, self.context, self.models = path, context, {}

    def model(self, threads: int, n: int):
        if (threads, n) not in self.models:
            import llama_cpp

            draft = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=n) if n else None
            self.models[threads, n] = llama_cpp.Llama(model_path=self.path, n_threads=threads, n_threads_batch=threads,
                                                      n_ctx=self.context, draft_model=draft, verbose=False,
                                                      logits_all=bool(n))
        return self.models[threads, n]

    def run(self, cfg: Config, ids: list[int], max_new_tokens: int) -> list[int]:
        llm = self.model(cfg.threads, cfg.n)
        llm.reset()
        tokens = []
        for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            if llm.token_eos() == token or len(tokens) >= max_new_tokens:
                break
            tokens.append(token)
        return tokens


def speed_table(verifiers: dict, drafters: dict, drafter: str, draft_lengths, rounds: int) -> dict:
    """Per format: {"c_rel": {drafter: c}, "c_block": {tokens: c}, "step_ms"} from the bench's speed_constants
    (interleaved rounds), at the current thread count."""
    from relaxspec.bench.cell import speed_constants

    out = {}
    for fmt, verifier in verifiers.items():
        cells = [_Cell(fmt, d, n) for d in dict.fromkeys([drafter, NGRAM]) for n in draft_lengths]
        cells += [_Cell(fmt, drafter, b - 1) for b in BLOCKS]
        const = speed_constants({fmt: verifier}, cells, rounds=rounds,
                                drafters={(fmt, d): drafters[fmt][d] for d in dict.fromkeys([drafter, NGRAM])})
        out[fmt] = {"c_rel": {d: const[(fmt, d, draft_lengths[0])]["c_rel_measured"] for d in (drafter, NGRAM)},
                    "c_block": {n + 1: c["c_block_measured"] for (_, d, n), c in const.items() if d == drafter},
                    "step_ms": 1e3 * const[(fmt, drafter, draft_lengths[0])]["latency_verifier_s"]}
    return out


def interleaved(configs: list, prompts: int, run, *, desc: str, progress: bool = True) -> tuple[dict, dict]:
    """Every configuration once on each of `prompts` prompts, in an order rotated from prompt to prompt (a change in
    the machine's load hits all alike), at its thread count (`threads`, set before the clock starts). run(cfg, i) ->
    (tokens: a list or their count, anything else, seconds: the call's own time, or None for its wall time here).
    Returns ({config: [ms/token per prompt]}, {config: [(tokens, anything else) per prompt]})."""
    from tqdm import tqdm

    ms = {c: [] for c in configs}
    outs = {c: [] for c in configs}
    bar = tqdm(total=prompts * len(configs), desc=desc, disable=not progress)
    for i in range(prompts):
        shift = i % len(configs)
        for cfg in configs[shift:] + configs[:shift]:
            torch.set_num_threads(cfg.threads)
            start = time.perf_counter()
            tokens, other, seconds = run(cfg, i)
            seconds = time.perf_counter() - start if seconds is None else seconds
            ms[cfg].append(seconds * 1e3 / max(tokens if isinstance(tokens, int) else len(tokens), 1))
            outs[cfg].append((tokens, other))
            bar.update()
    bar.close()
    return ms, outs


def measure(model: str, drafter: str, formats, prompts, *, threads=(1, 2), draft_lengths=(2, 3, 5),
            max_new_tokens=64, with_llamacpp=True, rounds=20, progress=True) -> dict:
    verifiers = {fmt: load_model(model, device="cpu", dtype=fmt) for fmt in formats}
    drafters = {fmt: {d: load_drafter(d, v) for d in dict.fromkeys([drafter, NGRAM])} for fmt, v in verifiers.items()}
    tokenizer = next(iter(verifiers.values())).tokenizer
    encoded = encode_prompts(tokenizer, prompts, chat_template="auto")
    llama = None
    if with_llamacpp:
        directory, file = split_gguf(model)
        llama = LlamaCpp(str(directory / file), context=max(len(e) for e in encoded) + max_new_tokens + 16)
    configs = configurations(formats, drafter, threads, draft_lengths, llama is not None)
    constants = {}
    for th in threads:
        torch.set_num_threads(th)
        constants[th] = speed_table(verifiers, drafters, drafter, list(draft_lengths), rounds)
    def run(cfg: Config, i: int, new_tokens: int):
        """(tokens, GenerationStats or None, None: timed by the caller)"""
        torch.set_num_threads(cfg.threads)
        if cfg.system == LLAMACPP:
            return llama.run(cfg, encoded[i], new_tokens), None, None
        res = generate(verifiers[cfg.fmt], drafters[cfg.fmt].get(cfg.drafter), [prompts[i]], method=cfg.method,
                       draft_length=max(cfg.n, 1), max_new_tokens=new_tokens, chat_template="auto")
        return res.results[0].token_ids, res.stats, None

    for cfg in configs:  # warm-up, untimed: llama.cpp loads its model on first use, first calls allocate
        run(cfg, 0, 4)
    ms, outs = interleaved(configs, len(prompts), lambda cfg, i: run(cfg, i, max_new_tokens), desc="cpu peer",
                           progress=progress)
    tokens = {c: [t for t, _ in out] for c, out in outs.items()}
    tau = {c: statistics.mean(s.mean_acceptance_length for _, s in out) for c, out in outs.items()
           if c.method == "strict" and out}
    divergences = greedy_divergences(verifiers, configs, tokens, encoded)
    return {"configs": configs, "ms": ms, "tau": tau, "constants": constants, "divergences": divergences,
            "drafter": drafter, "llamacpp": llama is not None}


@torch.inference_mode()
def greedy_divergences(verifiers, configs, tokens, encoded) -> dict:
    """{format: [(config, prompt index, position, top-2 gap of AR's logits there)]} for strict runs whose tokens
    differ from AR's (same format, threads and prompt)."""
    out = {fmt: [] for fmt in verifiers}
    for cfg in configs:
        if cfg.system != OURS or cfg.method != "strict":
            continue
        ar = tokens[Config(OURS, cfg.fmt, "ar", "", 0, cfg.threads)]
        for i, (a, s) in enumerate(zip(ar, tokens[cfg])):
            if a == s:
                continue
            pos = next((k for k, (x, y) in enumerate(zip(a, s)) if x != y), min(len(a), len(s)))
            lm = verifiers[cfg.fmt]
            ids = torch.tensor([encoded[i] + a[:pos]], device=lm.device)
            logits, _ = lm.forward(ids, lm.new_cache(), torch.ones_like(ids), torch.arange(ids.shape[1])[None])
            top = logits[0, -1].topk(2).values
            out[cfg.fmt].append((cfg, i, pos, float(top[0] - top[1])))
    return out


def peak_rss_mb(model: str, fmt: str, drafter: str | None = None) -> tuple[float, float]:
    """(peak RSS, RSS after the run) in MB of a fresh process that loads `model` in `fmt` and generates 16 tokens,
    AR (as llama.cpp's process does), or strict with `drafter` when given (the peak includes loading:
    transformers dequantizes a GGUF to float32 first)."""
    run = ("d = load_drafter({drafter!r}, v); generate(v, d, ['Hello'], method='strict', draft_length=3, "
           "max_new_tokens=16); ").format(drafter=drafter) if drafter else \
        "generate(v, None, ['Hello'], method='ar', max_new_tokens=16); "
    code = ("import torch; from relaxspec.models import load_model; "
            "from relaxspec.drafters import load_drafter; from relaxspec.engine import generate; "
            f"v = load_model({model!r}, device='cpu', dtype={fmt!r}); " + run + _PRINT_RSS)
    if fmt == "gguf":
        directory, file = split_gguf(model)
        code = ("import llama_cpp; "
                f"m = llama_cpp.Llama(model_path={str(directory / file)!r}, n_threads=1, n_ctx=256, verbose=False); "
                "m.create_completion('Hello', max_tokens=16); " + _PRINT_RSS)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode:
        return float("nan"), float("nan")
    peak, now = out.stdout.strip().splitlines()[-1].split()
    return float(peak), float(now)


# VmHWM / VmRSS of the process's own memory since exec (ru_maxrss would also count the parent's resident memory
# at the fork: Linux carries the forked copy's high-water mark across exec).
_PRINT_RSS = ("status = dict(line.split(':', 1) for line in open('/proc/self/status')); "
              "print(int(status['VmHWM'].split()[0]) / 1024, int(status['VmRSS'].split()[0]) / 1024)")


def _f(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def rows(result: dict) -> list[dict]:
    med = {c: statistics.median(v) for c, v in result["ms"].items()}
    extra = get_rule("strict").extra_draft_passes
    out = []
    for c in result["configs"]:
        own = med[Config(c.system, c.fmt, "ar", "", 0, c.threads)]
        peer = med.get(Config(LLAMACPP, "gguf", "ar", "", 0, c.threads))
        row = {"config": c, "ms": med[c], "x_own": own / med[c], "x_peer": None if peer is None else peer / med[c],
               "tau": result["tau"].get(c), "c_rel": None, "c_block": None, "modelled": None}
        if c.system == OURS and c.method == "strict":
            const = result["constants"][c.threads][c.fmt]
            row["c_rel"] = const["c_rel"][c.drafter]
            row["c_block"] = const["c_block"][c.n + 1]
            row["modelled"] = block_aware_speedup(row["tau"], c.n, row["c_rel"], row["c_block"], extra)
        out.append(row)
    return out


def report(result: dict, rss: dict) -> str:
    lines = ["| threads | system | weights | method | drafter | N | ms/token | x own AR | x llama.cpp AR | tau | "
             "c_rel | c_block | modelled | measured/modelled |", "|" + "---|" * 14]
    for r in rows(result):
        c = r["config"]
        ratio = None if r["modelled"] is None else r["x_own"] / r["modelled"]
        lines.append(f"| {c.threads} | {c.system} | {c.fmt} | {c.method} | {c.drafter or '-'} | {c.n or '-'} | "
                     f"{r['ms']:.1f} | {r['x_own']:.2f} | {_f(r['x_peer'])} | {_f(r['tau'])} | {_f(r['c_rel'], 3)} | "
                     f"{_f(r['c_block'])} | {_f(r['modelled'])} | {_f(ratio)} |")
    notes = []
    for th, per_format in result["constants"].items():
        for fmt, const in per_format.items():
            blocks = ", ".join(f"{b} tokens {v:.2f}" for b, v in sorted(const["c_block"].items()) if b in BLOCKS)
            notes.append(f"{th} thread(s), {fmt}: verifier step {const['step_ms']:.1f} ms; c_block {blocks}")
    for fmt, found in result["divergences"].items():
        runs = sum(len(result["ms"][c]) for c in result["configs"]
                   if c.system == OURS and c.method == "strict" and c.fmt == fmt)
        gaps = ", ".join(f"{g:.3g}" for *_, g in found)
        notes.append(f"greedy, {fmt}: {len(found)} of {runs} strict runs differ from AR"
                     + (f" (top-2 logit gaps at the first difference: {gaps})" if found else ""))
    if rss:
        notes.append("RSS (MB, a fresh process loading the model, generating 16 tokens AR; peak / after): "
                     + ", ".join(f"{k} {peak:.0f} / {now:.0f}" for k, (peak, now) in rss.items()))
    if not result["llamacpp"]:
        notes.append("llama.cpp: not run (--no-llamacpp or --quick, the model is not a GGUF file, or "
                     "llama-cpp-python is not installed: pip install 'relaxspec[llamacpp]')")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="a GGUF model reference (llama.cpp runs the same file)")
    ap.add_argument("--drafter", default="smollm2-drafter")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=[2, 3, 5])
    ap.add_argument("--prompts", type=int, default=6, help=f"held-out chat prompts (at most {len(chat.HELDOUT)})")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds of the speed constants")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS processes")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CI: built-in verifier + drafter-mtp, 1 thread, N=3, "
                    "2 prompts, 8 tokens, no RSS, no llama.cpp")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.drafter, args.threads, args.draft_lengths = "verifier", "drafter-mtp", [1], [3]
        args.prompts, args.max_new_tokens, args.rounds, args.no_rss, args.no_llamacpp = 2, 8, 3, True, True
    if not 1 <= args.prompts <= len(chat.HELDOUT):
        ap.error(f"--prompts must be between 1 and {len(chat.HELDOUT)}")
    with_llamacpp = not args.no_llamacpp and is_gguf(args.model) and llama_cpp_available()
    result = measure(args.model, args.drafter, args.formats, chat.HELDOUT[:args.prompts], threads=args.threads,
                     draft_lengths=args.draft_lengths, max_new_tokens=args.max_new_tokens,
                     with_llamacpp=with_llamacpp, rounds=args.rounds, progress=not args.no_progress)
    rss = {} if args.no_rss else {fmt: peak_rss_mb(args.model, fmt) for fmt in args.formats}
    if rss and with_llamacpp:
        rss["llama.cpp"] = peak_rss_mb(args.model, "gguf")
    print(f"model {args.model}, drafter {args.drafter}, {args.prompts} held-out chat prompts, "
          f"max {args.max_new_tokens} new tokens, greedy, batch 1; this process's peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    print(report(result, rss))


if __name__ == "__main__":
    main()
