"""The cap on a step's draft length: one function for both loops, the replay and the adaptive controller, so
that what the replay predicts is what the loops run. No imports: the pure analysis layer uses it too."""


def gamma_cap(gamma: int, remaining: int) -> int:
    """At most remaining - 1 drafts when `remaining` tokens are still wanted: the target adds one of its own."""
    return min(gamma, remaining - 1)
