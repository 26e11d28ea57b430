"""`StaticRNN`: a scan written as a step block, as Paddle's StaticRNN is.

    rnn = StaticRNN()
    with rnn.step():
        x_t = rnn.step_input(x)            # x: [time, batch, ...]; x_t: x[t]
        h = rnn.memory(init=h0)            # the carry, h0 at the first step
        new_h = layers.fc(ops.concat([h, x_t], axis=1), 32, act="tanh", name="cell")
        rnn.update_memory(h, new_h)        # h at the next step
        rnn.step_output(new_h)             # stacked along a new axis 0
    hs = rnn()
"""
import contextlib

from lowering.errors import ProgramError
from progdesc.control_flow.builders import block_guard, scan_op
from progdesc.framework import default_main_program


class StaticRNN:
    """Build a `scan` op from the ops appended inside `with rnn.step():`; `rnn()` returns
    the stacked step outputs (a Variable, or a list of them for several)."""

    def __init__(self, name=None):
        self._name = name
        self._program = None
        self._block = None
        self._inputs, self._memories, self._updates, self._outputs = [], [], {}, []
        self._results = None

    @contextlib.contextmanager
    def step(self):
        """Inside, ops are appended to the step block; on leaving it, the scan op is built."""
        if self._program is not None:
            raise ProgramError("a StaticRNN has one step block")
        self._program = default_main_program()
        with block_guard(self._program) as block:
            self._block = block
            try:
                yield
            finally:
                self._block = None
        self._results = self._build(block)

    def _step_block(self, what):
        if self._block is None:
            raise ProgramError(f"StaticRNN.{what} is called inside `with rnn.step():`")
        return self._block

    def step_input(self, x):
        """The slice x[t] of the sequence `x` (scanned along axis 0) at the current step."""
        block = self._step_block("step_input")
        var = block.create_var(self._program.unique_name(f"{x.name}.step"), x.shape[1:], x.dtype)
        self._inputs.append((x, var))
        return var

    def memory(self, init):
        """A value carried from step to step: `init` at the first step, then what
        `update_memory` names."""
        block = self._step_block("memory")
        var = block.create_var(self._program.unique_name(f"{init.name}.mem"), init.shape, init.dtype)
        self._memories.append((init, var))
        return var

    def update_memory(self, mem, var):
        """Make `var` the value of the memory `mem` at the next step."""
        self._step_block("update_memory")
        if not any(m is mem for _, m in self._memories):
            raise ProgramError("is not a memory of this StaticRNN", var=mem.name)
        self._updates[mem.name] = var

    def step_output(self, out):
        """Output `out` at every step; `rnn()` returns it stacked along a new axis 0."""
        self._step_block("step_output")
        self._outputs.append(out)

    output = step_output

    def _build(self, block):
        missing = [m.name for _, m in self._memories if m.name not in self._updates]
        if missing:
            raise ProgramError("a memory of the StaticRNN is never updated (update_memory)",
                               var=missing[0])
        if not self._inputs:
            raise ProgramError("a StaticRNN needs a step_input to know its number of steps")
        carries = [(init, m, self._updates[m.name]) for init, m in self._memories]
        return scan_op(self._program, block, carries,
                       self._inputs, self._outputs, name=self._name)[1]

    def __call__(self):
        """The stacked step outputs: a Variable, or a list of them for several."""
        if self._results is None:
            raise ProgramError("StaticRNN() is called after its `with rnn.step():` block")
        return self._results[0] if len(self._results) == 1 else list(self._results)
