"""Building blocks of the training stages (torch lives here): the training loop, checkpoints,
optimizer, DDP helpers, models, data loading, FAISS search, metrics, logging and the
common stage entrypoint."""
