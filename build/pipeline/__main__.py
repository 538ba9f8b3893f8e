import signal
import sys

from .cli import main


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM as an exception, so `finally` blocks and temporary folders clean up.
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _terminate)
sys.exit(main())
