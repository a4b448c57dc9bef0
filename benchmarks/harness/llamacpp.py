"""The llama.cpp peer: llama-cpp-python (`pip install 'relaxspec[llamacpp]'`, builds llama.cpp from source) on a
GGUF file, and llama.cpp's own speculative loop, the binary llama-speculative-simple (not part of llama-cpp-python:
built from the sources in that package's sdist, docs/real-pair.md, "Speed against llama.cpp")."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from pathlib import Path

INSTALL = "pip install 'relaxspec[llamacpp]'"
SPEC_BINARY = "llama-speculative-simple"
SPEC_DEFAULT_N = 3  # llama-speculative-simple's --spec-draft-n-max default
BIN_ENV = "RELAXSPEC_LLAMA_BIN"
NO_BINARY = (f"llama.cpp speculative: not run (no {SPEC_BINARY} in --llama-bin / ${BIN_ENV}; build it from the "
             "llama-cpp-python==0.3.36 sdist's vendor/llama.cpp, see docs/real-pair.md, 'Speed against llama.cpp')")


def available() -> bool:
    """Whether llama-cpp-python is installed."""
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_path(model: str) -> str:
    """The GGUF file of a model reference (a registry name or a file)."""
    from relaxspec.models.gguf import split_gguf

    return str(Path(*split_gguf(model)))


def llama(path: str, threads: int, context: int, *, logits_all: bool = False, draft=None):
    """llama_cpp.Llama on the GGUF file at `path`, `threads` threads for a token and for a batch, quiet; `logits_all`:
    every position's logits kept (llm.scores); `draft`: its draft model (e.g. LlamaPromptLookupDecoding)."""
    import llama_cpp

    return llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=context,
                           draft_model=draft, logits_all=logits_all, verbose=False)


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the GGUF file, greedy: one Llama per (threads, N), N > 0 its prompt
    lookup (`LlamaPromptLookupDecoding(num_pred_tokens=N)`), N = 0 AR."""

    def __init__(self, path: str, context: int):
        self.path, self.context, self.models = path, context, {}

    def model(self, threads: int, n: int):
        if (threads, n) not in self.models:
            import llama_cpp

            draft = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=n) if n else None
            self.models[threads, n] = llama(self.path, threads, self.context, logits_all=bool(n), draft=draft)
        return self.models[threads, n]

    def run(self, cfg, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy tokens after the token ids `ids` at the configuration's `threads` and `n`."""
        llm = self.model(cfg.threads, cfg.n)
        llm.reset()
        tokens = []
        for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            if llm.token_eos() == token or len(tokens) >= max_new_tokens:
                break
            tokens.append(token)
        return tokens


def spec_binary(directory: str | None) -> Path | None:
    """llama-speculative-simple in `directory` (or $RELAXSPEC_LLAMA_BIN), if it is there."""
    directory = directory or os.environ.get(BIN_ENV)
    if not directory:
        return None
    path = Path(directory) / SPEC_BINARY
    return path if path.is_file() and os.access(path, os.X_OK) else None


class LlamaSpeculative:
    """llama.cpp's own speculative loop: one llama-speculative-simple process per call (its model loading is not
    timed: the binary prints the prompt's and the decoding's times itself)."""

    def __init__(self, binary: Path, verifier: str, drafter: str, context: int):
        self.binary, self.verifier, self.drafter, self.context = binary, verifier, drafter, context

    def run(self, cfg, text: str, max_new_tokens: int) -> dict:
        """parse_spec_log's counts of one greedy call on the text `text`, at the configuration's `threads` and
        `n` (--spec-draft-n-max)."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as prompt:
            prompt.write(text)
            prompt.flush()
            th = str(cfg.threads)
            command = [str(self.binary), "-m", self.verifier, "-md", self.drafter, "-f", prompt.name,
                       "-n", str(max_new_tokens), "-c", str(self.context), "-t", th, "-tb", th, "-td", th, "-tbd", th,
                       "--temp", "0", "--top-k", "1", "--seed", "0", "--spec-type", "draft-simple",
                       "--spec-draft-n-max", str(cfg.n)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"{SPEC_BINARY} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        return parse_spec_log(done.stderr + done.stdout)


def parse_spec_log(log: str) -> dict:
    """What llama-speculative-simple prints at its end: prompt tokens and seconds, tokens decoded and seconds,
    drafted and accepted draft tokens."""
    def find(pattern):
        match = re.search(pattern, log)
        if match is None:
            raise RuntimeError(f"{SPEC_BINARY}: no {pattern!r} in its output")
        return match.groups()

    enc_tokens, enc_s = find(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
    dec_tokens, dec_s = find(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
    return {"prompt_tokens": int(enc_tokens), "tokens": int(dec_tokens), "seconds": float(enc_s) + float(dec_s),
            "drafted": int(find(r"n_drafted\s*=\s*(\d+)")[0]), "accepted": int(find(r"n_accept\s*=\s*(\d+)")[0])}


def last_logits(llm, prompt: list[int], steps: list[int] = ()):
    """The logits (a torch tensor) after the token ids `prompt`, fed in one pass, then each of `steps` in a decode
    step of its own; `llm` keeps every position's logits (logits_all)."""
    import torch

    llm.reset()
    llm.eval(prompt)
    for token in steps:
        llm.eval([token])
    return torch.from_numpy(llm.scores[llm.n_tokens - 1].copy())
