"""Speed of a real verifier / drafter pair on this machine, batch 1: relaxspec's engine vs Hugging Face generate.

    python benchmarks/real_pair.py [--verifier smollm2] [--drafter smollm2-drafter] [--prompts 20]
        [--max-new-tokens 32] [--threads 1 2] [--draft-lengths 3 5 8] [--temperatures 0 0.7]

Configurations, at every thread count and temperature (T > 0 samples with top-p 0.95):
* ours AR: `relaxspec.engine.generate(method="ar")`;
* ours strict + the drafter (`--drafter`) and ours strict + `ngram` (prompt lookup), at every N;
* HF AR: the same verifier as a `transformers` model, plain `model.generate`;
* HF prompt lookup: `model.generate(prompt_lookup_num_tokens=N, max_matching_ngram_size=3)`, the same
  drafter kind as our `ngram` (which also matches up to 3 tokens);
* HF assisted with the drafter as `assistant_model`, only when the drafter is a standalone causal LM:
  transformers cannot run an MTP head.
The prompts are the held-out chat prompts (`relaxspec.tasks.chat.HELDOUT`, through the chat template), run
interleaved: for each prompt every configuration runs once, in an order that rotates from prompt to prompt,
so a change in the machine's load hits every configuration alike. ms/token is the median over prompts of one
call's wall time (prefill included) over the tokens it generated; speed-ups are ratios of those medians to
our AR at the same threads and temperature. tau is the engine's mean accepted drafts + 1 per round; c_rel (the
drafter's step: an LM's forward, any other kind's time per drafted token through the drafter protocol / a
verifier step) and c_block (the verifier's (N+1)-token block / a one-token step) are measured before the run at
each thread count as `relaxspec bench` does (bench.cell.speed_constants: interleaved, medians of within-round
ratios); "modelled" is the block-aware model tau / (c_block + N * c_rel) (bench/speedup.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from harness.options import add, chat_prompts, parser, progress, within_chat
from harness.output import header, num, row, with_notes
from harness.timing import interleaved, strict_constants
from relaxspec.acceptance import get_rule
from relaxspec.bench.speedup import block_aware_speedup
from relaxspec.engine import GenerationStats, generate
from relaxspec.models import load_model
from relaxspec.drafters import LMDrafter, load_drafter
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.hf import CausalLM
from relaxspec.models.prompts import encode_prompts
from relaxspec.tasks import chat

OURS, HF = "ours", "HF"
NGRAM = "ngram"
TOP_P = 0.95
HF_NGRAM_SIZE = 3  # our ngram drafter matches up to 3 tokens; HF's default is 2
NO_HF_ASSIST = "transformers cannot run a drafter of kind {kind!r} (an MTP head) as an assistant: HF's drafter " \
    "here is prompt lookup, the same kind as our `ngram`"


@dataclass(frozen=True)
class Config:
    system: str  # OURS or HF
    method: str  # "ar", "strict", "prompt lookup" or "assisted"
    drafter: str  # "" for AR
    n: int  # draft length, 0 for AR
    threads: int
    temperature: float


def configurations(drafter: str, hf_can_assist: bool, threads, draft_lengths, temperatures) -> list[Config]:
    out = []
    for th in threads:
        for t in temperatures:
            out += [Config(OURS, "ar", "", 0, th, t), Config(HF, "ar", "", 0, th, t)]
            for n in draft_lengths:
                out += [Config(OURS, "strict", d, n, th, t) for d in dict.fromkeys([drafter, NGRAM])]
                out.append(Config(HF, "prompt lookup", NGRAM, n, th, t))
                if hf_can_assist:
                    out.append(Config(HF, "assisted", drafter, n, th, t))
    return out


def pair_constants(verifier: CausalLM, drafter, draft_lengths) -> dict:
    """c_rel of the drafter and c_block at every N + 1, at the current thread count, as `relaxspec bench`
    measures them (bench.cell.speed_constants): the verifier's one-token step, its blocks and the drafter's
    step (an LM's forward, any other kind per drafted token through its protocol) interleaved round by round,
    each constant the median of the within-round ratio."""
    speed = strict_constants(verifier.name, verifier, {drafter.name: drafter},
                             [(drafter.name, n) for n in draft_lengths])
    first = speed[(verifier.name, drafter.name, draft_lengths[0])]
    return {"step_ms": first["latency_verifier_s"] * 1e3, "c_rel": first["c_rel_measured"],
            "c_block": {n + 1: speed[(verifier.name, drafter.name, n)]["c_block_measured"] for n in draft_lengths}}


def _run_ours(cfg: Config, verifier, drafters, prompt, max_new_tokens, seed):
    out = generate(verifier, drafters.get(cfg.drafter), [prompt], method=cfg.method, draft_length=max(cfg.n, 1),
                   max_new_tokens=max_new_tokens, temperature=cfg.temperature,
                   top_p=TOP_P if cfg.temperature > 0 else None, seed=seed, chat_template="auto")
    return len(out.results[0].token_ids), out.stats


@torch.inference_mode()
def _run_hf(cfg: Config, verifier, drafters, prompt, max_new_tokens, seed):
    ids = torch.tensor(encode_prompts(verifier.tokenizer, [prompt], chat_template="auto"), device=verifier.device)
    kwargs = {}
    if cfg.method == "prompt lookup":
        kwargs = {"prompt_lookup_num_tokens": cfg.n, "max_matching_ngram_size": HF_NGRAM_SIZE}
    elif cfg.method == "assisted":
        kwargs = {"assistant_model": drafters[cfg.drafter].lm.model, "num_assistant_tokens": cfg.n,
                  "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    sampling = {"do_sample": True, "temperature": cfg.temperature, "top_p": TOP_P, "top_k": 0} \
        if cfg.temperature > 0 else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    torch.manual_seed(seed)
    eos = verifier.eos_token_id
    out = verifier.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                  eos_token_id=eos, pad_token_id=eos, **sampling, **kwargs)
    return out.shape[1] - ids.shape[1], None


def measure(verifier: CausalLM, drafter: str, prompts: list[str], *, threads=(1, 2), draft_lengths=(3, 5, 8),
            temperatures=(0.0, 0.7), max_new_tokens: int = 32, progress: bool = True) -> dict:
    """Every configuration on every prompt, interleaved prompt by prompt (see the module doc).
    `verifier`: a CausalLM whose `model` is a transformers model (HF runs it) and whose `fast` path, if
    any, our engine runs. Returns {"configs", "ms" {config: [ms/token per prompt]}, "stats" {config:
    GenerationStats}, "constants" {threads: pair_constants}, "hf_can_assist", "drafter_kind"}."""
    drafters = {drafter: load_drafter(drafter, verifier), NGRAM: load_drafter(NGRAM, verifier)}
    hf_can_assist = isinstance(drafters[drafter], LMDrafter)
    verifier.restore_weights()  # HF generate runs the transformers models themselves (relaxspec keeps one copy)
    if hf_can_assist:
        drafters[drafter].lm.restore_weights()
    configs = configurations(drafter, hf_can_assist, threads, draft_lengths, temperatures)
    constants = {}
    for th in threads:
        torch.set_num_threads(th)
        constants[th] = pair_constants(verifier, drafters[drafter], draft_lengths)

    def run(cfg: Config, i: int):
        """(tokens generated, GenerationStats or None, None: timed by `interleaved`)"""
        call = _run_ours if cfg.system == OURS else _run_hf
        tokens, st = call(cfg, verifier, drafters, prompts[i], max_new_tokens, seed=i)
        return tokens, st, None

    ms, outs = interleaved(configs, len(prompts), run, desc="real pair", progress=progress)
    stats = {c: [st for _, st in out if st is not None] for c, out in outs.items()}
    merged = {c: GenerationStats.merge(s) for c, s in stats.items() if s}
    return {"configs": configs, "ms": ms, "stats": merged, "constants": constants, "hf_can_assist": hf_can_assist,
            "drafter_kind": drafters[drafter].kind}


def rows(result: dict) -> list[dict]:
    """One dict per configuration: its median ms/token, speed-ups and, for our strict, the model's figures."""
    med = {c: statistics.median(v) for c, v in result["ms"].items()}
    extra = get_rule("strict").extra_draft_passes
    out = []
    for c in result["configs"]:
        base = med[Config(OURS, "ar", "", 0, c.threads, c.temperature)]
        r = {"config": c, "ms": med[c], "speedup": base / med[c], "tau": None, "c_rel": None, "c_block": None,
             "modelled": None, "measured/modelled": None, "vs_hf": None}
        if c.system == OURS and c.method == "strict":
            const = result["constants"][c.threads]
            r["tau"] = result["stats"][c].mean_acceptance_length
            r["c_rel"] = 0.0 if c.drafter == NGRAM else const["c_rel"]
            r["c_block"] = const["c_block"][c.n + 1]
            r["modelled"] = block_aware_speedup(r["tau"], c.n, r["c_rel"], r["c_block"], extra)
            r["measured/modelled"] = r["speedup"] / r["modelled"]
            same = Config(HF, "assisted", c.drafter, c.n, c.threads, c.temperature)
            hf = same if same in med else Config(HF, "prompt lookup", NGRAM, c.n, c.threads, c.temperature)
            r["vs_hf"] = med[hf] / med[c]
        out.append(r)
    return out


def table(result: dict) -> str:
    """The markdown table of `rows(result)`, with the pair's constants and what HF could run."""
    lines = header("threads", "T", "system", "method", "drafter", "N", "ms/token", "x our AR", "tau", "c_rel",
                   "c_block", "modelled", "measured/modelled", "x HF (same N)")
    for r in rows(result):
        c = r["config"]
        lines.append(row(c.threads, f"{c.temperature:g}", c.system, c.method, c.drafter or "-", c.n or "-",
                         f"{r['ms']:.1f}", f"{r['speedup']:.2f}", num(r["tau"]), num(r["c_rel"], 3), num(r["c_block"]),
                         num(r["modelled"]), num(r["measured/modelled"]), num(r["vs_hf"])))
    notes = []
    for th, const in result["constants"].items():
        blocks = ", ".join(f"{b} tokens {v:.2f}" for b, v in const["c_block"].items())
        notes.append(f"{th} thread(s): verifier step {const['step_ms']:.1f} ms, drafter c_rel {const['c_rel']:.3f}, "
                     f"c_block {blocks}")
    notes.append("x HF (same N): HF's ms/token over ours, HF with the same drafter (prompt lookup for `ngram`, "
                 "assisted generation for a causal LM drafter), else HF prompt lookup.")
    if result["drafter_kind"] not in ("lm", NGRAM):
        notes.append(NO_HF_ASSIST.format(kind=result["drafter_kind"]) + ".")
    return with_notes(lines, notes)


def load_pair_verifier(name: str) -> CausalLM:
    """The verifier loaded once as a transformers model (HF generate runs it), with our fast path over the
    same weights where the architecture allows (what load_model's backend 'auto' gives on a CPU)."""
    base = load_model(name, device="cpu", dtype="float32", backend="transformers")
    fast = FastLlama(base.model) if FastLlama.supports(base.model) else None
    return CausalLM(base.name, base.model, base.tokenizer, fast)


def main() -> None:
    ap = parser(__doc__)
    add(ap, verifier=("smollm2", "any load_model name (default: SmolLM2-135M-Instruct)"),
        drafter=("smollm2-drafter", "any load_drafter name"))
    chat_prompts(ap, 20)
    add(ap, max_new_tokens=(32, "default 32 (not 128): a full default run then takes ~25 min on a quiet 2-core CPU"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=[3, 5, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    progress(ap)
    args = ap.parse_args()
    within_chat(ap, args.prompts)
    verifier = load_pair_verifier(args.verifier)
    result = measure(verifier, args.drafter, chat.HELDOUT[:args.prompts], threads=args.threads,
                     draft_lengths=args.draft_lengths, temperatures=args.temperatures,
                     max_new_tokens=args.max_new_tokens, progress=not args.no_progress)
    print(f"verifier {args.verifier}, drafter {args.drafter}, {args.prompts} held-out chat prompts, "
          f"max {args.max_new_tokens} new tokens, batch 1, top-p {TOP_P} when T > 0")
    print(table(result))


if __name__ == "__main__":
    main()
