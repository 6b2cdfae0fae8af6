"""``python3 -m determined.launch.deepspeed`` runs ``cairn.launch.deepspeed``."""

import sys

from cairn.launch.deepspeed import main

if __name__ == "__main__":
    sys.exit(main())
