"""How closely relaxspec runs a GGUF model in each weight format against llama.cpp on the same file, greedy.

    python benchmarks/real_pair_fidelity.py [--model qwen2.5-coder-1.5b] [--formats float32 bfloat16 int4 auto]
        [--prompts 20] [--max-new-tokens 128] [--threads 2] [--reference llama.cpp|float32] [--csv FILE]

The reference (llama.cpp through llama-cpp-python, `pip install 'relaxspec[llamacpp]'`; or relaxspec's own float32
with --reference float32, what runs where llama-cpp-python is absent, with one line saying so) generates
--max-new-tokens greedily from each held-out chat prompt (`relaxspec.tasks.chat.HELDOUT`, through the chat template;
both systems get the same token ids). Per format:
* greedy agreement: relaxspec's own greedy tokens against the reference's: the fraction of the reference's tokens
  before the first difference (1 where there is none), and that position;
* KL(reference || ours): the mean over every generated position of the KL divergence between the next-token
  distributions, both teacher-forced on the prompt and the reference's own continuation (llama.cpp's per-position
  logits from `logits_all=True`), with the teacher-forced top-1 agreement;
* each divergence explained where it can be: the reference's top-2 gap there (its token's logit minus ours'),
  our gap the other way, and the format's median RMS logit difference over the text; "near tie" where the
  reference's gap is below that RMS difference (a tie the format's rounding may flip).
Medians, means and the divergences are printed; one row per format and prompt goes to the CSV (--csv).
"""

from __future__ import annotations

import statistics
import time

import torch

from harness import llamacpp
from harness.llamacpp import LlamaCpp
from harness.options import add, chat_prompts, csv_file, parser, progress, within_chat
from harness.output import first_difference, header, write_csv
from harness.peer import LLAMACPP, Config
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.models.gguf import is_gguf
from relaxspec.models.prompts import encode_prompts
from relaxspec.tasks import chat

FORMATS = ("float32", "bfloat16", "int4", "auto")
REFERENCES = ("llama.cpp", "float32")
NO_LLAMACPP = ("reference: relaxspec float32 (llama.cpp not run: --reference float32, the model is not a GGUF file, "
               f"or llama-cpp-python is not installed: {llamacpp.INSTALL})")


class LlamaReference(LlamaCpp):
    """llama.cpp on the GGUF file: greedy tokens (harness.llamacpp.LlamaCpp, AR) and per-position logits
    (logits_all)."""

    def __init__(self, path: str, context: int, threads: int):
        super().__init__(path, context)
        self.threads = threads
        self.scorer = llamacpp.llama(path, threads, context, logits_all=True)

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        return self.run(Config(LLAMACPP, "gguf", "ar", "", 0, self.threads), ids, max_new_tokens)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), V] float32: the next-token logits after each prefix."""
        self.scorer.reset()
        self.scorer.eval(ids)
        return torch.from_numpy(self.scorer.scores[:len(ids)].copy()).float()


class OwnReference:
    """relaxspec's float32 model as the reference."""

    def __init__(self, lm):
        self.lm = lm

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        return own_greedy(self.lm, ids, max_new_tokens)

    def logits(self, ids: list[int]) -> torch.Tensor:
        return own_logits(self.lm, ids)


def own_greedy(lm, ids: list[int], max_new_tokens: int) -> list[int]:
    text = lm.tokenizer.decode(ids)  # templated already: generate leaves it as it is (chat_template "auto")
    out = generate(lm, None, [text], method="ar", max_new_tokens=max_new_tokens, chat_template="auto")
    return list(out.results[0].token_ids)


@torch.inference_mode()
def own_logits(lm, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], device=lm.device)
    logits, _ = lm.forward(x, lm.new_cache(), torch.ones_like(x), torch.arange(len(ids), device=lm.device)[None])
    return logits[0].float().cpu()


def compare(reference: list[int], ours: list[int], ref_logits: torch.Tensor, our_logits: torch.Tensor,
            prompt_len: int) -> dict:
    """Greedy agreement and teacher-forced closeness of one prompt (logits over prompt + the reference's tokens)."""
    first = first_difference(reference, ours)
    rows = slice(prompt_len - 1, prompt_len - 1 + len(reference))  # the positions that predict generated tokens
    p, q = ref_logits[rows].log_softmax(-1), our_logits[rows].log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)
    diff = ref_logits[rows] - our_logits[rows]
    rms = (diff - diff.mean(-1, keepdim=True)).pow(2).mean(-1).sqrt()  # logits are defined up to a constant
    out = {"agreement": (first if first is not None else len(reference)) / max(len(reference), 1),
           "first_divergence": first, "kl": kl.mean().item(), "kl_max": kl.max().item(),
           "top1": (p.argmax(-1) == q.argmax(-1)).float().mean().item(), "rms": rms.median().item(),
           "ref_gap": None, "our_gap": None}
    if first is not None and first < min(len(reference), len(ours)):
        row = prompt_len - 1 + first
        a, b = reference[first], ours[first]
        out["ref_gap"] = (ref_logits[row, a] - ref_logits[row, b]).item()
        out["our_gap"] = (our_logits[row, b] - our_logits[row, a]).item()
    return out


def measure(model: str, formats, prompts: list[str], *, max_new_tokens=128, threads=2, reference="llama.cpp",
            progress=True) -> dict:
    from tqdm import tqdm

    torch.set_num_threads(threads)
    first = load_model(model, device="cpu", dtype="float32" if reference == "float32" else formats[0])
    encoded = encode_prompts(first.tokenizer, prompts, chat_template="auto")
    context = max(len(e) for e in encoded) + max_new_tokens + 8
    if reference == "llama.cpp":
        ref = LlamaReference(llamacpp.gguf_path(model), context, threads)
    else:
        ref = OwnReference(first)
    start = time.perf_counter()
    ref_tokens = [ref.greedy(ids, max_new_tokens) for ids in tqdm(encoded, desc="reference greedy",
                                                                   disable=not progress)]
    ref_seconds = time.perf_counter() - start
    results = {}
    for k, fmt in enumerate(formats):
        reuse = fmt == "float32" if reference == "float32" else k == 0  # the model loaded first, in this format
        lm = first if reuse else load_model(model, device="cpu", dtype=fmt)
        results[fmt] = []
        for ids, theirs in tqdm(list(zip(encoded, ref_tokens)), desc=fmt, disable=not progress):
            ours = own_greedy(lm, ids, max_new_tokens)
            text = ids + theirs
            results[fmt].append(compare(theirs, ours, ref.logits(text), own_logits(lm, text), len(ids)))
        lm = None
        if reference != "float32":
            first = None  # one model in memory at a time (the 1.5B in float32 is 6 GB)
    return {"results": results, "reference": reference, "tokens": [len(t) for t in ref_tokens],
            "ref_ms": 1e3 * ref_seconds / max(sum(len(t) for t in ref_tokens), 1)}


def report(result: dict) -> str:
    lines = header("weights", "greedy agreement (median)", "mean", "identical", "first divergence (median)",
                   "KL(ref || ours), mean", "KL max", "top-1 (teacher-forced)", "RMS logit diff (median)")
    notes = []
    for fmt, per in result["results"].items():
        firsts = [r["first_divergence"] for r in per if r["first_divergence"] is not None]
        lines.append(f"| {fmt} | {statistics.median(r['agreement'] for r in per):.3f} | "
                     f"{statistics.fmean(r['agreement'] for r in per):.3f} | {len(per) - len(firsts)}/{len(per)} | "
                     f"{statistics.median(firsts) if firsts else '-'} | "
                     f"{statistics.fmean(r['kl'] for r in per):.2e} | {max(r['kl_max'] for r in per):.2e} | "
                     f"{statistics.fmean(r['top1'] for r in per):.4f} | {statistics.median(r['rms'] for r in per):.3g} |")
        gaps = [(i, r) for i, r in enumerate(per) if r["ref_gap"] is not None]
        if gaps:
            ties = sum(r["ref_gap"] < r["rms"] for _, r in gaps)
            notes.append(f"{fmt}: {len(gaps)} divergences, {ties} near ties (reference top-2 gap < the RMS logit "
                         "difference); (prompt, position, reference gap, our gap): " + ", ".join(
                             f"({i}, {r['first_divergence']}, {r['ref_gap']:.3g}, {r['our_gap']:.3g})" for i, r in gaps))
    head = (f"reference {result['reference']}: {sum(result['tokens'])} greedy tokens over {len(result['tokens'])} "
            f"prompts ({result['ref_ms']:.1f} ms/token)")
    if result["reference"] != "llama.cpp":
        notes.append(NO_LLAMACPP)
    return "\n".join([head, ""] + lines + [""] + [f"- {n}" for n in notes])


COLUMNS = ("weights", "prompt", "agreement", "first_divergence", "kl", "kl_max", "top1", "rms", "ref_gap", "our_gap")


def main(argv=None) -> None:
    ap = parser(__doc__)
    add(ap, model=("qwen2.5-coder-1.5b", "a GGUF model (llama.cpp runs the same file)"))
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=(*FORMATS, "file"),
                    help="weight formats (file: the GGUF file's own types, not run by default)")
    chat_prompts(ap, 20)
    add(ap, max_new_tokens=128, threads=2)
    ap.add_argument("--reference", choices=REFERENCES, default="llama.cpp",
                    help="llama.cpp (falls back to float32 where it cannot run) or relaxspec's float32")
    csv_file(ap, "real_pair_fidelity")
    progress(ap)
    args = ap.parse_args(argv)
    within_chat(ap, args.prompts)
    if args.max_new_tokens < 1 or args.threads < 1:
        ap.error("--max-new-tokens and --threads must be >= 1")
    reference = args.reference
    if reference == "llama.cpp" and not (is_gguf(args.model) and llamacpp.available()):
        reference = "float32"
    result = measure(args.model, args.formats, chat.HELDOUT[:args.prompts], max_new_tokens=args.max_new_tokens,
                     threads=args.threads, reference=reference, progress=not args.no_progress)
    print(f"model {args.model}, {args.prompts} held-out chat prompts, {args.max_new_tokens} new tokens, greedy, "
          f"{args.threads} thread(s)")
    print(report(result))
    write_csv(args.csv, COLUMNS, [{"weights": fmt, "prompt": i, **r} for fmt, per in result["results"].items()
                                  for i, r in enumerate(per)])
    print(f"CSV: {args.csv}")


if __name__ == "__main__":
    main()
