"""Everything Airflow: the hook for the service's connections, task bodies, DAG factories, notifiers, plugin, page."""
