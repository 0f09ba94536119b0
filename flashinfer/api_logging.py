"""API logging for flashinfer (placeholder until the C logging core lands).

Only level-0 behaviour: the decorator returns the function it was given.
"""


def flashinfer_api(func=None, *, trace=None):
    if func is None:
        return lambda f: f
    return func
