"""The `file` weight format (a GGUF file's matrices in their own types, models/gguf_block.py) against int4 on the
same files: AR ms/token at batch 1 and greedy agreement with int4's tokens.

    python benchmarks/file_format.py --models qwen2.5-coder-1.5b qwen2.5-coder-0.5b --threads 2 --prompts 3 \\
        --max-new-tokens 64 [--closeness float32]

Per model both formats are loaded (through the weight cache: the first load of a format converts and says so), one
untimed warm-up call each, then each held-out chat prompt (`relaxspec.tasks.chat.HELDOUT`, through the chat
template) runs greedy AR in each format, the formats' order rotated from prompt to prompt (`--repeats R`: R rounds
of that, each prompt's fastest call kept: a loaded machine's spikes left out). ms/token: one call's time over its
tokens (prefill included), the median over prompts. Agreement: the tokens of `file` before its first
difference from int4's, over int4's count (1: identical), per prompt. `--closeness F`: each format teacher-forced
on each prompt and int4's tokens against the model loaded in F (float32: the file's values dequantized, inputs not
rounded; converted in memory, not cached): KL(F || format) and top-1 agreement over the generated positions (means).
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, chat_prompts, parser, within_chat
from harness.output import first_difference, header, row
from harness.timing import interleaved
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.models.prompts import encode_prompts
from relaxspec.tasks import chat


def greedy(lm, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """(tokens, seconds) of one greedy AR call."""
    start = time.perf_counter()
    out = generate(lm, None, [prompt], method="ar", max_new_tokens=max_new_tokens, temperature=0.0)
    return list(out.results[0].token_ids), time.perf_counter() - start


def agreement(reference: list[int], ours: list[int]) -> tuple[float, int | None]:
    """(tokens before the first difference over the reference's count, that position or None)."""
    first = first_difference(reference, ours)
    return (1.0 if first is None else first / max(len(reference), 1)), first


def teacher_forced(lms: dict, reference, ids: list[int], prompt_len: int) -> dict:
    """{format: (KL(reference || format), top-1 agreement)} over the positions that predict ids[prompt_len:]."""
    rows = slice(prompt_len - 1, len(ids) - 1)
    x = torch.tensor([ids])

    def log_probs(lm):
        logits, _ = lm.forward(x, lm.new_cache(), None, torch.arange(len(ids))[None])
        return logits[0, rows].float().log_softmax(-1)

    ref = log_probs(reference)
    out = {}
    for fmt, lm in lms.items():
        ours = log_probs(lm)
        kl = (ref.exp() * (ref - ours)).sum(-1)
        out[fmt] = (float(kl.mean()), float((ours.argmax(-1) == ref.argmax(-1)).float().mean()))
    return out


def measure(model: str, formats: list[str], prompts: list[str], max_new_tokens: int, closeness: str | None,
            repeats: int = 1) -> dict:
    lms = {}
    for fmt in formats:
        start = time.perf_counter()
        lms[fmt] = load_model(model, device="cpu", dtype=fmt)
        print(f"{model} {fmt}: loaded in {time.perf_counter() - start:.1f} s, "
              f"{lms[fmt].fast.weight_bytes() / 1e9:.2f} GB of weights", flush=True)
        greedy(lms[fmt], prompts[0], 4)  # (warm-up)

    def run(fmt: str, i: int):
        ids, seconds = greedy(lms[fmt], prompts[i], max_new_tokens)
        return ids, None, seconds

    times, outs = interleaved(formats, len(prompts), run, repeats=repeats)
    tokens = {f: [ids for ids, _ in out] for f, out in outs.items()}
    close = {f: [] for f in formats}
    if closeness:
        reference = load_model(model, device="cpu", dtype=closeness, weight_cache=False)
        encoded = encode_prompts(reference.tokenizer, prompts, chat_template="auto")
        for ids, generated in zip(encoded, tokens[formats[0]]):
            for fmt, pair in teacher_forced(lms, reference, ids + generated, len(ids)).items():
                close[fmt].append(pair)
    return {"ms": {f: statistics.median(t) for f, t in times.items()}, "per_prompt_ms": times, "tokens": tokens,
            "closeness": close}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"],
                    help="GGUF models read natively (qwen2): registry names or files")
    ap.add_argument("--formats", nargs="+", default=["int4", "file"], help="the first is the reference")
    add(ap, threads=2)
    chat_prompts(ap, 3)
    add(ap, max_new_tokens=64, repeats=(1, "rounds per prompt (each prompt's fastest call kept)"))
    ap.add_argument("--closeness", default=None, metavar="FORMAT",
                    help="also teacher-force each format against the model in FORMAT (e.g. float32)")
    args = ap.parse_args()
    within_chat(ap, args.prompts)
    torch.set_num_threads(args.threads)
    reference = args.formats[0]
    print(f"{args.prompts} held-out chat prompts, {args.max_new_tokens} new tokens, greedy AR, batch 1, "
          f"{args.threads} threads, the fastest of {args.repeats} interleaved rounds per prompt")
    close = [f"KL({args.closeness} || format)", f"top-1 with {args.closeness}"] if args.closeness else []
    print("\n".join(header("model", "weights", "ms/token (median)", "per prompt", f"greedy agreement with {reference}",
                           "first divergence", *close)))
    for model in args.models:
        result = measure(model, args.formats, list(chat.HELDOUT[:args.prompts]), args.max_new_tokens, args.closeness,
                         args.repeats)
        for fmt in args.formats:
            pairs = [agreement(r, o) for r, o in zip(result["tokens"][reference], result["tokens"][fmt])]
            kl = result["closeness"][fmt]
            extra = [f"{statistics.fmean(k for k, _ in kl):.2e}", f"{statistics.fmean(t for _, t in kl):.3f}"] \
                if kl else []
            per = " / ".join(f"{t:.1f}" for t in result["per_prompt_ms"][fmt])
            print(row(model, fmt, f"{result['ms'][fmt]:.1f}", per, " / ".join(f"{a:.2f}" for a, _ in pairs),
                      " / ".join("-" if f is None else str(f) for _, f in pairs), *extra), flush=True)


if __name__ == "__main__":
    main()
