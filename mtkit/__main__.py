"""Entry point for `python -m mtkit` (used by torchrun and in tests)."""

from mtkit.cli import main

main()
