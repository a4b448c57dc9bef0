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
DEFAULT_TASK = "word-problems"  # `relaxspec pivot build`'s task for a chat pair (tasks/word_problems.py)


def builtin_classifier_path() -> Path:
    """The shipped classifier for the built-in pair (verifier + drafter-weak) on arithmetic."""
    path = BUILTIN_DIR / BUILTIN_CLASSIFIER
    if not path.exists():
        raise FileNotFoundError(
            f"the built-in pivot classifier is missing ({path}); train one with "
            "`relaxspec pivot label --verifier verifier --drafter drafter-weak --task arithmetic --out L.pt` "
            "then `relaxspec pivot train L.pt --out CLASSIFIER.pt`, and pass it explicitly")
    return path


def shipped_name(spec: dict) -> str:
    """The file name a classifier ships under in `pivot/builtin/`: `<task>-<verifier>-<drafter>.pt` (each model by
    its registry / built-in name, or its file's stem). The lookup (`classifier_for_pair`) reads the pair's
    fingerprints inside each file, so the name is for people; two classifiers for one pair: the first by name wins."""
    def stem(name) -> str:
        name = str(name or "none").rpartition("::")[2]
        return Path(name).name.removesuffix(".gguf")

    return f"{spec.get('task') or 'task'}-{stem(spec.get('verifier'))}-{stem(spec.get('drafter'))}.pt"


def train_command(verifier, drafter, dtype: str | None = None) -> str:
    """The command that builds a classifier for a pair (the missing-classifier message names it)."""
    return (f"relaxspec pivot build --verifier {verifier.name} --drafter {drafter.name}"
            + (f" --dtype {dtype}" if dtype else "") + f" --task {DEFAULT_TASK} --out DIR")


def shipped_for_names(pairs, directory: Path | None = None) -> Path | None:
    """The first classifier shipped in `directory` (default `BUILTIN_DIR`) trained for one of `pairs`, (verifier,
    drafter) as a bench config names them (registry or built-in names; the fingerprints are checked where the
    models are loaded, `classifier_for_pair`); None: none ships for them."""
    pairs = {(str(v), str(d)) for v, d in pairs}
    return next((path for path, clf in _shipped(directory)
                 if (str(clf.spec.get("verifier")), str(clf.spec.get("drafter"))) in pairs), None)


def _shipped(directory: Path | None):
    """(path, classifier) of each classifier in `directory` (default `BUILTIN_DIR`, read at each call), by name; a
    foreign `*.pt` file (not a classifier for any pair) is passed over."""
    for path in sorted(Path(BUILTIN_DIR if directory is None else directory).glob("*.pt")):
        try:
            yield path, load_classifier(path)
        except (OSError, ValueError):
            continue


def classifier_for_pair(verifier, drafter=None, directory: Path | None = None, force: bool = False) -> Path:
    """The classifier shipped in `directory` (default `BUILTIN_DIR`, read at each call) for this verifier and
    drafter (CausalLMs; drafter None: any drafter of the verifier): the first `*.pt` by name whose stored
    fingerprints match the pair (`PivotClassifier.check_models`); `force`: else the first for the verifier alone.
    None there: a FileNotFoundError in one line naming the command that trains one."""
    directory = Path(BUILTIN_DIR if directory is None else directory)
    for_verifier = None
    for path, clf in _shipped(directory):
        if not clf.check_models(verifier, drafter):
            return path
        if for_verifier is None and not clf.check_models(verifier):
            for_verifier = path
    if force and for_verifier is not None:
        return for_verifier
    dtype = getattr(verifier, "weight_format", None)
    command = train_command(verifier, drafter, dtype if dtype not in (None, "float32") else None) \
        if drafter is not None else "relaxspec pivot build"
    other = (f"; --force uses {for_verifier.name}, trained for another drafter of this verifier"
             if for_verifier is not None else "")
    raise FileNotFoundError(
        f"no pivot classifier ships for verifier {verifier.name!r}"
        + (f" with drafter {drafter.name!r}" if drafter is not None else "")
        + f" (in {directory}); train one with `{command}` and pass --param classifier=DIR/classifier.pt" + other)


__all__ = ["classifier_for_pair", "shipped_for_names", "shipped_name", "train_command", "label_pivots", "train_classifier", "load_classifier", "PivotClassifier", "candidate_features",
           "builtin_classifier_path", "is_pivot", "rollout_utilities", "roc_auc", "label_stats", "SCALAR_FEATURES",
           "pivot_timer"]
