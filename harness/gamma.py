"""The cap on a step's draft length: one function for both loops, the replay and the adaptive controller, so
that what the replay predicts is what the loops run; and the batch a step's verification must fit in. Nothing but
harness.errors below it: the pure analysis layer uses it too."""
from harness.errors import HarnessError

N_BATCH = 512  # the engines' n_batch: one step's tokens, all sequences together, must fit in one decode


def gamma_cap(gamma: int, remaining: int) -> int:
    """At most remaining - 1 drafts when `remaining` tokens are still wanted: the target adds one of its own."""
    return min(gamma, remaining - 1)


def require_fits_batch(gamma: int) -> None:
    """A step verifies gamma + 1 tokens in one decode, which holds at most N_BATCH."""
    if gamma + 1 > N_BATCH:
        raise HarnessError(f"--gamma {gamma}: a step verifies gamma + 1 = {gamma + 1} tokens in one batch of "
                           f"{N_BATCH}: the largest gamma is {N_BATCH - 1}")
