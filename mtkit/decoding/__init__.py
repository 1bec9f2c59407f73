"""Decoding: beam search and its constraints, the engines (PyTorch, CTranslate2), the translator, file
translation and pair scoring, CTranslate2 export, word alignment and attention heatmaps."""
