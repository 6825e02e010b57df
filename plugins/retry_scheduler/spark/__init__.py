"""Submitting the PySpark jobs: their arguments, JDBC settings and the driver's class archive."""
