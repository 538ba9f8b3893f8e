"""SERVE_* environment -> validated `vllm serve` argv: the settings, env files, the
option mapping and its checks, node roles, and the render. Imports the host wing."""
