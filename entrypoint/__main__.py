"""`python -m entrypoint`: the same as the `frontier-serve` console script."""

import sys

from entrypoint.cli import main

if __name__ == "__main__":
    sys.exit(main())
