"""Causal LMs for the engine: a Hugging Face adapter and the built-in family."""

from relaxspec.models.family import DEFAULT_DRAFTER, DEFAULT_VERIFIER, FAMILY, builtin_path, is_builtin
from relaxspec.models.hf import (CausalLM, check_same_vocab, load_model, measure_step_latencies, measure_step_latency,
                                 relative_costs)

__all__ = ["CausalLM", "load_model", "check_same_vocab", "measure_step_latency", "measure_step_latencies",
           "relative_costs", "FAMILY", "builtin_path", "is_builtin", "DEFAULT_VERIFIER", "DEFAULT_DRAFTER"]
