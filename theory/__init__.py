"""specbound.theory: what speculative decoding can achieve, computed exactly.

Conventions (see docs/): ``p`` is the target distribution and ``q`` the draft distribution; the last axis of
a probability array is the vocabulary and leading axes are a batch; computations are in float64; ``n`` is the
number of drafts per step and ``gamma`` the draft length of a chain. Nothing here imports torch.
"""

# Each problem family lives in its own module; the public names are re-exported here.
