"""Vendor drivers that ship with npu-manager."""
