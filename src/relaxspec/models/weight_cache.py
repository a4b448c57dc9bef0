"""The converted-weight cache: a GGUF file's weights, once converted for FastLlama (models/gguf_weights.py), and its
tokenizer, kept on disk and read back by later loads, which then neither read nor convert the file.

Reading a qwen2 GGUF costs seconds to minutes: the `gguf` package parses every metadata key (the 151,936 tokenizer
strings) once for the tensor table, transformers parses them twice more for the config and the tokenizer, and each
tensor is converted (Q4_K to the int4 form and packed into the int4 kernel's layout; other types dequantized). The
first load of a file in a format writes what that produced; a later load maps it: milliseconds for the weights, a
few hundred milliseconds for the tokenizer (its `tokenizer.json` parsed by the `tokenizers` package).

Two kinds of entry, each a folder under the cache's folder named by the GGUF file's SHA-256:

* the weights of one format, `<sha256>-<format>[-<layout>]`: the format (int4, auto, file, bfloat16, float32) and,
  for int4 and auto, the int4 layout this process runs (quant.int4_layout: the block kernel's "vnni" or "bf16", or
  "aten" with torch's version), for file its own (quant.file_layout: "blocks", the GGUF block kernel's layout, the
  same on both of its paths, or "float32" where that kernel cannot run). It holds `weights.bin` and the model's
  `config.json`; the conversion code's version (`VERSION`, raised whenever what a load produces changes) is inside
  `weights.bin`;
* the tokenizer, `<sha256>-tokenizer` (one for every format): `tokenizer.json`, the backend transformers built from
  the file's vocabulary, serialized as it is (read back with `tokenizers.Tokenizer`, not rebuilt by a tokenizer
  class: the same tokenizer as the converting load's), and `entry.json`: its version (`TOKENIZER_VERSION`), the
  file's SHA-256, tokenizer.json's size and SHA-256, the settings transformers wraps it with (special tokens, chat
  template, ...) and the vocabulary's digest (prompts.vocab_key, which generate compares a pair by).

A registry model's hash is its pinned one (the fetch's marker vouches for the file); another file is hashed once and
its hash remembered under `hashes/` by (resolved path, size, mtime_ns, ctime_ns, inode): a file changed in place
(ctime moves even when a tool restores mtime) is hashed again.

Where: `$RELAXSPEC_WEIGHT_CACHE_DIR`, else `relaxspec.pinned.cache_root() / "weights"` (`~/.cache/relaxspec/weights`
or `$RELAXSPEC_CACHE/weights`). In int4 about 1.3x the GGUF file (the embedding table is kept in bfloat16: the
Qwen2.5-Coder pair, 1.6 GB of files, takes 2.0 GB), more in bfloat16 and float32; a tokenizer about 11 MB.
`rm -r ~/.cache/relaxspec/weights` clears it; `RELAXSPEC_WEIGHT_CACHE=0` (or `load_model(..., weight_cache=False)`)
turns it off.

`weights.bin`: 8 bytes magic, a little-endian uint64 n, n bytes of JSON (version, key, the data's size, each
tensor's dtype, shape and offset from the data's start (the first multiple of 64 after the JSON), each linear
layer's kind, the files beside it and their sizes, the format's note line, the model's parameter count and RoPE
scale), then the tensors' bytes, each at an offset that is a multiple of 64. A hit maps the file once
(`torch.from_file`, MAP_PRIVATE: nothing is copied, pages are read as the kernels touch them and count in the
resident memory as file pages) and every tensor is a view of it in the dtype and layout the kernels read (the int4
block kernel's packed codes and scale / zero words, the GGUF block kernel's records, bfloat16 matrices, the bfloat16
embedding (float32 in float32 and file), float32 norms, biases and RoPE frequencies); float32's matrices alone are
laid out again for oneDNN (a copy). A hit needs no transformers model: FastLlama runs from the entry alone, and the
model (on the meta device, with the entry's small tensors) is built only when something reads it (hf.CausalLM).

Tokenizers: the tokenizers of two files with the same tokenizer.json and settings (a chat template aside) share one
parsed backend in a process (the Qwen2.5-Coder pair's: parsed once for the verifier and its drafter).

Safety: an entry is written into a temporary folder (`.fetch-<pid>-weights-...`, `.fetch-<pid>-tokenizer-...`,
removed by a later write once its process is gone), its weights file flushed to disk, and renamed into place whole:
an interrupted first load leaves no entry. A stale entry (another version) or a damaged one (weights: bad magic or
header, a size other than its header says, a missing or short file beside it, an unreadable file, a layer this
process cannot run, a config transformers cannot read; tokenizer: an unreadable or malformed entry.json, a
tokenizer.json of another size or SHA-256, one the `tokenizers` package or transformers cannot read) is never used:
one stderr line says so and the load converts (or builds the tokenizer) and writes it again. A cache folder that
cannot be written (read only, not a folder, full) leaves the load as without the cache, with one stderr line per
entry. The weights' bytes are not checksummed (a flipped bit inside a right-sized file goes unnoticed, as with any
mapped weights file); the tokenizer's are.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from relaxspec import pinned
from relaxspec.models.prompts import vocab_key

VERSION = 2  # of the conversion (gguf_weights, quant.Linear's layouts, FastLlama's layer order): raise on any change
TOKENIZER_VERSION = 1  # of the tokenizer's entry (what is stored, how it is read back): raise on any change
MAGIC = b"RXSWCACH"
ALIGN = 64
WEIGHTS = "weights.bin"
TOKENIZER, TOKENIZER_ENTRY = "tokenizer.json", "entry.json"
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


class Stale(Damaged):
    """An entry written by another version of its code (the message: "<what> version N, now M")."""


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


class _Entry:
    """What both kinds of entry share: the folder `<SHA-256 of the GGUF file>-<suffix>` under the cache's folder, the
    read (a subclass's `_read` raises Stale or Damaged for an entry it must not use), the lines a stale, damaged or
    unwritable one prints, and the atomic write (a temporary folder renamed into place)."""

    kind = ""  # "weight" or "tokenizer": the lines name the "<kind> cache"
    work_name = ""  # the temporary folder's name: .fetch-<pid>-<work_name>-...
    unwritten = ""  # what the line of an unwritable cache says happens instead

    def __init__(self, gguf_path: Path, suffix: str, sha256: str | None = None):
        self.root = directory()
        self.gguf = Path(gguf_path)
        self.sha256 = sha256 or file_sha256(self.gguf, self.root)
        self.folder = self.root / f"{self.sha256}-{suffix}"

    def read(self):
        """What the entry holds (`_read`), or None: a miss, or a stale or damaged entry, never used (one stderr line
        says it is rebuilt)."""
        if not self.folder.exists():
            return None
        try:
            return self._read()
        except Damaged as e:
            self.refuse(e)
            return None

    def refuse(self, error: BaseException) -> None:
        """The one line for an entry that is not used, stale or damaged (it is built and written again)."""
        why = str(error) if isinstance(error, Damaged) else _first_line(error)
        state = "stale" if isinstance(error, Stale) else "damaged"
        _say(f"{self.kind} cache entry {pinned.shown(self.folder)} is {state} ({why}): rebuilding it")

    def _store(self, fill) -> int | None:
        """`fill(work folder)` (it returns the entry's size) into a temporary folder renamed into place; the size, or
        None with one stderr line where the cache folder cannot be written."""
        work = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            pinned.remove_stale_work(self.root)
            work = Path(tempfile.mkdtemp(prefix=pinned.work_prefix(self.work_name), dir=self.root))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(work, 0o777 & ~umask)  # (mkdtemp's folder is private)
            size = fill(work)
            self._place(work)
            work = None
            return size
        except OSError as e:
            _say(f"cannot write the {self.kind} cache in {pinned.shown(self.root)} ({e.strerror or _first_line(e)}): "
                 f"{self.unwritten}")
            return None
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


@dataclass
class Stored:
    """A hit: the entry's folder (config), the note line, and the FastLlama source."""
    folder: Path
    note: str | None
    source: "StoredWeights"


class StoredWeights:
    """FastLlama's source on a hit (FastLlama.from_stored): `built` (layers, LM head already in the format), the RoPE
    frequencies and scale, the model's parameter count, and the small tensors by transformers name (embedding, norms,
    biases), all views of the mapped file."""

    def __init__(self, params: dict[str, torch.Tensor], built, inv_freq: torch.Tensor, rope_scale: float,
                 num_parameters: int):
        self.params, self.built = params, built
        self.inv_freq, self.rope_scale, self.num_parameters = inv_freq, rope_scale, num_parameters

    def __call__(self, hf_name: str) -> torch.Tensor:
        if hf_name not in self.params:
            raise Damaged(f"no tensor {hf_name!r}")
        return self.params[hf_name]


@dataclass
class _Built:
    layers: list
    lm_head: object


class Entry(_Entry):
    """The weight cache entry of one GGUF file in one format."""

    kind, work_name, unwritten = "weight", "weights", "the weights stay converted in memory only"

    def __init__(self, gguf_path: Path, weight_format: str):
        self.format = weight_format
        self.tag = runtime_tag(weight_format)
        super().__init__(gguf_path, "-".join(filter(None, (weight_format, self.tag))))

    # ---------------------------------------------------------------- read

    def _read(self) -> Stored:
        """The entry mapped."""
        return self._stored(*self._open())

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
            if header.get("version") != VERSION:
                raise Stale(f"conversion version {header.get('version')}, now {VERSION}")
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
            source = StoredWeights(params, built, tensors["rope.inv_freq"], float(header["rope_scale"]),
                                   int(header["num_parameters"]))
        except Damaged:
            raise
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise Damaged(_first_line(e)) from None
        return Stored(self.folder, header.get("note"), source)

    # ---------------------------------------------------------------- write

    def write(self, model, fast, note: str | None) -> None:
        """Store what a conversion produced (the meta model's config and small tensors, FastLlama's layers, LM head
        and RoPE frequencies) as this entry, atomically; a folder that cannot be written: one stderr line."""
        tensors, linears = _collect(model, fast)

        def fill(work: Path) -> int:
            model.config.save_pretrained(work)
            files = {p.name: p.stat().st_size for p in sorted(work.iterdir())}
            header = {"version": VERSION, "sha256": self.sha256, "format": self.format, "tag": self.tag,
                      "gguf": self.gguf.name, "note": note, "layers": len(fast.layers), "files": files,
                      "linears": linears, "num_parameters": fast.num_parameters, "rope_scale": fast.rope_scale}
            return _write_weights(work / WEIGHTS, header, tensors)

        size = self._store(fill)
        if size is not None:
            _say(f"{self.gguf.name}: converted weights ({pinned.human_size(size)}) cached in "
                 f"{pinned.shown(self.folder)}; later loads map them")


def _collect(model, fast) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """(tensors by entry name, linear layers' meta by prefix) of a converted model."""
    tensors: dict[str, torch.Tensor] = {"params.model.embed_tokens.weight": fast.embed,
                                        "rope.inv_freq": fast.inv_freq}
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


# ------------------------------------------------------------------ the tokenizer's entry


class TokenizerEntry(_Entry):
    """The tokenizer cache entry of one GGUF file (the same for every format)."""

    kind, work_name, unwritten = "tokenizer", "tokenizer", "the tokenizer is built from the GGUF file on every load"

    def __init__(self, gguf_path: Path, sha256: str | None = None):
        super().__init__(gguf_path, "tokenizer", sha256)

    def _read(self):
        """The stored tokenizer: a transformers PreTrainedTokenizerFast over the stored backend."""
        try:
            manifest = json.loads((self.folder / TOKENIZER_ENTRY).read_text())
            if not isinstance(manifest, dict) or not isinstance(manifest.get("version"), int):
                raise Damaged(f"{TOKENIZER_ENTRY} is not an entry's")
            if manifest["version"] != TOKENIZER_VERSION:
                raise Stale(f"tokenizer version {manifest['version']}, now {TOKENIZER_VERSION}")
            if manifest["sha256"] != self.sha256:
                raise Damaged(f"{TOKENIZER_ENTRY} names another file")
            data = (self.folder / TOKENIZER).read_bytes()
            expected = manifest["tokenizer_json"]
            if len(data) != expected["size"]:
                raise Damaged(f"{TOKENIZER} has {len(data):,} bytes, not {expected['size']:,}")
            digest = hashlib.sha256(data).hexdigest()
            if digest != expected["sha256"]:
                raise Damaged(f"{TOKENIZER}'s SHA-256 is not the one written")
            tokenizer = _wrap(data, digest, manifest["settings"])
            known = manifest["vocab_key"]
            if isinstance(known, list) and len(known) == 2 and known[0] == len(tokenizer):
                tokenizer._relaxspec_vocab_key = tuple(known)  # (prompts.vocab_key's, computed when it was written)
            return tokenizer
        except Damaged:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a damaged entry makes fail: rebuilt, never used
            raise Damaged(_first_line(e)) from None

    def write(self, tokenizer) -> None:
        """Store `tokenizer` (built from the GGUF file) as this entry, atomically; a folder that cannot be written:
        one stderr line."""

        def fill(work: Path) -> int:
            saved = work / "saved"
            tokenizer.save_pretrained(saved)  # (transformers' own serialization of the settings)
            settings = {k: v for k, v in json.loads((saved / "tokenizer_config.json").read_text()).items()
                        if k not in _NOT_SETTINGS}
            template = saved / "chat_template.jinja"
            if template.is_file():
                settings["chat_template"] = template.read_text()
            shutil.rmtree(saved)
            tokenizer.backend_tokenizer.save(str(work / TOKENIZER))  # the backend as it runs, not rebuilt
            data = (work / TOKENIZER).read_bytes()
            manifest = {"version": TOKENIZER_VERSION, "sha256": self.sha256, "gguf": self.gguf.name,
                        "tokenizer_json": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                        "settings": settings, "vocab_key": [len(tokenizer), vocab_key(tokenizer)]}
            (work / TOKENIZER_ENTRY).write_text(json.dumps(manifest))
            return len(data)

        self._store(fill)


# tokenizer_config.json's keys that are not the wrapper's settings (the class, where it was read from)
_NOT_SETTINGS = ("tokenizer_class", "backend", "is_local", "local_files_only", "name_or_path", "auto_map",
                 "added_tokens_decoder", "tokenizer_file", "vocab_file", "merges_file")
_shared = weakref.WeakValueDictionary()  # (tokenizer.json's SHA-256, settings but the chat template) -> a tokenizer


def _wrap(data: bytes, digest: str, settings: dict):
    """A PreTrainedTokenizerFast with `settings` over the backend serialized in `data` (tokenizer.json's bytes, of
    SHA-256 `digest`): parsed, or the backend of a tokenizer read before from the same bytes with the same settings
    (a chat template aside), which its wrappers share."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    key = (digest, json.dumps({k: v for k, v in settings.items() if k != "chat_template"}, sort_keys=True))
    other = _shared.get(key)
    tokenizer = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    # (its __init__ wraps a backend already set, as a tokenizer class that builds its own backend does)
    tokenizer._tokenizer = other._tokenizer if other is not None else tokenizers.Tokenizer.from_buffer(data)
    tokenizer.__init__(**settings)
    _shared[key] = tokenizer
    return tokenizer


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
