"""What people read after a run: its logs (``ragpool logs``) and its report (``ragpool report``).

Torch-free: these run on a laptop with the shared filesystem mounted, or against CloudWatch.
"""
