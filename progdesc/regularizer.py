"""Paddle's regularizer names: in progdesc a regularizer is its L2 coefficient.

    ParamAttr(regularizer=L2Decay(1e-4))        # this parameter's gradient += 1e-4 * param
    Adam(1e-3, weight_decay=L2Decay(1e-4))      # every parameter without one of its own

`L2Decay(c)` is the float `c` (see progdesc.paddle_names); progdesc has no L1 decay.
"""


class L2Decay(float):
    """Paddle's `L2Decay(coeff)`: the coefficient `coeff` of the term `coeff * param` added
    to a parameter's gradient; a float wherever progdesc takes an L2 coefficient."""

    def __new__(cls, coeff=0.0, *, regularization_coeff=None):
        return super().__new__(cls, coeff if regularization_coeff is None
                               else regularization_coeff)   # the second: fluid's keyword

    def __repr__(self):
        return f"L2Decay({float(self)!r})"


def __getattr__(name):
    if name in ("L1Decay", "L1DecayRegularizer"):
        raise AttributeError(f"progdesc has no L1 regularization ({name}); regularizers here "
                             "are L2 coefficients: L2Decay(coeff), ParamAttr(regularizer=...), "
                             "or an optimizer's weight_decay=...")
    raise AttributeError(f"module 'progdesc.regularizer' has no attribute {name!r}")
