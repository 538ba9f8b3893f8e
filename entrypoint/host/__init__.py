"""Host facts: the GPUs, the host's memory and disks, the cache folder. Imports only
`entrypoint.errors`."""
