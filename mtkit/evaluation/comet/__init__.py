"""COMET and COMET-QE scores without unbabel-comet: its published checkpoints read as they are, over transformers'
XLM-R encoder (the `comet` extra), so the metric shares mtkit's environment (unbabel-comet pins transformers < 5).
"""
