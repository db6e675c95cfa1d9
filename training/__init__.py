"""ragpool training package: RAG retriever, index, generator and evaluation entrypoints.

Importing this package is cheap (no torch); each entrypoint module imports torch itself.
See ``python -m training.<stage> --help`` and each module's docstring for its torchrun line.
"""
