"""The folder `npu-manager run` puts first on a program's PYTHONPATH."""
