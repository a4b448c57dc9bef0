"""The converted-weight cache: a GGUF file's weights, once converted for FastLlama (models/gguf_weights.py), kept
on disk and memory-mapped by later loads, which then neither read nor convert the file.

Reading a qwen2 GGUF costs seconds to minutes: the `gguf` package parses every metadata key (the 151,936 tokenizer
strings) once for the tensor table, transformers parses them twice more for the config and the tokenizer, and each
tensor is converted (Q4_K to the int4 form and packed into the int4 kernel's layout; other types dequantized). The
first load of a file in a format writes what that produced; a later load maps it: milliseconds for the weights,
well under a second for the config and tokenizer (transformers' own loading of a tokenizer.json).

Key: the GGUF file's SHA-256, the format (int4, auto, file, bfloat16, float32) and, for int4 and auto, the int4
layout this process runs (quant.int4_layout: the block kernel's "vnni" or "bf16", or "aten" with torch's version),
for file its own (quant.file_layout: "blocks", the GGUF block kernel's layout, the same on both of its paths, or
"float32" where that kernel cannot run). A
registry model's hash is its pinned one (the fetch's marker vouches for the file); another file is hashed once and
its hash remembered under `hashes/` by (resolved path, size, mtime_ns, ctime_ns, inode): a file changed in place
(ctime moves even when a tool restores mtime) is hashed again. The conversion code's version (`VERSION`, raised
whenever what a load produces changes) is inside the entry: an entry of another version is stale.

Where: `$RELAXSPEC_WEIGHT_CACHE_DIR`, else `relaxspec.pinned.cache_root() / "weights"` (`~/.cache/relaxspec/weights`
or `$RELAXSPEC_CACHE/weights`). An entry is a folder `<sha256>-<format>[-<layout>]` holding `weights.bin`, the
config and the tokenizer files (transformers' `save_pretrained`). In int4 about 1.3x the GGUF file (the embedding
table is kept in bfloat16: the Qwen2.5-Coder pair, 1.6 GB of files, takes 2.0 GB), more in bfloat16 and float32.
`rm -r ~/.cache/relaxspec/weights` clears it; `RELAXSPEC_WEIGHT_CACHE=0` (or `load_model(..., weight_cache=False)`)
turns it off.

`weights.bin`: 8 bytes magic, a little-endian uint64 n, n bytes of JSON (version, key, the data's size, each
tensor's dtype, shape and offset from the data's start (the first multiple of 64 after the JSON), each linear
layer's kind, the files beside it and their sizes, the format's note line, the tokenizer's vocabulary digest),
then the tensors' bytes, each at an offset that is a multiple of 64. A hit maps the file once (`torch.from_file`,
MAP_PRIVATE: nothing is copied, pages are read as the kernels touch them and count in the resident memory as
file pages) and every tensor is a view of it in the dtype and layout the kernels read (the int4 block kernel's
packed codes and scale / zero words, the GGUF block kernel's records, bfloat16 matrices, the bfloat16 embedding
(float32 in float32 and file), float32 norms and biases);
float32's matrices alone are laid out again for oneDNN (a copy).

Safety: an entry is written into a temporary folder (`.fetch-<pid>-weights-...`, removed by a later write once its
process is gone), its weights file flushed to disk, and renamed into place whole: an interrupted first load leaves
no entry. A stale entry (another version) or a damaged one (bad magic or header, a size other than its header
says, a missing or short file beside it, an unreadable file, a layer this process cannot run, a config or tokenizer
transformers cannot read) is never used: one stderr line says so and the load converts and writes it again. A
cache folder that cannot be written (read only, not a folder, full) leaves the load as without the cache, with one
stderr line. The tensors' bytes are not checksummed (a flipped bit inside a right-sized file goes unnoticed, as
with any mapped weights file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from relaxspec import pinned
from relaxspec.models.prompts import vocab_key

VERSION = 1  # of the conversion (gguf_weights, quant.Linear's layouts, FastLlama's layer order): raise on any change
MAGIC = b"RXSWCACH"
ALIGN = 64
WEIGHTS = "weights.bin"
_DTYPES = {name: getattr(torch, name) for name in ("uint8", "int8", "int16", "int32", "int64", "bfloat16",
                                                  "float16", "float32")}


def enabled(flag: bool | None = None) -> bool:
    """Whether loads use the cache: `flag` when given (load_model's `weight_cache`), else unless
    RELAXSPEC_WEIGHT_CACHE=0."""
    if flag is not None:
        return bool(flag)
    return os.environ.get("RELAXSPEC_WEIGHT_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def directory() -> Path:
    return Path(os.environ.get("RELAXSPEC_WEIGHT_CACHE_DIR") or pinned.cache_root() / "weights")


def _say(line: str) -> None:
    print(f"relaxspec: {line}", file=sys.stderr)


class Damaged(Exception):
    """An entry that must not be used (the message says why)."""


# ------------------------------------------------------------------ the key


def file_sha256(path: Path, root: Path) -> str:
    """The GGUF file's SHA-256: a registry model's pinned one when the fetch's marker vouches for the file, else
    remembered under root/hashes by (resolved path, size, mtime_ns, ctime_ns, inode), else computed (and remembered
    when the folder can be written)."""
    from relaxspec.models import registry

    stat = path.stat()
    for entry in registry.ENTRIES:
        if path.name == entry.file and stat.st_size == entry.size and pinned.is_marked(path, entry.size,
                                                                                          entry.sha256):
            return entry.sha256
    resolved = str(path.resolve())
    identity = {"path": resolved, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
                "inode": stat.st_ino}
    memo = root / "hashes" / (hashlib.sha256(resolved.encode()).hexdigest()[:32] + ".json")
    try:
        known = json.loads(memo.read_text())
        if {k: known.get(k) for k in identity} == identity and len(known.get("sha256", "")) == 64:
            return known["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = pinned.file_sha256(path, progress=False)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        pinned.remove_stale_work(memo.parent)
        fd, tmp = tempfile.mkstemp(prefix=pinned.work_prefix("hash"), dir=memo.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({**identity, "sha256": digest}, f)
        os.replace(tmp, memo)
    except OSError:
        pass  # (a folder that cannot be written: hashed again next time; the entry says so when it is written)
    return digest


def runtime_tag(weight_format: str) -> str:
    """What besides the file and format decides the stored layout: int4's layout (int4 and auto), the file format's
    ("blocks" where its kernel runs, else "float32"), else nothing."""
    if weight_format == "file":
        from relaxspec.models.quant import file_layout

        return file_layout()
    if weight_format not in ("int4", "auto"):
        return ""
    from relaxspec.models.quant import int4_layout

    layout = int4_layout()
    return layout if layout != "aten" else f"aten-torch{torch.__version__.split('+')[0]}"


# ------------------------------------------------------------------ an entry


@dataclass
class Stored:
    """A hit: the entry's folder (config and tokenizer), the note line, and the FastLlama source."""
    folder: Path
    note: str | None
    source: "StoredWeights"
    vocab_key: tuple | None = None  # (vocabulary size, digest): prompts.vocab_key's, computed when it was written

    def keep_vocab_key(self, tokenizer) -> None:
        """Give the tokenizer its vocabulary digest (generate compares a pair's vocabularies: ~0.3 s a tokenizer)."""
        if self.vocab_key is not None and self.vocab_key[0] == len(tokenizer):
            try:
                tokenizer._relaxspec_vocab_key = self.vocab_key
            except AttributeError:
                pass


class StoredWeights:
    """FastLlama's source on a hit: `built` (layers, LM head already in the format) and the small tensors by
    transformers name (embedding, norms, biases), all views of the mapped file."""

    def __init__(self, params: dict[str, torch.Tensor], built):
        self.params, self.built = params, built

    def __call__(self, hf_name: str) -> torch.Tensor:
        if hf_name not in self.params:
            raise Damaged(f"no tensor {hf_name!r}")
        return self.params[hf_name]


@dataclass
class _Built:
    layers: list
    lm_head: object


class Entry:
    """The cache entry of one GGUF file in one format."""

    def __init__(self, gguf_path: Path, weight_format: str):
        self.root = directory()
        self.gguf = Path(gguf_path)
        self.format = weight_format
        self.sha256 = file_sha256(self.gguf, self.root)
        self.tag = runtime_tag(weight_format)
        self.folder = self.root / "-".join(filter(None, (self.sha256, weight_format, self.tag)))

    # ---------------------------------------------------------------- read

    def read(self) -> Stored | None:
        """The entry mapped (None on a miss; on a stale or damaged entry, with one stderr line saying it is
        rebuilt)."""
        if not self.folder.exists():
            return None
        try:
            header, base = self._open()
            if header.get("version") != VERSION:
                _say(f"weight cache entry {pinned.shown(self.folder)} is stale (conversion version "
                     f"{header.get('version')}, now {VERSION}): rebuilding it")
                return None
            return self._stored(header, base)
        except Damaged as e:
            self.refuse(e)
            return None

    def refuse(self, error: BaseException) -> None:
        """The one line for a damaged entry (it is converted and written again)."""
        why = str(error) if isinstance(error, Damaged) else _first_line(error)
        _say(f"weight cache entry {pinned.shown(self.folder)} is damaged ({why}): rebuilding it")

    def _open(self) -> tuple[dict, torch.Tensor]:
        path = self.folder / WEIGHTS
        try:
            with open(path, "rb") as f:
                start = f.read(16)
                if len(start) < 16 or start[:8] != MAGIC:
                    raise Damaged(f"{WEIGHTS} does not start as a weight cache file")
                (n,) = struct.unpack("<Q", start[8:])
                if n > 1 << 28:
                    raise Damaged(f"{WEIGHTS} names a header of {n} bytes")
                text = f.read(n)
                size = os.fstat(f.fileno()).st_size
            if len(text) < n:
                raise Damaged(f"{WEIGHTS} ends inside its header")
            header = json.loads(text)
            if not isinstance(header, dict) or not isinstance(header.get("data_bytes"), int):
                raise Damaged(f"{WEIGHTS}'s header is not an entry's")
            if "version" in header and header["version"] != VERSION:
                return header, None
            header["data_start"] = _data_start(n)
            expected = header["data_start"] + header["data_bytes"]
            if size != expected:
                raise Damaged(f"{WEIGHTS} has {size:,} bytes, not {expected:,}")
            for name, expected in header["files"].items():
                actual = (self.folder / name).stat().st_size
                if actual != expected:
                    raise Damaged(f"{name} has {actual:,} bytes, not {expected:,}")
            if (header["sha256"], header["format"], header["tag"]) != (self.sha256, self.format, self.tag):
                raise Damaged("its header names another file or format")
            base = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
        except Damaged:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
            raise Damaged(_first_line(e)) from None
        return header, base

    def _stored(self, header: dict, base: torch.Tensor) -> Stored:
        from relaxspec.models.fast_llama import BuiltLayer
        from relaxspec.models.quant import Linear

        try:
            tensors = {}
            for name, (dtype, shape, relative) in header["tensors"].items():
                dt = _DTYPES[dtype]
                count = 1
                for d in shape:
                    count *= d
                offset = header["data_start"] + relative
                end = offset + count * dt.itemsize
                if offset % ALIGN or not header["data_start"] <= offset <= end <= base.numel():
                    raise Damaged(f"tensor {name!r} lies outside {WEIGHTS}")
                tensors[name] = base[offset:end].view(dt).view(shape)

            def linear(prefix: str):
                meta = header["linears"][prefix]
                return Linear.restore(meta, {k: tensors[f"{prefix}.{k}"] for k in meta["tensors"]})

            layers = [BuiltLayer((tensors[f"layers.{i}.w_in"], linear(f"layers.{i}.qkv"), linear(f"layers.{i}.o"),
                                  tensors[f"layers.{i}.w_post"], linear(f"layers.{i}.gate_up"),
                                  linear(f"layers.{i}.down")), tensors.get(f"layers.{i}.qkv_bias"))
                      for i in range(header["layers"])]
            built = _Built(layers, linear("lm_head"))
            params = {name.removeprefix("params."): t for name, t in tensors.items() if name.startswith("params.")}
        except Damaged:
            raise
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise Damaged(_first_line(e)) from None
        vocab_key = header.get("vocab_key")
        return Stored(self.folder, header.get("note"), StoredWeights(params, built),
                      tuple(vocab_key) if isinstance(vocab_key, list) and len(vocab_key) == 2 else None)

    # ---------------------------------------------------------------- write

    def write(self, model, tokenizer, fast, note: str | None) -> None:
        """Store what a conversion produced (the meta model's config and small tensors, the tokenizer, FastLlama's
        layers and LM head) as this entry, atomically; a folder that cannot be written: one stderr line."""
        tensors, linears = _collect(model, fast)
        work = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            pinned.remove_stale_work(self.root)
            work = Path(tempfile.mkdtemp(prefix=pinned.work_prefix("weights"), dir=self.root))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(work, 0o777 & ~umask)  # (mkdtemp's folder is private)
            model.config.save_pretrained(work)
            tokenizer.save_pretrained(work)
            files = {p.name: p.stat().st_size for p in sorted(work.iterdir())}
            header = {"version": VERSION, "sha256": self.sha256, "format": self.format, "tag": self.tag,
                      "gguf": self.gguf.name, "note": note, "layers": len(fast.layers), "files": files,
                      "linears": linears, "vocab_key": [len(tokenizer), vocab_key(tokenizer)]}
            size = _write_weights(work / WEIGHTS, header, tensors)
            self._place(work)
            work = None
            _say(f"{self.gguf.name}: converted weights ({pinned.human_size(size)}) cached in "
                 f"{pinned.shown(self.folder)}; later loads map them")
        except OSError as e:
            _say(f"cannot write the weight cache in {pinned.shown(self.root)} ({e.strerror or _first_line(e)}): "
                 f"the weights stay converted in memory only")
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)

    def _place(self, work: Path) -> None:
        """Rename the written folder into place, an old entry (stale or damaged) moved aside first and removed."""
        old = None
        if self.folder.exists():
            old = Path(tempfile.mkdtemp(prefix=pinned.work_prefix("old"), dir=self.root)) / "entry"
            os.rename(self.folder, old)
        try:
            os.rename(work, self.folder)
        except OSError:
            if not self.folder.is_dir():
                raise
            shutil.rmtree(work, ignore_errors=True)  # (another load placed the entry first)
        finally:
            if old is not None:
                shutil.rmtree(old.parent, ignore_errors=True)


def _collect(model, fast) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """(tensors by entry name, linear layers' meta by prefix) of a converted model."""
    tensors: dict[str, torch.Tensor] = {"params.model.embed_tokens.weight": fast.embed}
    for name, param in model.named_parameters():
        if param.numel() and name != "model.embed_tokens.weight":
            tensors[f"params.{name}"] = param.detach()
    linears: dict[str, dict] = {}

    def linear(prefix: str, layer) -> None:
        meta, parts = layer.state()
        linears[prefix] = {**meta, "tensors": sorted(parts)}
        tensors.update({f"{prefix}.{k}": t for k, t in parts.items()})

    for i, (w_in, qkv, o, w_post, gate_up, down) in enumerate(fast.layers):
        tensors[f"layers.{i}.w_in"], tensors[f"layers.{i}.w_post"] = w_in, w_post
        if fast.qkv_bias[i] is not None:
            tensors[f"layers.{i}.qkv_bias"] = fast.qkv_bias[i]
        for part, layer in (("qkv", qkv), ("o", o), ("gate_up", gate_up), ("down", down)):
            linear(f"layers.{i}.{part}", layer)
    linear("lm_head", fast.lm_head)
    return tensors, linears


def _data_start(header_bytes: int) -> int:
    return -(-(16 + header_bytes) // ALIGN) * ALIGN


def _write_weights(path: Path, header: dict, tensors: dict[str, torch.Tensor]) -> int:
    """weights.bin (module docstring's layout; offsets counted from the data's start, the first multiple of ALIGN
    after the header), flushed to disk; its size."""
    table, offset = {}, 0
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"weight cache: tensor {name!r} of dtype {dtype}")
        table[name] = [dtype, list(t.shape), offset]
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    text = json.dumps({**header, "tensors": table, "data_bytes": offset}).encode()
    data_start = _data_start(len(text))
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(text)) + text)
        f.write(b"\0" * (data_start - 16 - len(text)))
        for t in tensors.values():
            flat = t.detach().contiguous().reshape(-1)
            n = flat.numel() * flat.element_size()
            if n:
                f.write(memoryview(flat.view(torch.uint8).numpy()))
            f.write(b"\0" * (-n % ALIGN))
        f.flush()
        os.fsync(f.fileno())
    return data_start + offset


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
