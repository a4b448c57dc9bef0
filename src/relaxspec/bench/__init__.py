"""Bench: grid runner, speed-up model, result store, report and plots."""
