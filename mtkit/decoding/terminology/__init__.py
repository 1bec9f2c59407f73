"""Terminology: the terms a translation must contain, as users give them (`terms`: constraint lists,
`--constraints` and `--glossary` files) and as beam search keeps them (`search`: lexically
constrained beam search with dynamic beam allocation)."""
