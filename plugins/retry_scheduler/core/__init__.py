"""The domain and the header protocol: settings, headers and their codec, policies, retry jobs, record-to-row."""
