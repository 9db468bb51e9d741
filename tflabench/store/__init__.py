"""Suites and result sets on disk: the suite schema and its cases, shards, resume, result sets, reference sets, timing conditions."""
