"""``python3 -m determined.launch.wrap_rank`` runs ``cairn.launch.wrap_rank``."""

import sys

from cairn.launch.wrap_rank import main

if __name__ == "__main__":
    sys.exit(main())
