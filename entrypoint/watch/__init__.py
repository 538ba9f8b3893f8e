"""The watcher beside vLLM and what reads its files: readiness and status files, start
steps and their history, load progress, log capture, metrics, node links and heartbeat,
the stall watch, `probe`, `wait` and `status`. Imports the argv wing's settings."""
