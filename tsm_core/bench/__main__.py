"""``python -m tsm_core.bench COMMAND [options]``; see ``tsm_core.bench`` and ``--help``."""

import sys

from tsm_core.bench import main

if __name__ == "__main__":
    sys.exit(main())
