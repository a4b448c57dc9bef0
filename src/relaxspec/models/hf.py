"""The few model calls the engine needs, on any `transformers` AutoModelForCausalLM.

Rows of a batch may hold different numbers of valid tokens. Instead of per-row
cache lengths (which `DynamicCache` does not have), every row's cache grows by
the same block and rejected slots are masked out in `attention_mask`; each row
keeps its own position counter. Rollback is then only a mask update, plus a
crop of the columns that no row uses any more.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import statistics
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from relaxspec.models.device import inference, resolve_device, resolve_format
from relaxspec.models.family import builtin_path, is_builtin, is_mtp
from relaxspec.models.gguf import NATIVE_PACKAGES, check_gguf_packages, is_gguf, split_gguf
from relaxspec.models.prompts import check_context, encode_prompts, vocab_key
from relaxspec.models.quant import check_format, convert_linears, gguf_format

BACKENDS = ("auto", "fast", "transformers")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass
class CausalLM:
    name: str
    # the transformers model; None with `build_model`: built from it on first use (a GGUF file mapped from the
    # converted-weight cache runs through FastLlama alone, and transformers' model class takes seconds to import)
    model: torch.nn.Module | None = field(repr=False, compare=False)
    tokenizer: object
    fast: object = None  # a FastLlama over the same weights, where the architecture allows
    weight_format: str = ""  # what the weights run in (float32, bfloat16, float16, int4; models/quant.py)
    config: object = None  # the transformers config (default: the model's)
    build_model: Callable[[], torch.nn.Module] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.model is None:
            if self.build_model is None:
                raise ValueError(f"model {self.name!r}: no model and nothing to build it")
            del self.model  # (`__getattr__` builds it when it is read)
        if self.config is None:
            self.config = self.model.config
        if not self.weight_format:
            self.weight_format = (self.fast.weight_format if self.fast is not None
                                  else str(self.model.get_input_embeddings().weight.dtype).removeprefix("torch."))

    def __getattr__(self, name: str):
        """`model`, built by `build_model` the first time it is read (then an attribute like any other)."""
        build = self.__dict__.get("build_model")
        if name != "model" or build is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.model = build()
        return self.model

    @property
    def backend(self) -> str:
        return "fast" if self.fast is not None else "transformers"

    @property
    def compiled(self) -> bool:
        """Its steps run through torch.compile (`load_model(..., compile=True)`, models/compiled.py)."""
        return getattr(self.fast, "compiled_step", None) is not None

    @property
    def device(self) -> torch.device:
        return self.fast.device if self.fast is not None else self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype: bfloat16 in that format, torch.quint4x2 for int4, else the embedding's."""
        if self.weight_format == "int4":
            return torch.quint4x2
        if self.weight_format == "bfloat16":
            return torch.bfloat16
        return self.fast.embed.dtype if self.fast is not None else self.model.get_input_embeddings().weight.dtype

    @functools.cached_property  # read on every feed; a transformers config's attribute access is slow
    def max_position_embeddings(self) -> int | None:
        """The context length the model was made for (prompt + generated tokens), None when unknown."""
        return getattr(self.config, "max_position_embeddings", None)

    @property
    def vocab_size(self) -> int:
        if self.fast is not None:
            return self.fast.lm_head.shape[0]
        return self.model.get_output_embeddings().out_features  # (an nn.Linear, or one in a format)

    @functools.cached_property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def num_parameters(self) -> int:
        if self.fast is not None:  # (the transformers model may have handed its weights to it)
            return self.fast.num_parameters
        return sum(p.numel() for p in self.model.parameters())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The transformers model's state_dict with every weight present: those it handed to FastLlama (one
        resident copy, `FastLlama.release_weights`) are read back from FastLlama's copies, in float32 (exact
        in float32 and bfloat16; int4: the dequantized weights). A new dict: the model is left as it is."""
        state = self.model.state_dict()
        released = [name for name, t in state.items() if t.numel() == 0]
        if released and self.fast is not None:
            dense = self.fast.linear_weights(head="lm_head.weight" in released)
            state.update({name: dense[name] for name in released if name in dense})
        return state

    def restore_weights(self) -> "CausalLM":
        """Put the weights FastLlama holds back into the transformers model (a second resident copy, in float32),
        for code that runs the transformers model itself (e.g. its `generate`); relaxspec does not need it."""
        released = {name for name, t in self.model.state_dict().items() if t.numel() == 0}
        for name, weight in self.state_dict().items():
            if name in released:
                module, _, attr = name.rpartition(".")
                setattr(self.model.get_submodule(module), attr, torch.nn.Parameter(weight, requires_grad=False))
        return self

    def new_cache(self):
        if self.fast is not None:
            return self.fast.new_cache()
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @inference
    def forward(self, input_ids, cache, attention_mask, position_ids,
                hidden_layer: int | tuple[int, ...] | None = None, logits: bool = True):
        """Logits [B, T, V] (float32, whatever the model's dtype) for `input_ids` [B, T] appended to `cache`
        (None with `logits` False: a prefill whose logits nobody reads skips the LM head, V x H per token, a fifth
        of SmolLM2-135M's work; a transformers model computes the last position's only, `logits_to_keep`);
        optionally the hidden state [B, T, H] (float32) after block `hidden_layer` (0-based; negative counts
        from the end; the last block's is reported after the final norm, as transformers does), or, for a
        tuple of blocks, their hidden states concatenated in that order [B, T, k * H].
        Inputs live on the model's device (`self.device`); attention_mask [B, past + T] (1: a real slot) or None
        when every slot is real."""
        layers = hidden_blocks(hidden_layer, self.num_layers)
        if self.fast is not None:
            out, hidden = self.fast.forward(input_ids, cache, attention_mask, position_ids, layers, logits=logits)
        else:
            keep = {} if logits or not self._keeps_logits else {"logits_to_keep": 1}
            result = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                past_key_values=cache, use_cache=True, output_hidden_states=bool(layers), **keep)
            out, hidden = result.logits if logits else None, None
            if layers:
                # hidden_states[0] is the embedding output; block i's output is hidden_states[i + 1].
                hidden = torch.cat([result.hidden_states[i + 1] for i in layers], dim=-1)
        return None if out is None else _float32(out), None if hidden is None else _float32(hidden)

    @functools.cached_property
    def _keeps_logits(self) -> bool:
        """Whether the transformers model takes `logits_to_keep` (its LM head on the last positions only)."""
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters


def _float32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()  # (a no-op .float() still costs a dispatch per call)


def hidden_blocks(hidden_layer: int | tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    """The 0-based blocks a `hidden_layer` argument names (an int, a tuple of them, or None: none); a
    ValueError for a block the model lacks (negative indices count from the last, -1)."""
    if hidden_layer is None:
        return ()
    layers = (hidden_layer,) if isinstance(hidden_layer, int) else tuple(hidden_layer)
    if any(not -num_layers <= i < num_layers for i in layers):
        named = f"layer {hidden_layer}" if isinstance(hidden_layer, int) else f"layers {list(layers)}"
        raise ValueError(f"hidden {named}: the verifier has {num_layers} blocks (0..{num_layers - 1}, or -1 for the last)")
    return tuple(i % num_layers for i in layers)


def crop_cache(cache, length: int) -> None:
    """Drop cache columns at and after `length`."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def can_gather_cache(cache) -> bool:
    """Whether `gather_cache` can rearrange this cache: FastLlama's, or transformers' DynamicCache of plain
    full-attention layers (not a compiled model's static cache: its buffers keep the rows that left the batch,
    and its shapes are fixed)."""
    from relaxspec.models.fast_llama import KVCache

    if isinstance(cache, KVCache):
        return True
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))


@torch.inference_mode()
def gather_cache(cache, index: torch.Tensor) -> None:
    """Keep, in row b, the cache slots index[b] in that order (index [B, L']): the cache then has L' slots."""
    width = index.shape[1]
    if hasattr(cache, "kv"):  # FastLlama's KVCache: buffers [B, 2 * KV heads, capacity, D]
        for buf in cache.kv:
            if buf is not None:
                used = buf[:, :, :cache.length]
                buf[:, :, :width] = used.gather(2, index[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3]))
        cache.length = width
        return
    for layer in cache.layers:  # transformers' DynamicLayer: keys, values [B, heads, L, D]
        if layer.keys is not None and layer.keys.numel():
            expanded = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, expanded), layer.values.gather(2, expanded)


def load_model(name_or_path: str | os.PathLike, device=None, dtype=None, backend: str = "auto",
               compile: bool = False, weight_cache: bool | None = None) -> CausalLM:
    """A built-in model by name (see `relaxspec models list`), a local Hugging Face model directory, a hub id
    (`org/name`, from the local Hugging Face cache: nothing is downloaded unless HF_HUB_OFFLINE=0), or a
    GGUF file (`FILE.gguf`, `DIR::FILE.gguf`, or `smollm2`; dequantized on load).

    device: "cpu", "cuda", "cuda:N", "mps" or a torch.device (default: cuda when available, else cpu);
    dtype: "float32", "bfloat16", "float16", "int4", "auto", "file" or a torch dtype (default: bfloat16 on CUDA,
    float32 elsewhere). On a CPU it is the weights' format (models/quant.py): the large matrices are stored once in it
    (float32, bfloat16, or int4 weight-only in groups of 32; "auto": a GGUF file of an architecture read tensor
    by tensor (qwen2, models/gguf_weights.py) keeps each 4-bit tensor's codes in int4 and the 5-, 6- and 8-bit
    ones in bfloat16, saying so in one line; another GGUF file runs in the class it was shipped in, Q4 -> int4;
    anything else float32; "file": such a qwen2 GGUF file's matrices, its head included, in their own types
    (models/gguf_block.py), any other model a ValueError); a model whose layers cannot be stored in it is a
    ValueError.
    backend "auto" runs Llama- and Qwen2-architecture models on a CPU through the lean FastLlama path (same weights,
    same logits, less per-call overhead) and everything else through `transformers`; "fast" forces
    FastLlama (a ValueError for other architectures), "transformers" forces the latter.
    compile: run the engine's steps through torch.compile with a static KV cache (models/compiled.py; Llama
    architectures, on any device; CUDA graphs on CUDA); off by default (on a CPU it was measured slower).
    weight_cache: keep a GGUF file's converted weights on disk and map them on later loads (models/weight_cache.py;
    a file read natively, on a CPU); None: on unless RELAXSPEC_WEIGHT_CACHE=0.
    Every failure to load is a one-line ValueError naming the model.
    """
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise ValueError(f"load_model needs a model's name or path (`relaxspec models list` names the built-in ones), "
                         f"got {name_or_path!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if compile and backend == "transformers":
        raise ValueError("compile=True compiles the lean Llama path: it cannot run with backend 'transformers'")
    device = resolve_device(device)
    name = str(name_or_path)
    dtype, weight_format = resolve_format(dtype, device, lambda: _gguf_format(name))
    if weight_format == "file" and (compile or backend == "transformers" or _gguf_format(name) != "auto"):
        raise ValueError(f"--dtype file runs a qwen2 GGUF file's matrices in their own types, read natively (no "
                         f"--compile, not backend 'transformers'); model {name!r} is not one: use int4, auto, "
                         f"bfloat16 or float32")
    if is_mtp(name_or_path):
        raise ValueError(f"{name!r} is an MTP drafter head, not a causal LM: use it as a drafter "
                         f"(--drafter, relaxspec.drafters.load_drafter)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
    if is_gguf(name):
        directory, gguf_file = split_gguf(name)
        check_gguf_packages(NATIVE_PACKAGES)
        if backend != "transformers" and not compile:
            from relaxspec.models import gguf_weights  # the file's own quantization, tensor by tensor

            loaded = gguf_weights.load(name, directory / gguf_file, weight_format, device, cache=weight_cache)
            if loaded is not None:
                _return_freed_memory()
                return CausalLM(name=name, weight_format=weight_format, **loaded._asdict())
        check_gguf_packages()  # (transformers' loader)
        if weight_format == "auto":  # (transformers' loader: the file's class as a whole)
            weight_format = gguf_format(directory / gguf_file)
        source, extra = directory, {"gguf_file": gguf_file}
    elif not is_builtin(name) and not Path(name_or_path).exists() and HUB_ID.fullmatch(name):
        # A hub id (org/name): resolved from the local Hugging Face cache (offline unless HF_HUB_OFFLINE=0).
        source, extra = name, {}
    else:
        source, extra = builtin_path(name) if is_builtin(name) else Path(name_or_path), {}
        if not source.exists():
            raise ValueError(f"model {name!r} is neither a built-in model, a GGUF file, an existing directory "
                             "nor a hub id (org/name)")
        if not (source / "config.json").is_file():
            raise ValueError(f"model directory {name!r} has no config.json (not a Hugging Face model directory)")
    model, tokenizer = _from_pretrained(name, source, dtype, extra)
    model = model.to(device).eval()
    from relaxspec.models.fast_llama import FastLlama

    if backend == "fast" and not FastLlama.supports(model):
        raise ValueError(f"backend 'fast' supports {FastLlama.SUPPORTED} with default RoPE, not model {name!r} "
                         f"({type(model).__name__}); use backend 'auto' or 'transformers'")
    if compile:
        from relaxspec.models.compiled import CompiledLlama

        if not FastLlama.supports(model):
            raise ValueError(f"compile supports {FastLlama.SUPPORTED} with default RoPE, not model {name!r} "
                             f"({type(model).__name__})")
        if device.type == "cpu" and weight_format != "float32":
            raise ValueError(f"compile runs float32 weights on a CPU, not {weight_format}: use --dtype float32 "
                             "(or leave out --compile)")
        return CausalLM(name=name, model=model, tokenizer=tokenizer, fast=CompiledLlama(model))
    use_fast = backend == "fast" or (backend == "auto" and device.type == "cpu" and FastLlama.supports(model))
    check_format(model, weight_format, f"model {name!r}")
    if not use_fast:
        return CausalLM(name, convert_linears(model, weight_format), tokenizer, weight_format=weight_format)
    fast = FastLlama(model, weight_format)
    FastLlama.release_weights(model)  # one resident copy: FastLlama's, in the format (CausalLM.state_dict reads it)
    _return_freed_memory()
    return CausalLM(name=name, model=model, tokenizer=tokenizer, fast=fast, weight_format=weight_format)


def load_beside(name_or_path: str | os.PathLike, verifier: CausalLM) -> CausalLM:
    """A model that runs beside `verifier` (a drafter's LM): on its device, in its weight format, compiled if it is."""
    return load_model(name_or_path, device=verifier.device, dtype=verifier.weight_format, compile=verifier.compiled)


def load_inputs(verifier: CausalLM | str | os.PathLike, prompts, max_new_tokens: int, *, chat_template: str = "auto",
                system: str | None = None, drafter_lm: CausalLM | str | os.PathLike | None = None,
                ) -> tuple[CausalLM, CausalLM | None, list[list[int]]]:
    """A generate call's models and prompts, in one call: the verifier (loaded when given by name or path, as
    `load_model` does with its defaults), the drafter's own LM (`drafter_lm`: a CausalLM, the name or path of one,
    loaded beside the verifier, or None: a drafter without one) and the prompts' token ids (`encode_prompts`), each
    checked to fit with `max_new_tokens` in the context of both (`check_context`). Returns (verifier, drafter_lm,
    token ids)."""
    if isinstance(verifier, (str, os.PathLike)):
        verifier = load_model(verifier)
    if isinstance(drafter_lm, (str, os.PathLike)):
        drafter_lm = load_beside(drafter_lm, verifier)
    encoded = encode_prompts(verifier.tokenizer, prompts, chat_template=chat_template, system=system)
    return verifier, drafter_lm, check_context(encoded, max_new_tokens, verifier, drafter_lm)


def _return_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc keeps them otherwise: the float32 weights just
    dropped would still count in the process's resident memory). Elsewhere nothing to do."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _gguf_format(name: str) -> str | None:
    """`--dtype auto` for a GGUF model reference (None for another model): "auto" (each tensor in the file's own
    class, models/gguf_weights.py) where the file's architecture is read natively, else the file's class as a whole
    (quant.gguf_format)."""
    if not is_gguf(name):
        return None
    check_gguf_packages(NATIVE_PACKAGES)
    directory, file = split_gguf(name)
    from relaxspec.models import gguf_weights

    if gguf_weights.architecture(directory / file) in gguf_weights.SUPPORTED:
        return "auto"
    return gguf_format(directory / file)


def _from_pretrained(name: str, source: Path | str, dtype: torch.dtype, extra: dict):
    """(model, tokenizer) from `source`; whatever transformers raises on a broken file becomes one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
    except Exception as e:  # noqa: BLE001 - corrupted config or weights: one clear line, not a traceback
        what = "the GGUF file is truncated or corrupt: " if "gguf_file" in extra and isinstance(
            e, (struct.error, EOFError, ValueError, IndexError, KeyError)) else ""
        raise ValueError(f"cannot load model {name!r}: {what}{_first_line(e)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **extra)
    except Exception as e:  # noqa: BLE001 - a broken tokenizer file
        raise ValueError(f"cannot load the tokenizer of model {name!r}: {_first_line(e)}") from None
    return model, tokenizer


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else 'no message'}"


def check_same_vocab(verifier: CausalLM, drafter: CausalLM) -> None:
    if verifier.vocab_size != drafter.vocab_size:
        raise ValueError(f"drafter and verifier must share a vocabulary: verifier {verifier.name!r} has "
                         f"{verifier.vocab_size} tokens, drafter {drafter.name!r} has {drafter.vocab_size}")
    vt, dt = verifier.tokenizer, drafter.tokenizer
    if vt is not None and dt is not None and vt is not dt and vocab_key(vt) != vocab_key(dt):
        raise ValueError(f"drafter {drafter.name!r} and verifier {verifier.name!r} have vocabularies of the same "
                         f"size ({verifier.vocab_size}) but different tokens: they need the same tokenizer")


def measure_step_latency(lm: CausalLM, context: int = 128, block: int = 1, repeats: int = 30) -> float:
    """Median seconds of one cached forward of `block` tokens after `context` tokens (on the model's device; CPU
    seconds on a CPU with one torch thread, see step_clock)."""
    return statistics.median(t[0] for t in measure_step_latencies([(lm, block)], context, repeats))


@torch.inference_mode()
def measure_step_latencies(steps: list, context: int = 128, rounds: int = 30, warmup: int = 3,
                           max_seconds: float | None = None, min_rounds: int = 30) -> list[list[float]]:
    """Seconds of one cached forward of `block` tokens after `context` tokens for each (lm, block) of `steps`,
    interleaved: each round runs every step once, starting one step later each round, so a load that comes and
    goes falls on all of them alike. Returns `rounds` lists of times (fewer, but at least `min_rounds`, where the
    measured rounds reach `max_seconds` of wall time first: large models), in the order of `steps`; a ratio of two
    steps' costs is best taken within each round, then its median over rounds (see relative_costs). On a CPU
    with one torch thread the clock is the thread's CPU time (step_clock), which other processes' load does
    not inflate. A step may also be a callable `timer(clock) -> seconds` that times itself on that clock (e.g.
    drafters.draft_timer: a drafter of any kind, per drafted token); the first step must be an (lm, block)."""
    clock = step_clock(steps[0][0].device) if steps else time.perf_counter
    states = []
    for step in steps:
        if callable(step):
            states.append(step)
            continue
        lm, block = step
        ids = torch.randint(0, lm.vocab_size, (1, context + block), device=lm.device)
        cache = lm.new_cache()
        pos = torch.arange(context + block, device=lm.device)[None]
        # attention_mask None: every slot is real, as the engine passes it at batch 1 (models.stream's dense Stream)
        lm.forward(ids[:, :context], cache, None, pos[:, :context], logits=False)
        states.append((lm, ids[:, context:], cache, None, pos[:, context:]))
    out = []
    k = len(states)
    started = None
    for r in range(warmup + rounds):
        if r == warmup:
            started = time.perf_counter()
        elif (max_seconds is not None and len(out) >= min_rounds
              and time.perf_counter() - started >= max_seconds):
            break
        times = [0.0] * k
        for j in range(k):
            i = (r + j) % k
            if callable(states[i]):
                times[i] = states[i](clock)
                continue
            lm, ids, cache, mask, pos = states[i]
            synchronize(lm.device)
            t = clock()
            lm.forward(ids, cache, mask, pos)
            synchronize(lm.device)
            times[i] = clock() - t
            crop_cache(cache, context)
        if r >= warmup:
            out.append(times)
    return out


def step_clock(device: torch.device):
    """The clock of a step measurement: on a CPU with one torch thread, this thread's CPU time (the forward
    runs in it; time the scheduler gives other processes is not counted, so a loaded machine measures the
    same costs as a quiet one); otherwise wall time."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def relative_costs(times: list[list[float]], reference: int = 0) -> list[float]:
    """Each step's cost over the `reference` step's, the median over rounds of the ratio within a round
    (times: measure_step_latencies' output)."""
    return [statistics.median(t[i] / t[reference] for t in times) for i in range(len(times[0]))]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (for timing); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
