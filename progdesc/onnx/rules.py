"""The rows of the ONNX table (`RULES`), one module per family of ops.

How to write a row (see `progdesc.translate` for the rule signature):

```python
RULES.rename("Relu", "relu")                # one-to-one: a row, no function

@RULES.rule("Softmax", since=13)            # the row for opsets 13 and up
def softmax(t, x, *, axis=-1):              # inputs, then attributes with ONNX's defaults
    return t.call("softmax", x, axis=axis)
```

- Positional parameters after `t` are the node's inputs in ONNX's order (our variable
  names; None for an absent optional input; `*rest` for a variadic tail); keyword-only
  parameters are its attributes with ONNX's defaults. `in_types` / `out_types` give the
  ONNX (dims, dtype) of each input / output as shape inference found them (None where
  unknown).
- Return one name per output of the node, or None for an optional output the rule does
  not compute (the driver reports it if something reads it).
- Inputs ONNX passes as tensors but that shape the program (Reshape's shape, Slice's
  starts, Resize's sizes) are read with `t.value_of(name)` or, for sizes that may be
  symbolic, `t.sizes_of(name)` (ints and `symbolic.Size`s such as batch*seq); raise
  `Unsupported("... is computed at run time")` when neither knows them, never guess.
  `progdesc.onnx.shape_args` maps symbolic sizes onto our ops (`reshape_to`,
  `computed_dims` for `reshape_dims` / `broadcast_dims` / `slice_dims`). Nodes whose
  inputs are all known are folded before their row is called (`progdesc.onnx.folding`).
- Ops outside the default domain are keyed '<domain>.<type>' ('com.microsoft.Gelu').
- An op we lack gets one in `lowering/ops/` (samples, gradient maker), never a private
  lowering here.
"""
from progdesc.onnx import (rules_control, rules_math, rules_microsoft,  # noqa: F401
                           rules_misc, rules_nn, rules_recurrent, rules_shape)
from progdesc.onnx import rules_extra, rules_index  # noqa: F401
from progdesc.onnx.table import RULES

__all__ = ["RULES"]
