"""Values for the stack configs tests write."""

REAL_CIDR = "100.64.0.0/10"
"""A CIDR outside every documentation range (infra/deploy_config.py DOCUMENTATION_NETWORKS), for stack configs that must
pass ``config check --deploy``; the tests' other configs use documentation ranges, which deploy refuses."""
