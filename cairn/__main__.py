"""``python -m cairn`` runs the CLI."""

import sys

from cairn.cli import main

sys.exit(main())
