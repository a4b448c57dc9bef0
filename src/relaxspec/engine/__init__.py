"""Draft -> verify -> accept loop over a verifier/drafter pair, plus the autoregressive baseline."""

from relaxspec.engine.generate import AR, GenerationOutput, Round, SequenceResult, generate

__all__ = ["generate", "GenerationOutput", "SequenceResult", "Round", "AR"]
