"""`relaxspec methods` shows what each rule needs, how it behaves at temperature 0 and with a one-hot q."""

import argparse
import json

from relaxspec.acceptance import RULES
from relaxspec.cli import cmd_methods


def _run(capsys, as_json):
    assert cmd_methods(argparse.Namespace(json=as_json)) == 0
    return capsys.readouterr().out


def test_json_listing_has_needs_greedy_and_one_hot_q(capsys):
    listed = json.loads(_run(capsys, True))
    assert set(listed) == set(RULES)
    for name, rule in RULES.items():
        info = listed[name]
        assert info["needs"] == {"extra_draft_passes": rule.extra_draft_passes, "reads_q": rule.reads_q,
                                 "inputs": {t: spec.doc for t, spec in rule.inputs.items()},
                                 "state": {t: spec.doc for t, spec in rule.state.items()},
                                 "reads_uniforms": rule.reads_uniforms,
                                 "greedy_closed_form": rule.greedy_closed_form}
        assert info["one_hot_q"] == {"valid": rule.valid_with_one_hot_q, "behaviour": rule.one_hot_q}
        assert info["at_temperature_0"] == rule.at_greedy
    assert listed["spec-cont-dec"]["needs"]["extra_draft_passes"] == 1
    assert listed["typical"]["needs"]["reads_q"] is False
    assert listed["ensemble"]["one_hot_q"]["valid"] is False
    assert listed["pad"]["params"]["floor"] == {
        "default": "classifier", "range": "one of classifier, authors", "grid": [],
        "doc": RULES["pad"].params["floor"].doc}
    assert listed["pad"]["strict"] == {"threshold": 0.0, "floor": "classifier"}


def test_text_listing_says_it_too(capsys):
    out = _run(capsys, False)
    assert "greedy='rule', the default" in out and "greedy='strict'" in out
    blocks = {b.split(":", 1)[0]: b for b in out.split("\n\n")[1:]}
    assert set(blocks) == set(RULES)
    for name, rule in RULES.items():
        verdict = "ok" if rule.valid_with_one_hot_q else "refused"
        assert f"one-hot q (drafter without distributions): {verdict}: {rule.one_hot_q}" in blocks[name]
        assert f"needs: {rule.needs_text()}" in blocks[name]
        assert f"at temperature 0: {rule.at_greedy}" in blocks[name]
    assert "1 extra drafter pass(es) per round" in blocks["spec-cont-dec"]
    assert "--param floor=<classifier>  range one of classifier, authors" in blocks["pad"]
