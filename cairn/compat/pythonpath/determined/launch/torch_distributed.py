"""``python3 -m determined.launch.torch_distributed`` runs ``cairn.launch.torch_distributed``."""

import sys

from cairn.launch.torch_distributed import main

if __name__ == "__main__":
    sys.exit(main())
