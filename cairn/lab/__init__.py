"""Tools of the compose lab cluster (``deploy/compose``), run inside cairn's services image."""
