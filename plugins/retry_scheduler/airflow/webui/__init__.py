"""The Dead letters page: a FastAPI app served by the Airflow api-server, and its static files."""
