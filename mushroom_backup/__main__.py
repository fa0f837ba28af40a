"""``python -m mushroom_backup`` runs the CLI."""

from .cli import main

main()
