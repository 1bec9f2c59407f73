"""The parts of `python -m benchmarks.gpu_check`: its time budget, its lever table, its data and its timed runs."""
