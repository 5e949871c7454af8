"""How loaded the machine was while a unit ran, from the per-second shares of the cores other processes used
(bench.noise measures them): the mean, the worst 10-second stretch, and whether that passed the threshold.

A stretch, not a second: a 100 ms blip (a shell command, a cron job) disturbs a fraction of one generation and
fades into the bootstrap's spread, while a process using a tenth of a core for ten seconds slows every decode
in them; the threshold is low because llama.cpp's spinning threads make sustained foreign load cost far more
than its share."""
from __future__ import annotations

WINDOW_S = 10


def summarize(shares: list[float], threshold: float, window: int = WINDOW_S) -> dict:
    """{"foreign_mean", "foreign_max" (the worst `window`-second mean; the whole run if shorter), "busy"}."""
    if not shares:
        return {"foreign_mean": 0.0, "foreign_max": 0.0, "busy": False}
    w = min(window, len(shares))
    run = sum(shares[:w])
    worst = run
    for i in range(w, len(shares)):
        run += shares[i] - shares[i - w]
        worst = max(worst, run)
    worst /= w
    return {"foreign_mean": sum(shares) / len(shares), "foreign_max": worst, "busy": worst > threshold}


def unit_summary(record: dict) -> dict:
    """A noise.jsonl record's summary: recomputed from its shares, or as recorded by runs that kept none."""
    if "shares" in record:
        return summarize(record["shares"], record["threshold"])
    return {k: record[k] for k in ("foreign_mean", "foreign_max", "busy")}
