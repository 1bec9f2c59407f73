"""Models that make data: the synthetic sides of a recipe's corpora (`data.train[i].translate_with` for
distillation, `back_translate_with` for back-translation), generated once and cached in the data directory."""
