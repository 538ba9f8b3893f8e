"""frontier-serve entrypoint: environment -> validated vLLM argv, exec, readiness watcher, probe.

Kept import-free on purpose: `probe` and `status` must start in a few milliseconds.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
