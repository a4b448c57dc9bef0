"""The real pair (Qwen2.5-Coder-1.5B-Instruct, drafter its 0.5B) on a CPU: relaxspec against llama.cpp, which runs
the same GGUF files, greedy, batch 1.

    python benchmarks/real_pair_peer.py [--verifier qwen2.5-coder-1.5b] [--drafter qwen2.5-coder-0.5b]
        [--formats float32 bfloat16 int4 auto] [--threads 1 2] [--draft-lengths 2 3 5 auto]
        [--code-prompts 10] [--chat-prompts 10] [--max-new-tokens 128] [--llama-bin DIR] [--csv FILE]
        [--breakdown-context 200]

Rows, at every thread count:
* llama.cpp AR: llama-cpp-python (`pip install 'relaxspec[llamacpp]'`) on the verifier's GGUF file, greedy;
* llama.cpp speculative: llama.cpp's own loop, the binary `llama-speculative-simple`, greedy, swept
  (harness.llamacpp.recipes): the drafter's GGUF as its draft model at this version's defaults at every integer N
  (`--spec-draft-n-max N`; 3 is its default), its tuned CPU recipe (n-max 16, n-min 4 or 5, p-min 0.75), n-max x
  p-min, its prompt lookup (`--spec-type ngram-simple`, no draft model), and the drafter re-quantized to Q4_0 (by
  `llama-quantize` beside the binary; a type its x86 code repacks). The prompt goes as an argument and its token
  count is checked against ours; a call's tokens are counted without the end-of-turn token, as ours. Beside it,
  where `llama-bench` is built, llama.cpp's own verify-block cost (a prompt of 2-8 tokens after the breakdown's
  context, over one token's), and each llama.cpp row's build in the CSV. The binaries are not part of
  llama-cpp-python: build them from the sources in that package's sdist (docs/real-pair.md, "Speed against
  llama.cpp") and pass their directory as --llama-bin DIR or RELAXSPEC_LLAMA_BIN; without them these rows are left
  out with one line saying so;
* relaxspec AR in every weight format (`--formats`; "auto": the file's own class, models/gguf_weights.py);
* relaxspec strict with the drafter (an LM, stored in the verifier's format) and with `ngram` (prompt lookup),
  at every N ("auto": the engine's per-sequence schedule).
Prompts: HumanEval problems through the `humaneval-instruct` task's prompt (EvalPlus's instruct convention: a
request for a self-contained script in a markdown code block, then the problem's prompt in a fenced block) and the held-out chat prompts
(`relaxspec.tasks.chat.HELDOUT`), alternated, all through the chat template. Every configuration runs alone,
once per prompt, in an order rotated from prompt to prompt (a change in the machine's load hits all alike), after
one untimed warm-up call each. ms/token: the median over prompts of a call's time over its tokens, prefill
included and loading excluded (llama-speculative-simple's own "encoded" + "decoded" times, as it prints them).
acceptance: accepted drafts / drafted; tau: tokens per verifier step; c_rel, c_block: `relaxspec bench`'s speed
constants (bench.cell.speed_constants, interleaved), for N "auto" at its mean drafts per round as the bench
models it; modelled = tau / (N c_rel + c_block) (bench/speedup.py); x llama.cpp AR: its ms/token over the row's.
The table is printed and written as CSV (--csv). Then, per thread count and format, the verifier's decode step
after --breakdown-context tokens split into its parts (harness/breakdown.py: each linear shape's ms and GB/s,
RMSNorm, RoPE, attention, the LM head, the rest) next to this machine's plain read bandwidth: where the step's time
goes here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from harness import peer
from harness.breakdown import breakdown_lines, plain_read_gbs, step_parts
from harness.llamacpp import (BIN_ENV, INSTALL, NO_BINARY, QUANTIZE_BINARY, SPEC_BINARY, SPEC_DEFAULT_N, LlamaCpp,
                              LlamaSpeculative, Recipe, available, binary_version, block_costs, gguf_path, recipes,
                              spec_binary)
from harness.llamacpp import parse_spec_log  # noqa: F401 (the binary's summary: tests read it here)
from harness.options import add, chat_prompts, csv_file, parser, progress, within_chat
from harness.output import header, num, row, with_notes, write_csv
from harness.peer import LLAMACPP, OURS, Config, greedy_divergences
from harness.timing import strict_constants
from relaxspec.acceptance import get_rule
from relaxspec.bench.metrics import c_block_at
from relaxspec.bench.speedup import block_aware_speedup
from relaxspec.engine import GenerationStats
from relaxspec.models.gguf import is_gguf
from relaxspec.names import AUTO
from relaxspec.tasks import chat, humaneval
from relaxspec.tasks import humaneval_instruct as humaneval_instruct_task
from relaxspec.tasks.benchmarks import render

FORMATS = ("float32", "bfloat16", "int4", "auto")


def humaneval_instruct(problem: dict) -> str:
    """The humaneval-instruct task's prompt of a HumanEval problem (EvalPlus's instruct convention)."""
    return render(humaneval_instruct_task.TEMPLATE, problem["prompt"].strip())


def pair_prompts(code: int, chats: int) -> list[tuple[str, str]]:
    """[(kind, prompt)], "code" (the first `code` HumanEval problems) and "chat" (held-out) alternated."""
    problems = list(humaneval.problems().values())[:code]
    coded = [("code", humaneval_instruct(p)) for p in problems]
    talk = [("chat", p) for p in chat.HELDOUT[:chats]]
    out = []
    for i in range(max(len(coded), len(talk))):
        out += coded[i:i + 1] + talk[i:i + 1]
    return out


def spec_config(recipe: Recipe, drafter: str, threads: int) -> Config:
    """A row of llama.cpp's own speculative loop: its method the recipe's label, N its n-max."""
    return Config(LLAMACPP, "gguf", recipe.label, drafter if recipe.uses_drafter else "", recipe.n_max, threads, recipe)


def configurations(formats, drafter, threads, draft_lengths, with_llamacpp: bool, spec_recipes=()) -> list[Config]:
    out = []
    for th in threads:
        if with_llamacpp:
            out.append(Config(LLAMACPP, "gguf", "ar", "", 0, th))
        out += [spec_config(r, drafter, th) for r in spec_recipes]
        out += peer.ours(formats, drafter, draft_lengths, th)
    return out


def format_constants(verifiers: dict, drafters: dict, drafter: str, draft_lengths, rounds: int) -> dict:
    """{(format, drafter, N): bench.cell.speed_constants' entry} at the current thread count (interleaved rounds)."""
    out = {}
    for fmt, verifier in verifiers.items():
        cells = [(d, n) for d in peer.drafter_names(drafter) for n in draft_lengths]
        out.update(strict_constants(fmt, verifier, drafters[fmt], cells, rounds))
    return out


def measure(verifier: str, drafter: str, formats, prompts: list[tuple[str, str]], *, threads=(1, 2),
            draft_lengths=(2, 3, 5, AUTO), max_new_tokens=128, with_llamacpp=True, binary: Path | None = None,
            rounds=20, progress=True, device="cpu", breakdown_context=200) -> dict:
    texts = [p for _, p in prompts]
    verifiers, drafters, encoded = peer.load(verifier, drafter, formats, texts, device)
    tokenizer = next(iter(verifiers.values())).tokenizer
    context = max(len(e) for e in encoded) + max_new_tokens + 16
    llama = LlamaCpp(gguf_path(verifier), context) if with_llamacpp else None
    spec, sweep = None, []
    if binary is not None:
        sweep = recipes([n for n in draft_lengths if n != AUTO])
        spec = LlamaSpeculative(binary, gguf_path(verifier), gguf_path(drafter),
                                context + max(r.n_max for r in sweep) + 8)
        sweep = [r for r in sweep if spec.serves(r)]
    configs = configurations(formats, drafter, threads, draft_lengths, llama is not None, sweep)
    versions = {"ar": llamacpp_python_version() if llama is not None else None,
                "speculative": binary_version(binary) if binary is not None else None}
    blocks = peer.at_threads(threads, lambda: block_costs(binary.parent, gguf_path(verifier), torch_threads(),
                                                          depth=breakdown_context or 200)) if binary else {}
    constants = peer.at_threads(threads, lambda: format_constants(verifiers, drafters, drafter, list(draft_lengths),
                                                                  rounds))

    def run(cfg: Config, i: int, new_tokens: int):
        """(tokens or their count, GenerationStats or llama.cpp's counts or None, seconds)"""
        start = time.perf_counter()
        if cfg.recipe is not None:
            got = spec.run(cfg, encoded[i], tokenizer.decode(encoded[i]), new_tokens)
            return got["tokens"], got, got["seconds"]
        if cfg.system == LLAMACPP:
            out = llama.run(cfg, encoded[i], new_tokens)
            return out, None, time.perf_counter() - start
        ids, stats = peer.generate_ours(verifiers, drafters, cfg, texts[i], new_tokens)
        return ids, stats, time.perf_counter() - start

    ms, outs = peer.runs(configs, len(prompts), run, max_new_tokens, desc="real pair peer", progress=progress)
    breakdown = peer.at_threads(threads, lambda: (plain_read_gbs(), {
        fmt: step_parts(v, context=breakdown_context, rounds=rounds) for fmt, v in verifiers.items()
        if v.fast is not None})) if breakdown_context else {}
    counts = {c: [count for _, count in out] for c, out in outs.items()}
    tokens = {c: [t for t, _ in out] for c, out in outs.items()}
    return {"configs": configs, "ms": ms, "counts": counts, "kinds": [k for k, _ in prompts],
            "constants": constants, "drafter": drafter, "llamacpp": llama is not None, "spec": spec is not None,
            "q4_0": spec is not None and spec.q4_0 is not None, "versions": versions, "blocks": blocks,
            "divergences": greedy_divergences(verifiers, configs, tokens, encoded), "breakdown": breakdown,
            "breakdown_context": breakdown_context}


def breakdown_text(result: dict) -> str:
    """Each format's verifier step split into its parts (harness.breakdown), at each thread count."""
    out = []
    for th, (read_gbs, by_format) in result["breakdown"].items():
        for fmt, (step, parts) in by_format.items():
            out += ["", *breakdown_lines(f"{th} thread(s), {fmt}, after {result['breakdown_context']} tokens", step,
                                         parts, read_gbs)]
    return "\n".join(out)


def llamacpp_python_version() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}"


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _acceptance(cfg: Config, counts: list) -> tuple[float | None, float | None]:
    """(accepted / drafted, tokens per verifier step) of a speculative configuration's calls."""
    if cfg.recipe is not None:
        drafted, accepted = sum(c["drafted"] for c in counts), sum(c["accepted"] for c in counts)
        produced = sum(c["tokens"] for c in counts)
        return (accepted / drafted if drafted else None), produced / max(produced - accepted, 1)
    if cfg.method == "strict":
        merged = GenerationStats.merge(counts)
        return merged.acceptance_rate, merged.mean_acceptance_length
    return None, None


def rows(result: dict) -> list[dict]:
    extra = get_rule("strict").extra_draft_passes
    kinds = result["kinds"]
    out = []
    for c in result["configs"]:
        ms = result["ms"][c]
        med = statistics.median(ms)
        by_kind = {k: statistics.median([m for m, kind in zip(ms, kinds) if kind == k]) if k in kinds else None
                   for k in ("code", "chat")}
        own = statistics.median(result["ms"][c.ar]) if c.system == OURS else None
        them = statistics.median(result["ms"][c.llamacpp_ar]) if c.llamacpp_ar in result["ms"] else None
        acceptance, tau = _acceptance(c, result["counts"][c])
        r = {"threads": c.threads, "system": c.system, "weights": c.fmt, "method": c.method,
             "drafter": c.drafter or "-", "N": c.n or "-", "ms_per_token": med, "ms_code": by_kind["code"],
             "ms_chat": by_kind["chat"], "acceptance": acceptance, "tau": tau, "c_rel": None, "c_block": None,
             "modelled": None, "measured": None if own is None else own / med,
             "x_llamacpp_ar": None if them is None else them / med,
             "llamacpp_version": None if c.system != LLAMACPP else
             result["versions"]["speculative" if c.recipe is not None else "ar"]}
        if c.system == OURS and c.method == "strict":
            const = result["constants"][c.threads][(c.fmt, c.drafter, c.n)]
            n, c_block = c.n, const["c_block_measured"]
            if c.n == AUTO:  # as the bench models it (bench.metrics.cell_metrics): at the mean drafts per round
                merged = GenerationStats.merge(result["counts"][c])
                n = merged.drafts_proposed / merged.sequence_rounds if merged.sequence_rounds else 0.0
                c_block = c_block_at(const["c_block_widths"], n + 1)
            r["c_rel"], r["c_block"] = const["c_rel_measured"], c_block
            r["modelled"] = block_aware_speedup(tau, n, r["c_rel"], c_block, extra)
        out.append(r)
    return out


COLUMNS = ("threads", "system", "weights", "method", "drafter", "N", "ms_per_token", "ms_code", "ms_chat", "acceptance",
           "tau", "c_rel", "c_block", "modelled", "measured", "measured/modelled", "x_llamacpp_ar", "llamacpp_version")


def table(result: dict) -> tuple[str, list[dict]]:
    """The markdown table and its rows (with measured/modelled), then notes."""
    lines = header("threads", "system", "weights", "method", "drafter", "N", "ms/token", "code", "chat", "acceptance",
                   "tau", "c_rel", "c_block", "modelled", "x own AR", "measured/modelled", "x llama.cpp AR")
    out = []
    for r in rows(result):
        r["measured/modelled"] = None if r["modelled"] is None else r["measured"] / r["modelled"]
        out.append(r)
        name = Path(r["drafter"]).name if r["drafter"] != "-" else "-"
        lines.append(row(r["threads"], r["system"], r["weights"], r["method"], name, r["N"], f"{r['ms_per_token']:.1f}",
                         num(r["ms_code"], 1), num(r["ms_chat"], 1), num(r["acceptance"]), num(r["tau"]),
                         num(r["c_rel"], 3), num(r["c_block"]), num(r["modelled"]), num(r["measured"]),
                         num(r["measured/modelled"]), num(r["x_llamacpp_ar"])))
    notes = []
    for th, const in result["constants"].items():
        steps = {fmt: 1e3 * c["latency_verifier_s"] for (fmt, _, _), c in const.items()}
        notes.append(f"{th} thread(s): verifier step " + ", ".join(f"{f} {s:.1f} ms" for f, s in steps.items()))
    notes += peer.divergence_notes(result)
    if not result["llamacpp"]:
        notes.append("llama.cpp AR: not run (--no-llamacpp, the verifier is not a GGUF file, or llama-cpp-python "
                     f"is not installed: {INSTALL})")
    if not result["spec"]:
        notes.append(NO_BINARY)
    else:
        notes.append(f"llama.cpp speculative: {SPEC_BINARY}, greedy, the drafter's GGUF as its draft model (N: "
                     f"--spec-draft-n-max, default {SPEC_DEFAULT_N}; n-min and p-min 0 unless named), lookup: its "
                     "ngram-simple (no draft model)")
        notes.append(f"llama.cpp builds: {result['versions']['speculative']} ({SPEC_BINARY})"
                     + (f", {result['versions']['ar']} (AR)" if result["versions"]["ar"] else ""))
        for th, block in result["blocks"].items():
            notes.append(f"llama.cpp's verify block, {th} thread(s), after {block['depth']} tokens (llama-bench): "
                         + ", ".join(f"{k} tokens {c:.2f}x one" for k, c in sorted(block["c_block"].items()) if k > 1)
                         if block else f"llama.cpp's verify block: not measured (no llama-bench beside {SPEC_BINARY})")
        if not result["q4_0"]:
            notes.append(f"llama.cpp with a Q4_0 draft: not run (no {QUANTIZE_BINARY} beside {SPEC_BINARY})")
    return with_notes(lines, notes), out


def _draft_length(text: str):
    if text == AUTO:
        return AUTO
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a draft length is an integer >= 1 or {AUTO!r}, got {text!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"a draft length is an integer >= 1 or {AUTO!r}, got {text!r}")
    return n


def main(argv=None) -> None:
    ap = parser(__doc__)
    add(ap, verifier=("qwen2.5-coder-1.5b", "a GGUF model (llama.cpp runs the same file)"),
        drafter=("qwen2.5-coder-0.5b", "an LM drafter (a GGUF file for llama.cpp's loop)"))
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=(*FORMATS, "file"),
                    help="weight formats (file: the GGUF file's own types, not run by default)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--draft-lengths", type=_draft_length, nargs="+", default=[2, 3, 5, AUTO])
    add(ap, code_prompts=(10, "HumanEval problems (instruct prompt)"))
    chat_prompts(ap, 10, "--chat-prompts")
    add(ap, max_new_tokens=128, rounds=(20, "interleaved rounds of the speed constants"),
        device=("cpu", "relaxspec's device (llama.cpp's rows: on a CPU only)"))
    ap.add_argument("--llama-bin", help=f"directory holding {SPEC_BINARY} (default ${BIN_ENV})")
    add(ap, no_llamacpp=(False, "no llama.cpp rows"))
    add(ap, breakdown_context=(200, "context of the verifier step's breakdown into its parts (0: none)"))
    csv_file(ap, "real_pair_peer")
    progress(ap)
    args = ap.parse_args(argv)
    within_chat(ap, args.chat_prompts, "--chat-prompts", low=0)
    if not 0 <= args.code_prompts <= 164 or args.code_prompts + args.chat_prompts < 1:
        ap.error("--code-prompts must be between 0 and 164, and there must be at least one prompt")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    if args.breakdown_context < 0:
        ap.error("--breakdown-context must be >= 0")
    ggufs = is_gguf(args.verifier) and is_gguf(args.drafter)
    args.no_llamacpp = args.no_llamacpp or args.device != "cpu"
    with_llamacpp = not args.no_llamacpp and is_gguf(args.verifier) and available()
    binary = spec_binary(args.llama_bin) if not args.no_llamacpp and ggufs else None
    if args.llama_bin and binary is None and not args.no_llamacpp:
        ap.error(f"no executable {SPEC_BINARY} in {args.llama_bin}" if ggufs else
                 "--llama-bin needs GGUF files for both the verifier and the drafter")
    prompts = pair_prompts(args.code_prompts, args.chat_prompts)
    result = measure(args.verifier, args.drafter, args.formats, prompts, threads=args.threads,
                     draft_lengths=list(dict.fromkeys(args.draft_lengths)), max_new_tokens=args.max_new_tokens,
                     with_llamacpp=with_llamacpp, binary=binary, rounds=args.rounds, progress=not args.no_progress,
                     device=args.device, breakdown_context=args.breakdown_context)
    text, table_rows = table(result)
    print(f"verifier {args.verifier}, drafter {args.drafter}, {args.code_prompts} HumanEval (instruct) + "
          f"{args.chat_prompts} chat prompts, max {args.max_new_tokens} new tokens, greedy, batch 1, {args.device}")
    print(text)
    print(breakdown_text(result))
    write_csv(args.csv, COLUMNS, table_rows)
    print(f"CSV: {args.csv}")


if __name__ == "__main__":
    main()
