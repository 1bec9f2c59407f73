"""Importers: models trained elsewhere turned into ordinary mtkit run directories.

One module per foreign format, each with the same small interface: `import_<format>(source, output)`
reads the format's files directly (no foreign library at run time), refuses what mtkit cannot
represent with one line naming the key, and writes `best.pt` and `config.yaml` into `output`, which
every mtkit command then accepts. `mtkit import <format>` calls it.
"""
