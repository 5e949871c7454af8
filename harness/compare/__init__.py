"""Many machines: runs from several machines side by side (compare.runs), and a run's replayed acceptance
combined with another machine's calibrated costs into that machine's predicted verdicts (compare.predict)."""
