"""Local demos on CPU, no cloud.

- ``python -m training.demo --out DIR``: synthetic data -> torchrun pipeline -> report (:mod:`.direct`).
- ``python -m training.demo.through_queue --out DIR``: the same run submitted through a local
  redis-server and run by a worker, as in a cluster (what ``make demo`` runs).
- :mod:`.synthetic` generates the dataset; the local redis-server and Ray head they start are in
  :mod:`training.localdev`.
"""
