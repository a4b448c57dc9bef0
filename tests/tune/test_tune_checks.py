"""tune's settings checked before any work, through the Python API: values of the wrong kind, caps that follow the
rungs, search prompts past the last rung, no budget."""

import math

import pytest

import relaxspec
from relaxspec.tune.run import TuneConfig


@pytest.mark.parametrize("settings, says", [
    ({"budget_minutes": "5"}, "tune: budget minutes must be a number, got '5'"),
    ({"methods": "strict,cactus"}, "tune: methods must be a list of strings"),
    ({"methods": []}, "tune: methods name nothing to search"),
    ({"methods": ["ar"]}, "tune: methods name nothing to search"),
    ({"c_block": float("inf")}, "tune: c-block must be a finite number > 0"),
])
def test_python_tune_settings_of_the_wrong_kind(tmp_path, settings, says):
    with pytest.raises(ValueError) as raised:
        relaxspec.tune(out=str(tmp_path / "t"), plots=False, **settings)
    assert says in str(raised.value)


def test_search_prompts_beyond_the_last_rung_are_not_built():
    from relaxspec.tune.run import TuneConfig
    config = TuneConfig(search_prompts=100000, sizes=(2, 4))
    with pytest.warns(UserWarning, match="the race reads at most 4 samples of a configuration"):
        config.validate()
    assert config.search_prompts == 4


def test_tune_caps_follow_rungs():
    two, one = TuneConfig(sizes=(2, 4)), TuneConfig(sizes=(2,))
    two.validate()
    one.validate()
    assert (two.caps, one.caps) == ((64,), ())
    five = TuneConfig(sizes=(1, 2, 3, 4, 5))
    five.validate()
    assert five.caps == (64, 16, 4, 4)
    explicit = TuneConfig(sizes=(2, 4), caps=(2, 2))
    with pytest.raises(ValueError, match="one positive cap per rung"):
        explicit.validate()  # given caps are still checked, not replaced


def test_tune_without_a_budget_is_one_line(tmp_path):
    """budget_minutes=None: TypeError: '>' not supported before; no budget is inf minutes (docs/tune.md)."""
    import relaxspec
    with pytest.raises(ValueError, match=r"^tune: budget must be > 0 minutes \(inf: no budget\), got None$"):
        relaxspec.tune(budget_minutes=None, out=str(tmp_path / "t"))
    TuneConfig(budget_minutes=math.inf, out=str(tmp_path / "t")).validate()
