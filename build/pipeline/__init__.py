"""Build steps that turn the pinned upstream inputs plus our patch series into
verified trees, wheels and the CPU test venv. Standard library only, so every
step runs before any virtual environment exists (and inside the Dockerfile)."""
