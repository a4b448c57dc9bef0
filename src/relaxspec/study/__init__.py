"""The study: one paper's claims checked against a bench store (`study.findings`, `relaxspec report --findings`)."""
