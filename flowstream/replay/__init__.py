"""The pure replay core: projection (``RunState``), decisions and the workflow context."""
