"""The exceptions a user can cause, in one small hierarchy.

Every error names what it can of: the op type, the op's index in its block, the
user's source line that created the op, and the variable concerned.
"""
import difflib


class ProgdescError(Exception):
    """Base class of every error progdesc raises on bad input."""

    def __init__(self, message, *, op_type=None, op_index=None, block_idx=None,
                 var=None, callsite=None, slot=None, during=None):
        self.op_type = op_type
        self.op_index = op_index
        self.block_idx = block_idx
        self.var = var
        self.callsite = callsite
        self.slot = slot        # the input slot at fault ('X', or 'X[1]' in a list slot)
        self.during = during    # the user's call that failed, e.g. "run called at train.py:12"
        self.detail = message
        super().__init__(self._format(message))

    def _format(self, message):
        where = []
        if self.op_type is not None:
            op = f"op '{self.op_type}'"
            if self.op_index is not None:
                op = f"op #{self.op_index} '{self.op_type}'"
                if self.block_idx:
                    op += f" in block {self.block_idx}"
            where.append(op)
        if self.callsite:
            where.append(f"created at {self.callsite}")
        if self.during:
            where.append(f"in {self.during}")
        if self.var is not None:
            where.append(f"variable '{self.var}'")
        return f"{', '.join(where)}: {message}" if where else message


def did_you_mean(name, known):
    """" (did you mean 'x'?)" naming the names in `known` closest to `name`, or ""."""
    close = difflib.get_close_matches(str(name), list(known), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


class ProgramError(ProgdescError, ValueError):
    """An op or variable that does not fit its definition or its block."""


class UnknownOpError(ProgramError):
    """An op type that is not registered."""


class AttributeTypeError(ProgramError, TypeError):
    """An attribute that is undeclared or of the wrong type."""


class AttributeValueError(ProgramError):
    """An attribute whose value breaks what it must mean: a range, a positive size, a
    choice, a shape too large to hold (see lowering.constraints)."""


class OperandError(ProgramError, TypeError):
    """A Python value a Variable operator (`+`, `<`, ...) cannot take: not a Variable, an
    array or a number."""


class ShapeError(ProgramError):
    """Shapes or dtypes of an op's inputs that its rule rejects."""


class FeedError(ProgdescError, ValueError):
    """A missing feed, or a fed value of the wrong shape or dtype."""


class FetchError(ProgdescError, ValueError):
    """A fetch target that does not exist or cannot be computed."""


class FormatError(ProgdescError, ValueError):
    """Bytes or files that are not a valid program, checkpoint or artifact."""


class BackwardError(ProgdescError, ValueError):
    """A gradient request that cannot be satisfied (non-scalar loss, nothing trainable, ...)."""


class ScopeError(ProgdescError, LookupError):
    """A variable missing from a Scope, or a value that does not fit it."""


class UnsupportedOpError(ProgramError):
    """Ops of a foreign program (JAX primitives, ONNX or PaddlePaddle ops) that no
    translation rule handles, all of them in one error.

    `unsupported` lists (foreign op type, source line or '', why) for each one;
    `places` the same with where the op sits in the foreign program:
    (op type, foreign block, index in that block, source line or '', why).
    """

    def __init__(self, message, *, unsupported=(), places=(), **kw):
        self.unsupported = list(unsupported)
        self.places = list(places)
        super().__init__(message, **kw)


class UnsupportedPrimitiveError(UnsupportedOpError):
    """JAX primitives `progdesc.from_jax` / `from_flax` cannot translate into ops.

    `unsupported` lists (primitive name, the user's source line, why) for each one.
    """


class BatchPolymorphismError(UnsupportedPrimitiveError):
    """A function `from_jax` / `from_flax` cannot translate for any batch size (a shape
    that depends on the batch dim in a way the ops cannot follow); with
    `batch_polymorphic=False` it translates for the example's shapes."""


class RecordingError(ProgdescError, TypeError):
    """A Variable's value turned into a Python bool, int or float where the program cannot
    follow: while `capture` records (a Python `if` or `range` on a value would freeze one
    branch into the program), or for a Variable that has no value (outside eager mode)."""


class NumericsError(ProgdescError, FloatingPointError):
    """A NaN or Inf produced by an op, found by `Executor(check_numerics=True)`.

    Besides what every error names (the op, its index and block, the line that
    created it, the bad variable and its `slot`), it carries `values`, a
    summary (NaN and Inf counts, finite min and max) of each float input and
    output of the op by label ('output Out', 'input X[1]'), `forward_op`, the
    forward op a gradient op belongs to, and `outer_op`, the op whose sub-block
    holds the bad op: each an (block, index, type, callsite) tuple, or None
    when it does not apply.
    """

    def __init__(self, message, *, values=None, forward_op=None, outer_op=None, **where):
        self.values = dict(values or {})
        self.forward_op = forward_op
        self.outer_op = outer_op
        super().__init__(message, **where)


class DistributedError(ProgdescError, RuntimeError):
    """A multi-process run that cannot start (bad arguments, peers that do not join) or that
    lost a process: names the lost process where it is known."""


class CompiledCallError(ProgdescError, RuntimeError):
    """A loaded compiled artifact (`.pdx`) that failed when called: names the file and the
    inputs, and holds what XLA raised as `__cause__`."""


class SaveError(ProgdescError, OSError):
    """A save that could not write its file or directory (read-only, disk full, no
    permission): names the path; the previous file or directory is left as it was.
    `errno`, `strerror` and `filename` are those of the failed system call."""

    def __init__(self, message, *, path=None, errno=None, strerror=None, **where):
        super().__init__(message, **where)
        self.errno, self.strerror, self.filename = errno, strerror, path

    def __str__(self):
        return self.args[0]


class JaxCompatError(ProgdescError, RuntimeError):
    """A progdesc feature that needs a JAX internal this JAX version lacks (see
    progdesc/jax_compat.py): names the internal, the JAX version and the feature."""

    def __init__(self, message, *, internal=None, jax_version=None, feature=None, **where):
        self.internal, self.jax_version, self.feature = internal, jax_version, feature
        super().__init__(message, **where)
