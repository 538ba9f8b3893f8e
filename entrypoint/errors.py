"""Errors that stop the entrypoint before anything starts."""

from __future__ import annotations

USAGE_EXIT = 2  # bad configuration or environment: the same code argparse and typer use
GGUF_NO_LAYOUT = 3  # check-gguf: no tensor layout is known for this model type


class ConfigError(Exception):
    """One or more problems with the configuration, each naming its variable."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))
