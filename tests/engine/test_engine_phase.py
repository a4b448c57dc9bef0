"""Phase-aware relaxation: the spec grammar, the per-sequence tracker on the built-in tokenizer, verify's `relax`
mask (strict where False, with the same uniforms), the engine (strict outside the span, the rule inside, coupled),
and the bench / tune setting."""

import pytest
import torch

from relaxspec.acceptance import verify
from relaxspec.engine import generate
from relaxspec.engine.phase import Phase, PhaseTracker, parse_phase
from relaxspec.tasks import synthetic
from helpers import random_block, sample_drafts

ANSWER = "The answer is"


# ---------------------------------------------------------------- spec


def test_parse_phase():
    assert parse_phase(None) is None
    assert parse_phase("think") == Phase("<think>", "</think>")
    assert parse_phase("..The answer is") == Phase(None, ANSWER)
    assert parse_phase("#5..#7") == Phase(5, 7) and parse_phase(("<a>", None)) == Phase("<a>", None)
    assert str(Phase(None, ANSWER)) == "..The answer is" and str(Phase(5, "x")) == "#5..x"
    for bad, match in [("thinking", "phase must be 'think' or 'BEGIN..END'"), ("..", "give a begin marker"),
                       ("task", "phase 'task' needs a task"), (3, "phase must be None"),
                       ((-1, "x"), "token ids >= 0")]:
        with pytest.raises(ValueError, match=match):
            parse_phase(bad)


# ---------------------------------------------------------------- tracker


@pytest.fixture(scope="module")
def tok(builtin_pair):
    return builtin_pair[0].tokenizer


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_tracker_marks_positions_up_to_a_marker_split_across_tokens(tok):
    prompt = _ids(tok, "Question: sort 3, 1.\nAnswer:")
    before, marker, after = _ids(tok, " Then 1, 3."), _ids(tok, " The answer is"), _ids(tok, " 1, 3.")
    assert len(marker) == 3  # the marker spans three tokens
    tracker = PhaseTracker(Phase(None, ANSWER), tok, [prompt])
    drafts = before + marker + after
    flags = tracker.relax([drafts])[0]
    assert len(flags) == len(drafts) + 1
    k = len(before) + len(marker)  # the marker's last token is still decided by the rule, the rest strictly
    assert flags == [True] * k + [False] * (len(drafts) + 1 - k)
    tracker.advance([before + marker[:2]])  # a partial marker: still inside
    assert tracker.relax([marker[2:] + after])[0] == [True] + [False] * (len(after) + 1)
    tracker.advance([marker[2:]])
    assert tracker.relax([after])[0] == [False] * (len(after) + 1)


def test_tracker_state_from_the_prompt_and_id_markers(tok):
    a, b = _ids(tok, "A")[0], _ids(tok, "B")[0]
    x = _ids(tok, "x")[0]
    tracker = PhaseTracker(Phase(a, b), tok, [[x, a, x], [a, x, b, x], [x, x]])
    assert [row[0] for row in tracker.relax([[x], [x], [x]])] == [True, False, False]
    assert tracker.relax([[x, b, x], [a, x, x], [x, a]]) == [[True, True, False, False], [False, True, True, True],
                                                             [False, False, True]]
    tracker.select([1])
    tracker.advance([[a]])
    assert tracker.relax([[x]]) == [[True, True]]


# ---------------------------------------------------------------- verify's mask


def test_relax_mask_is_strict_where_false_with_the_same_uniforms():
    target, draft = random_block(seed=80, B=3000, N=4, V=10, noise=1.5)
    sampling = dict(temperature=0.8)
    x = sample_drafts(draft, 4, sampling, seed=1)

    def run(method, **kw):
        return verify(method, target, draft, x, **sampling, generator=torch.Generator().manual_seed(2), **kw)

    strict, rule = run("strict"), run("ensemble", weight=0.3)
    none = run("ensemble", weight=0.3, relax=torch.zeros(3000, 5, dtype=torch.bool))
    every = run("ensemble", weight=0.3, relax=torch.ones(3000, 5, dtype=torch.bool))
    assert torch.equal(none.tokens, strict.tokens) and not none.relaxed_only.any()
    assert torch.equal(every.tokens, rule.tokens)
    # Per position: the rule's test before position 2, strict's from there (the residual / bonus too).
    mask = torch.zeros(3000, 5, dtype=torch.bool)
    mask[:, :2] = True
    mixed = run("ensemble", weight=0.3, relax=mask)
    assert torch.equal(mixed.accept_prob[:, :2], rule.accept_prob[:, :2])
    assert torch.equal(mixed.accept_prob[:, 2:], strict.accept_prob[:, 2:])
    assert not mixed.relaxed_only[:, 2:].any() and mixed.relaxed_only[:, :2].any()
    early = mixed.num_accepted < 2  # stopped inside the relaxed part: the rule's residual, as the rule
    assert torch.equal(mixed.tokens[early], rule.tokens[early])
    late = (strict.num_accepted >= 2) & (rule.num_accepted >= 2)  # both kept the first two drafts
    assert torch.equal(mixed.tokens[late, 2:], strict.tokens[late, 2:])
    with pytest.raises(ValueError, match=r"relax must be a bool tensor \[B, N\+1\] = \[3000, 5\], got torch.int64"):
        run("ensemble", relax=torch.zeros(3000, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"relax must be a bool tensor"):
        verify("strict", target, draft, x, temperature=0.0, relax=torch.zeros(3000, 4, dtype=torch.bool))


# ---------------------------------------------------------------- engine


PROMPTS = [e.prompt for e in synthetic.examples("arithmetic", "test", 12)]
KW = dict(draft_length=4, max_new_tokens=80, temperature=0.7, top_p=0.95, seed=3)


def test_a_span_that_never_opens_is_strict_token_for_token(builtin_pair):
    verifier, drafter = builtin_pair
    strict = generate(verifier, drafter, PROMPTS, method="strict", **KW)
    closed = generate(verifier, drafter, PROMPTS, method="ensemble", weight=0.3, phase="QQQ..ZZZ", **KW)
    assert [r.token_ids for r in closed.results] == [r.token_ids for r in strict.results]
    relaxed = generate(verifier, drafter, PROMPTS, method="ensemble", weight=0.3, **KW)
    assert [r.token_ids for r in relaxed.results] != [r.token_ids for r in strict.results]


def test_relaxing_the_steps_only(builtin_pair):
    """Coupled to relaxing everywhere until the final-answer marker (the same decisions, so the same text), strict
    after it: no draft is accepted on the relaxation's word once the marker is out."""
    verifier, drafter = builtin_pair
    tok = verifier.tokenizer
    steps = generate(verifier, drafter, PROMPTS, method="ensemble", weight=0.3, phase=(None, ANSWER), **KW)
    everywhere = generate(verifier, drafter, PROMPTS, method="ensemble", weight=0.3, **KW)
    checked = 0
    for a, b in zip(steps.results, everywhere.results):
        if ANSWER not in a.text:
            continue
        checked += 1
        assert a.text[:a.text.index(ANSWER) + len(ANSWER)] == b.text[:b.text.index(ANSWER) + len(ANSWER)]
        done = []
        for rnd in a.trace:
            if ANSWER in tok.decode(done):  # the round starts after the marker: strict
                assert not any(rnd.relaxed_only), a.text
            done += rnd.drafts[:rnd.num_accepted] + [rnd.emitted]
    assert checked >= 6
    assert sum(any(any(r.relaxed_only) for r in res.trace) for res in steps.results) >= 6  # relaxed before it


def test_phase_errors(builtin_pair):
    verifier, drafter = builtin_pair
    with pytest.raises(ValueError, match="phase 'think': the verifier's tokenizer has no <think> / </think> tokens"):
        generate(verifier, drafter, PROMPTS[:1], method="ensemble", phase="think")
    with pytest.raises(ValueError, match=r"phase marker #100000 is not a token id of the verifier's tokenizer"):
        generate(verifier, drafter, PROMPTS[:1], method="ensemble", phase="#100000..")


# ---------------------------------------------------------------- bench and tune settings


def test_bench_phase_setting(tmp_path):
    from relaxspec.bench.config import BenchConfig
    from relaxspec.bench.cell import CellSpec, cell_config
    from relaxspec.bench.runner import run_grid
    from relaxspec.bench.report import build_rows, format_report
    from relaxspec.bench.store import Store
    with pytest.raises(ValueError, match="phase must be 'think' or 'BEGIN..END'"):
        BenchConfig(phase="steps").validate()
    with pytest.raises(ValueError, match="task 'jsonl:x.jsonl' offers no relaxation span"):
        BenchConfig(tasks=["arithmetic", "jsonl:x.jsonl"], phase="task").validate()
    config = BenchConfig(verifiers=["verifier"], drafters=["drafter-weak"], tasks=["arithmetic"],
                         methods=["ar", "strict", "ensemble:weight=0.3"], draft_lengths=[2], limit=3, repeats=1,
                         max_new_tokens=40, looks=1, speed_prompts=0, workers=1, out=str(tmp_path), phase="task")
    config.validate()
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "ensemble", {"weight": 0.3}, 2, 0)
    versions = {"verifier": "v", "drafter-weak": "d", "code": "c"}
    assert cell_config(spec, config, versions)["phase"] == "..The answer is"
    plain = BenchConfig(**{**config.__dict__, "phase": None})
    assert "phase" not in cell_config(spec, plain, versions)  # keys without a phase are unchanged
    run_grid(config, progress=False, log=lambda *a: None)
    with Store(tmp_path) as store:
        rows = build_rows(store)
        assert {r["method"] for r in rows} == {"ar", "strict", "ensemble"}
        assert "relaxed only in the phase '..The answer is'" in format_report(rows, 0.03)


def test_tune_setting_and_generate_config(tmp_path, forker):
    import json
    from relaxspec.tune.run import TuneConfig
    assert TuneConfig(phase="task").bench_config(4).phase == "task"
    with pytest.raises(ValueError, match="phase must be 'think' or 'BEGIN..END'"):
        TuneConfig(phase="answer").validate()
    toml = tmp_path / "tune.toml"  # what tune writes: the task's span resolved to its markers
    toml.write_text('method = "ensemble:weight=0.3"\ntemperature = 0.7\nphase = "..The answer is"\n')

    def cli(*args):  # in a process of its own (forked: this tree's src first, conftest.forker)
        out = forker.run(["-m", "relaxspec", "generate", "--prompt", PROMPTS[0], "--json", "--max-new-tokens", "60",
                          *args], cwd=tmp_path, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["results"][0]["token_ids"]

    explicit = cli("--method", "ensemble", "--param", "weight=0.3", "--temperature", "0.7", "--phase", "..The answer is")
    assert cli("--config", str(toml)) == explicit
    bad = forker.run(["-m", "relaxspec", "generate", "--prompt", "x", "--phase", "task"], cwd=tmp_path, timeout=300)
    assert bad.returncode != 0 and "phase 'task' needs a task" in bad.stderr and "Traceback" not in bad.stderr


def test_the_default_think_span_on_a_tokenizer_that_has_it(tok):
    import copy
    from relaxspec.engine.phase import check_phase
    think = copy.deepcopy(tok)
    think.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    begin, end = think.convert_tokens_to_ids("<think>"), think.convert_tokens_to_ids("</think>")
    check_phase(Phase(), think)
    x = _ids(think, "ok")
    tracker = PhaseTracker(parse_phase("think"), think, [_ids(think, "Q: hi") + [begin], _ids(think, "Q: hi")])
    assert tracker.relax([x + [end] + x, x + [begin] + x]) == [
        [True] * (len(x) + 1) + [False] * (len(x) + 1),
        [False] * (len(x) + 1) + [True] * (len(x) + 1)]


def test_a_phase_counts_its_relaxed_drafts_and_says_when_it_never_opened():
    from relaxspec.drafters import load_drafter
    from relaxspec.engine import generate
    from relaxspec.models import load_model
    verifier = load_model("verifier")
    drafter = load_drafter("drafter-weak", verifier)
    run = dict(method="cactus", draft_length=3, max_new_tokens=12, temperature=0.7)
    with pytest.warns(UserWarning, match="the span never opened in any response"):
        never = generate(verifier, drafter, ["Compute 12 + 7.", "Sort 3 1 2."], phase="NEVER-SEEN..", **run).stats
    assert never.drafts_proposed > 0 and never.phase_relaxed_positions == 0
    always = generate(verifier, drafter, ["Compute 12 + 7.", "Sort 3 1 2."], phase="..NEVER-SEEN", **run).stats
    assert always.phase_relaxed_positions == always.drafts_proposed > 0

