import sys

from relaxspec.cli import main

sys.exit(main())
