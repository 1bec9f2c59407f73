"""mtkit's benchmarks: one script per question (speed, serving, peers, scale, ...), each writing JSON and a table.

Run a script as a module from the repository root, e.g. `python -m benchmarks.speed
recipes/multi30k/transformer.yaml`; `--help` says what it measures. `--smoke` runs any of them in seconds
on a tiny model and data (tests/corpus/), offline; tests/test_benchmarks.py runs every one that way.
Helpers shared by the scripts live in `benchmarks/common.py` (and OpenNMT-py's set-up in `opennmt.py`).
"""
