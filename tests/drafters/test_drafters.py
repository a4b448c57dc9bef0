"""The drafter protocol and its three kinds: LM, MTP head, prompt lookup (docs/design.md, "Drafters")."""

import json
from dataclasses import replace

import pytest
import torch

from relaxspec.cli import main
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.drafters import LMDrafter, NgramDrafter, load_drafter, measure_draft_latency, parse_ngram
from relaxspec.drafters.mtp import HeadConfig, load_mtp_drafter
from relaxspec.models.quant import dequantize_int4, quantize_int4
from relaxspec.training.mtp import TrainConfig, train_head, training_prompts
from helpers import SHORT_PROMPTS, strict_vs_ar_by_position, task_prompts, verifier_prefix_hidden


def GREEDY(logits, i):  # the engine's sampler at temperature 0
    return logits.argmax(-1), None


@pytest.fixture(scope="session")
def mtp_dir(tmp_path_factory, builtin_pair):
    """A small MTP head for the built-in verifier, trained here (seconds): its quality does not
    matter to these tests, only that it is a real trained head."""
    verifier, _ = builtin_pair
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("mtp")
    train_head(verifier, training_prompts(["arithmetic", "sorting"], 8), out,
               cfg=TrainConfig(steps=15, batch_size=8, max_new_tokens=40), log=lambda *a: None)
    return out


@pytest.fixture(scope="session")
def truncated_mtp_dir(tmp_path_factory, builtin_pair):
    """A truncated-vocabulary head: q over the verifier's 64 most frequent answer tokens only (of 714),
    so the verifier often wants a token the head cannot propose (strict's residual path outside q's
    support is exercised). Saved in float16."""
    verifier, _ = builtin_pair
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("mtp-k64")
    train_head(verifier, training_prompts(["arithmetic", "sorting"], 8), out, HeadConfig(hidden=128, draft_vocab=64),
               cfg=TrainConfig(steps=15, batch_size=8, max_new_tokens=40, save_dtype="float16"), log=lambda *a: None)
    return out


FUSED = (1, 3, -1)  # EAGLE-3 style: a low, a middle and the last block of the 6-block verifier


@pytest.fixture(scope="session")
def fused_mtp_dir(tmp_path_factory, builtin_pair):
    """A head reading three verifier blocks fused into one feature (EAGLE-3)."""
    verifier, _ = builtin_pair
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("mtp-fused")
    train_head(verifier, training_prompts(["arithmetic", "sorting"], 8), out, HeadConfig(hidden=128, feature_layers=FUSED),
               cfg=TrainConfig(steps=15, batch_size=8, max_new_tokens=40), log=lambda *a: None)
    return out


@pytest.fixture
def heads(request):
    """Trained heads by kind name, built only when a test asks for them."""
    return {"mtp": lambda: request.getfixturevalue("mtp_dir"), "mtp-fused": lambda: request.getfixturevalue("fused_mtp_dir")}


def _drafter(kind, verifier, drafter_lm, heads):
    if kind == "lm":
        return LMDrafter(drafter_lm)
    if kind.startswith("mtp"):
        return load_mtp_drafter(heads[kind](), verifier)
    return load_drafter("ngram:n=3", verifier)


@pytest.mark.parametrize("kind", ["lm", "mtp", "mtp-fused", "ngram"])
def test_greedy_strict_equals_ar_with_each_kind_on_a_ragged_batch(builtin_pair, heads, kind):
    verifier, drafter_lm = builtin_pair
    prompts = task_prompts(3) + task_prompts(2, "sorting")
    drafter = _drafter(kind, verifier, drafter_lm, heads)
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=40)
    for n in (1, 4):
        sd = generate(verifier, drafter, prompts, method="strict", draft_length=n, max_new_tokens=40)
        assert [r.token_ids for r in sd.results] == [r.token_ids for r in ar.results], n
        assert sd.stats.drafts_accepted > 0  # the drafter really proposed something the verifier took
        assert (sd.stats.drafter_forwards == 0) == (kind == "ngram")


def test_sampled_strict_with_the_mtp_head_matches_ar_sampling(builtin_pair, mtp_dir):
    verifier, _ = builtin_pair
    drafter = load_mtp_drafter(mtp_dir, verifier)
    prompts = list(SHORT_PROMPTS)  # ragged, and rows diverge
    sd, spread = strict_vs_ar_by_position(verifier, drafter, prompts, 250, (0, 3, 7), max_new_tokens=8,
                                          temperature=1.0)
    assert 0.1 < sd.stats.acceptance_rate < 0.95  # both accept and reject paths are exercised
    assert min(spread) < 0.7  # not a deterministic position: the comparison has teeth


def test_truncated_head_q_is_zero_outside_its_vocabulary_and_sums_to_one(builtin_pair, truncated_mtp_dir):
    verifier, _ = builtin_pair
    config = json.loads((truncated_mtp_dir / "config.json").read_text())
    assert config["draft_vocab"] == 64 and config["dtype"] == "float16" and "64 tokens most frequent" in config["lm_head"]
    # float16 weights plus the 64 int64 token ids; the LM-head rows are the verifier's, not stored.
    assert (truncated_mtp_dir / "model.safetensors").stat().st_size < 2 * config["params"] + 8 * 64 + 10_000
    drafter = load_mtp_drafter(truncated_mtp_dir, verifier)
    kept = drafter.draft_vocab
    assert len(set(kept.tolist())) == 64 and int(kept.max()) < verifier.vocab_size
    outside = torch.ones(verifier.vocab_size, dtype=torch.bool)
    outside[kept] = False
    rows = [verifier.tokenizer(p)["input_ids"] for p in (task_prompts(1)[0], task_prompts(1, "sorting")[0])]
    ids, mask, hidden = verifier_prefix_hidden(verifier, [r[:-1] for r in rows])
    drafter.prefill(ids, mask, hidden)

    def sample(logits, i):  # temperature and top-p processing, as the engine's sampler does
        q = torch.softmax(logits / 0.7, dim=-1)
        return torch.multinomial(q, 1)[:, 0], q

    torch.manual_seed(0)
    proposal = drafter.propose(torch.tensor([r[-1] for r in rows]), 4, 1, sample)
    for q in (torch.softmax(proposal.logits, dim=-1), proposal.probs):
        assert (q[..., outside] == 0).all() and (q[..., kept] > 0).all()
        assert torch.allclose(q.sum(dim=-1), torch.ones(q.shape[:-1]), atol=1e-5)
    assert torch.isin(proposal.tokens, kept).all()


def test_truncated_head_keeps_strict_lossless(builtin_pair, truncated_mtp_dir):
    verifier, _ = builtin_pair
    drafter = load_mtp_drafter(truncated_mtp_dir, verifier)
    prompts = task_prompts(3) + task_prompts(2, "sorting")
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=40)
    sd = generate(verifier, drafter, prompts, method="strict", draft_length=4, max_new_tokens=40)
    assert [r.token_ids for r in sd.results] == [r.token_ids for r in ar.results]
    assert 0 < sd.stats.drafts_accepted < sd.stats.drafts_proposed
    outside = set(range(verifier.vocab_size)) - set(drafter.draft_vocab.tolist())
    assert any(t in outside for r in ar.results for t in r.token_ids)  # the verifier does leave the head's vocabulary
    sampled, spread = strict_vs_ar_by_position(verifier, drafter, list(SHORT_PROMPTS), 250, (0, 3, 7),
                                               max_new_tokens=8, temperature=1.0)
    assert 0.1 < sampled.stats.acceptance_rate < 0.95
    assert min(spread) < 0.7


@pytest.mark.parametrize("longest", [None, 4])
@pytest.mark.parametrize("kind", ["mtp", "mtp-fused", "lm"])
def test_rollback_gives_the_draft_of_a_fresh_run_on_the_accepted_prefix(builtin_pair, heads, kind, longest):
    """One round by hand on a ragged batch: row 0 accepts nothing, row 1 all four drafts (the LM
    drafter's catch-up path). The next proposal equals that of a fresh drafter prefilled on the
    accepted prefix; with `longest` (the engine's host copy of accepted.max()) or without."""
    verifier, drafter_lm = builtin_pair
    prompts = [verifier.tokenizer(p)["input_ids"] for p in (task_prompts(1)[0], task_prompts(1, "sorting")[0])]
    drafter = _drafter(kind, verifier, drafter_lm, heads)
    layers = drafter.hidden_layers or -1
    ids, mask, hidden = verifier_prefix_hidden(verifier, [p[:-1] for p in prompts], layers)
    drafter.prefill(ids, mask, hidden)
    last = torch.tensor([p[-1] for p in prompts])
    drafts = drafter.propose(last, 4, 0, GREEDY).tokens
    accepted = torch.tensor([0, 4])
    _, _, block_hidden = verifier_prefix_hidden(verifier, [p + d for p, d in zip(prompts, drafts.tolist())], layers)
    drafter.rollback(accepted, block_hidden[:, -5:], longest=longest)  # the verifier's features of [last, x_1..x_4]
    nxt = torch.tensor([11, 12])
    rolled = drafter.propose(nxt, 3, 0, GREEDY)
    for b in range(2):
        prefix = prompts[b] + drafts[b, :accepted[b]].tolist()
        fresh = _drafter(kind, verifier, drafter_lm, heads)
        fresh.prefill(*verifier_prefix_hidden(verifier, [prefix], layers))
        again = fresh.propose(nxt[b:b + 1], 3, 0, GREEDY)
        assert torch.allclose(rolled.logits[b], again.logits[0], atol=1e-4), b
        assert rolled.tokens[b].tolist() == again.tokens[0].tolist()


def test_prompt_lookup_proposes_what_followed_the_latest_match(builtin_pair):
    verifier, _ = builtin_pair
    drafter = NgramDrafter(vocab_size=20, max_n=3)
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6], [0, 0, 1, 2, 3, 4, 5]])
    drafter.prefill(ids, torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]]))
    proposal = drafter.propose(torch.tensor([7, 6]), 4, 0, GREEDY)
    # Row 0: [..5, 6, 7] matched at the start, followed by 8, 9, 5, 6. Row 1: no match, repeat the last token.
    assert proposal.tokens.tolist() == [[8, 9, 5, 6], [6, 6, 6, 6]]
    assert proposal.forwards == 0 and proposal.probs is None
    q = torch.softmax(proposal.logits / 0.7, dim=-1)  # one-hot q at any temperature
    assert torch.equal(q, torch.nn.functional.one_hot(proposal.tokens, 20).float())
    drafter.rollback(torch.tensor([2, 0]))
    assert drafter.texts == [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6]]
    # Continuations that run out are looked up again on the extended text: a period-2 pattern.
    drafter.select(torch.tensor([1]))
    drafter.texts = [[3, 4, 3, 4]]
    assert drafter.propose(torch.tensor([3]), 5, 0, GREEDY).tokens.tolist() == [[4, 3, 4, 3, 4]]
    with pytest.raises(ValueError, match="min <= n"):
        NgramDrafter(20, max_n=1, min_n=2)
    assert parse_ngram("ngram:n=4,min=2") == {"max_n": 4, "min_n": 2}
    with pytest.raises(ValueError, match="ngram"):
        load_drafter("ngram:n=x", verifier)


def test_prompt_lookup_reads_its_rounds_from_the_engines_host_copy(builtin_pair):
    """With `rounds` (the engine's host copy: each row's kept drafts, then the token it emitted) a round reads nothing
    from the device: `last` and `accepted` on the meta device (no values to read) serve, with the same texts and the
    same proposals as reading them; the engine's ngram outputs equal a run that reads them (rounds withheld)."""
    verifier, _ = builtin_pair
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6], [0, 0, 1, 2, 3, 4, 5]])
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    host, read = NgramDrafter(vocab_size=20, max_n=3), NgramDrafter(vocab_size=20, max_n=3)
    for d in (host, read):
        d.prefill(ids, mask)
        assert d.propose(torch.tensor([7, 6]), 4, 0, GREEDY).tokens.tolist() == [[8, 9, 5, 6], [6, 6, 6, 6]]
    read.rollback(torch.tensor([2, 0]))
    host.rollback(torch.empty(2, dtype=torch.long, device="meta"), rounds=[[8, 9, 5], [6]])
    assert host.texts == read.texts == [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6]]
    meta_last = torch.empty(2, dtype=torch.long, device="meta")
    with pytest.raises(Exception):
        meta_last.tolist()  # (the meta device has no values: reading them fails)
    on_meta = host.propose(meta_last, 3, 0, GREEDY)  # (its tokens land on `last`'s device)
    assert on_meta.tokens.shape == (2, 3) and host._proposed == read.propose(torch.tensor([5, 6]), 3, 0, GREEDY).tokens.tolist()
    host.select(torch.tensor([1]))
    read.select(torch.tensor([1]))
    assert host.texts == read.texts and host._last == [6]

    class Reading(NgramDrafter):
        host_rounds = False  # the engine withholds `rounds`: the drafter reads `last` and `accepted`

    prompts = ["Sort: 5 3 9 1 5 3 9 1", "What is 12 + 12 + 12?"]
    kw = dict(method="strict", draft_length=3, max_new_tokens=40, temperature=0.7, seed=2)
    out = generate(verifier, NgramDrafter(verifier.vocab_size), prompts, **kw)
    ref = generate(verifier, Reading(verifier.vocab_size), prompts, **kw)
    assert [r.token_ids for r in out.results] == [r.token_ids for r in ref.results]
    assert out.stats.drafts_accepted == ref.stats.drafts_accepted > 0


def test_prompt_lookup_refuses_rules_that_need_a_real_q(builtin_pair):
    verifier, _ = builtin_pair
    with pytest.raises(ValueError, match="bonus position.*ngram"):
        generate(verifier, "ngram", ["x"], method="spec-cont-dec", beta=0.5)
    for method in ("ensemble", "spec-casc-opt"):  # declared invalid with one-hot q (relaxspec methods)
        with pytest.raises(ValueError, match="meaningless.*one-hot"):
            generate(verifier, "ngram", ["x"], method=method)
    # Rules that stay meaningful run with prompt lookup; the LM drafter has a real q and runs ensemble.
    generate(verifier, "ngram", ["x"], method="fuzzy", max_new_tokens=2)
    generate(verifier, "drafter-weak", ["x"], method="ensemble", max_new_tokens=2)


def test_mtp_head_refuses_another_verifier_and_is_no_causal_lm(builtin_pair, mtp_dir, capsys):
    verifier, _ = builtin_pair
    other = load_model("drafter-strong")  # same vocabulary and hidden size, different weights
    with pytest.raises(ValueError, match="trained for verifier 'verifier'"):
        load_drafter(str(mtp_dir), other)
    with pytest.raises(ValueError, match="MTP drafter head, not a causal LM"):
        load_model(mtp_dir)
    config = json.loads((mtp_dir / "config.json").read_text())
    assert config["relaxspec_kind"] == "mtp" and config["verifier"]["name"] == "verifier"
    # Only the head's own weights are stored (the embedding and LM head are the verifier's).
    assert (mtp_dir / "model.safetensors").stat().st_size < 4 * config["params"] + 10_000
    assert main(["generate", "--verifier", "drafter-strong", "--drafter", str(mtp_dir), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaxspec: error: MTP drafter") and err.count("\n") == 1


def test_fused_features_start_as_the_last_block_alone_and_are_the_blocks_concatenated(builtin_pair, fused_mtp_dir):
    """An untrained fusion drafts exactly as an EAGLE-1 head with the same weights (it starts as the last
    block alone); the verifier hands over its blocks' states concatenated, on both backends; the trained
    head drafts from all three blocks (its fusion moved off the start) and says so in its config."""
    from relaxspec.drafters.mtp import MTPDrafter, MTPHead

    verifier, _ = builtin_pair
    torch.manual_seed(0)
    fused = MTPHead(HeadConfig(hidden=128, feature_layers=FUSED))
    plain = MTPHead(HeadConfig(hidden=128))
    plain.load_state_dict({k: v for k, v in fused.state_dict().items() if k != "fuse.weight"})
    rows = [verifier.tokenizer(p)["input_ids"] for p in task_prompts(2)]
    outs = []
    for head in (fused, plain):
        drafter = MTPDrafter(head, verifier)
        drafter.prefill(*verifier_prefix_hidden(verifier, [r[:-1] for r in rows], drafter.hidden_layers))
        outs.append(drafter.propose(torch.tensor([r[-1] for r in rows]), 3, 0, GREEDY).logits)
    assert torch.allclose(outs[0], outs[1], atol=1e-4)
    ids, mask, together = verifier_prefix_hidden(verifier, rows, FUSED)
    slow = load_model("verifier", backend="transformers")
    _, _, slow_together = verifier_prefix_hidden(slow, rows, FUSED)
    apart = torch.cat([verifier_prefix_hidden(verifier, rows, layer)[2] for layer in FUSED], dim=-1)
    assert together.shape[-1] == 3 * 128 and torch.equal(together, apart)
    real = mask.bool()  # (left padding's states are garbage on either backend)
    assert torch.allclose(together[real], slow_together[real], atol=2e-4)
    config = json.loads((fused_mtp_dir / "config.json").read_text())
    assert config["feature_layers"] == list(FUSED)
    trained = load_mtp_drafter(fused_mtp_dir, verifier)
    assert trained.hidden_layers == FUSED and trained.head.fuse.weight[:, :256].abs().sum() > 0


def test_feature_layers_the_verifier_lacks_or_without_the_last_are_one_line_errors(tmp_path, capsys):
    base = ["drafter", "train", "--task", "sorting", "--n", "2", "--steps", "1", "--out", str(tmp_path / "h")]
    assert main([*base, "--feature-layers", "2", "9", "-1"]) == 2
    assert capsys.readouterr().err == "relaxspec: error: hidden layers [2, 9, -1]: the verifier has 6 blocks " \
        "(0..5, or -1 for the last)\n"
    assert main([*base, "--feature-layers", "1", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaxspec: error: feature_layers must end with -1") and err.count("\n") == 1


def test_a_hidden_block_the_verifier_lacks_is_an_error_on_both_backends_and_in_pad(builtin_pair, tmp_path, capsys):
    """Block 6 of a 6-block verifier (or -7) is refused, not wrapped round to another block: by either
    backend's forward and by `pivot label --hidden-layer` (one line, before any roll-out)."""
    verifier, _ = builtin_pair
    rows = [verifier.tokenizer(p)["input_ids"] for p in task_prompts(2)]
    for lm in (verifier, load_model("verifier", backend="transformers")):
        assert verifier_prefix_hidden(lm, rows, -6)[2].shape[-1] == 128  # block 0, counted from the end
        for bad in (6, -7, (1, 6)):
            with pytest.raises(ValueError, match=r"^hidden layers? .*: the verifier has 6 blocks \(0\.\.5, or -1"):
                verifier_prefix_hidden(lm, rows, bad)
    assert main(["pivot", "label", "--prompts", "2", "--hidden-layer", "6", "--out", str(tmp_path / "l.pt")]) == 2
    assert capsys.readouterr().err == ("relaxspec: error: hidden layer 6: the verifier has 6 blocks (0..5, or -1 "
                                       "for the last)\n")


def test_mtp_training_resumes_to_the_same_head(builtin_pair, tmp_path):
    verifier, _ = builtin_pair
    prompts = training_prompts(["sorting"], 6)
    cfg = TrainConfig(steps=6, batch_size=4, max_new_tokens=20)
    quiet = dict(log=lambda *a: None)
    train_head(verifier, prompts, tmp_path / "once", cfg=cfg, **quiet)
    train_head(verifier, prompts, tmp_path / "twice", cfg=cfg, stop_after=4, **quiet)
    assert (tmp_path / "twice" / "checkpoint.pt").exists() and not (tmp_path / "twice" / "config.json").exists()
    train_head(verifier, prompts, tmp_path / "twice", cfg=cfg, **quiet)
    assert not (tmp_path / "twice" / "checkpoint.pt").exists()
    from safetensors.torch import load_file

    once, twice = load_file(tmp_path / "once" / "model.safetensors"), load_file(tmp_path / "twice" / "model.safetensors")
    assert once.keys() == twice.keys() and all(torch.equal(once[k], twice[k]) for k in once)
    untrained = train_head(verifier, prompts, tmp_path / "short", cfg=TrainConfig(steps=1, batch_size=4,
                                                                                   max_new_tokens=20), **quiet)
    assert not torch.equal(load_file(untrained / "model.safetensors")["fc.weight"], once["fc.weight"])
    # How a head is saved is not part of its training: a run stopped early resumes under another --save-dtype.
    train_head(verifier, prompts, tmp_path / "int4", cfg=cfg, stop_after=4, **quiet)
    said = []
    train_head(verifier, prompts, tmp_path / "int4", cfg=replace(cfg, save_dtype="int4"), log=said.append)
    assert "resuming from step 4 of 6" in said
    packed = load_file(tmp_path / "int4" / "model.safetensors")
    matrices = [k for k, v in once.items() if v.dim() == 2]
    assert "fc.weight" in matrices and not set(matrices) & set(packed)  # every matrix in int4, none in float
    assert (tmp_path / "int4" / "model.safetensors").stat().st_size < 0.3 * (tmp_path / "once" / "model.safetensors").stat().st_size
    int4_head = load_mtp_drafter(tmp_path / "int4", verifier).head.state_dict()
    for k in matrices:  # the int4 runtime format's codes of the same trained weights, to bfloat16 rounding
        assert torch.allclose(int4_head[k], dequantize_int4(*quantize_int4(once[k])), atol=1e-6), k
        assert 0 < (int4_head[k] - once[k]).abs().max() <= (once[k].amax() - once[k].amin()) / 15, k
        assert torch.equal(dequantize_int4(*quantize_int4(int4_head[k])), int4_head[k]), k  # int4 runs it as saved
    ar = generate(verifier, None, task_prompts(2), method="ar", max_new_tokens=24)
    sd = generate(verifier, str(tmp_path / "int4"), task_prompts(2), method="strict", draft_length=3, max_new_tokens=24)
    assert [r.token_ids for r in sd.results] == [r.token_ids for r in ar.results] and sd.stats.drafts_accepted > 0


def test_mtp_training_makes_no_tensor_on_the_default_device(builtin_pair, tmp_path):
    """With torch's default device set to `meta`, a tensor that data generation or training made without
    naming a device would be a meta tensor and meet CPU ones (or fail `.tolist()`): the same head as
    without the default (a truncated head, so that the draft vocabulary's selection runs too)."""
    verifier, _ = builtin_pair
    prompts = training_prompts(["sorting"], 6)
    kw = dict(head_cfg=HeadConfig(hidden=128, draft_vocab=64), log=lambda *a: None,
              cfg=TrainConfig(steps=3, batch_size=4, max_new_tokens=20, gen_batch=4))
    train_head(verifier, prompts, tmp_path / "plain", **kw)
    with torch.device("meta"):
        train_head(verifier, prompts, tmp_path / "meta", **kw)
    from safetensors.torch import load_file

    plain, meta = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "meta" / "model.safetensors")
    assert plain.keys() == meta.keys() and all(torch.equal(plain[k], meta[k]) for k in plain)


def test_drafter_cli_trains_a_head_that_generate_uses(tmp_path, capsys, forker):
    out = tmp_path / "head"
    assert main(["drafter", "train", "--task", "sorting", "--n", "4", "--steps", "3", "--batch-size", "2",
                 "--max-new-tokens", "10", "--out", str(out)]) == 0
    assert "train mtp head" in capsys.readouterr().err  # the progress bar
    assert main(["generate", "--drafter", str(out), "--json", "--prompt", task_prompts(1)[0],
                 "--max-new-tokens", "20"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["drafter_forwards"] > 0
    # --stop-after 0 makes the data set and stops (benchmarks/gpu_train_drafters.sh shares it between variants)
    data_only = tmp_path / "data-only"
    assert main(["drafter", "train", "--task", "sorting", "--n", "4", "--steps", "3", "--batch-size", "2",
                 "--max-new-tokens", "10", "--stop-after", "0", "--out", str(data_only)]) == 0
    assert sorted(p.name for p in data_only.iterdir()) == ["train_data.pt"]
    assert "stopped at step 0 of 3" in capsys.readouterr().out
    assert main(["drafter", "train", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == "relaxspec: error: give the training prompts: --prompts FILE or --task NAME " \
        "(repeatable)\n"
    # One real process: prompt lookup from the command line.
    run = forker.run(["-m", "relaxspec", "generate", "--drafter", "ngram:n=2", "--json", "--prompt", task_prompts(1)[0],
                      "--max-new-tokens", "30"], cwd=tmp_path)  # (forked: this tree's src first, conftest.forker)
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout)["stats"]
    assert stats["generated_tokens"] > 0 and stats["drafter_forwards"] == 0


def test_builtin_mtp_head_drafts_for_the_builtin_verifier(builtin_pair):
    verifier, _ = builtin_pair
    drafter = load_drafter("drafter-mtp", verifier)
    out = generate(verifier, drafter, task_prompts(6), method="strict", draft_length=5, max_new_tokens=60)
    assert out.stats.mean_acceptance_length > 2.5  # measured 3.56 on 50 prompts x 160 tokens
    assert 0 < measure_draft_latency(drafter, verifier, rounds=3) < 0.1
    with pytest.raises(ValueError, match="trained for verifier 'verifier'"):
        load_drafter("drafter-mtp", load_model("drafter-strong"))


@pytest.mark.parametrize("name", ["drafter-mtp", "ngram:n=3"])
def test_sampled_output_is_batch_invariant_with_each_kind(builtin_pair, name):
    """A prompt's sampled output with its seed is the same in a mixed batch, in another order and alone
    (the drafter's samples come from the engine's per-sequence streams; padding and rollback are per row)."""
    from relaxspec.acceptance import derive_seed

    verifier, _ = builtin_pair
    drafter = load_drafter(name, verifier)
    prompts = task_prompts(3) + task_prompts(2, "sorting")
    seeds = [derive_seed(7, i) for i in range(len(prompts))]
    kw = dict(method="strict", draft_length=4, temperature=0.7, top_p=0.9, max_new_tokens=30)
    batch = generate(verifier, drafter, prompts, seed=seeds, **kw)
    order = [3, 0, 4, 1, 2]
    shuffled = generate(verifier, drafter, [prompts[i] for i in order], seed=[seeds[i] for i in order], **kw)
    assert [r.token_ids for r in shuffled.results] == [batch.results[i].token_ids for i in order]
    alone = generate(verifier, drafter, [prompts[4]], seed=[seeds[4]], **kw)
    assert alone.results[0].token_ids == batch.results[4].token_ids
    assert len({tuple(r.token_ids) for r in batch.results}) == len(prompts)
