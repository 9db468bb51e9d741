"""What the rows mean: measured rows against the analytic model, and verify's verdicts."""
