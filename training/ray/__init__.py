"""The Ray executor: the run's stages as Ray work (driver), placed per stage on its pool
(placement), and the Ray Tune search over the retriever (tune). Needs the ``ray`` extra (importing this
package itself does not import Ray)."""

RAY_VERSION = "2.58.0"
"""The Ray the training image carries (pyproject's ``ray[default,train,tune]`` pin; tests/infra/test_ray_cluster.py
ties them): RayCluster.spec.rayVersion (infra/ray_cluster.py) and the Grafana dashboards generated from
it (dashboards/boards/ray.py) follow it. Here, below both infra/ and dashboards/, so neither imports the other
for it."""
