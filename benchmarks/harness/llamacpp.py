"""The llama.cpp peer: llama-cpp-python (`pip install 'relaxspec[llamacpp]'`, builds llama.cpp from source) on a
GGUF file, and llama.cpp's own speculative loop, the binary llama-speculative-simple (not part of llama-cpp-python:
built from the sources in that package's sdist, docs/real-pair.md, "Speed against llama.cpp")."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

INSTALL = "pip install 'relaxspec[llamacpp]'"
SPEC_BINARY = "llama-speculative-simple"
SPEC_DEFAULT_N = 3  # llama-speculative-simple's --spec-draft-n-max default
QUANTIZE_BINARY = "llama-quantize"
BENCH_BINARY = "llama-bench"
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
    return _tool(Path(directory), SPEC_BINARY)


@dataclass(frozen=True)
class Recipe:
    """One configuration of llama.cpp's own speculative loop (llama-speculative-simple): its --spec-type, the draft
    bounds (--spec-draft-n-max / -n-min / -p-min; this version's defaults 3 / 0 / 0), ngram-simple's n-gram and
    m-gram sizes, and whether the draft model is the drafter re-quantized to Q4_0 (a type llama.cpp's x86 code
    repacks; the 0.5B ships Q5_0 / Q6_K / Q8_0 matrices it runs row by row)."""

    spec_type: str = "draft-simple"
    n_max: int = SPEC_DEFAULT_N
    n_min: int = 0
    p_min: float = 0.0
    ngram: tuple[int, int] | None = None  # (size n, size m) of ngram-simple
    q4_0: bool = False

    @property
    def uses_drafter(self) -> bool:
        return self.spec_type.startswith("draft")

    @property
    def label(self) -> str:
        """The table's method: "speculative" at this version's defaults, else what differs; "lookup" for n-grams."""
        if not self.uses_drafter:
            return f"lookup {self.spec_type}" + (f" n {self.ngram[0]} m {self.ngram[1]}" if self.ngram else "")
        extra = [f"n-min {self.n_min}"] * bool(self.n_min) + [f"p-min {self.p_min:g}"] * bool(self.p_min) + \
            ["Q4_0 draft"] * self.q4_0
        return " ".join(["speculative", *extra])

    def flags(self) -> list[str]:
        out = ["--spec-type", self.spec_type, "--spec-draft-n-max", str(self.n_max)]
        out += ["--spec-draft-n-min", str(self.n_min)] if self.n_min else []
        out += ["--spec-draft-p-min", f"{self.p_min:g}"] if self.p_min else []
        if self.ngram:
            out += ["--spec-ngram-simple-size-n", str(self.ngram[0]), "--spec-ngram-simple-size-m", str(self.ngram[1])]
        return out


def recipes(draft_lengths) -> list[Recipe]:
    """The sweep: this version's defaults at each N; the tuned CPU recipe (n-max 16, n-min 4 or 5, p-min 0.75); n-max
    4 / 8 / 16 x p-min 0.5 / 0.9; prompt lookup (ngram-simple, n-grams of 3 drafting 3 or 8 tokens, and its own
    defaults 12 / 48); the defaults at N = 3 and the tuned recipe with the drafter in Q4_0."""
    out = [Recipe(n_max=n) for n in draft_lengths]
    out += [Recipe(n_max=16, n_min=k, p_min=0.75) for k in (4, 5)]
    out += [Recipe(n_max=n, p_min=p) for n in (4, 8, 16) for p in (0.5, 0.9)]
    out += [Recipe("ngram-simple", n_max=m, ngram=(3, m)) for m in (3, 8)] + [Recipe("ngram-simple", n_max=48,
                                                                                     ngram=(12, 48))]
    out += [Recipe(n_max=3, q4_0=True), Recipe(n_max=16, n_min=4, p_min=0.75, q4_0=True)]
    return list(dict.fromkeys(out))


def quantized_drafter(directory: Path, drafter: str) -> str | None:
    """The drafter's GGUF re-quantized to Q4_0 by llama-quantize (in `directory`, beside the speculative binary),
    made once into relaxspec's cache; None where llama-quantize is not built."""
    tool = _tool(directory, QUANTIZE_BINARY)
    if tool is None:
        return None
    from relaxspec.pinned import cache_root

    out = cache_root() / "llamacpp" / (Path(drafter).stem + "-q4_0.gguf")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        done = subprocess.run([str(tool), "--allow-requantize", drafter, str(tmp), "Q4_0"], capture_output=True,
                              text=True)
        if done.returncode:
            raise RuntimeError(f"{QUANTIZE_BINARY} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        tmp.replace(out)
    return str(out)


class LlamaSpeculative:
    """llama.cpp's own speculative loop: one llama-speculative-simple process per call (its model loading is not
    timed: the binary prints the prompt's and the decoding's times itself). The prompt goes as an argument (`-f`
    drops a file's trailing newline: another prompt), and its token count is checked against ours."""

    def __init__(self, binary: Path, verifier: str, drafter: str, context: int):
        self.binary, self.verifier, self.drafter, self.context = binary, verifier, drafter, context
        self.q4_0 = quantized_drafter(binary.parent, drafter)

    def serves(self, recipe: Recipe) -> bool:
        """Whether this build runs the recipe (a Q4_0 draft needs llama-quantize)."""
        return not recipe.q4_0 or self.q4_0 is not None

    def run(self, cfg, ids: list[int], text: str, max_new_tokens: int) -> dict:
        """parse_spec_log's counts of one greedy call on `text` (whose token ids are `ids`) with the configuration's
        recipe at its `threads`; "tokens" counted as every other row counts them: without the end-of-turn token."""
        recipe, th = cfg.recipe, str(cfg.threads)
        draft = ["-md", self.q4_0 if recipe.q4_0 else self.drafter] if recipe.uses_drafter else []
        command = [str(self.binary), "-m", self.verifier, *draft, "-p", text, "-n", str(max_new_tokens),
                   "-c", str(self.context), "-t", th, "-tb", th, "-td", th, "-tbd", th, "--temp", "0", "--top-k", "1",
                   "--seed", "0", *recipe.flags()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"{SPEC_BINARY} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        got = parse_spec_log(done.stderr + done.stdout)
        if got["prompt_tokens"] != len(ids):
            raise RuntimeError(f"{SPEC_BINARY} made {got['prompt_tokens']} prompt tokens of the text, ours "
                               f"{len(ids)}: not the same prompt")
        got["tokens"] = spec_tokens(got["tokens"], max_new_tokens)
        return got


def spec_tokens(n_predict: int, max_new_tokens: int) -> int:
    """The binary's token count as ours: it counts the end-of-turn token of an answer that ended (n_predict at most
    -n: it stops past -n otherwise, having counted every token of its last round)."""
    return n_predict - 1 if n_predict <= max_new_tokens else n_predict


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


def _tool(directory: Path, name: str) -> Path | None:
    path = directory / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def binary_version(binary: Path) -> str:
    """A llama.cpp binary's build, or "unknown": `--version` prints "version: NUMBER (COMMIT)" in llama.cpp's own
    builds ("bNUMBER (COMMIT)" here) and "version: NAME (build NUMBER, commit COMMIT)" in the one vendored by
    llama-cpp-python ("NAME (COMMIT)" here)."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return parse_version(done.stderr + done.stdout)


def parse_version(text: str) -> str:
    """The build named by a llama.cpp binary's `--version` output (binary_version)."""
    match = re.search(r"version:\s*(\S+)\s*\((?:build\s*\d+,\s*commit\s*)?(\w+)\)", text)
    if match is None:
        return "unknown"
    name, commit = match.groups()
    return f"b{name} ({commit})" if name.isdigit() else f"{name} ({commit})"


def block_costs(directory: Path, model: str, threads: int, depth: int = 200, widths=tuple(range(1, 9)),
                repetitions: int = 5) -> dict | None:
    """llama.cpp's own cost of a verify block: llama-bench's time for a prompt of k tokens after `depth` tokens in
    the cache, k in `widths` (parse_bench_json); None where llama-bench is not built beside the binary."""
    tool = _tool(directory, BENCH_BINARY)
    if tool is None:
        return None
    done = subprocess.run([str(tool), "-m", model, "-p", ",".join(map(str, widths)), "-n", "0", "-d", str(depth),
                           "-t", str(threads), "-r", str(repetitions), "-o", "json"], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{BENCH_BINARY} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return parse_bench_json(done.stdout)


def parse_bench_json(text: str) -> dict:
    """llama-bench's JSON (-o json) of prompt-only tests: {"ms": {k: ms of a k-token prompt}, "c_block": {k: that
    over a 1-token one's}, "depth": its context, "version": its build}."""
    tests = [t for t in json.loads(text) if t["n_gen"] == 0]
    if not tests:
        raise RuntimeError(f"{BENCH_BINARY}: no prompt test in its output")
    ms = {t["n_prompt"]: t["avg_ns"] / 1e6 for t in tests}
    one = ms.get(1)
    return {"ms": ms, "c_block": {k: v / one for k, v in ms.items()} if one else {}, "depth": tests[0].get("n_depth"),
            "version": f"b{tests[0]['build_number']} ({tests[0]['build_commit']})"}
