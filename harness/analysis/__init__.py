"""Analysis of traces: pure functions over frames and arrays (metrics, intervals, verdicts). Nothing here runs a
model or knows how a sweep is run."""
