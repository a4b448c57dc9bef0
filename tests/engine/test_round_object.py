"""The round as an object: `generate` is a thin driver over a checked `Request` and a strategy (`Autoregressive`,
`Speculative`) whose round runs propose -> verifier feed -> verify -> record -> rollback, its drafter with its
drafting policy (N, dynamic N, confidence stop) and the verify step's hooks (pivot classifier, phase: one interface,
`VerifyHook`, in a list) configured once, none when not asked for."""

import inspect

import numpy as np
import pytest
import torch

from relaxspec.acceptance.verify import VerifyStep
from relaxspec.drafters import LMDrafter
from relaxspec.drafters.policy import AUTO_MAX, AUTO_START, AutoDraftLength, ConfidenceStop
from relaxspec.engine import generate
from relaxspec.engine.book import Book
from relaxspec.engine.hooks import Block, PhaseRelax, VerifyHook
from relaxspec.engine.request import Request, load
from relaxspec.engine.round import Autoregressive, Speculative
from relaxspec.models.hf import CausalLM, load_inputs
from relaxspec.models.stream import Stream
from relaxspec.tasks import synthetic

PROMPTS = [e.prompt for e in synthetic.examples("arithmetic", "test", 3)]


def _arguments(verifier, drafter, prompts=PROMPTS, method="strict", draft_length=3, max_new_tokens=30,
               temperature=0.0, seed=0, pivot_fn=None, phase=None, draft_confidence=None, **rule_params) -> dict:
    return dict(verifier=verifier, drafter=drafter, prompts=prompts, method=method, draft_length=draft_length,
                max_new_tokens=max_new_tokens, temperature=temperature, top_k=None, top_p=None, seed=seed,
                pivot_fn=pivot_fn, chat_template="auto", system=None, phase=phase, draft_confidence=draft_confidence,
                rule_params=rule_params)


def _check(verifier, drafter, **kw) -> Request:
    return load(Request(**_arguments(verifier, drafter, **kw)))


def _run(decoding, started=None):
    """generate's loop by hand (in one inference mode, as generate runs); `started()` after the prefills."""
    with torch.inference_mode():
        last = decoding.start()
        if started is not None:
            started()
        while decoding.book.live_count:
            last = decoding.round(last)
    return decoding.book.results()


def test_the_request_holds_the_checked_arguments(builtin_pair):
    verifier, drafter = builtin_pair
    ar = _check(verifier, drafter, method="ar", phase="..The answer is")
    assert ar.rule is None and ar.step is None and ar.drafter is None and ar.draft_length == 0
    assert ar.phase is not None  # (checked; AR relaxes nothing, so it reads no phase)
    spec = _check(verifier, drafter, method="cactus", draft_length="auto", max_new_tokens=7, seed=[4, 5, 6], delta=0.2)
    assert isinstance(spec.drafter, LMDrafter) and isinstance(spec.step, VerifyStep)
    assert spec.auto and spec.draft_length == 7  # auto's bound, AUTO_MAX, cut to the length limit
    assert _check(verifier, drafter, draft_length="auto").draft_length == AUTO_MAX
    assert spec.seeds == [4, 5, 6] and spec.inputs == {}
    assert len(spec.encoded) == 3 and all(ids for ids in spec.encoded)
    with pytest.raises(ValueError, match=r"^seed: got 2 per-prompt seeds for 3 prompts$"):
        _check(verifier, drafter, seed=[1, 2])
    with pytest.raises(ValueError, match=r"^method 'pad' needs a pivot classifier"):
        _check(verifier, drafter, method="pad")


def test_a_request_only_checks_and_one_call_of_the_models_loads_them(builtin_pair, monkeypatch, tmp_path):
    """`Request` takes keyword arguments only and loads nothing (an argument's error comes before a missing model's);
    `load` gives it its models through one call of the models layer, which counts the drafter's own context."""
    verifier, drafter = builtin_pair
    with pytest.raises(TypeError):
        Request(*_arguments(verifier, drafter).values())
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match=r"^max_new_tokens must be an integer >= 1, got 0$"):
        Request(**_arguments(missing, missing, max_new_tokens=0))
    request = Request(**_arguments(missing, "drafter-weak", method="cactus", delta=0.2))
    assert (request.verifier, request.drafter, request.draft_length) == (missing, "drafter-weak", 3)  # nothing loaded
    with pytest.raises(ValueError, match="missing"):
        load(request)
    from relaxspec.engine import request as request_module
    calls = []
    monkeypatch.setattr(request_module, "load_inputs", lambda *a, **k: calls.append(a) or load_inputs(*a, **k))
    loaded = load(Request(**_arguments("verifier", "drafter-weak", prompts=PROMPTS[:1])))
    assert len(calls) == 1 and calls[0][0] == "verifier"
    assert isinstance(loaded.verifier, CausalLM) and isinstance(loaded.drafter, LMDrafter)
    assert loaded.drafter_lm is loaded.drafter.lm and loaded.encoded and loaded.device == loaded.verifier.device
    # the drafter's own LM counts: a context it cannot hold is refused by the same one call
    limit = verifier.max_position_embeddings
    monkeypatch.setattr(type(drafter), "max_position_embeddings", property(lambda lm: 8 if lm is drafter else limit))
    with pytest.raises(ValueError, match=r"^max_new_tokens 30 leaves no room for a prompt in the context of 8 "):
        _check(verifier, drafter)
    assert _check(verifier, drafter, method="ar").drafter is None  # (AR ignores the drafter argument)


@pytest.mark.parametrize("method", ["ar", "strict"])
def test_driving_a_strategy_round_by_round_is_generate(builtin_pair, method):
    verifier, drafter = builtin_pair
    kw = dict(method=method, max_new_tokens=30, temperature=0.7, seed=3)
    out = generate(verifier, drafter if method != "ar" else None, PROMPTS, **kw, **(
        {"draft_length": "auto", "draft_confidence": 0.5} if method != "ar" else {}))
    request = _check(verifier, drafter, **kw, **({"draft_length": "auto", "draft_confidence": 0.5}
                                                 if method != "ar" else {}))
    decoding = (Autoregressive if method == "ar" else Speculative)(request)
    outputs, stats, traces = _run(decoding)
    assert outputs == [r.token_ids for r in out.results]
    assert [s.as_dict() for s in stats] == [r.stats.as_dict() for r in out.results]
    assert decoding.stats.verifier_forwards == out.stats.verifier_forwards
    assert (method == "ar") == (traces == [[], [], []])


def test_the_round_runs_its_parts_in_order_and_its_hooks_only_when_asked(builtin_pair, monkeypatch):
    """Per round: propose, the verifier's feed, verify, record, then both rollbacks; a hook that is not asked for
    is None (and never runs), one that is asked for runs in every round."""
    verifier, drafter = builtin_pair
    calls = []

    def spy(owner, name, label, verifiers_only=False):
        original = getattr(owner, name)

        def wrapper(self, *a, **k):
            if not verifiers_only or self.lm is verifier:  # (the LM drafter has a Stream of its own)
                calls.append(label)
            return original(self, *a, **k)
        monkeypatch.setattr(owner, name, wrapper)

    spy(LMDrafter, "propose", "propose")
    spy(Stream, "feed", "feed", verifiers_only=True)
    spy(VerifyStep, "__call__", "verify")
    spy(Book, "record", "record")
    spy(Stream, "invalidate_tail", "rollback", verifiers_only=True)
    spy(LMDrafter, "rollback", "drafter rollback")
    spy(ConfidenceStop, "__init__", "confidence stop")
    spy(PhaseRelax, "inputs", "phase")
    spy(AutoDraftLength, "update", "schedule")

    plain = Speculative(_check(verifier, drafter))
    assert (plain.drafter.confidence, plain.drafter.schedule, plain.hooks) == (None, None, [])
    _run(plain, started=calls.clear)
    rounds = plain.stats.verifier_forwards
    assert rounds > 3
    assert calls == ["propose", "feed", "verify", "record", "rollback", "drafter rollback"] * rounds

    hooked = Speculative(_check(verifier, drafter, method="ensemble", draft_length="auto", draft_confidence=0.5,
                                phase="..The answer is", weight=0.3))
    assert hooked.drafter.confidence == 0.5 and isinstance(hooked.drafter.schedule, AutoDraftLength)
    assert [type(hook) for hook in hooked.hooks] == [PhaseRelax]
    _run(hooked, started=calls.clear)
    rounds = hooked.stats.verifier_forwards
    assert [calls.count(hook) for hook in ("confidence stop", "phase", "schedule")] == [rounds] * 3


class Recorder(VerifyHook):
    """A verify hook that makes every draft strict (the `relax` rule input all False) and records each call the
    round makes to it."""

    host_rounds = True

    def __init__(self, rows: int):
        self.calls, self.rows = [], rows

    def inputs(self, block: Block) -> dict:
        rows, width = block.drafts.shape
        assert rows == self.rows and block.target_logits.shape[1] == width + 1
        self.calls.append("inputs")
        return {"relax": torch.zeros((rows, width + 1), dtype=torch.bool)}

    def advance(self, rounds) -> None:
        assert len(rounds) == self.rows and all(rounds)  # each row's kept drafts and its emitted token
        self.calls.append("advance")

    def select(self, rows) -> None:
        self.rows = len(rows)
        self.calls.append("select")

    def warning(self) -> str | None:
        return f"{self.calls.count('inputs')} rounds"


def test_a_verify_hook_is_called_at_its_named_points(builtin_pair):
    """The round calls each hook of its list: `inputs` before verify (what it gives reaches the rule), `advance` after
    the rollbacks with the round's host rows, `select` when rows leave, `warning` at the end; the interface's own
    methods do nothing."""
    verifier, drafter = builtin_pair
    relaxed = _check(verifier, drafter, method="ensemble", weight=0.0)  # (every draft accepted)
    decoding = Speculative(relaxed)
    assert decoding.hooks == [] and not decoding.host_rounds
    recorder = Recorder(len(PROMPTS))
    decoding.hooks.append(recorder)
    decoding.host_rounds = True
    outputs = _run(decoding)[0]
    rounds = decoding.stats.verifier_forwards
    assert [call for call in recorder.calls if call != "select"] == ["inputs", "advance"] * rounds
    assert recorder.calls.count("select") >= 1 and recorder.rows == 0  # every row ended (not all at once)
    assert decoding.warnings() == [f"{rounds} rounds"]
    # strict everywhere: strict's outputs, not the relaxed rule's
    assert outputs == _run(Speculative(_check(verifier, drafter)))[0] != _run(Speculative(relaxed))[0]

    class Bare(VerifyHook):
        pass

    bare = Bare()
    assert (bare.inputs(None), bare.advance(None), bare.select([]), bare.warning(), bare.host_rounds) == (
        {}, None, None, None, False)


def test_the_drafting_policy_alone():
    schedule = AutoDraftLength(3, bound=6)
    assert schedule.limit(6).tolist() == [AUTO_START] * 3
    assert schedule.limit(np.array([6, 2, 6])).tolist() == [AUTO_START, 2, AUTO_START]  # within each row's room
    schedule.update(np.array([5, 1, 4]), 5)  # row 0 kept all its drafts, rows 1 and 2 did not
    assert schedule.lengths.tolist() == [6, AUTO_START - 1, AUTO_START - 1]  # +2 capped at the bound, -1
    schedule.select([0, 2])  # row 1 left the batch
    schedule.update(np.array([6, 3]), np.array([6, 3]))  # each row's own number proposed
    assert schedule.lengths.tolist() == [6, AUTO_START + 1]
    stop = ConfidenceStop(0.5, np.array([4, 4]))
    q = torch.tensor([[0.9, 0.1], [0.3, 0.7]])
    token = torch.tensor([0, 0])  # row 1's draft had probability 0.3
    assert stop(0, None, token, q) is False and stop.count.tolist() == [4, 1]
    assert stop(1, None, torch.tensor([1, 0]), q) is True and stop.count.tolist() == [2, 1]


def test_generate_is_a_thin_driver():
    source = inspect.getsource(generate.__wrapped__)
    assert len(source.splitlines()) < 60, len(source.splitlines())
    # once the request is checked, the driver reads none of the hooks' arguments: each is the round's
    after_check = source.split('"""')[2].split("load(Request(", 1)[1].split("))\n", 1)[1]
    assert "decoding.round(" in after_check
    for word in ("phase", "pivot", "confidence", "draft_length", "auto", "rule_params"):
        assert word not in after_check, word
