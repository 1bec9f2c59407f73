"""Serving: the FastAPI app (`mtkit serve`), its request batcher and its page."""
