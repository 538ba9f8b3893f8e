"""The start sequence: `serve`, the preflight and GGUF checks, hub and plugin files, and
the exec of vLLM with its logging. Imports the host, argv and watch wings."""
