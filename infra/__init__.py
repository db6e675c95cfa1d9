"""ragpool infrastructure: the Pulumi program (``main: infra/``) and its offline plan.

Nothing here creates resources on import; ``infra/__main__.py`` wires the components.
"""
