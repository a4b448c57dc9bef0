"""PAD (pivot-aware speculative decoding): label pivot tokens by verifier roll-outs, compute
features, train the small classifier the `pad` acceptance rule consults.

    from relaxspec.pivot import load_classifier, builtin_classifier_path
    clf = load_classifier(builtin_classifier_path())
    relaxspec.engine.generate(verifier, drafter, prompts, method="pad", pivot_fn=clf.pivot_fn())
"""

from __future__ import annotations

from pathlib import Path

from relaxspec.pivot.classifier import PivotClassifier, load_classifier, pivot_timer, roc_auc, train_classifier
from relaxspec.pivot.features import SCALAR_FEATURES, candidate_features
from relaxspec.pivot.label import is_pivot, label_pivots, label_stats, rollout_utilities

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN_CLASSIFIER = "arithmetic-verifier-drafter-weak.pt"


def builtin_classifier_path() -> Path:
    """The shipped classifier for the built-in pair (verifier + drafter-weak) on arithmetic."""
    path = BUILTIN_DIR / BUILTIN_CLASSIFIER
    if not path.exists():
        raise FileNotFoundError(
            f"the built-in pivot classifier is missing ({path}); train one with "
            "`relaxspec pivot label --verifier verifier --drafter drafter-weak --task arithmetic --out L.pt` "
            "then `relaxspec pivot train L.pt --out CLASSIFIER.pt`, and pass it explicitly")
    return path


__all__ = ["label_pivots", "train_classifier", "load_classifier", "PivotClassifier", "candidate_features",
           "builtin_classifier_path", "is_pivot", "rollout_utilities", "roc_auc", "label_stats", "SCALAR_FEATURES",
           "pivot_timer"]
