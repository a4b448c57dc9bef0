"""Tune vs the exhaustive grid (relaxspec.tune.compare, benchmarks/tune_vs_grid.py) on two real bench stores whose
samples are built so that every objective and interval is known exactly."""

from pathlib import Path

import pytest

from relaxspec.bench.store import Row, Store, cell_key
from relaxspec.tune.compare import compare, format_comparison, tune_choice
from relaxspec.tune.space import make_config

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = dict(verifier="verifier", drafter="drafter-weak", task="arithmetic", seed=0, temperature=0.7, top_k=None,
                top_p=0.95, max_new_tokens=160)
N = 2
TOKENS = 60


def _put(store, method, params, n_samples, tau, wrong=0, heldout=False, c_rel=0.25, c_block=1.5, start=0):
    """A cell of n_samples samples of TOKENS tokens at acceptance length tau; the first `wrong` have utility 0."""
    config = dict(SETTINGS, method=method, params=params, draft_length=0 if method == "ar" else N)
    if method == "ar":
        config["drafter"] = None
    if heldout:
        config["prompts"] = "held-out"
    rows = [Row(prompt_index=start + i, repeat=0, prompt=f"p{i}", reference="1", response="1",
                utility=0.0 if i < wrong else 1.0, tokens=TOKENS, stats={"mean_acceptance_length": tau})
            for i in range(n_samples)]
    metrics = {} if method == "ar" else {"c_rel_measured": c_rel, "c_block_measured": c_block}
    store.put(cell_key(config), config, metrics, rows)


@pytest.fixture
def stores(tmp_path):
    grid, tune = tmp_path / "grid", tmp_path / "tune"
    with Store(grid) as s:  # constants 0.2 / 1.0 in the grid, 0.25 / 1.5 in tune
        consts = dict(c_rel=0.2, c_block=1.0)
        _put(s, "ar", {}, 400, 1.0)
        _put(s, "strict", {}, 400, 2.0, **consts)
        _put(s, "cactus", {"delta": 1.0}, 400, 3.0, **consts)  # feasible: identical utilities (drop bound 0.0095)
        _put(s, "fuzzy", {"threshold": 0.3}, 400, 4.0, wrong=80, **consts)  # faster but lossy (drop 0.2)
        _put(s, "mentored", {"alpha": 0.3}, 400, 2.5, **consts)  # feasible, slower
    with Store(tune) as s:
        _put(s, "ar", {}, 40, 1.0)
        _put(s, "strict", {}, 40, 2.0)
        _put(s, "mentored", {"alpha": 0.3}, 40, 2.5)
        _put(s, "fuzzy", {"threshold": 0.3}, 6, 4.0, wrong=3)
        for method, params, tau in (("ar", {}, 1.0), ("strict", {}, 2.0), ("mentored", {"alpha": 0.3}, 2.4)):
            _put(s, method, params, 30, tau, heldout=True, start=100)
    (tune / "tune.toml").write_text('method = "mentored:alpha=0.3"\ndraft_length = 2\n')
    return grid, tune


def _speed(tau, c_rel, c_block, n=N):
    return TOKENS / (TOKENS / tau * (n * c_rel + c_block))  # AR's tokens over the rounds' cost


def test_compare_uses_one_set_of_constants_and_the_same_rule(stores):
    grid, tune = stores
    c = compare(grid, tune, max_drop=0.02)
    assert c.constants == {N: (0.25, 1.5)}  # tune's measured constants, for both
    assert c.choice.config == make_config("mentored", {"alpha": 0.3}, N)
    assert c.choice.speed.mean == pytest.approx(_speed(2.5, 0.25, 1.5)) and c.choice.speed.n == 40
    assert c.choice_heldout.speed.mean == pytest.approx(_speed(2.4, 0.25, 1.5)) and c.choice_heldout.speed.n == 30
    # The grid's best within the budget is cactus (the lossy fuzzy is faster but its drop of 0.2 is beyond it).
    assert c.grid_best.config == make_config("cactus", {"delta": 1.0}, N)
    assert c.grid_best.speed.mean == pytest.approx(_speed(3.0, 0.25, 1.5))
    assert c.choice_on_grid.speed.mean == pytest.approx(c.choice.speed.mean)
    assert c.grid_best_on_tune is None  # tune never sampled cactus
    assert not c.as_fast  # 1.875 < 2.25 with degenerate (exact) intervals
    # Tokens: every stored sample of each; tune's search and confirmation apart.
    assert c.grid_tokens == 2000 * TOKENS and c.grid_samples == 2000
    assert (c.search_tokens, c.confirm_tokens) == (126 * TOKENS, 90 * TOKENS)
    assert c.token_ratio == pytest.approx(216 / 2000)
    text = format_comparison(c)
    assert "SLOWER than the grid's best" in text and "within one third" in text and "ratio 0.108" in text
    # Within the CI: a noisy choice whose interval reaches the grid's best counts as at least as fast.
    c.choice.speed = type(c.choice.speed)(1.875, 1.5, 2.3, 40, 0.95)
    assert c.as_fast and "at least as fast as" in format_comparison(c)
    # A budget that admits the lossy configuration makes it the grid's best.
    assert compare(grid, tune, max_drop=0.5).grid_best.config.method == "fuzzy"


def test_compare_constants_from_the_grid_or_given(stores):
    grid, tune = stores
    g = compare(grid, tune, constants="grid")
    assert g.constants == {N: (0.2, 1.0)}
    assert g.grid_best.speed.mean == pytest.approx(_speed(3.0, 0.2, 1.0))
    assert g.choice.speed.mean == pytest.approx(_speed(2.5, 0.2, 1.0))
    given = compare(grid, tune, c_rel=0.5, c_block=1.0)
    assert given.constants == {N: (0.5, 1.0)} and given.choice.speed.mean == pytest.approx(_speed(2.5, 0.5, 1.0))
    with pytest.raises(ValueError, match="constants must be one of"):
        compare(grid, tune, constants="mine")


def test_tune_vs_grid_script(stores, tmp_path, forker):  # (forker: this tree's src first)
    grid, tune = stores
    script = str(ROOT / "benchmarks" / "tune_vs_grid.py")
    run = forker.run([script, "--grid", grid, "--tune", tune, "--c-block", "3"], cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "N=2: 0.250/3.000" in run.stdout and "verdict:" in run.stdout
    (tune / "tune.toml").unlink()
    bad = forker.run([script, "--grid", grid, "--tune", tune], cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("tune_vs_grid: error:") and "Traceback" not in bad.stderr
    with pytest.raises(ValueError, match="does not exist"):
        tune_choice(tmp_path)


@pytest.mark.parametrize("drafter", ["drafter-weak", "drafter-mtp"])
def test_constants_measured_now_for_a_drafter_of_any_kind(drafter):
    from relaxspec.tune.compare import measure_constants

    got = measure_constants({"verifier": "verifier", "drafter": drafter, "task": "arithmetic"}, {3, 5})
    assert set(got) == {3, 5}
    for c_rel, c_block in got.values():
        assert 0 < c_rel < 5 and 0.5 < c_block < 10
