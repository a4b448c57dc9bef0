"""A GGUF file's weights read tensor by tensor, in the file's own quantization where the format allows.

transformers' `gguf_file=` loader dequantizes the whole model to float32 first (about 7 GB for a 1.5B model). Here
a file of a supported architecture (`SUPPORTED`: qwen2) is read with the `gguf` package's memory-mapped reader,
one tensor at a time, straight into FastLlama's copies (`FastLlama(model, fmt, source=GGUFWeights(...))`); the
transformers module is built on the meta device for its config and keeps only the norms, biases and embedding.

What each format does with each tensor type (the `--dtype`; `auto` is a file's own classes, `file` its own types):

| tensor type | int4 | auto | file | bfloat16 / float32 |
|---|---|---|---|---|
| Q4_K, Q4_0, Q4_1 | the file's codes kept (scale, zero per 32 rounded to bfloat16) | same | kept* | dequantized |
| Q5_0, Q5_1, Q6_K, Q8_0 | dequantized, re-quantized min-max to 4 bits (lossy) | bfloat16 | kept* | dequantized |
| F16, BF16, F32, other types | dequantized, re-quantized min-max to 4 bits (lossy) | bfloat16 | float32 | dequantized |

*the file's codes and scales (gguf_block.py: the file's values exactly).

In `file` a tied head (no output.weight) is the embedding's tensor in its own type (`tied_head`), and the embedding
table is float32 (the file's values; 4 bytes a weight, paged in from the weight cache only where looked up).

Q4_K's sub-blocks of 32 weights are affine, w = d·sc·q − dmin·m with q in 0..15, which is quant.py's int4 form
(w = (q − 8)·scale + zero) with scale = d·sc and zero = 8·d·sc − dmin·m. The embedding table is stored in
bfloat16 (float32 in the float32 and file formats) and only looked up. Tensors are dequantized in slices of rows, so
no tensor is ever held whole in float32 beside its copy (the 151,936-row LM head included). A file that ends before a
tensor's last byte is a one-line ValueError ("truncated or corrupt").

What a load converts (FastLlama's layers in their format, the embedding, norms and biases, the config and the
tokenizer) is written to the converted-weight cache and memory-mapped by later loads of the same file in the same
format (models/weight_cache.py; `load(..., cache=False)` or RELAXSPEC_WEIGHT_CACHE=0: every load converts). A change
to what a load produces here, in quant.Linear's or int4_block.pack's layouts or in FastLlama's layer order raises
weight_cache.VERSION, so that entries written before are rebuilt.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch

from relaxspec.models import gguf_block
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.gguf_block import BlockCodes
from relaxspec.models.quant import GROUP_SIZE, Int4Codes, quantize_int4

SUPPORTED = ("qwen2",)
ROWS_PER_SLICE = 2048  # rows read and dequantized at once (the LM head: 2048 x 1536 float32 = 12.6 MB)

# transformers' state_dict names -> the file's tensor names (llama.cpp's naming for qwen2)
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def file_name(hf_name: str) -> str:
    """The GGUF tensor name of a transformers state_dict name (Qwen2 / Llama layout)."""
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, index, rest = hf_name.split(".", 3)  # model.layers.{i}.{module}.{weight|bias}
    module, _, kind = rest.rpartition(".")
    return f"blk.{index}.{_LAYER[module]}.{kind}"


def _corrupt(path, error: Exception) -> ValueError:
    return ValueError(f"the GGUF file {str(path)!r} is truncated or corrupt ({type(error).__name__}: "
                      f"{str(error).splitlines()[0] if str(error) else 'no message'})")


def open_reader(path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - a short or damaged file: one line
        raise _corrupt(path, e) from None


_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types


def architecture(path) -> str:
    """`general.architecture` read from the file's header alone ("" when it is not among the scalar and string
    keys before the first array: the parsers then decide). GGUFReader parses every key, the tokenizer's 151,936
    strings included: seconds."""
    import struct

    try:
        with open(path, "rb") as f:
            magic, _, _, count = struct.unpack("<4sIQQ", f.read(24))
            if magic != b"GGUF":
                return ""
            for _ in range(count):
                key = f.read(struct.unpack("<Q", f.read(8))[0]).decode()
                kind = struct.unpack("<I", f.read(4))[0]
                if kind == 8:  # a string
                    value = f.read(struct.unpack("<Q", f.read(8))[0])
                    if key == "general.architecture":
                        return value.decode()
                elif kind in _SCALAR_BYTES:
                    f.seek(_SCALAR_BYTES[kind], 1)
                else:
                    return ""
    except (OSError, struct.error, UnicodeDecodeError):
        return ""
    return ""


# ------------------------------------------------------------------ 4-bit types in the int4 form


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of each block, as float32 [rows, blocks]."""
    return np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0].astype(np.float32)


def _int4(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> Int4Codes:
    """Int4Codes from codes [rows, in] and per-group scale, zero [rows, in / 32] (float32)."""
    scale_zero = torch.from_numpy(np.stack([scale, zero], axis=-1)).transpose(0, 1).to(torch.bfloat16).contiguous()
    return Int4Codes(torch.from_numpy(np.ascontiguousarray(codes)), scale_zero)


def q4_k_affine(data: np.ndarray):
    """A Q4_K tensor's rows (uint8 [rows, 144 * blocks]) as (codes uint8 [rows, in], scale, zero float32
    [rows, in / 32]) with w = (q - 8) scale + zero exactly as the file's dequantization (in float32).
    Block of 256: d, dmin (float16), 12 bytes of 6-bit scales and minima for 8 sub-blocks, 128 bytes of codes
    (each 64 weights: 32 bytes, the first sub-block in the low nibbles, the second in the high ones)."""
    rows = data.shape[0]
    d, dmin, sc, mn, codes = gguf_block.q4_k_fields(data)
    d, dmin = (_f16(x, 0)[..., None] for x in (d, dmin))
    scale, minimum = (d * sc).reshape(rows, -1), (dmin * mn).reshape(rows, -1)
    return codes, scale, 8 * scale - minimum


def q4_0_affine(data: np.ndarray):
    """Q4_0 (block of 32: d float16, 16 bytes: weights 0..15 low nibbles, 16..31 high; w = d (q - 8))."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 18)
    d = _f16(blocks, 0)
    qs = blocks[..., 2:].reshape(rows, -1, 1, 16)
    return np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(rows, -1), d, np.zeros_like(d)


def q4_1_affine(data: np.ndarray):
    """Q4_1 (block of 32: d, m float16, 16 bytes of codes as Q4_0; w = d q + m)."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 20)
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    qs = blocks[..., 4:].reshape(rows, -1, 1, 16)
    return np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(rows, -1), d, m + 8 * d


def affine_dense(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """The float32 weight [rows, in] of (codes, scale, zero) per group of 32 (w = (q - 8) scale + zero)."""
    rows = codes.shape[0]
    groups = (codes.reshape(rows, -1, GROUP_SIZE).astype(np.float32) - 8) * scale[..., None] + zero[..., None]
    return groups.reshape(rows, -1)


AFFINE = {"Q4_K": q4_k_affine, "Q4_0": q4_0_affine, "Q4_1": q4_1_affine}  # the 4-bit types kept as int4


# ------------------------------------------------------------------ the source


class _Info:
    __slots__ = ("kind", "shape", "rows_shape", "offset", "n_bytes")

    def __init__(self, kind: str, shape: tuple, rows_shape: tuple, offset: int, n_bytes: int):
        self.kind, self.shape, self.rows_shape, self.offset, self.n_bytes = kind, shape, rows_shape, offset, n_bytes


class GGUFWeights:
    """`source(name)` for FastLlama: the weight of a transformers state_dict name read from the file, as the
    format asks (module docstring's table): quant.Int4Codes, gguf_block.BlockCodes (file), or a float tensor
    (bfloat16 for auto's and bfloat16's matrices and the embedding, float32 in the float32 and file formats, and for
    norms and biases)."""

    def __init__(self, path, reader, weight_format: str):
        """`reader`: a GGUFReader of the file, read for its tensors' names, types, shapes and offsets only (its
        parsed keys are large: it need not outlive this call). Each tensor's bytes are read from the file when
        asked for, into memory of their own: the file is never mapped whole, so its pages do not count in the
        process's resident memory."""
        self.path, self.format = Path(path), weight_format
        self.tensors = {t.name: _Info(t.tensor_type.name, tuple(t.shape), tuple(t.data.shape), int(t.data_offset),
                                      int(t.n_bytes)) for t in reader.tensors}
        self.converted: dict[str, int] = {}  # tensor type -> matrices re-quantized or widened (for the log line)
        self.kept: dict[str, int] = {}  # tensor type -> matrices kept in it (file)
        # file: a tied head (no output.weight) is read from the embedding's tensor in its type, not the float table
        self.tied_head = weight_format == "file" and "output.weight" not in self.tensors

    def _read(self, info: "_Info", start: int = 0, rows: int | None = None) -> np.ndarray:
        """A tensor's bytes from the file (its rows start..start + rows, default all): uint8 [rows, bytes per row]
        for a quantized type, else float32."""
        dtype = np.float32 if info.kind == "F32" else np.uint8
        total = info.rows_shape[0] if len(info.rows_shape) > 1 else 1
        row_bytes = info.n_bytes // total
        rows = total - start if rows is None else min(rows, total - start)
        data = np.fromfile(self.path, dtype=np.uint8, count=rows * row_bytes, offset=info.offset + start * row_bytes)
        if data.size != rows * row_bytes:
            raise ValueError(f"the GGUF file {str(self.path)!r} is truncated or corrupt (tensor data ends "
                             f"{rows * row_bytes - data.size} bytes early)")
        return data.view(dtype).reshape((rows, *info.rows_shape[1:]) if start or rows != total else info.rows_shape)

    def kind(self, hf_name: str) -> str:
        return self.tensors[file_name(hf_name)].kind

    def __call__(self, hf_name: str):
        name = "token_embd.weight" if self.tied_head and hf_name == "lm_head.weight" else file_name(hf_name)
        if name not in self.tensors:
            raise ValueError(f"the GGUF file {str(self.path)!r} has no tensor {name!r} ({hf_name})")
        info = self.tensors[name]
        kind = info.kind
        try:
            if len(info.shape) < 2:  # norms and biases: float32 as stored
                return torch.from_numpy(np.array(self._read(info), dtype=np.float32).reshape(-1))
            if hf_name == "model.embed_tokens.weight":
                return self._dense(info, torch.float32 if self.format in ("float32", "file") else torch.bfloat16)
            if self.format == "file":
                return self._file_type(info)
            if self.format in ("int4", "auto") and kind in AFFINE:
                return _int4(*AFFINE[kind](self._read(info)))
            if self.format == "int4":
                self.converted[kind] = self.converted.get(kind, 0) + 1
                return self._requantized(info)
            if self.format == "auto":
                self.converted[kind] = self.converted.get(kind, 0) + 1
            return self._dense(info, torch.float32 if self.format == "float32" else torch.bfloat16)
        except ValueError as e:
            if "truncated or corrupt" in str(e) or "has no tensor" in str(e):
                raise
            raise _corrupt(self.path, e) from None
        except (IndexError, TypeError, OSError) as e:
            raise _corrupt(self.path, e) from None

    def _file_type(self, info: "_Info"):
        """A matrix in the file format: its type's codes and scales (gguf_block), else float32 (counted)."""
        in_features = int(info.shape[0])  # (GGUF shapes are [in, out])
        if gguf_block.problem(info.kind, (info.rows_shape[0], in_features)) is None:
            self.kept[info.kind] = self.kept.get(info.kind, 0) + 1
            out = [BlockCodes.from_file(info.kind, self._read(info, start, ROWS_PER_SLICE), in_features)
                   for start in range(0, info.rows_shape[0], ROWS_PER_SLICE)]  # (packed slice by slice)
            return out[0] if len(out) == 1 else BlockCodes.cat(out)
        self.converted[info.kind] = self.converted.get(info.kind, 0) + 1
        return self._dense(info, torch.float32)

    def _slices(self, info: "_Info"):
        """(first row, the rows' float32 values) slice by slice, each read from the file when it is dequantized:
        neither the tensor's bytes nor its float32 values are ever held whole."""
        for start in range(0, info.rows_shape[0], ROWS_PER_SLICE):
            yield start, self._float_rows(self._read(info, start, ROWS_PER_SLICE), info.kind)

    def _float_rows(self, rows: np.ndarray, kind: str) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        if kind == "F32":
            return torch.from_numpy(np.array(rows, dtype=np.float32))
        return torch.from_numpy(dequantize(np.asarray(rows), GGMLQuantizationType[kind]).astype(np.float32))

    def _dense(self, info: "_Info", dtype: torch.dtype) -> torch.Tensor:
        out = None
        for start, part in self._slices(info):  # (filled slice by slice: no second whole copy)
            if out is None:
                out = torch.empty((info.rows_shape[0], part.shape[1]), dtype=dtype)
            out[start:start + part.shape[0]] = part
        return out

    def _requantized(self, info: "_Info") -> Int4Codes:
        out = None
        for start, part in self._slices(info):
            codes, scale_zero = quantize_int4(part, GROUP_SIZE)
            if out is None:
                rows = info.rows_shape[0]
                out = Int4Codes(torch.empty((rows, codes.shape[1]), dtype=torch.uint8),
                                torch.empty((scale_zero.shape[0], rows, 2), dtype=torch.bfloat16))
            out.codes[start:start + codes.shape[0]] = codes
            out.scale_zero[:, start:start + codes.shape[0]] = scale_zero
        return out

    def note(self) -> str | None:
        """One line saying what the format did with the tensors that are not 4-bit, or in file the types kept (None:
        nothing to say)."""
        if self.format == "file":
            kept = ", ".join(f"{n} {k}" for k, n in sorted(self.kept.items()))
            other = ", ".join(f"{n} {k}" for k, n in sorted(self.converted.items()))
            return (f"relaxspec: {self.path.name}: every matrix in the file's own type ({kept or 'none'}; "
                    f"the embedding table in float32)" + (f"; without a kernel, in float32: {other}" if other else ""))
        if not self.converted:
            return None
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.converted.items()))
        how = "re-quantized to int4 (min-max, groups of 32)" if self.format == "int4" else "kept in bfloat16"
        return f"relaxspec: {self.path.name}: 4-bit tensors keep the file's codes; the other matrices ({kinds}) {how}"


class Loaded(NamedTuple):
    """A GGUF file read natively: hf.CausalLM's fields. A converted-weight cache hit has no transformers model yet
    (`model` None): `build_model()` builds it (transformers' model class, seconds to import, for what reads it)."""
    model: torch.nn.Module | None
    tokenizer: object
    fast: FastLlama
    config: object
    build_model: Callable[[], torch.nn.Module] | None = None


def load(name: str, path, weight_format: str, device: torch.device, tokenizer_source=None,
         cache: bool | None = None) -> Loaded | None:
    """The model of a GGUF file of a SUPPORTED architecture on a CPU (FastLlama over its weights, the tokenizer, the
    config, the transformers model on the meta device but for its small tensors), or None (another architecture or
    device: transformers' loader serves). `cache` (None: unless RELAXSPEC_WEIGHT_CACHE=0): read the converted-weight
    cache's entries of the file (its weights in this format, memory-mapped, and its tokenizer; models/weight_cache.py)
    when it has them, else convert (or build the tokenizer) and write them."""
    from relaxspec.models import weight_cache

    path = Path(path)
    if device.type != "cpu" or architecture(path) not in SUPPORTED:
        return None
    entry = None
    if weight_cache.enabled(cache):
        try:
            entry = weight_cache.Entry(path, weight_format)
        except OSError:
            entry = None  # (an unreadable file: the reader below says so in one line)
        stored = entry.read() if entry is not None else None
        if stored is not None:
            loaded = _load_stored(entry, stored, weight_format, device)
            if loaded is not None:
                return loaded
    source = GGUFWeights(path, open_reader(path), weight_format)  # (the reader is dropped: its keys are large)
    tokenizer = _tokenizer(path, entry)
    try:
        config = _config(path.parent, gguf_file=path.name)
    except Exception as e:  # noqa: BLE001 - damaged metadata: one line
        raise _corrupt(path, e) from None
    config.tie_word_embeddings = "output.weight" not in source.tensors
    model = _meta_model(config, device)
    fast = FastLlama(model, weight_format, source=source)
    note = source.note()
    if note:
        print(note, file=sys.stderr)
    _materialize(model, fast, source)
    if entry is not None:
        entry.write(model, fast, note)
    return Loaded(model.eval(), tokenizer, fast, config)


def _tokenizer(path: Path, entry):
    """The file's tokenizer: from its tokenizer cache entry when `entry` (the file's weight cache entry, None: the
    cache is off) is given and it holds one, else built from the file's vocabulary (seconds: transformers parses
    every metadata key) and written there."""
    from relaxspec.models import weight_cache

    tokenizer_entry = weight_cache.TokenizerEntry(path, entry.sha256) if entry is not None else None
    tokenizer = tokenizer_entry.read() if tokenizer_entry is not None else None
    if tokenizer is not None:
        return tokenizer
    tokenizer = gguf_tokenizer(path)
    if tokenizer_entry is not None:
        tokenizer_entry.write(tokenizer)
    return tokenizer


def gguf_tokenizer(path: Path):
    """The tokenizer transformers builds from the GGUF file's vocabulary (a damaged file: one line)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:  # noqa: BLE001 - damaged metadata: one line
        raise _corrupt(path, e) from None


def _config(folder, **extra):
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoConfig.from_pretrained(folder, **extra)


def _meta_model(config, device: torch.device):
    """The transformers model of `config` on the meta device, but for its RoPE module (inverse frequencies computed,
    not read from the file) on `device`."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    inner = model.model
    with torch.device(device):
        inner.rotary_emb = type(inner.rotary_emb)(config)
    return model


def _load_stored(entry, stored, weight_format: str, device: torch.device) -> Loaded | None:
    """The model of a cache hit (its config from the entry, the weights mapped, FastLlama run without a transformers
    model: that is built from the same tensors when something reads it), or None with one stderr line when the
    entry turns out unusable (it is then rebuilt)."""
    try:
        config = _config(stored.folder)
        fast = FastLlama.from_stored(config, weight_format, stored.source)
    except Exception as e:  # noqa: BLE001 - whatever a damaged entry makes fail: rebuilt, never used
        entry.refuse(e)
        return None
    if stored.note:
        print(stored.note, file=sys.stderr)
    return Loaded(None, _tokenizer(entry.gguf, entry), fast, config,
                  functools.partial(_stored_model, config, fast, stored.source, device))


def _stored_model(config, fast: FastLlama, source, device: torch.device) -> torch.nn.Module:
    """The transformers model of a cache hit: on the meta device but for the entry's small tensors (`_materialize`)."""
    model = _meta_model(config, device)
    _materialize(model, fast, source)
    return model.eval()


def _materialize(model, fast, source: GGUFWeights) -> None:
    """Give the meta model real tensors: the embedding (FastLlama's own table), norms and biases (small, float32),
    and empty [0, in] linear weights (FastLlama holds them: CausalLM.state_dict reads them back)."""
    for name, param in list(model.named_parameters()):
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if name == "model.embed_tokens.weight":
            value = fast.embed
        elif isinstance(module, torch.nn.Linear) and attr == "weight":
            value = torch.empty((0, module.in_features), dtype=torch.float32)
        else:
            value = source(name).float()
        setattr(module, attr, torch.nn.Parameter(value, requires_grad=False))
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
