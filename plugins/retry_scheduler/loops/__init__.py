"""The service's loops: ingest from the retry topics, publish due jobs, handover between runs, Kafka clients."""
