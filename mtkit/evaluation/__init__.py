"""Evaluation: sacreBLEU metrics with signatures, paired significance tests, problem flags, and the `evaluate` report."""
