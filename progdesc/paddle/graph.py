"""A PaddlePaddle program as the readers hand it to the translator, whichever file it
came from (a legacy `.pdmodel` ProgramDesc or a Paddle 3 PIR `.json`).

The readers (`pdmodel`, `pir`) only decode: they check that the file is well formed and
turn it into these plain objects, with attribute values as Python values. Everything
that gives Paddle's ops their meaning lives in the translation table (`rules`).
"""
from dataclasses import dataclass, field


@dataclass
class Var:
    """A variable a block declares.

    `shape` holds -1 for an unknown dim (the batch); `dtype` is NumPy's name of the
    element type ('float32', 'int64', 'bool', 'bfloat16'); `kind` is 'dense' for a
    tensor, else Paddle's name of the variable type in lower case ('feed_minibatch',
    'fetch_list', 'lod_tensor_array', 'step_scopes', ...)."""
    name: str
    shape: tuple
    dtype: str
    persistable: bool = False
    kind: str = "dense"
    stop_gradient: bool = False


@dataclass
class Op:
    """One op of a block, in file order.

    `type` is Paddle's op type as the file names it: 'conv2d' in a legacy program,
    'pd_op.conv2d', 'builtin.combine', 'pd_op.if' in a PIR one. `inputs` and `outputs`
    map a slot to the names of the variables in it, in order: the legacy slot names
    ('Input', 'Filter'); for PIR, where operands are positional, the reader names the
    slots '0', '1', ... and the values by their ids. `attrs` are the attributes decoded
    (a legacy BLOCK attribute is the index of the sub-block). `regions` holds the
    blocks of a PIR op's regions (`if`: then, else; `while`: body), [] otherwise.
    `index` is the op's place in its block, `block` the block's index."""
    type: str
    inputs: dict
    outputs: dict
    attrs: dict
    block: int = 0
    index: int = 0
    regions: list = field(default_factory=list)


@dataclass
class Block:
    """A block: its variables by name and its ops in order. `parent` is the index of the
    enclosing block (-1 for the global block)."""
    idx: int
    parent: int
    vars: dict
    ops: list


@dataclass
class PaddleProgram:
    """A whole program: its blocks (blocks[0] is the global one), the file's format
    ('pdmodel' or 'pir'), and the versions the file records (Paddle's op versions for
    a legacy program, {} when absent)."""
    blocks: list
    format: str
    op_versions: dict = field(default_factory=dict)
