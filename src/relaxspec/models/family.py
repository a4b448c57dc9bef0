"""The built-in model family: specifications, and where the shipped weights live (the family's LMs and MTP
drafter heads; a head's kind is recognized here so that `load_model` can refuse one)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BUILTIN_DIR = Path(__file__).parent / "builtin"
TOKENIZER_DIR = BUILTIN_DIR / "tokenizer"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    steps: int  # optimiser steps in the reproducible training recipe
    batch_size: int
    lr: float
    role: str
    # Distillation: start from the teacher's embedding, final norm and these decoder layers (layer
    # truncation), and add KL(teacher || model) on the response tokens to the loss.
    teacher: str | None = None
    teacher_layers: tuple[int, ...] = ()
    # Warm restarts, (steps, lr) each: continue from the saved weights with a fresh optimiser, schedule
    # and data stream (as `python -m relaxspec.training.family --continue-from`).
    restarts: tuple[tuple[int, float], ...] = ()


FAMILY = {
    spec.name: spec
    for spec in [
        ModelSpec("verifier", layers=6, hidden=128, heads=4, ffn=512, steps=3600, batch_size=32, lr=2.5e-3,
                  role="verifier: the strongest of the family"),
        # Layer truncation + distillation: the verifier's embedding and layers 0, 1 and 5 (the last layer
        # maps to the LM head: 68% greedy agreement before training, against 50% for layers 0-2), then
        # cross-entropy + KL to the verifier. Half the verifier's depth, so c_rel about 0.5. Greedy
        # arithmetic accuracy after each stage: 12%, 23%, 72% (100 held-out problems).
        ModelSpec("drafter-strong", layers=3, hidden=128, heads=4, ffn=512, steps=800, batch_size=32, lr=1.5e-3,
                  restarts=((600, 1e-3), (2000, 1e-3)),
                  role="drafter: competent smaller LM, distilled from the verifier's first two and last layers",
                  teacher="verifier", teacher_layers=(0, 1, 5)),
        # Two layers let the tiny drafter copy numbers from the question (an induction head needs two).
        ModelSpec("drafter-weak", layers=2, hidden=64, heads=2, ffn=192, steps=2000, batch_size=32, lr=3e-3,
                  role="drafter: tiny LM, knows the format, weak at the arithmetic"),
    ]
}
DEFAULT_VERIFIER = "verifier"
DEFAULT_DRAFTER = "drafter-weak"


def builtin_path(name: str) -> Path:
    if name not in FAMILY:
        raise ValueError(f"unknown built-in model {name!r}; built-in models: {sorted(FAMILY)}")
    return BUILTIN_DIR / name


def is_builtin(name: str) -> bool:
    return name in FAMILY


# MTP drafter heads (relaxspec.drafters.mtp): built-in ones by name, or directories saved by `drafter train`
KIND = "mtp"
BUILTIN_HEADS = ("drafter-mtp", "smollm2-drafter", "qwen2.5-coder-1.5b-head")


def head_directory(name: str | Path) -> Path:
    """Where a head lives: a built-in head's name, or a directory."""
    return BUILTIN_DIR / str(name) if str(name) in BUILTIN_HEADS else Path(name)


def is_mtp(name: str | Path) -> bool:
    """A built-in head name or a directory saved by `relaxspec drafter train --kind mtp`."""
    config = head_directory(name) / "config.json"
    try:
        return json.loads(config.read_text()).get("relaxspec_kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False
