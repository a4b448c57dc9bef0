"""Training: the built-in model family (`training.family`, `relaxspec models train`) and MTP drafter heads by
self-distillation (`training.mtp`, `relaxspec drafter train`)."""
