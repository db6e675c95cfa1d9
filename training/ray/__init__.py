"""The Ray executor: the run's stages as Ray work (driver), placed per stage on its pool
(placement), and the Ray Tune search over the retriever (tune). Needs the ``ray`` extra (importing this
package itself does not import Ray)."""

