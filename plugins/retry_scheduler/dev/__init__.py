"""Dev tooling: the embedded stack (broker, PostgreSQL, Airflow), the demo, a client of Airflow's REST API."""
