"""`harness crosscheck RUN_DIR`: does a run's verdict hold in the software people run? Each configuration the
run's answers name runs in llama.cpp's own llama-server (`make native` builds it from the wheel's sources),
speculative and plain, on the run's own prompts, and its speedup and acceptance, from the server's own timings,
stand beside the harness's. binary: which llama-server; server: one server process; checks: what to run;
stats: the figures and the rule; output: crosscheck.json and crosscheck.md; run: all of it in order.
servercheck: `harness server-check COMMAND`, the same servers on a user's own llama-server command line and its
plain twin: is speculation running?"""
from harness.crosscheck.run import crosscheck_command

__all__ = ["crosscheck_command"]
