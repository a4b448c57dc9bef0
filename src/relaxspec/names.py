"""Names every layer shares (the bottom layer: imports nothing)."""

AR = "ar"  # autoregressive decoding: the baseline every cell is compared with (no drafter, no acceptance rule)
