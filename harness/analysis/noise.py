"""How loaded the machine was while a unit ran, from the per-second shares of the cores other processes used
(bench.noise measures them): the mean, the worst 10-second stretch, and whether that passed the threshold.

A stretch, not a second: a 100 ms blip (a shell command, a cron job) disturbs a fraction of one generation and
fades into the bootstrap's spread, while a process using a tenth of a core for ten seconds slows every decode
in them; the threshold is low because llama.cpp's spinning threads make sustained foreign load cost far more
than its share."""
from __future__ import annotations

WINDOW_S = 10
# A unit whose worker used less than this share of the CPU its threads ask for, over at least SLOWED_MIN_S
# seconds, ran slowed (stopped and resumed, throttled): its timings are no more to be trusted than a busy
# machine's. Healthy units of the smoke profile on an Intel Xeon 2-core VM used 92-96% of it (run
# 20261202-054828-vm; spin-waiting threads count; loading the models keeps the first second near 80%).
SLOWED = 0.5
SLOWED_MIN_S = 3


def summarize(shares: list[float], threshold: float, window: int = WINDOW_S, own: list[float] | None = None,
              asked: float | None = None) -> dict:
    """{"foreign_mean", "foreign_max" (the worst `window`-second mean; the whole run if shorter), "own_mean",
    "slowed" (a unit of at least SLOWED_MIN_S seconds whose worker used under SLOWED of the CPU it asked for),
    "busy" (either)}."""
    slowed, own_mean = False, None
    if own:
        own_mean = sum(own) / len(own)
        slowed = asked is not None and len(own) >= SLOWED_MIN_S and own_mean < SLOWED * asked
    if not shares:
        return {"foreign_mean": 0.0, "foreign_max": 0.0, "own_mean": own_mean, "slowed": slowed, "busy": slowed}
    w = min(window, len(shares))
    run = sum(shares[:w])
    worst = run
    for i in range(w, len(shares)):
        run += shares[i] - shares[i - w]
        worst = max(worst, run)
    worst /= w
    return {"foreign_mean": sum(shares) / len(shares), "foreign_max": worst, "own_mean": own_mean,
            "slowed": slowed, "busy": worst > threshold or slowed}


def unit_summary(record: dict) -> dict:
    """A noise.jsonl record's summary: recomputed from its shares, or as recorded by runs that kept none."""
    if "shares" in record:
        return summarize(record["shares"], record["threshold"], own=record.get("own_shares"),
                         asked=record.get("asked"))
    return {k: record[k] for k in ("foreign_mean", "foreign_max", "busy")} | {"own_mean": None, "slowed": False}
