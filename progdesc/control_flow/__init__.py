"""Control flow that reads like Python: `cond`, `switch`, `scan` and `while_loop` build ops
with sub-blocks (`builders`); `StaticRNN` builds a scan step by step, as Paddle's does."""
from progdesc.control_flow.builders import block_guard, cond, scan, switch, while_loop
from progdesc.control_flow.static_rnn import StaticRNN

__all__ = ["block_guard", "cond", "switch", "scan", "while_loop", "StaticRNN"]
