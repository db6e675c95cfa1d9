"""The simulated kubelet (bench/autoscale_sim_kubelet.py): env values expanded as the kubelet does."""

from __future__ import annotations

from bench.autoscale_sim_kubelet import expand


def test_env_values_expand_like_the_kubelet():
    env = {"RAGPOOL_WORKER_GROUP": "ragpool-worker-gpu-spot-n2-abcde"}
    assert expand("$(RAGPOOL_WORKER_GROUP)-0.ragpool-workers.ns.svc", env) == \
        "ragpool-worker-gpu-spot-n2-abcde-0.ragpool-workers.ns.svc"
    assert expand("$$(RAGPOOL_WORKER_GROUP) $(UNDEFINED)", env) == "$(RAGPOOL_WORKER_GROUP) $(UNDEFINED)"
