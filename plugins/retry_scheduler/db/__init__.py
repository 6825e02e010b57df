"""PostgreSQL: connections, the migrations and named queries shipped in the package, the job store."""
