"""``python3 -m determined.launch.horovod`` runs ``cairn.launch.horovod``."""

import sys

from cairn.launch.horovod import main

if __name__ == "__main__":
    sys.exit(main())
