"""`relaxspec drafter train --kind mtp` for a verifier loaded from a GGUF file in int4 (the real pair's shape: a
Qwen2 GGUF, here small and random, `write_qwen2`), on the code-instruction pool: the head borrows the verifier's LM
head from FastLlama (the transformers model keeps an empty one), training lowers the KL and raises the head's
agreement with the verifier, the data set and the training resume in parts to the same head, and the command shows
its progress bars with the time left."""

import json

import pytest
import torch
from safetensors.torch import load_file
from helpers import write_qwen2

from relaxspec.cli import main
from relaxspec.drafters.mtp import HeadConfig, MTPHead, head_rows, load_mtp_drafter, read_head, verifier_weights
from relaxspec.models import load_model
from relaxspec.tasks import code_pool
from relaxspec.training import mtp
from relaxspec.training.mtp import TrainConfig, head_loss, train_head, unrolled_outputs

QUIET = dict(log=lambda *a: None)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_qwen2(tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf", {})


@pytest.fixture(scope="module")
def verifier(gguf):
    return load_model(str(gguf), dtype="int4")


def short_code_prompts(n: int) -> list[str]:
    """n of the pool's shortest prompts (the test's tokenizer spends a token per byte)."""
    return sorted(code_pool.training_prompts(code_pool.pool_size()), key=len)[:n]


def agreement(head, data, embed, lm_head) -> float:
    """Teacher-forced top-1 agreement on the answer tokens: the head's first-pass output against the verifier."""
    hits = total = 0
    H = embed.shape[1]
    for r in range(len(data["tokens"])):
        tokens, features = data["tokens"][r][None], data["features"][r][None].float()
        out = next(unrolled_outputs(head, tokens, features, torch.ones_like(tokens), embed, 1))
        start = max(0, data["answer_start"][r] - 2)
        target = (features[0, 1:, -H:] @ lm_head.t()).argmax(-1)[start:-1]
        hits += int(((out[0] @ lm_head.t()).argmax(-1)[start:-1] == target).sum())
        total += len(target)
    return hits / total


def test_the_verifiers_lm_head_is_read_back_from_fastllama(verifier):
    embed, lm_head = verifier_weights(verifier)
    assert verifier.model.get_output_embeddings().weight.numel() == 0  # (the file's own head: FastLlama holds it)
    assert lm_head.shape == embed.shape == (verifier.vocab_size, 256)
    ids = torch.tensor([verifier.tokenizer("def ab(x):")["input_ids"]])
    logits, hidden = verifier.forward(ids, verifier.new_cache(), None, torch.arange(ids.shape[1])[None],
                                      hidden_layer=-1)
    # the verifier's logits are its last hidden state times that head (int4 activations: within ~1%)
    assert torch.allclose(hidden[0] @ lm_head.t(), logits[0], atol=0.02 * float(logits.abs().max()))


def test_training_lowers_the_kl_and_raises_agreement_with_the_verifier(verifier, tmp_path):
    prompts = short_code_prompts(8)
    cfg = TrainConfig(steps=40, batch_size=4, max_new_tokens=24, lr=3e-3, gen_batch=4, seed=0)
    head_cfg = HeadConfig(hidden=256, ffn=256)
    train_head(verifier, prompts, tmp_path, head_cfg, cfg, stop_after=0, **QUIET)  # the data set only
    data = torch.load(tmp_path / mtp.DATA)
    train_head(verifier, prompts, tmp_path, head_cfg, cfg, **QUIET)
    embed, lm_head = (w.detach().float() for w in verifier_weights(verifier))
    torch.manual_seed(cfg.seed)
    fresh = MTPHead(head_cfg).eval()  # the trainer's starting head (same seed)
    trained = MTPHead(head_cfg).eval()
    trained.load_state_dict(load_file(tmp_path / "model.safetensors"))
    rows = list(range(len(data["tokens"])))
    with torch.no_grad():
        before, after = (float(head_loss(h, data, rows, embed, head_rows(h, lm_head), 2)) for h in (fresh, trained))
        agree_before, agree_after = (agreement(h, data, embed, lm_head) for h in (fresh, trained))
    assert before > 1.0 and after < 0.6 * before, (before, after)
    assert agree_after > agree_before + 0.2, (agree_before, agree_after)
    # the saved head drafts for this verifier (its fingerprint reads the same LM head)
    assert load_mtp_drafter(tmp_path, verifier).vocab_size == verifier.vocab_size


def test_an_interrupted_data_set_and_training_resume_to_the_same_head(verifier, tmp_path, monkeypatch):
    prompts = short_code_prompts(6)
    cfg = TrainConfig(steps=4, batch_size=2, max_new_tokens=12, gen_batch=2)
    head_cfg = HeadConfig(hidden=256, ffn=64)
    train_head(verifier, prompts, tmp_path / "once", head_cfg, cfg, **QUIET)
    saved = mtp._save_part

    def save_then_stop(parts, start, part):  # killed right after the second batch of answers is on disk
        saved(parts, start, part)
        if start == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(mtp, "_save_part", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_head(verifier, prompts, tmp_path / "parts", head_cfg, cfg, **QUIET)
    monkeypatch.setattr(mtp, "_save_part", saved)
    assert sorted(p.name for p in (tmp_path / "parts" / mtp.PARTS).iterdir()) == [
        "00000000.pt", "00000002.pt", "identity.json"]
    said = []
    train_head(verifier, prompts, tmp_path / "parts", head_cfg, cfg, stop_after=2, log=said.append)
    assert said[0].startswith("resuming the data set: 4 answers made earlier (2 batches in ")
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [mtp.CHECKPOINT, mtp.DATA]
    train_head(verifier, prompts, tmp_path / "parts", head_cfg, cfg, **QUIET)
    once, twice = (load_file(tmp_path / d / "model.safetensors") for d in ("once", "parts"))
    assert once.keys() == twice.keys() and all(torch.equal(once[k], twice[k]) for k in once)


def test_the_command_trains_on_the_code_pool_with_a_gguf_verifier_in_int4(gguf, tmp_path, capsys):
    out = tmp_path / "head"
    args = ["drafter", "train", "--kind", "mtp", "--verifier", str(gguf), "--dtype", "int4", "--task", "code",
            "--n", "2", "--gen-batch", "1", "--max-new-tokens", "4", "--steps", "2", "--batch-size", "2", "--ffn", "64",
            "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err
    # both bars, each with its elapsed<left time
    for bar in ("verifier answers: 100%", "train mtp head: 100%"):
        assert bar in err and "<00:00" in err.split(bar)[1].split("\n")[0].split("\r")[0], err
    assert (out / "config.json").exists() and not (out / mtp.PARTS).exists()


def test_a_head_for_a_gguf_verifier_drafts_for_its_file_in_any_dtype_and_for_no_other_file(gguf, verifier, tmp_path):
    """The head's config names the verifier's file: loaded in float32 the same file has another LM head than its
    int4 copy (re-quantized), and the head still serves it; another file with the same shapes is refused."""
    from relaxspec.drafters.mtp import save_head, verifier_fingerprint
    from relaxspec.models.gguf import gguf_fingerprint

    save_head(MTPHead(HeadConfig(hidden=256, ffn=64)).eval(), verifier, tmp_path / "head", {})
    float32 = load_model(str(gguf), dtype="float32", weight_cache=False)
    assert verifier_fingerprint(float32) != verifier_fingerprint(verifier)  # the weights alone would refuse it
    assert load_mtp_drafter(tmp_path / "head", float32).vocab_size == verifier.vocab_size
    other = load_model(str(write_qwen2(tmp_path / "other-qwen2.gguf", {}, seed=1)), dtype="int4", weight_cache=False)
    assert gguf_fingerprint(other) != gguf_fingerprint(verifier)
    with pytest.raises(ValueError, match="was trained for verifier .*tiny-qwen2.gguf.* is a different model"):
        load_mtp_drafter(tmp_path / "head", other)


def test_training_continues_from_a_saved_head_and_refuses_one_of_other_settings(gguf, verifier, tmp_path, capsys):
    """`init_from` starts from a saved head's weights and draft vocabulary: two steps at a vanishing learning rate
    end where that head was (a seeded head, ignoring it, is far from there); the new config records what it
    continued; a head of other settings is a one-line error, before any work."""
    prompts = short_code_prompts(6)
    cfg = TrainConfig(steps=12, batch_size=4, max_new_tokens=16, lr=3e-3, gen_batch=3, seed=0)
    head_cfg = HeadConfig(hidden=256, ffn=64, draft_vocab=64)
    train_head(verifier, prompts, tmp_path / "first", head_cfg, cfg, **QUIET)
    still = TrainConfig(**{**cfg.__dict__, "steps": 2, "lr": 1e-9, "seed": 1})
    train_head(verifier, prompts, tmp_path / "more", head_cfg, still, init_from=tmp_path / "first", **QUIET)
    data = torch.load(tmp_path / "first" / mtp.DATA)
    embed, lm_head = (w.detach().float() for w in verifier_weights(verifier))
    torch.manual_seed(cfg.seed)
    heads = {"seeded": MTPHead(head_cfg).eval(), "first": MTPHead(head_cfg).eval(), "more": MTPHead(head_cfg).eval()}
    for d in ("first", "more"):
        heads[d].load_state_dict(read_head(tmp_path / d)[2])
    assert torch.equal(heads["first"].draft_vocab, heads["more"].draft_vocab)
    heads["seeded"].draft_vocab.copy_(heads["first"].draft_vocab)  # (the trainer's seeded head, over the same rows)
    rows = list(range(len(data["tokens"])))
    with torch.no_grad():
        loss = {k: float(head_loss(h, data, rows, embed, head_rows(h, lm_head), 2)) for k, h in heads.items()}
    assert abs(loss["more"] - loss["first"]) < 0.01 * loss["first"] and loss["seeded"] > 3 * loss["first"], loss
    record = json.loads((tmp_path / "more" / "config.json").read_text())["training"]["continued_from"]
    assert record["training"]["steps"] == 12 and len(record["sha256"]) == 16
    capsys.readouterr()
    args = ["drafter", "train", "--kind", "mtp", "--verifier", str(gguf), "--dtype", "int4", "--task", "code",
            "--n", "2", "--ffn", "128", "--draft-vocab", "64", "--out", str(tmp_path / "x"),
            "--init-from", str(tmp_path / "first")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("that head has other settings: ffn 64 (asked 128)"), err
    assert main(args[:-1] + [str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"relaxspec: error: --init-from '{tmp_path / 'nothing'}': no saved MTP head there"), err
    assert not (tmp_path / "x").exists()


def test_a_head_drafts_for_a_mapped_verifier_without_building_its_transformers_model(gguf, verifier, tmp_path):
    """A second load maps the converted weights and builds no transformers model; a head loaded for it reads the
    embedding, the LM head and the model class's name from FastLlama alone (nothing builds the model), and they are
    the ones the built model gives: the same fingerprint and weights before and after it is built."""
    from relaxspec.drafters.mtp import save_head, verifier_fingerprint

    save_head(MTPHead(HeadConfig(hidden=256, ffn=64)).eval(), verifier, tmp_path / "head", {})
    mapped = load_model(str(gguf), dtype="int4")  # (the module's `verifier` wrote the cache entry)
    assert "model" not in vars(mapped)
    drafter = load_mtp_drafter(tmp_path / "head", mapped)
    ids = torch.tensor([mapped.tokenizer("def ab(x):")["input_ids"]])
    assert drafter.vocab_size == mapped.vocab_size and ids.shape[1] > 1
    lazy_weights, lazy_fingerprint = verifier_weights(mapped), verifier_fingerprint(mapped)
    assert "model" not in vars(mapped)
    mapped.model  # built now
    assert verifier_fingerprint(mapped) == lazy_fingerprint == verifier_fingerprint(verifier)
    assert all(torch.equal(a, b) for a, b in zip(lazy_weights, verifier_weights(mapped)))
