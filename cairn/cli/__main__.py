"""``python -m cairn.cli`` runs the CLI."""

import sys

from cairn.cli import main

sys.exit(main())
