"""Break-even and the rule: speculate only when accepted progress per millisecond beats plain decoding."""
from __future__ import annotations


def break_even_rate(step_ms: float, base_ms_per_token: float, gamma: float) -> float | None:
    """The acceptance rate (accepted / proposed) at which a speculative step of step_ms, emitting
    1 + rate * gamma tokens, matches plain decoding at base_ms_per_token. None: even 100% loses."""
    if gamma <= 0 or base_ms_per_token <= 0:
        return None
    rate = (step_ms / base_ms_per_token - 1) / gamma
    return max(rate, 0.0) if rate <= 1 else None


def where_time_goes(draft_ms: float, verify_ms: float, overhead_ms: float) -> str:
    total = draft_ms + verify_ms + overhead_ms
    if total <= 0:
        return ""
    return (f"draft {draft_ms / total:.0%}, verify {verify_ms / total:.0%}, "
            f"overhead {overhead_ms / total:.0%} of step time")


def decide(speedup: float | None) -> str:
    """speedup: speculative tokens/ms over plain tokens/ms, measured alike."""
    if not speedup:
        return "no data"
    return "speculate" if speedup > 1 else "plain decoding"
