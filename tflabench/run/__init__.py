"""Running a suite: the orchestration of run and verify, the worker pool, and one case's measurement."""
