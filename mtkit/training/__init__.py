"""Training: the trainer and its loop, batches, loss, schedules, EMA, validation, the run directory and its curves."""
