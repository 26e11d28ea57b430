"""Which ops run in low precision, which stay in float32, and which follow their inputs.

- **allow**: matrix products (matmul, conv2d, fused attention, whose softmax
  JAX computes in float32). They gain the most from bfloat16/float16 and
  accumulate in float32 inside the hardware.
- **deny**: ops whose results lose too much in 8 or 11 bits of mantissa:
  exponentials and logarithms, softmax, normalizations, losses, and
  reductions that sum many terms. Their inputs are cast to float32.
- every other op **follows** its inputs (see progdesc.amp.rewrite).

The defaults are close to PyTorch's autocast lists and Paddle's static AMP
lists, restricted to the ops progdesc has.
"""
from lowering import registry
from lowering.errors import ProgramError

DEFAULT_ALLOW = frozenset({"matmul", "conv2d", "scaled_dot_product_attention"})

DEFAULT_DENY = frozenset({
    # exponentials, logarithms, powers
    "exp", "log", "pow", "rsqrt", "sqrt", "softplus", "square",
    # softmax and normalizations
    "softmax", "log_softmax", "layer_norm", "batch_norm",
    # losses
    "softmax_with_cross_entropy", "sigmoid_cross_entropy_with_logits",
    # reductions that accumulate
    "mean", "reduce_mean", "reduce_sum", "reduce_prod",
})


class AmpLists:
    """The allow and deny lists of a rewrite: the defaults, changed by custom lists.

    `custom_allow` op types run in low precision and `custom_deny` ones in
    float32, whatever the defaults say. An op type named in both, or one
    that is not registered, raises ProgramError.
    """

    def __init__(self, custom_allow=(), custom_deny=()):
        custom_allow, custom_deny = frozenset(custom_allow), frozenset(custom_deny)
        both = custom_allow & custom_deny
        if both:
            raise ProgramError(f"op type '{sorted(both)[0]}' is in both custom_allow and "
                               "custom_deny")
        for op_type in sorted(custom_allow | custom_deny):
            if not registry.is_registered(op_type):
                raise ProgramError(f"custom AMP list names op type '{op_type}', which is not "
                                   "registered", op_type=op_type)
        self.allow = (DEFAULT_ALLOW - custom_deny) | custom_allow
        self.deny = (DEFAULT_DENY - custom_allow) | custom_deny

    def __repr__(self):
        return f"AmpLists(allow={sorted(self.allow)}, deny={sorted(self.deny)})"
