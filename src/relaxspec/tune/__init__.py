"""Auto-tune: a budgeted search over (rule, strength, N) under a utility budget, confirmed on held-out prompts
(docs/design.md, "Auto-tune")."""

from __future__ import annotations

import sys
import types


def tune(verifier: str | None = None, drafter: str | None = None, task: str = "arithmetic",
         max_drop: float = 0.02, progress: bool = False, plots: bool = True, executor=None, **settings):
    """Run `relaxspec tune` from Python; returns a TuneResult (its .choice, .race, .confirmation, .toml_path).
    `settings`: any TuneConfig field (objective, c_rel, c_block, methods, draft_lengths, budget_minutes, out,
    search_prompts, heldout_prompts, heldout_repeats, sizes, caps, seed, temperature, top_k, top_p, phase, ...).
    `executor`: a relaxspec.bench.ExecutorOptions (kind "ray" runs each rung's samples on Ray)."""
    from relaxspec.tune.report import write_outputs
    from relaxspec.tune.run import TuneConfig, run_tune
    result = run_tune(TuneConfig(verifier=verifier, drafter=drafter, task=task, max_drop=max_drop, **settings),
                      progress=progress, executor=executor)
    write_outputs(result, plots=plots)
    return result


class _CallableModule(types.ModuleType):
    """`relaxspec.tune(...)` calls tune() even after `import relaxspec.tune` made the attribute this package."""

    def __call__(self, *args, **kwargs):
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["tune"]
