"""The benchmark (``make bench``) and the chaos harness (``make chaos``): part of the repository, not of the wheel.

They drive the installed service (``retry_scheduler``) from the outside, the way its users do, and
are importable by the tests from the repository root.
"""
