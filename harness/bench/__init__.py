"""`harness bench` end to end: check, run every configuration in its own worker, keep what finished, report.
Sits above report/ and analysis/, which never import it."""
