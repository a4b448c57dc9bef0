"""Tune against the exhaustive grid (issue 15): generated tokens of each, tune's choice against the grid's best
configuration under the same rule (upper 95% bound of the drop vs strict <= max drop, highest objective), both
objectives at the same speed constants (relaxspec.tune.compare).

    relaxspec bench --out GRID                                   # the exhaustive default grid
    relaxspec tune --task arithmetic --max-drop 0.02 --out TUNE
    PYTHONPATH=src python benchmarks/tune_vs_grid.py --grid GRID --tune TUNE [--max-drop 0.02]
        [--constants tune|grid|measured] [--c-rel X] [--c-block X]
"""

import sys

from harness.options import parser
from relaxspec.tune.compare import CONSTANTS, compare, format_comparison


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--grid", required=True, help="the grid's bench output directory")
    p.add_argument("--tune", required=True, help="tune's output directory")
    p.add_argument("--max-drop", type=float, default=0.02)
    p.add_argument("--constants", choices=CONSTANTS, default="tune",
                   help="the c_rel / c_block (per N) both objectives use: those tune's or the grid's store measured "
                        "(the grid's: only its N), or measured now for the pair (default: tune's)")
    p.add_argument("--c-rel", type=float, help="c_rel for both, every N (overrides the measured one)")
    p.add_argument("--c-block", type=float, help="c_block for both, every N (overrides the measured one)")
    args = p.parse_args(argv)
    try:
        result = compare(args.grid, args.tune, args.max_drop, args.constants, args.c_rel, args.c_block)
    except ValueError as e:
        print(f"tune_vs_grid: error: {e}", file=sys.stderr)
        return 2
    print(format_comparison(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
