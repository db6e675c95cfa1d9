"""The offline stand-in for Pulumi's Python language host (``mock_exec.py``) and the check that no
module of the program directory shadows an installed one (``shadowing.py``)."""
