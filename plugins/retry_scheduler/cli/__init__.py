"""The ``retry-scheduler`` command line, one module per command group."""
