"""PaddlePaddle's static-graph spellings of progdesc's own API: one table, and the aliases.

A script written for `paddle.static` / `paddle.fluid` mostly ports by changing its
imports: `NAMES` lists every Paddle spelling progdesc also answers to, where it lives here
and what it is. Rows with a `same_as` are plain aliases, made from this table by
`install` in the module that hosts them (a method, `get_tensor`, is spelled in its class;
a test checks that each is the very object it names); the others are the few places where
Paddle's meaning differs from ours (an `axis` that aligns a lower-rank operand, a place
object) and are defined below or in their host module. The README's table is `markdown_table()` (a test compares them).
Nothing here is a second API: each name is one of ours under Paddle's spelling.
"""
import importlib
from dataclasses import dataclass
from typing import Optional

import jax

from lowering.errors import ShapeError
from progdesc import ops
from progdesc.activations import activation_op
from progdesc.callsites import user_callsite
from progdesc.framework import append_whole


@dataclass(frozen=True)
class Name:
    """One Paddle spelling: `paddle` as a Paddle script writes it, `ours` the progdesc
    spelling it is available as, `where` the dotted path of that name here, `same_as` the
    dotted path of the object it is an alias of (None where it is defined in its own
    right), and `note` what a porting user should know."""
    paddle: str
    ours: str
    where: str
    note: str
    same_as: Optional[str] = None


NAMES = (
    Name("fluid.layers.mean(x)", "pd.layers.mean(x)", "progdesc.layers.mean",
         "`pd.ops.mean`: the mean of all elements, shape `[]` (as `paddle.mean`)",
         same_as="progdesc.ops.mean"),
    *(Name(f"fluid.layers.elementwise_{op}(x, y, axis=-1, act=None)",
           f"pd.layers.elementwise_{op}(x, y, axis=-1, act=None)",
           f"progdesc.layers.elementwise_{op}",
           f"`pd.ops.{op}` (NumPy broadcasting); `axis` lines up a lower-rank operand's dims "
           f"with the other's from `axis` on, as Paddle does")
      for op in ("add", "sub", "mul", "div")),
    Name("paddle.regularizer.L2Decay(coeff)", "pd.regularizer.L2Decay(coeff)",
         "progdesc.regularizer.L2Decay",
         "the L2 coefficient itself, a float (fluid's `regularization_coeff=` too): for "
         "`ParamAttr(regularizer=...)` or an optimizer's `weight_decay=...`; no L1Decay"),
    Name("fluid.CPUPlace()", "pd.CPUPlace()", "progdesc.CPUPlace",
         "the CPU `jax.Device`, for `pd.Executor(place)`"),
    Name("fluid.CUDAPlace(i)", "pd.CUDAPlace(i)", "progdesc.CUDAPlace",
         "JAX's GPU device `i`; without a GPU, a ValueError saying so"),
    Name("scope.find_var(name).get_tensor()", "scope.find_var(name).get_tensor()",
         "progdesc.scope.ScopeVariable.get_tensor",
         "the stored array (`np.array(...)` copies it to the host)",
         same_as="progdesc.scope.ScopeVariable.get"),
    Name("fluid.io.save_inference_model(dirname, feeded_var_names, target_vars, exe, "
         "main_program=prog)",
         "pd.io.save_inference_model(dirname, feed_vars, fetch_vars, exe, program=prog)",
         "progdesc.io.save_inference_model",
         "`main_program=` is accepted for `program=`; without either, the default main "
         "program is saved and its errors say so"),
)


def resolve(path):
    """The object at dotted `path` ('progdesc.scope.ScopeVariable.get'): the longest
    importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"nothing importable in {path!r}")


def install(namespace):
    """Put the aliases of `NAMES` that live in the module of `namespace` (a module's
    globals()) into it: each name whose `where` is in that module, bound to its
    `same_as` or, without one, to the function of that name defined here."""
    module = namespace["__name__"]
    for name in NAMES:
        home, _, attr = name.where.rpartition(".")
        if home == module:
            namespace[attr] = resolve(name.same_as) if name.same_as else globals()[attr]


def markdown_table():
    """The README's table of the Paddle spellings (Markdown)."""
    rows = ["| Paddle | progdesc | |", "|---|---|---|"]
    rows += [f"| `{n.paddle}` | `{n.ours}` | {n.note} |" for n in NAMES]
    return "\n".join(rows) + "\n"


# --- places ---

def CPUPlace():
    """Paddle's `CPUPlace()`: the CPU `jax.Device`, which `Executor(place)` runs on."""
    return jax.devices("cpu")[0]


def CUDAPlace(device_id=0):
    """Paddle's `CUDAPlace(i)`: JAX's GPU device `i`; ValueError when JAX has no GPU (or
    fewer than i + 1)."""
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not 0 <= device_id < len(gpus):
        raise ValueError(
            f"CUDAPlace({device_id}): JAX has {len(gpus)} GPU device(s) "
            f"(its devices: {', '.join(str(d) for d in jax.devices())}); use CPUPlace(), or "
            f"install a CUDA build of jaxlib (pip install 'jax[cuda12]')")
    return gpus[device_id]


# --- elementwise ops with Paddle's axis ---

def _aligned(x, y, axis, paddle_name):
    """(x, y) made broadcastable the Paddle way: with `axis` != -1 the lower-rank operand's
    dims line up with the other's from `axis` on (size-1 dims appended after them)."""
    rx, ry = len(x.shape), len(y.shape)
    if axis == -1 or rx == ry:
        return x, y
    swap = rx < ry
    high, low = (y, x) if swap else (x, y)
    rank, low_rank = max(rx, ry), min(rx, ry)
    start = axis + rank if axis < 0 else axis
    trailing = rank - start - low_rank
    if start < 0 or trailing < 0:
        raise ShapeError(f"{paddle_name}: axis={axis} cannot line up a rank-{low_rank} operand "
                         f"{list(low.shape)} with a rank-{rank} one {list(high.shape)} "
                         f"(axis must be -1 or in 0..{rank - low_rank})",
                         callsite=user_callsite())
    if trailing:
        low = ops.unsqueeze(low, axes=list(range(low_rank, low_rank + trailing)))
    return (low, high) if swap else (high, low)


def _elementwise(op):
    paddle_name = f"elementwise_{op}"
    ours = getattr(ops, op)

    def elementwise(x, y, axis=-1, act=None, name=None):
        activation = activation_op(act, paddle_name)
        return activation(ours(*_aligned(x, y, axis, paddle_name), name=name))
    elementwise.__name__ = elementwise.__qualname__ = paddle_name
    elementwise.__doc__ = (f"Paddle's `{paddle_name}(x, y, axis=-1, act=None)`: `ops.{op}` "
                           "after lining up a lower-rank operand's dims with the other's "
                           "from `axis` on (-1: the trailing dims, as NumPy), then `act`.")
    return append_whole(elementwise)   # as a layer: one that fails leaves nothing behind


elementwise_add = _elementwise("add")
elementwise_sub = _elementwise("sub")
elementwise_mul = _elementwise("mul")
elementwise_div = _elementwise("div")
