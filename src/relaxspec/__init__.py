"""relaxspec: lossless and relaxed speculative decoding, with utility measured next to speed."""

from relaxspec.version import __version__

__all__ = ["verify", "generate", "tune"]


def __getattr__(name):
    # Lazy, so `import relaxspec` (and the CLI's --help) does not pay for importing torch.
    if name == "verify":
        from relaxspec.acceptance import verify

        return verify
    if name == "generate":
        from relaxspec.engine import generate

        return generate
    if name == "tune":
        import relaxspec.tune as tune  # a callable package: relaxspec.tune(...) runs the search

        return tune
    raise AttributeError(f"module 'relaxspec' has no attribute {name!r}")
