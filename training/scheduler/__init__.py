"""The scheduling plane: run specs, the Redis queue (Lua scripts in ``lua/``), the worker's run
loop, the ``ragpool`` run commands and the queue exporter.

Torch-free by contract (``ragpool submit`` validates specs without torch);
``tests/training/test_torch_boundary.py`` enforces it.
"""
