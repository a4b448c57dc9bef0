"""Pivot labelling with real (tiny, random-init) Llama models: roll-out utilities, the pivot
decision on a hand-made task, the greedy walk, and resumable shards."""

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from relaxspec.models import builtin_path
from relaxspec.models.hf import CausalLM
from relaxspec.pivot import is_pivot, label_pivots, rollout_utilities
from relaxspec.pivot.label import label_prompt, merge_shards
from relaxspec.tasks.base import Example, Task

torch.set_num_threads(1)


def tiny_lm(name, seed, layers=2):
    tok = AutoTokenizer.from_pretrained(builtin_path("verifier"))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    return CausalLM(name=name, model=LlamaForCausalLM(cfg).eval(), tokenizer=tok)


@pytest.fixture(scope="module")
def models():
    return tiny_lm("tiny-verifier", 0), tiny_lm("tiny-drafter", 1)


def _prefix_cache(lm, text):
    ids = lm.tokenizer(text)["input_ids"]
    cache = lm.new_cache()
    x = torch.tensor([ids])
    lm.forward(x, cache, torch.ones_like(x), torch.arange(len(ids))[None])
    return cache, len(ids)


def test_rollout_utility_decided_by_one_token(models):
    """A task whose utility is decided by the first word: ' Maya' and ' Mia' are both right (a wording
    change), ' Liam' is wrong (flips the answer)."""
    verifier, _ = models
    tok = verifier.tokenizer
    right = {tok.decode([tok(" Maya")["input_ids"][0]]), tok.decode([tok(" Mia")["input_ids"][0]])}
    score = lambda text: float(any(text.startswith(w) for w in right))  # noqa: E731
    maya, mia, liam = (tok(w)["input_ids"][0] for w in (" Maya", " Mia", " Liam"))
    cache, L = _prefix_cache(verifier, "Question: who is it?\nAnswer:")
    before = cache.get_seq_length()
    g = torch.Generator().manual_seed(0)
    (u_mia, u_liam, u_maya), hidden = rollout_utilities(verifier, cache, L, [], [mia, liam, maya], k=4,
                                                        score=score, budget=6, temperature=1.0, generator=g,
                                                        hidden_layer=-1)
    assert cache.get_seq_length() == before  # the prefix cache is copied, not consumed
    assert (u_mia, u_liam, u_maya) == (1.0, 0.0, 1.0)
    assert hidden.shape == (3, 32)
    assert is_pivot(u_liam, u_maya) and not is_pivot(u_mia, u_maya)
    # the hidden state is the verifier's at the candidate's own position, after feeding it
    ids = tok("Question: who is it?\nAnswer:")["input_ids"] + [liam]
    x = torch.tensor([ids])
    _, h_full = verifier.forward(x, verifier.new_cache(), torch.ones_like(x), torch.arange(len(ids))[None],
                                 hidden_layer=-1)
    torch.testing.assert_close(hidden[1], h_full[0, -1], atol=1e-5, rtol=1e-4)


def test_rollout_utility_is_a_mean_over_rollouts(models):
    verifier, _ = models
    tok = verifier.tokenizer
    cache, L = _prefix_cache(verifier, "Question: x\nAnswer:")
    g = torch.Generator().manual_seed(3)
    # utility 1 iff the sampled continuation's first token is one particular token: a fraction in [0, 1]
    (u,), _ = rollout_utilities(verifier, cache, L, [], [tok(" Maya")["input_ids"][0]], k=64,
                                score=lambda t: float(len(t) % 2 == 0), budget=4, temperature=1.0, generator=g)
    assert 0.0 < u < 1.0 and (u * 64) == int(u * 64)


def _one_token_task(tok):
    """A task decided by one word of the response: correct iff it contains ' Maya' or ' Mia'."""
    def utility(response, reference):
        return float(" Maya" in response or " Mia" in response)
    return Task(name="one-word", examples=[Example(prompt="Question: who?\nAnswer:", reference="Maya")],
                utility=utility, metric="word")


def test_label_prompt_walk(models):
    verifier, drafter = models
    task = _one_token_task(verifier.tokenizer)
    ex = task.examples[0]
    g = torch.Generator().manual_seed(0)
    rec = label_prompt(verifier, drafter, ex.prompt, ex.reference, task.utility, k=2, alpha=1.0, margin=0.5,
                       temperature=1.0, max_new_tokens=8, hidden_layer=-1, min_baseline=0.0, generator=g)
    n = len(rec["labels"])
    assert n >= 1  # two random models disagree somewhere in 8 tokens
    assert len(rec["hidden"]) == len(rec["scalars"]) == len(rec["u_draft"]) == n
    for lab, ud, uv in zip(rec["labels"], rec["u_draft"], rec["u_verifier"]):
        assert lab == int(is_pivot(ud, uv, 1.0, 0.5))
    # the walk continues with the drafter's token exactly where it was not a pivot
    for step, lab, d, v in zip(rec["steps"], rec["labels"], rec["draft_token"], rec["verifier_token"]):
        if step < len(rec["trajectory"]):
            assert rec["trajectory"][step] == (v if lab else d)


def test_label_pivots_shards_resume_and_identity(models, tmp_path):
    verifier, drafter = models
    task = Task(name="one-word", examples=[Example(prompt=f"Question: {w}?\nAnswer:", reference="x")
                                           for w in ("who", "what", "where")],
                utility=lambda r, ref: float(" Maya" in r), metric="word", meta={"split": "pivot"})
    out = tmp_path / "labels.pt"
    kw = dict(k=2, max_new_tokens=6, hidden_layer=-1, out=out, min_baseline=0.0, min_prob=0.0, progress=False)
    data = label_pivots(verifier, drafter, task, 2, **kw)
    assert out.exists() and len(data["prompts"]) == 2 and data["meta"]["verifier"] == "tiny-verifier"
    assert data["hidden"].shape[1] == 32 and data["scalars"].shape[1] == 6
    assert len(data["labels"]) == len(data["prompt_index"]) == len(data["u_draft"])
    shard = out.with_name("labels.pt.shards") / "prompt_00000.pt"
    mtime = shard.stat().st_mtime_ns
    data3 = label_pivots(verifier, drafter, task, 3, **kw)  # resumes: prompt 0 is not redone
    assert shard.stat().st_mtime_ns == mtime and len(data3["prompts"]) == 3
    assert torch.equal(data3["labels"][: len(data["labels"])], data["labels"])
    assert len(merge_shards(out.with_name("labels.pt.shards"))["prompts"]) == 3
    with pytest.raises(ValueError, match="different settings"):
        label_pivots(verifier, drafter, task, 3, **{**kw, "k": 3})
    with pytest.raises(ValueError, match="pivot"):
        bad = Task(name="x", examples=task.examples, utility=task.utility, metric="m", meta={"split": "test"})
        label_pivots(verifier, drafter, bad, 1, **{**kw, "out": tmp_path / "other.pt"})


def test_rollout_of_eos_candidate_is_the_response_itself(models):
    verifier, _ = models
    tok = verifier.tokenizer
    cache, L = _prefix_cache(verifier, "Question: x\nAnswer:")
    generated = tok(" Maya")["input_ids"]
    g = torch.Generator().manual_seed(0)
    texts = []
    (u,), _ = rollout_utilities(verifier, cache, L, generated, [verifier.eos_token_id], k=3,
                                score=lambda t: texts.append(t) or 1.0, budget=6, temperature=1.0, generator=g)
    assert texts == [tok.decode(generated)] * 3 and u == 1.0
