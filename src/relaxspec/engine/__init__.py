"""Draft -> verify -> accept loop over a verifier/drafter pair, plus the autoregressive baseline."""

from relaxspec.acceptance import derive_seed
from relaxspec.engine.generate import AR, GenerationOutput, Round, SequenceResult, generate
from relaxspec.engine.stats import GenerationStats

__all__ = ["generate", "GenerationOutput", "GenerationStats", "SequenceResult", "Round", "AR", "derive_seed"]
