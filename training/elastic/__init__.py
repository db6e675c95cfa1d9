"""Elastic torchrun runs (``nodes: {min, max}``): a rendezvous on the queue's Redis that the loss of any
training pod cannot take down (:mod:`training.elastic.rendezvous`), the launcher that registers it with
torchrun (``python -m training.elastic.launch``), and the batch arithmetic that keeps the global batch at
every world size (:mod:`training.elastic.sizes`, torch-free). docs/DESIGN.md "Elastic torchrun runs"."""
