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

import resource
import statistics
import subprocess
import sys

from harness import llamacpp, peer
from harness.llamacpp import LlamaCpp
from harness.options import add, chat_prompts, parser, progress, within_chat
from harness.output import header, num, row, with_notes
from harness.peer import LLAMACPP, NGRAM, OURS, Config, greedy_divergences
from harness.timing import strict_constants
from relaxspec.acceptance import get_rule
from relaxspec.bench.speedup import block_aware_speedup
from relaxspec.models.gguf import is_gguf
from relaxspec.tasks import chat

FORMATS = ("float32", "bfloat16", "int4")
BLOCKS = (4, 6, 9)  # c_block is reported at these block sizes in every format


def configurations(formats, drafter, threads, draft_lengths, with_llamacpp) -> list[Config]:
    out = []
    for th in threads:
        if with_llamacpp:
            out.append(Config(LLAMACPP, "gguf", "ar", "", 0, th))
            out += [Config(LLAMACPP, "gguf", "prompt lookup", NGRAM, n, th) for n in draft_lengths]
        out += peer.ours(formats, drafter, draft_lengths, th)
    return out


def speed_table(verifiers: dict, drafters: dict, drafter: str, draft_lengths, rounds: int) -> dict:
    """Per format: {"c_rel": {drafter: c}, "c_block": {tokens: c}, "step_ms"} from the bench's speed_constants
    (interleaved rounds), at the current thread count."""
    out = {}
    for fmt, verifier in verifiers.items():
        cells = [(d, n) for d in peer.drafter_names(drafter) for n in draft_lengths]
        const = strict_constants(fmt, verifier, drafters[fmt], cells + [(drafter, b - 1) for b in BLOCKS], rounds)
        out[fmt] = {"c_rel": {d: const[(fmt, d, draft_lengths[0])]["c_rel_measured"] for d in (drafter, NGRAM)},
                    "c_block": {n + 1: c["c_block_measured"] for (_, d, n), c in const.items() if d == drafter},
                    "step_ms": 1e3 * const[(fmt, drafter, draft_lengths[0])]["latency_verifier_s"]}
    return out


def measure(model: str, drafter: str, formats, prompts, *, threads=(1, 2), draft_lengths=(2, 3, 5),
            max_new_tokens=64, with_llamacpp=True, rounds=20, progress=True) -> dict:
    verifiers, drafters, encoded = peer.load(model, drafter, formats, prompts)
    llama = None
    if with_llamacpp:
        llama = LlamaCpp(llamacpp.gguf_path(model), context=max(len(e) for e in encoded) + max_new_tokens + 16)
    configs = configurations(formats, drafter, threads, draft_lengths, llama is not None)
    constants = peer.at_threads(threads, lambda: speed_table(verifiers, drafters, drafter, list(draft_lengths), rounds))

    def run(cfg: Config, i: int, new_tokens: int):
        """(tokens, GenerationStats or None, None: timed by the caller)"""
        if cfg.system == LLAMACPP:
            return llama.run(cfg, encoded[i], new_tokens), None, None
        return *peer.generate_ours(verifiers, drafters, cfg, prompts[i], new_tokens), None

    ms, outs = peer.runs(configs, len(prompts), run, max_new_tokens, desc="cpu peer", progress=progress)
    tokens = {c: [t for t, _ in out] for c, out in outs.items()}
    tau = {c: statistics.mean(s.mean_acceptance_length for _, s in out) for c, out in outs.items()
           if c.method == "strict" and out}
    divergences = greedy_divergences(verifiers, configs, tokens, encoded)
    return {"configs": configs, "ms": ms, "tau": tau, "constants": constants, "divergences": divergences,
            "drafter": drafter, "llamacpp": llama is not None}


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
        code = ("import llama_cpp; "
                f"m = llama_cpp.Llama(model_path={llamacpp.gguf_path(model)!r}, n_threads=1, n_ctx=256, "
                "verbose=False); "
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


def rows(result: dict) -> list[dict]:
    med = {c: statistics.median(v) for c, v in result["ms"].items()}
    extra = get_rule("strict").extra_draft_passes
    out = []
    for c in result["configs"]:
        own, them = med[c.ar], med.get(c.llamacpp_ar)
        r = {"config": c, "ms": med[c], "x_own": own / med[c], "x_peer": None if them is None else them / med[c],
             "tau": result["tau"].get(c), "c_rel": None, "c_block": None, "modelled": None, "measured/modelled": None}
        if c.system == OURS and c.method == "strict":
            const = result["constants"][c.threads][c.fmt]
            r["c_rel"] = const["c_rel"][c.drafter]
            r["c_block"] = const["c_block"][c.n + 1]
            r["modelled"] = block_aware_speedup(r["tau"], c.n, r["c_rel"], r["c_block"], extra)
            r["measured/modelled"] = r["x_own"] / r["modelled"]
        out.append(r)
    return out


def report(result: dict, rss: dict) -> str:
    lines = header("threads", "system", "weights", "method", "drafter", "N", "ms/token", "x own AR", "x llama.cpp AR",
                   "tau", "c_rel", "c_block", "modelled", "measured/modelled")
    for r in rows(result):
        c = r["config"]
        lines.append(row(c.threads, c.system, c.fmt, c.method, c.drafter or "-", c.n or "-", f"{r['ms']:.1f}",
                         f"{r['x_own']:.2f}", num(r["x_peer"]), num(r["tau"]), num(r["c_rel"], 3), num(r["c_block"]),
                         num(r["modelled"]), num(r["measured/modelled"])))
    notes = []
    for th, per_format in result["constants"].items():
        for fmt, const in per_format.items():
            blocks = ", ".join(f"{b} tokens {v:.2f}" for b, v in sorted(const["c_block"].items()) if b in BLOCKS)
            notes.append(f"{th} thread(s), {fmt}: verifier step {const['step_ms']:.1f} ms; c_block {blocks}")
    notes += peer.divergence_notes(result)
    if rss:
        notes.append("RSS (MB, a fresh process loading the model, generating 16 tokens AR; peak / after): "
                     + ", ".join(f"{k} {peak:.0f} / {now:.0f}" for k, (peak, now) in rss.items()))
    if not result["llamacpp"]:
        notes.append("llama.cpp: not run (--no-llamacpp or --quick, the model is not a GGUF file, or "
                     f"llama-cpp-python is not installed: {llamacpp.INSTALL})")
    return with_notes(lines, notes)


def main(argv=None) -> None:
    ap = parser(__doc__)
    add(ap, model=("smollm2", "a GGUF model reference (llama.cpp runs the same file)"), drafter="smollm2-drafter")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=[2, 3, 5])
    chat_prompts(ap, 6)
    add(ap, max_new_tokens=64, rounds=(20, "interleaved rounds of the speed constants"),
        no_rss=(False, "skip the peak-RSS processes"), no_llamacpp=False,
        quick=(False, "CI: built-in verifier + drafter-mtp, 1 thread, N=3, 2 prompts, 8 tokens, no RSS, no llama.cpp"))
    progress(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.drafter, args.threads, args.draft_lengths = "verifier", "drafter-mtp", [1], [3]
        args.prompts, args.max_new_tokens, args.rounds, args.no_rss, args.no_llamacpp = 2, 8, 3, True, True
    within_chat(ap, args.prompts)
    with_llamacpp = not args.no_llamacpp and is_gguf(args.model) and llamacpp.available()
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
