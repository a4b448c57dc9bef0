"""GGUF files read tensor by tensor in their own quantization (models/gguf_weights.py): each quant type against
the `gguf` package's dequantization, the 4-bit types' codes kept exactly in int4, and a small Qwen2 file written
here loaded natively against transformers' own GGUF loader."""

import numpy as np
import pytest
import torch

from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from relaxspec.models import load_model
from relaxspec.models.gguf_weights import AFFINE, GGUFWeights, affine_dense, architecture, open_reader
from relaxspec.models.quant import quantize_int4
from helpers import kquant_blocks, logits_of, qwen2_file, write_qwen2  # noqa: F401  (qwen2_file: a fixture)

RNG = np.random.default_rng(0)


def four_bit(kind: str, rows: int, cols: int) -> np.ndarray:
    if kind == "Q4_K":
        return kquant_blocks(kind, rows, cols, RNG)
    return quantize(RNG.standard_normal((rows, cols)).astype(np.float32) * 0.05, GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_0", "Q4_1"])
def test_four_bit_types_map_exactly_onto_the_int4_form(kind):
    data = four_bit(kind, 8, 512)
    reference = dequantize(data, GGMLQuantizationType[kind])
    codes, scale, zero = AFFINE[kind](data)
    assert codes.min() >= 0 and codes.max() <= 15 and codes.shape == reference.shape
    assert np.array_equal(affine_dense(codes, scale, zero), reference)  # the file's own values, exactly


def test_native_float32_load_matches_transformers_gguf_loader(qwen2_file):
    assert architecture(qwen2_file) == "qwen2"
    native = load_model(qwen2_file, dtype="float32")
    slow = load_model(qwen2_file, dtype="float32", backend="transformers")
    assert native.backend == "fast" and native.model.lm_head.weight.numel() == 0  # one copy: FastLlama's
    assert native.vocab_size == slow.vocab_size and native.num_layers == slow.num_layers
    a, b = logits_of(native), logits_of(slow)
    assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()
    state, reference = native.state_dict(), slow.model.state_dict()
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias", "lm_head.weight"):
        assert torch.allclose(state[name], reference[name], atol=1e-5), name


def test_int4_keeps_the_files_codes_and_requantizes_the_rest(qwen2_file, capsys):
    source = GGUFWeights(qwen2_file, open_reader(qwen2_file), "int4")
    gate = source("model.layers.0.mlp.gate_proj.weight")  # Q4_K: the file's codes
    reader = open_reader(qwen2_file)
    raw = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    codes, _, _ = AFFINE["Q4_K"](np.asarray(raw.data))
    assert np.array_equal(gate.codes.numpy(), codes)
    down = source("model.layers.0.mlp.down_proj.weight")  # Q5_0: re-quantized
    assert down.codes.max() <= 15 and source.converted == {"Q5_0": 1}
    int4 = load_model(qwen2_file, dtype="int4")
    assert int4.weight_format == "int4"
    assert "re-quantized to int4" in capsys.readouterr().err
    # int4 computes with the weights it holds (read back dequantized): transformers on those weights agrees
    reference = load_model(qwen2_file, dtype="float32", backend="transformers")
    with torch.no_grad():
        for name, weight in int4.state_dict().items():
            reference.model.get_parameter(name).copy_(weight)
    a, b = logits_of(int4), logits_of(reference)
    # the kernels round every linear's input (bfloat16 on aten's and the bf16 path; int8 per group of 32 on the VNNI
    # path, up to max|x| / 254 an input, as llama.cpp's Q8_0): measured 0.8 % (aten) and 1.2 % (VNNI) of the largest
    # logit through this seeded model, 0.8-1.6 % over seeds 0-4
    from relaxspec.models import int4_block
    tol = 0.025 if int4_block.path() == "vnni" else 0.02
    assert (a - b).abs().max() < tol * b.abs().max(), (a - b).abs().max()


def test_auto_keeps_four_bit_in_int4_and_the_rest_in_bfloat16(qwen2_file, capsys):
    lm = load_model(qwen2_file, dtype="auto")
    assert lm.weight_format == "auto"
    qkv, o, gate_up, down = (lm.fast.layers[0][i] for i in (1, 2, 4, 5))
    assert o.format == "int4" and gate_up.format == "int4"  # Q4_0; Q4_K and Q4_1 stacked
    assert qkv.format == "bfloat16" and down.format == "bfloat16"  # q, k Q4_K with v Q8_0; Q5_0
    assert "kept in bfloat16" in capsys.readouterr().err


def test_a_file_truncated_mid_tensor_is_one_line(qwen2_file, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = qwen2_file.read_bytes()
    cut.write_bytes(data[:len(data) - 5000])
    with pytest.raises(ValueError, match="truncated or corrupt") as error:
        load_model(cut, dtype="int4")
    assert "\n" not in str(error.value)


def test_gguf_weights_float_formats_match_the_packages_dequantization(qwen2_file):
    reader = open_reader(qwen2_file)
    raw = {t.name: t for t in reader.tensors}
    for fmt, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        source = GGUFWeights(qwen2_file, reader, fmt)
        for hf, name in (("lm_head.weight", "output.weight"), ("model.layers.0.mlp.down_proj.weight",
                                                                "blk.0.ffn_down.weight"),
                         ("model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight")):
            t = raw[name]
            reference = torch.from_numpy(dequantize(np.asarray(t.data), t.tensor_type)).to(dtype)
            assert torch.equal(source(hf), reference), (fmt, hf)


# (transformers name, file name, type) of every tensor type the fixture file holds
TYPES = [("model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", "Q4_K"),
         ("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", "Q4_0"),
         ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", "Q4_1"),
         ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", "Q5_0"),
         ("model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", "Q8_0"),
         ("lm_head.weight", "output.weight", "Q6_K")]


@pytest.mark.parametrize("fmt", ["int4", "auto"])
@pytest.mark.parametrize("hf, name, kind", TYPES)
def test_each_quant_type_in_int4_and_auto_follows_the_documented_policy(qwen2_file, fmt, hf, name, kind):
    reader = open_reader(qwen2_file)
    raw = next(t for t in reader.tensors if t.name == name)
    assert raw.tensor_type.name == kind
    reference = dequantize(np.asarray(raw.data), raw.tensor_type)  # the gguf package's own values
    got = GGUFWeights(qwen2_file, reader, fmt)(hf)
    if kind in AFFINE:  # the file's codes; its values up to bfloat16's rounding of each group's scale and zero
        codes, scale, zero = AFFINE[kind](np.asarray(raw.data))
        assert np.array_equal(got.codes.numpy(), codes)
        rounded = affine_dense(codes, torch.from_numpy(scale).bfloat16().float().numpy(),
                               torch.from_numpy(zero).bfloat16().float().numpy())
        assert torch.equal(got.dense(), torch.from_numpy(rounded))
        bound = 2 ** -8 * (8 * np.abs(scale) + np.abs(zero))  # bfloat16: a relative 2^-9 on each of scale, zero
        error = np.abs(rounded - reference).reshape(*scale.shape, -1).max(axis=-1)
        assert (error <= bound + 1e-12).all()
    elif fmt == "int4":  # 5-, 6- and 8-bit: re-quantized min-max from the file's dequantized values
        codes, scale_zero = quantize_int4(torch.from_numpy(reference))
        assert torch.equal(got.codes, codes) and torch.equal(got.scale_zero, scale_zero)
    else:  # auto: those in bfloat16
        assert got.dtype == torch.bfloat16 and torch.equal(got, torch.from_numpy(reference).bfloat16())


def test_a_tied_head_file_loads_natively_and_strict_greedy_equals_ar_greedy(qwen2_file, tmp_path):
    """No output.weight (the 0.5B's layout: the head is the embedding, here Q8_0): each format loads natively with
    transformers' properties; float32 against transformers' loader; an int4 pair of files decodes greedy alike."""
    from relaxspec.engine import generate

    tied = write_qwen2(tmp_path / "tied.gguf", {"head": None, "embed": "Q8_0"}, layers=1)
    slow = load_model(tied, dtype="float32", backend="transformers")
    for fmt in ("float32", "bfloat16", "int4", "auto"):
        lm = load_model(tied, dtype=fmt)
        assert lm.backend == "fast" and lm.model.config.tie_word_embeddings
        assert (lm.vocab_size, lm.num_parameters(), lm.device.type) == (slow.vocab_size, slow.num_parameters(), "cpu")
        assert sorted(lm.state_dict()) == sorted(slow.model.state_dict())
        if fmt == "float32":
            a, b = logits_of(lm), logits_of(slow)
            assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()
    verifier, drafter = load_model(qwen2_file, dtype="int4"), load_model(tied, dtype="int4")
    prompts = ["def ab(x):", "print(ab)"]
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=16, temperature=0.0, chat_template="off")
    strict = generate(verifier, drafter, prompts, method="strict", draft_length=3, max_new_tokens=16,
                      temperature=0.0, chat_template="off")
    assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results]
    assert min(len(r.token_ids) for r in ar.results) > 4, [r.token_ids for r in ar.results]
