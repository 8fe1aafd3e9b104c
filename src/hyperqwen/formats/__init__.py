"""Low-level file and wire formats, one module per job, used by every caller."""
