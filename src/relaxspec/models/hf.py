"""The few model calls the engine needs, on any `transformers` AutoModelForCausalLM.

Rows of a batch may hold different numbers of valid tokens. Instead of per-row
cache lengths (which `DynamicCache` does not have), every row's cache grows by
the same block and rejected slots are masked out in `attention_mask`; each row
keeps its own position counter. Rollback is then only a mask update, plus a
crop of the columns that no row uses any more.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from relaxspec.models.family import builtin_path, is_builtin


@dataclass
class CausalLM:
    name: str
    model: torch.nn.Module
    tokenizer: object
    fast: object = None  # a FastLlama over the same weights, where the architecture allows

    @property
    def backend(self) -> str:
        return "fast" if self.fast is not None else "transformers"

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def new_cache(self):
        if self.fast is not None:
            return self.fast.new_cache()
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, input_ids, cache, attention_mask, position_ids, hidden_layer: int | None = None):
        """Logits [B, T, V] (float32) for `input_ids` [B, T] appended to `cache`; optionally the
        hidden state [B, T, H] after block `hidden_layer` (0-based; negative counts from the end;
        the last block's is reported after the final norm, as transformers does)."""
        if self.fast is not None:
            return self.fast.forward(input_ids, cache, attention_mask, position_ids, hidden_layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, output_hidden_states=hidden_layer is not None)
        hidden = None
        if hidden_layer is not None:
            # hidden_states[0] is the embedding output; block i's output is hidden_states[i + 1].
            hidden = out.hidden_states[hidden_layer % self.num_layers + 1].float()
        return out.logits.float(), hidden


def crop_cache(cache, length: int) -> None:
    """Drop cache columns at and after `length`."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def load_model(name_or_path: str | os.PathLike, dtype=torch.float32, backend: str = "auto") -> CausalLM:
    """A built-in model by name (see `relaxspec models list`) or any local Hugging Face model directory.

    backend "auto" runs Llama-architecture models through the lean FastLlama path (same weights, same
    logits, less per-call overhead) and everything else through `transformers`; "transformers" forces the latter.
    """
    if backend not in ("auto", "transformers"):
        raise ValueError(f"backend must be 'auto' or 'transformers', got {backend!r}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relaxspec.models.mtp import is_mtp

    if is_mtp(name_or_path):
        raise ValueError(f"{str(name_or_path)!r} is an MTP drafter head, not a causal LM: use it as a drafter "
                         f"(--drafter, relaxspec.models.drafters.load_drafter)")
    path = builtin_path(str(name_or_path)) if is_builtin(str(name_or_path)) else Path(name_or_path)
    if not path.exists():
        raise ValueError(f"model {str(name_or_path)!r} is neither a built-in model nor an existing directory")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    from relaxspec.models.fast_llama import FastLlama

    fast = FastLlama(model) if backend == "auto" and FastLlama.supports(model) else None
    return CausalLM(name=str(name_or_path), model=model, tokenizer=tokenizer, fast=fast)


def check_same_vocab(verifier: CausalLM, drafter: CausalLM) -> None:
    if verifier.vocab_size != drafter.vocab_size:
        raise ValueError(f"drafter and verifier must share a vocabulary: verifier {verifier.name!r} has "
                         f"{verifier.vocab_size} tokens, drafter {drafter.name!r} has {drafter.vocab_size}")
    vt, dt = verifier.tokenizer, drafter.tokenizer
    if vt is not None and dt is not None and vt.get_vocab() != dt.get_vocab():
        raise ValueError(f"drafter {drafter.name!r} and verifier {verifier.name!r} have vocabularies of the same "
                         f"size ({verifier.vocab_size}) but different tokens: they need the same tokenizer")


@torch.inference_mode()
def measure_step_latency(lm: CausalLM, context: int = 128, block: int = 1, repeats: int = 30) -> float:
    """Median seconds of one cached forward of `block` tokens after `context` tokens."""
    ids = torch.randint(0, lm.vocab_size, (1, context + block))
    cache = lm.new_cache()
    mask = torch.ones_like(ids)
    pos = torch.arange(context + block)[None]
    lm.forward(ids[:, :context], cache, mask[:, :context], pos[:, :context])
    times = []
    for _ in range(repeats + 3):
        t = time.perf_counter()
        lm.forward(ids[:, context:], cache, mask, pos[:, context:])
        times.append(time.perf_counter() - t)
        crop_cache(cache, context)
    return statistics.median(times[3:])
