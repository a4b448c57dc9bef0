"""Weight formats on a CPU (models/quant.py): float32, bfloat16 and int4 weight-only, for verifiers, LM drafters
and MTP heads; `--dtype int4|bfloat16|float32|auto`."""

import pytest
import torch

from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.drafters import load_drafter
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.hf import CausalLM
from relaxspec.models import int4_block
from relaxspec.models.quant import (FormatLinear, Linear, convert_linears, dequantize_int4, int4_problem,
                                    quantize_int4)
from relaxspec.tasks import synthetic
from helpers import SHORT_PROMPTS, task_prompts, tiny_llama, token_freq

FORMATS = ("float32", "bfloat16", "int4")


def test_int4_codes_and_kernel_match_the_dequantized_weight():
    torch.manual_seed(0)
    w = torch.randn(50, 96)  # 50 output rows: padded to 64 inside, sliced off
    codes, scale_zero = quantize_int4(w)
    assert codes.min() >= 0 and codes.max() <= 15 and scale_zero.shape == (3, 50, 2)
    deq = dequantize_int4(codes, scale_zero)
    step = (w.amax() - w.amin()) / 15
    assert (deq - w).abs().max() <= step  # half a code step (+ bfloat16 scales), per group: within one
    x = torch.randn(7, 96)
    y = Linear(w, "int4")(x)
    ref = x.bfloat16().float() @ deq.t()
    assert y.shape == (7, 50) and y.dtype == torch.float32
    # aten's kernel rounds its output to bfloat16, the block kernel (models/int4_block.py) each dequantized weight:
    # 2^-9 relative either way, so within 2^-8 of sum |x| |w| (plus float32 accumulation)
    bound = 2 ** -8 * (x.bfloat16().float().abs() @ deq.abs().t()) + 1e-4
    assert ((y - ref).abs() <= bound).all(), ((y - ref).abs() / bound).max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_in_each_format_matches_float32_and_adds_the_residual(fmt):
    torch.manual_seed(1)
    w, x, r = torch.randn(640, 512) * 0.05, torch.randn(6, 512), torch.randn(6, 640)  # 640 * 512 >= oneDNN's cut
    lin = Linear(w, fmt)
    ref = x @ w.t()
    tol = {"float32": 1e-4, "bfloat16": 0.05, "int4": 0.6}[fmt]  # bf16 inputs/weights 2^-8; int4: 1/30 of range
    assert (lin(x) - ref).abs().max() < tol
    assert torch.allclose(lin(x, residual=r.clone()), lin(x) + r, atol=1e-5)
    # one copy: 4 / 2 bytes a weight; int4 half a byte plus a bfloat16 scale and zero per 32 weights
    assert lin.nbytes == {"float32": 4, "bfloat16": 2, "int4": 0.5 + 4 / 32}[fmt] * w.numel()


@pytest.mark.parametrize("fmt,impl,shape", [("float32", None, (640, 512)), ("float32", None, (40, 64)),
                                            ("bfloat16", None, (640, 512)), ("int4", "block", (640, 512)),
                                            ("int4", "aten", (640, 512))])
def test_dense_of_some_rows_is_those_rows_of_the_whole(fmt, impl, shape):
    """A head's rows of an LM head (drafters.mtp.verifier_weights) read alone: the whole weight's rows, bit for bit,
    in every layout (oneDNN's, the small-float32 tiles, bfloat16, the int4 block kernel's, aten's int4)."""
    torch.manual_seed(2)
    lin = Linear(torch.randn(*shape) * 0.05, fmt, **({"int4_impl": impl} if impl else {}))
    rows = torch.tensor([shape[0] - 1, 0, 17, 17, 3])
    assert torch.equal(lin.dense(rows), lin.dense()[rows])


@pytest.mark.parametrize("threads", [1, 2])
def test_int4_kernel_gives_a_block_the_numbers_of_single_rows_bf16_within_its_rounding(threads):
    # int4: the numbers of a row do not depend on how many rows are multiplied together (SmolLM2's shapes and a
    # tiny model's), so its linear layers cannot make strict greedy drift from AR greedy. bfloat16 (oneDNN)
    # may block differently: a difference of at most its output rounding (2^-8 relative).
    torch.manual_seed(2)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in ((960, 576), (576, 1536), (384, 128), (714, 128)):
            w, x = torch.randn(shape) * 0.05, torch.randn(9, shape[1])
            lin = Linear(w, "int4")
            assert torch.equal(lin(x), torch.cat([lin(x[i:i + 1]) for i in range(9)])), shape
            lin = Linear(w, "bfloat16")
            block, rows = lin(x), torch.cat([lin(x[i:i + 1]) for i in range(9)])
            assert torch.allclose(block, rows, rtol=2 ** -7, atol=1e-6), shape
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("fmt", ["bfloat16", "int4"])
def test_small_llama_in_each_format_matches_float32_through_both_paths(fmt):
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 12))
    mask, pos = torch.ones_like(ids), torch.arange(12)[None].expand(2, 12)
    ref = CausalLM("f32", model, None, FastLlama(model))
    fast = CausalLM("fast", model, None, FastLlama(model, fmt))
    assert fast.weight_format == fmt and fast.fast.weight_bytes() < ref.fast.weight_bytes()
    want, _ = ref.forward(ids, ref.new_cache(), mask, pos)
    got, hidden = fast.forward(ids, fast.new_cache(), mask, pos, hidden_layer=0)
    assert got.dtype == hidden.dtype == torch.float32
    # Stated tolerance, relative to the largest logit: bf16 rounds every linear's input, weight and output
    # (2^-9 relative each, through two layers and the LM head: within 2^-6); int4 rounds every weight to within
    # half of 1/15 of its group's range: a uniform error of std range / 52, about 0.12 of a Gaussian weight's
    # std, which the outputs inherit in relative RMS (checked below 0.2); int4 against the weights it stands
    # for is checked tightly in the next test.
    if fmt == "bfloat16":
        assert (got - want).abs().max() < 2 ** -6 * want.abs().max(), (got - want).abs().max()
    else:
        assert (got - want).norm() < 0.2 * want.norm(), (got - want).norm() / want.norm()
    tol = 2 ** -6 * want.abs().max()
    assert (got - want).abs().max() > 0  # it did run in the format
    # the transformers path with its nn.Linear layers converted gives the same numbers as FastLlama's
    converted = convert_linears(tiny_llama(), fmt)
    assert isinstance(converted.model.layers[0].mlp.down_proj, FormatLinear)
    other = CausalLM("hf", converted, None, weight_format=fmt)
    assert other.vocab_size == 256 and other.device.type == "cpu"
    theirs, _ = other.forward(ids, other.new_cache(), mask, pos)
    # (int4 on the VNNI path rounds every linear's input to int8, a step of max|x_g| / 127 per group of 32: the
    # two paths' norms, equal to float32 rounding, can land an input on either side of a step, so they agree
    # within twice bfloat16's allowance there)
    vnni = fmt == "int4" and int4_block.path() == "vnni"
    assert (theirs - got).abs().max() < (tol / 2 if vnni else tol / 4)


def test_int4_fast_path_equals_float32_on_the_dequantized_weights():
    # Apart from the bfloat16 rounding of the linear inputs and outputs, int4 is float32 on the weights it stands for.
    model = tiny_llama(seed=3)
    fast = FastLlama(model, "int4")
    with torch.no_grad():
        for lin in (m for m in model.modules() if isinstance(m, torch.nn.Linear)):
            codes, scale_zero = quantize_int4(lin.weight)
            lin.weight.copy_(dequantize_int4(codes, scale_zero))
    ids = torch.randint(0, 256, (1, 10))
    mask, pos = torch.ones_like(ids), torch.arange(10)[None]
    a, _ = CausalLM("int4", model, None, fast).forward(ids, KV(fast), mask, pos)
    b, _ = CausalLM("deq", model, None, FastLlama(model)).forward(ids, KV(FastLlama(model)), mask, pos)
    assert (a - b).abs().max() < 5e-3, (a - b).abs().max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_released_weights_read_back_from_fastllama(fmt):
    """One resident copy: once FastLlama holds a model's linear weights, the transformers copy is dropped and
    CausalLM.state_dict reads them back from FastLlama's (float32: bit for bit, through oneDNN's reordered copy
    and the small-weight kernel's tiles alike; bfloat16: the weights rounded to it; int4: the dequantized weights, to bfloat16)."""
    model = tiny_llama(hidden=256)  # gate_up 1024 x 256 reaches oneDNN's cut, the other linears stay small
    want = {k: v.clone() for k, v in model.state_dict().items()}
    lm = CausalLM("m", model, None, FastLlama(model, fmt))
    if fmt == "float32":
        assert lm.fast.layers[0][4].packed.is_mkldnn and lm.fast.layers[0][5].tiles is not None
    FastLlama.release_weights(model)
    assert model.model.layers[1].self_attn.q_proj.weight.numel() == 0
    got = lm.state_dict()
    assert got.keys() == want.keys()
    for name, w in want.items():
        if fmt == "float32" or "proj" not in name:
            assert torch.equal(got[name], w), name
        elif fmt == "bfloat16":
            assert torch.equal(got[name], w.bfloat16().float()), name
        else:
            deq = dequantize_int4(*quantize_int4(w))
            assert torch.allclose(got[name], deq, rtol=2 ** -8, atol=0), name
    # the transformers model's own copy is still gone: the read-back is a new dict
    assert model.model.layers[1].self_attn.q_proj.weight.numel() == 0


def KV(fast):
    return fast.new_cache()


@pytest.fixture(scope="module")
def pairs():
    """The built-in verifier in each format, with drafter-weak (an LM drafter) and drafter-mtp (an MTP head)."""
    out = {}
    for fmt in FORMATS:
        verifier = load_model("verifier", device="cpu", dtype=fmt)
        out[fmt] = verifier, load_drafter("drafter-weak", verifier), load_drafter("drafter-mtp", verifier)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_model_kind_runs_in_the_format_and_strict_greedy_equals_ar_greedy(pairs, fmt):
    verifier, lm_drafter, mtp = pairs[fmt]
    assert verifier.weight_format == lm_drafter.lm.weight_format == fmt
    assert verifier.dtype == {"float32": torch.float32, "bfloat16": torch.bfloat16, "int4": torch.quint4x2}[fmt]
    assert mtp.lm_head.format == fmt
    if fmt != "float32":
        assert isinstance(mtp.head.layers[0].qkv, FormatLinear)
    # the MTP head drafts through its lean layers (drafters/mtp.py HeadLayers), whose matrices are in the format
    assert [w.format for layer in mtp.fast.layers for w in layer if isinstance(w, Linear)] == [fmt] * 4
    for lm in (verifier, lm_drafter.lm):  # one copy in every format: FastLlama's
        assert lm.model.model.layers[0].mlp.down_proj.weight.numel() == 0
    prompts = task_prompts(3) + task_prompts(2, "sorting")
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=40)
    for drafter in (lm_drafter, mtp):
        strict = generate(verifier, drafter, prompts, method="strict", draft_length=4, max_new_tokens=40)
        assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results], drafter.name
    assert all(len(r.token_ids) > 10 for r in ar.results)


@pytest.mark.parametrize("fmt", ["bfloat16", "int4"])
def test_sampled_strict_is_lossless_in_the_format(pairs, fmt):
    # Monte Carlo, as tests/engine/test_engine.py: the first token's frequencies under strict sampling match the
    # format's own softmax within 5 sigma (n = 1500); the drafter is the MTP head (in the format too).
    verifier, _, mtp = pairs[fmt]
    prompt, n = SHORT_PROMPTS[0], 1500
    sd = generate(verifier, mtp, [prompt] * n, method="strict", draft_length=2, max_new_tokens=2,
                  temperature=1.0, seed=1)
    ids = torch.tensor([verifier.tokenizer(prompt)["input_ids"]])
    logits, _ = verifier.forward(ids, verifier.new_cache(), torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    exact = torch.softmax(logits[0, -1].double(), -1)
    first = token_freq([r.token_ids[0] for r in sd.results], verifier.vocab_size)
    tol = 5 * torch.sqrt(exact * (1 - exact) / n) + 2e-3
    assert ((first - exact).abs() <= tol).all()
    assert exact.max() < 0.9  # not a deterministic first token
    assert sd.stats.drafts_accepted > 0


def test_a_model_that_cannot_be_int4_is_one_clear_line(tmp_path, forker):
    model = tiny_llama(hidden=48)  # 48 inputs: not a multiple of the group size 32
    assert int4_problem((48, 48)) and int4_problem((50, 64)) is None
    model.save_pretrained(tmp_path / "odd")
    from relaxspec.models.family import builtin_path

    import shutil

    for f in builtin_path("verifier").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp_path / "odd" / f.name)
    with pytest.raises(ValueError, match=r"cannot run as int4: layer .* in_features 48 is not a multiple of the "
                                         r"group size 32; use --dtype bfloat16 or float32"):
        load_model(tmp_path / "odd", device="cpu", dtype="int4")
    load_model(tmp_path / "odd", device="cpu", dtype="bfloat16")  # the other formats take it
    out = forker.run(["-m", "relaxspec", "generate", "--verifier", tmp_path / "odd", "--method", "ar", "--prompt", "x",
                      "--dtype", "int4", "--max-new-tokens", "2"], cwd=tmp_path, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot run as int4" in lines[0], out.stderr


def test_int4_off_a_cpu_and_auto_resolution():
    from relaxspec.models.device import resolve_format

    cpu = torch.device("cpu")
    assert resolve_format("int4", cpu) == (torch.float32, "int4")
    assert resolve_format("auto", cpu, lambda: "int4") == (torch.float32, "int4")
    assert resolve_format("auto", cpu, lambda: None) == (torch.float32, "float32")
    assert resolve_format("bfloat16", cpu) == (torch.float32, "bfloat16")
    with pytest.raises(ValueError, match="runs on a GPU only; on a CPU use float32, bfloat16, int4 or auto"):
        resolve_format("float16", cpu)
    with pytest.raises(ValueError, match="int4 runs on a CPU only"):
        resolve_format("int4", torch.device("meta"))


def write_tiny_q4_gguf(path, hidden=64, layers=2, ffn=128, seed=0):
    """A small Llama GGUF with Q4_1 matrices (written with the `gguf` package) and a byte-level tokenizer padded to
    2059 tokens: an embedding with more elements than the blocks, as in a real file (SmolLM2's own tokenizer fields,
    49k tokens and merges, were read back at each of the loads' ten GGUF reads: ~25 s of the test's 28)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from helpers import add_byte_tokenizer

    writer = GGUFWriter(str(path), "llama")
    vocab = add_byte_tokenizer(writer, "smollm", reserved=1800)
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // 4)
    rng = np.random.default_rng(seed)

    def matrix(name, rows, cols):
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        writer.add_tensor(name, quantize(w, GGMLQuantizationType.Q4_1), raw_dtype=GGMLQuantizationType.Q4_1)

    writer.add_tensor("token_embd.weight", (rng.standard_normal((vocab, hidden)) * 0.05).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    kv = hidden // 2
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden),
                                 ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
            matrix(f"blk.{i}.{name}.weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_q4_gguf_runs_as_int4_on_the_files_own_codes(tmp_path):
    import numpy as np
    from gguf import GGUFReader

    from relaxspec.models.quant import gguf_format

    path = write_tiny_q4_gguf(tmp_path / "tiny.Q4_1.gguf")
    assert gguf_format(path) == "int4"  # its blocks are Q4_1 (the embedding, F32, has more elements)
    auto = load_model(path, device="cpu", dtype="auto")
    assert auto.weight_format == "int4" and auto.backend == "fast"
    fp32 = load_model(path, device="cpu", dtype="float32")
    # Re-quantizing the dequantized Q4_1 blocks gives back the file's own 4-bit codes.
    raw = [t for t in GGUFReader(str(path)).tensors if t.name == "blk.1.ffn_down.weight"][0]
    qs = np.asarray(raw.data).reshape(-1, 20)[:, 4:]  # Q4_1 block: fp16 d, fp16 m, 16 bytes of nibbles
    file_codes = torch.from_numpy(np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32)).reshape(64, 128)
    codes, _ = quantize_int4(fp32.state_dict()["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(codes, file_codes)
    # so its blocks are the file's weights up to bfloat16 scales and activations (not a second quantization):
    # the last hidden state (before the LM head, which the file keeps in F32 and int4 quantizes) within 2%
    # relative RMS, where quantizing float weights anew moves a small model's outputs by ~12%.
    ids = torch.randint(0, auto.vocab_size, (1, 16))
    mask, pos = torch.ones_like(ids), torch.arange(16)[None]
    _, a = auto.forward(ids, auto.new_cache(), mask, pos, hidden_layer=-1)
    _, b = fp32.forward(ids, fp32.new_cache(), mask, pos, hidden_layer=-1)
    assert (a - b).norm() < 0.02 * b.norm(), (a - b).norm() / b.norm()
    ar = generate(auto, None, ["Hello"], method="ar", max_new_tokens=6, chat_template="off")
    assert len(ar.results[0].token_ids) > 0
