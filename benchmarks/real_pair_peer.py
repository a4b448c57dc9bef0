"""The real pair (Qwen2.5-Coder-1.5B-Instruct, drafter its 0.5B) on a CPU: relaxspec against llama.cpp, which runs
the same GGUF files, greedy, batch 1.

    python benchmarks/real_pair_peer.py [--verifier qwen2.5-coder-1.5b] [--drafter qwen2.5-coder-0.5b]
        [--formats float32 bfloat16 int4 auto] [--threads 1 2] [--draft-lengths 2 3 5 auto]
        [--code-prompts 10] [--chat-prompts 10] [--max-new-tokens 128] [--llama-bin DIR] [--csv FILE]

Rows, at every thread count:
* llama.cpp AR: llama-cpp-python (`pip install 'relaxspec[llamacpp]'`) on the verifier's GGUF file, greedy;
* llama.cpp speculative: llama.cpp's own loop, the binary `llama-speculative-simple` with the drafter's GGUF as
  its draft model (`--spec-draft-n-max N`, greedy), at every integer N (3 is its default). The binary is not
  part of llama-cpp-python: build it from the sources in that package's sdist (docs/real-pair.md, "Speed against
  llama.cpp") and pass its directory as --llama-bin DIR or RELAXSPEC_LLAMA_BIN; without it these rows are left
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
The table is printed and written as CSV (--csv).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from cpu_peer import (LLAMACPP, NGRAM, OURS, Config, LlamaCpp, _f, greedy_divergences, interleaved,
                      llama_cpp_available)
from relaxspec.acceptance import get_rule
from relaxspec.bench.cell import CellSpec, speed_constants
from relaxspec.bench.metrics import c_block_at
from relaxspec.bench.speedup import block_aware_speedup
from relaxspec.drafters import load_drafter
from relaxspec.engine import GenerationStats, generate
from relaxspec.models import load_model
from relaxspec.models.gguf import is_gguf, split_gguf
from relaxspec.models.prompts import encode_prompts
from relaxspec.names import AUTO
from relaxspec.tasks import chat, humaneval
from relaxspec.tasks import humaneval_instruct as humaneval_instruct_task
from relaxspec.tasks.benchmarks import render

FORMATS = ("float32", "bfloat16", "int4", "auto")
SPEC = "speculative"  # llama.cpp's own loop (llama-speculative-simple)
SPEC_BINARY = "llama-speculative-simple"
SPEC_DEFAULT_N = 3  # llama-speculative-simple's --spec-draft-n-max default
BIN_ENV = "RELAXSPEC_LLAMA_BIN"
NO_BINARY = (f"llama.cpp speculative: not run (no {SPEC_BINARY} in --llama-bin / ${BIN_ENV}; build it from the "
             "llama-cpp-python==0.3.36 sdist's vendor/llama.cpp, see docs/real-pair.md, 'Speed against llama.cpp')")


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


def spec_binary(directory: str | None) -> Path | None:
    """llama-speculative-simple in `directory` (or $RELAXSPEC_LLAMA_BIN), if it is there."""
    directory = directory or os.environ.get(BIN_ENV)
    if not directory:
        return None
    path = Path(directory) / SPEC_BINARY
    return path if path.is_file() and os.access(path, os.X_OK) else None


class LlamaSpeculative:
    """llama.cpp's own speculative loop: one llama-speculative-simple process per call (its model loading is not
    timed: the binary prints the prompt's and the decoding's times itself)."""

    def __init__(self, binary: Path, verifier: str, drafter: str, context: int):
        self.binary, self.verifier, self.drafter, self.context = binary, verifier, drafter, context

    def run(self, cfg: Config, text: str, max_new_tokens: int) -> dict:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as prompt:
            prompt.write(text)
            prompt.flush()
            th = str(cfg.threads)
            command = [str(self.binary), "-m", self.verifier, "-md", self.drafter, "-f", prompt.name,
                       "-n", str(max_new_tokens), "-c", str(self.context), "-t", th, "-tb", th, "-td", th, "-tbd", th,
                       "--temp", "0", "--top-k", "1", "--seed", "0", "--spec-type", "draft-simple",
                       "--spec-draft-n-max", str(cfg.n)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"{SPEC_BINARY} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        return parse_spec_log(done.stderr + done.stdout)


def parse_spec_log(log: str) -> dict:
    """What llama-speculative-simple prints at its end: prompt tokens and seconds, tokens decoded and seconds,
    drafted and accepted draft tokens."""
    def find(pattern):
        match = re.search(pattern, log)
        if match is None:
            raise RuntimeError(f"{SPEC_BINARY}: no {pattern!r} in its output")
        return match.groups()

    enc_tokens, enc_s = find(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
    dec_tokens, dec_s = find(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
    return {"prompt_tokens": int(enc_tokens), "tokens": int(dec_tokens), "seconds": float(enc_s) + float(dec_s),
            "drafted": int(find(r"n_drafted\s*=\s*(\d+)")[0]), "accepted": int(find(r"n_accept\s*=\s*(\d+)")[0])}


def configurations(formats, drafter, threads, draft_lengths, with_llamacpp: bool, with_spec: bool) -> list[Config]:
    out = []
    for th in threads:
        if with_llamacpp:
            out.append(Config(LLAMACPP, "gguf", "ar", "", 0, th))
        if with_spec:
            out += [Config(LLAMACPP, "gguf", SPEC, drafter, n, th) for n in draft_lengths if n != AUTO]
        for fmt in formats:
            out.append(Config(OURS, fmt, "ar", "", 0, th))
            for n in draft_lengths:
                out += [Config(OURS, fmt, "strict", d, n, th) for d in dict.fromkeys([drafter, NGRAM])]
    return out


def format_constants(verifiers: dict, drafters: dict, drafter: str, draft_lengths, rounds: int) -> dict:
    """{(format, drafter, N): bench.cell.speed_constants' entry} at the current thread count (interleaved rounds)."""
    out = {}
    for fmt, verifier in verifiers.items():
        names = list(dict.fromkeys([drafter, NGRAM]))
        cells = [CellSpec(fmt, d, "", "strict", {}, n, 0) for d in names for n in draft_lengths]
        const = speed_constants({fmt: verifier}, cells, rounds=rounds,
                                drafters={(fmt, d): drafters[fmt][d] for d in names})
        out.update(const)
    return out


def measure(verifier: str, drafter: str, formats, prompts: list[tuple[str, str]], *, threads=(1, 2),
            draft_lengths=(2, 3, 5, AUTO), max_new_tokens=128, with_llamacpp=True, binary: Path | None = None,
            rounds=20, progress=True, device="cpu") -> dict:
    verifiers = {fmt: load_model(verifier, device=device, dtype=fmt) for fmt in formats}
    drafters = {fmt: {d: load_drafter(d, v) for d in dict.fromkeys([drafter, NGRAM])} for fmt, v in verifiers.items()}
    tokenizer = next(iter(verifiers.values())).tokenizer
    texts = [p for _, p in prompts]
    encoded = encode_prompts(tokenizer, texts, chat_template="auto")
    context = max(len(e) for e in encoded) + max_new_tokens + 16
    llama = LlamaCpp(str(Path(*split_gguf(verifier))), context) if with_llamacpp else None
    spec = None
    if binary is not None:
        spec = LlamaSpeculative(binary, str(Path(*split_gguf(verifier))), str(Path(*split_gguf(drafter))),
                                context + max(n for n in draft_lengths if n != AUTO) + 8)
    configs = configurations(formats, drafter, threads, draft_lengths, llama is not None, spec is not None)
    constants = {}
    for th in threads:
        torch.set_num_threads(th)
        constants[th] = format_constants(verifiers, drafters, drafter, list(draft_lengths), rounds)

    def run(cfg: Config, i: int, new_tokens: int):
        """(tokens or their count, GenerationStats or llama.cpp's counts or None, seconds)"""
        torch.set_num_threads(cfg.threads)
        start = time.perf_counter()
        if cfg.system == LLAMACPP and cfg.method == SPEC:
            got = spec.run(cfg, tokenizer.decode(encoded[i]), new_tokens)
            return got["tokens"], got, got["seconds"]
        if cfg.system == LLAMACPP:
            out = llama.run(cfg, encoded[i], new_tokens)
            return out, None, time.perf_counter() - start
        res = generate(verifiers[cfg.fmt], drafters[cfg.fmt].get(cfg.drafter), [texts[i]], method=cfg.method,
                       draft_length=cfg.n or 1, max_new_tokens=new_tokens, chat_template="auto")
        return res.results[0].token_ids, res.stats, time.perf_counter() - start

    for cfg in configs:  # warm-up, untimed: llama.cpp loads its model on first use, first calls allocate
        run(cfg, 0, 4)
    ms, outs = interleaved(configs, len(prompts), lambda cfg, i: run(cfg, i, max_new_tokens), desc="real pair peer",
                           progress=progress)
    counts = {c: [count for _, count in out] for c, out in outs.items()}
    tokens = {c: [t for t, _ in out] for c, out in outs.items()}
    return {"configs": configs, "ms": ms, "counts": counts, "kinds": [k for k, _ in prompts],
            "constants": constants, "drafter": drafter, "llamacpp": llama is not None, "spec": spec is not None,
            "divergences": greedy_divergences(verifiers, configs, tokens, encoded)}


def _acceptance(cfg: Config, counts: list) -> tuple[float | None, float | None]:
    """(accepted / drafted, tokens per verifier step) of a speculative configuration's calls."""
    if cfg.method == SPEC:
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
        own = statistics.median(result["ms"][Config(c.system, c.fmt, "ar", "", 0, c.threads)]) \
            if c.system == OURS else None
        peer_cfg = Config(LLAMACPP, "gguf", "ar", "", 0, c.threads)
        peer = statistics.median(result["ms"][peer_cfg]) if peer_cfg in result["ms"] else None
        acceptance, tau = _acceptance(c, result["counts"][c])
        row = {"threads": c.threads, "system": c.system, "weights": c.fmt, "method": c.method,
               "drafter": c.drafter or "-", "N": c.n or "-", "ms_per_token": med, "ms_code": by_kind["code"],
               "ms_chat": by_kind["chat"], "acceptance": acceptance, "tau": tau, "c_rel": None, "c_block": None,
               "modelled": None, "measured": None if own is None else own / med,
               "x_llamacpp_ar": None if peer is None else peer / med}
        if c.system == OURS and c.method == "strict":
            const = result["constants"][c.threads][(c.fmt, c.drafter, c.n)]
            n, c_block = c.n, const["c_block_measured"]
            if c.n == AUTO:  # as the bench models it (bench.metrics.cell_metrics): at the mean drafts per round
                merged = GenerationStats.merge(result["counts"][c])
                n = merged.drafts_proposed / merged.sequence_rounds if merged.sequence_rounds else 0.0
                c_block = c_block_at(const["c_block_widths"], n + 1)
            row["c_rel"], row["c_block"] = const["c_rel_measured"], c_block
            row["modelled"] = block_aware_speedup(tau, n, row["c_rel"], c_block, extra)
        out.append(row)
    return out


COLUMNS = ("threads", "system", "weights", "method", "drafter", "N", "ms_per_token", "ms_code", "ms_chat", "acceptance",
           "tau", "c_rel", "c_block", "modelled", "measured", "measured/modelled", "x_llamacpp_ar")


def table(result: dict) -> tuple[str, list[dict]]:
    """The markdown table and its rows (with measured/modelled), then notes."""
    lines = ["| threads | system | weights | method | drafter | N | ms/token | code | chat | acceptance | tau | "
             "c_rel | c_block | modelled | x own AR | measured/modelled | x llama.cpp AR |", "|" + "---|" * 17]
    out = []
    for r in rows(result):
        r["measured/modelled"] = None if r["modelled"] is None else r["measured"] / r["modelled"]
        out.append(r)
        name = Path(r["drafter"]).name if r["drafter"] != "-" else "-"
        lines.append(f"| {r['threads']} | {r['system']} | {r['weights']} | {r['method']} | {name} | {r['N']} | "
                     f"{r['ms_per_token']:.1f} | {_f(r['ms_code'], 1)} | {_f(r['ms_chat'], 1)} | "
                     f"{_f(r['acceptance'])} | {_f(r['tau'])} | {_f(r['c_rel'], 3)} | {_f(r['c_block'])} | "
                     f"{_f(r['modelled'])} | {_f(r['measured'])} | {_f(r['measured/modelled'])} | "
                     f"{_f(r['x_llamacpp_ar'])} |")
    notes = []
    for th, const in result["constants"].items():
        steps = {fmt: 1e3 * c["latency_verifier_s"] for (fmt, _, _), c in const.items()}
        notes.append(f"{th} thread(s): verifier step " + ", ".join(f"{f} {s:.1f} ms" for f, s in steps.items()))
    for fmt, found in result["divergences"].items():
        runs = sum(len(result["ms"][c]) for c in result["configs"]
                   if c.system == OURS and c.method == "strict" and c.fmt == fmt)
        gaps = ", ".join(f"{g:.3g}" for *_, g in found)
        notes.append(f"greedy, {fmt}: {len(found)} of {runs} strict runs differ from AR"
                     + (f" (top-2 logit gaps at the first difference: {gaps})" if found else ""))
    if not result["llamacpp"]:
        notes.append("llama.cpp AR: not run (--no-llamacpp, the verifier is not a GGUF file, or llama-cpp-python "
                     "is not installed: pip install 'relaxspec[llamacpp]')")
    if not result["spec"]:
        notes.append(NO_BINARY)
    else:
        notes.append(f"llama.cpp speculative: {SPEC_BINARY}, greedy, the drafter's GGUF as its draft model; its "
                     f"default N is {SPEC_DEFAULT_N}")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]), out


def write_csv(path: Path, table_rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows([{k: r[k] for k in COLUMNS} for r in table_rows])


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", default="qwen2.5-coder-1.5b", help="a GGUF model (llama.cpp runs the same file)")
    ap.add_argument("--drafter", default="qwen2.5-coder-0.5b", help="an LM drafter (a GGUF file for llama.cpp's loop)")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=(*FORMATS, "file"),
                    help="weight formats (file: the GGUF file's own types, not run by default)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--draft-lengths", type=_draft_length, nargs="+", default=[2, 3, 5, AUTO])
    ap.add_argument("--code-prompts", type=int, default=10, help="HumanEval problems (instruct prompt)")
    ap.add_argument("--chat-prompts", type=int, default=10, help=f"held-out chat prompts (at most {len(chat.HELDOUT)})")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds of the speed constants")
    ap.add_argument("--device", default="cpu", help="relaxspec's device (llama.cpp's rows: on a CPU only)")
    ap.add_argument("--llama-bin", help=f"directory holding {SPEC_BINARY} (default ${BIN_ENV})")
    ap.add_argument("--no-llamacpp", action="store_true", help="no llama.cpp rows")
    ap.add_argument("--csv", type=Path, default=Path("relaxspec-results/real_pair_peer.csv"))
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if not 0 <= args.chat_prompts <= len(chat.HELDOUT):
        ap.error(f"--chat-prompts must be between 0 and {len(chat.HELDOUT)}")
    if not 0 <= args.code_prompts <= 164 or args.code_prompts + args.chat_prompts < 1:
        ap.error("--code-prompts must be between 0 and 164, and there must be at least one prompt")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    ggufs = is_gguf(args.verifier) and is_gguf(args.drafter)
    args.no_llamacpp = args.no_llamacpp or args.device != "cpu"
    with_llamacpp = not args.no_llamacpp and is_gguf(args.verifier) and llama_cpp_available()
    binary = spec_binary(args.llama_bin) if not args.no_llamacpp and ggufs else None
    if args.llama_bin and binary is None and not args.no_llamacpp:
        ap.error(f"no executable {SPEC_BINARY} in {args.llama_bin}" if ggufs else
                 "--llama-bin needs GGUF files for both the verifier and the drafter")
    prompts = pair_prompts(args.code_prompts, args.chat_prompts)
    result = measure(args.verifier, args.drafter, args.formats, prompts, threads=args.threads,
                     draft_lengths=list(dict.fromkeys(args.draft_lengths)), max_new_tokens=args.max_new_tokens,
                     with_llamacpp=with_llamacpp, binary=binary, rounds=args.rounds, progress=not args.no_progress,
                     device=args.device)
    text, table_rows = table(result)
    print(f"verifier {args.verifier}, drafter {args.drafter}, {args.code_prompts} HumanEval (instruct) + "
          f"{args.chat_prompts} chat prompts, max {args.max_new_tokens} new tokens, greedy, batch 1, {args.device}")
    print(text)
    write_csv(args.csv, table_rows)
    print(f"CSV: {args.csv}")


if __name__ == "__main__":
    main()
