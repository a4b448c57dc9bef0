"""relaxspec against llama.cpp on the same GGUF file, greedy, batch 1, per weight format (cpu_peer.py,
real_pair_peer.py): the configurations' key, the models of each format, the runs (an untimed warm-up, then every
configuration taking turns prompt by prompt) and the greedy divergences of strict from AR."""

from __future__ import annotations

from dataclasses import dataclass

from harness.timing import interleaved

NGRAM, LLAMACPP, OURS = "ngram", "llama.cpp", "relaxspec"


@dataclass(frozen=True)
class Config:
    system: str  # OURS or LLAMACPP
    fmt: str  # a weight format; "gguf" for llama.cpp
    method: str  # "ar", "strict", or llama.cpp's "prompt lookup" or "speculative"
    drafter: str  # "" for AR
    n: int  # the draft length (or "auto"), 0 for AR
    threads: int
    recipe: object = None  # llama.cpp's speculative loop: its harness.llamacpp.Recipe (method: the recipe's label)

    @property
    def ar(self) -> Config:
        """AR of the same system and format at the same threads."""
        return Config(self.system, self.fmt, "ar", "", 0, self.threads)

    @property
    def llamacpp_ar(self) -> Config:
        """llama.cpp's AR at the same threads."""
        return Config(LLAMACPP, "gguf", "ar", "", 0, self.threads)


def drafter_names(drafter: str) -> list[str]:
    """The drafter, then prompt lookup (once where the drafter is prompt lookup)."""
    return list(dict.fromkeys([drafter, NGRAM]))


def ours(formats, drafter: str, draft_lengths, threads: int) -> list[Config]:
    """relaxspec's configurations at one thread count: per format AR, then strict with each drafter at every N."""
    out = []
    for fmt in formats:
        out.append(Config(OURS, fmt, "ar", "", 0, threads))
        for n in draft_lengths:
            out += [Config(OURS, fmt, "strict", d, n, threads) for d in drafter_names(drafter)]
    return out


def load(model: str, drafter: str, formats, texts: list[str], device: str = "cpu") -> tuple[dict, dict, list]:
    """({format: the verifier in it}, {format: {drafter name: Drafter}}, the texts' token ids through the chat
    template)."""
    from relaxspec.drafters import load_drafter
    from relaxspec.models import load_model
    from relaxspec.models.prompts import encode_prompts

    verifiers = {fmt: load_model(model, device=device, dtype=fmt) for fmt in formats}
    drafters = {fmt: {d: load_drafter(d, v) for d in drafter_names(drafter)} for fmt, v in verifiers.items()}
    tokenizer = next(iter(verifiers.values())).tokenizer
    return verifiers, drafters, encode_prompts(tokenizer, texts, chat_template="auto")


def generate_ours(verifiers: dict, drafters: dict, cfg: Config, text: str, max_new_tokens: int):
    """(token ids, GenerationStats) of one relaxspec call of the configuration on the text, greedy."""
    from relaxspec.engine import generate

    res = generate(verifiers[cfg.fmt], drafters[cfg.fmt].get(cfg.drafter), [text], method=cfg.method,
                   draft_length=cfg.n or 1, max_new_tokens=max_new_tokens, chat_template="auto")
    return res.results[0].token_ids, res.stats


def at_threads(threads, measure) -> dict:
    """{thread count: measure()} with torch at each of `threads`."""
    import torch

    out = {}
    for th in threads:
        torch.set_num_threads(th)
        out[th] = measure()
    return out


def runs(configs: list[Config], prompts: int, run, max_new_tokens: int, *, desc: str, progress: bool):
    """run(cfg, i, new tokens) once per configuration untimed (4 tokens of the first prompt: llama.cpp loads its model
    on first use, first calls allocate), then `interleaved` at `max_new_tokens`; each at its thread count."""
    import torch

    for cfg in configs:
        torch.set_num_threads(cfg.threads)
        run(cfg, 0, 4)
    return interleaved(configs, prompts, lambda cfg, i: run(cfg, i, max_new_tokens), desc=desc, progress=progress)


def greedy_divergences(verifiers: dict, configs: list[Config], tokens: dict, encoded: list) -> dict:
    """{format: [(config, prompt index, position, top-2 gap of AR's logits there)]} for strict runs whose tokens
    differ from AR's (same format, threads and prompt)."""
    import torch

    from harness.output import first_difference

    out = {fmt: [] for fmt in verifiers}
    with torch.inference_mode():
        for cfg in configs:
            if cfg.system != OURS or cfg.method != "strict":
                continue
            for i, (a, s) in enumerate(zip(tokens[cfg.ar], tokens[cfg])):
                if a == s:
                    continue
                pos = first_difference(a, s)
                lm = verifiers[cfg.fmt]
                ids = torch.tensor([encoded[i] + a[:pos]], device=lm.device)
                logits, _ = lm.forward(ids, lm.new_cache(), torch.ones_like(ids), torch.arange(ids.shape[1])[None])
                top = logits[0, -1].topk(2).values
                out[cfg.fmt].append((cfg, i, pos, float(top[0] - top[1])))
    return out


def divergence_notes(result: dict) -> list[str]:
    """A line per format: how many strict runs differ from AR, with the top-2 gaps at the first differences."""
    notes = []
    for fmt, found in result["divergences"].items():
        count = sum(len(result["ms"][c]) for c in result["configs"]
                    if c.system == OURS and c.method == "strict" and c.fmt == fmt)
        gaps = ", ".join(f"{g:.3g}" for *_, g in found)
        notes.append(f"greedy, {fmt}: {len(found)} of {count} strict runs differ from AR"
                     + (f" (top-2 logit gaps at the first difference: {gaps})" if found else ""))
    return notes
