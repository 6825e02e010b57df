"""Installed as ``retry_scheduler.db.sql``: the schema migrations and named queries, read with importlib.resources."""
