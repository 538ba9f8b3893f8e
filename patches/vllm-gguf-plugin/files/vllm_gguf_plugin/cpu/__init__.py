# SPDX-License-Identifier: Apache-2.0
"""Torch implementations of the plugin's ops for CPU tensors (see compute.py)."""
