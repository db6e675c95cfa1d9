"""Datasets in and out of the shared storage: S3 import and export (torch-free; it runs in a small Job)."""
