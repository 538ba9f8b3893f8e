"""One error type for every step, so the CLI can print it and exit non-zero."""


class PipelineError(Exception):
    """A failed build step; the message names the bad input."""
