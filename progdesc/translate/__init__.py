"""One translator for foreign programs (JAX's jaxprs today; PaddlePaddle and ONNX next).

A front end (`progdesc.interop.from_jax`) decodes each foreign op once into a `Node`
(its type, inputs, outputs, attributes as Python values, source line, place) and hands
the nodes to a `Translator`, which looks each type up in the front end's `RuleTable`
and calls the rule. The translator appends our ops through the public program-writing
API (`Block.append_op`), makes every constant one way
(`progdesc.constants.imported_constant`), maps foreign values to our variable names (an
`Environment` per graph), lowers foreign sub-graphs into our sub-blocks (`sub_block`,
inside a `progdesc.control_flow` builder), and collects every op it cannot translate,
with its type, block, index and source line, into one `UnsupportedOpError` (`check()`).

Adding a foreign op: one row in the front end's table, the way an op of ours is one
`@op` function in `lowering/ops/`.

```python
RULES = RuleTable("ONNX op")
RULES.rename("Relu", "relu")             # one-to-one: a row, no function
RULES.alias("Sum_legacy", "Sum")         # another name of a foreign op

@RULES.rule("Softmax", since=13)         # versions: the table picks the row
def softmax(t, x, *, axis=-1):
    return t.call("softmax", x, axis=axis)

@RULES.rule("Softmax")                   # opsets before 13
def softmax_old(t, x, *, axis=1):
    ...
```

- A rule is `rule(t, *inputs, **attributes)`: its positional parameters after `t` are
  the op's inputs (our variable names, in the foreign op's order; `*rest` for a
  variadic tail), its keyword-only parameters the attributes it reads, with their
  defaults. The driver passes only the attributes the signature names; a missing one
  without a default is reported as unsupported.
- Two keywords are the driver's, not attributes: `in_types` and `out_types`, the
  foreign types of the inputs and outputs (JAX avals), for a rule that needs them.
- A rule appends ops with `t.call(op_type, *inputs, **attrs)` (returns the output
  names), reads a variable's (dims, dtype) with `t.var(name)`, makes a constant with
  `t.constant(array)`, translates a sub-graph in place with `t.inline(graph, args)` or
  as a branch or loop body with `t.sub_block(graph, args)`, and returns the names of
  the op's outputs (one name, or a list).
- A rule raises `Unsupported("why")` for attributes it cannot translate: the op is
  collected with that reason and translation goes on, so one error lists them all.
- A foreign op that needs an op we lack gets one in `lowering/ops/` (samples, gradient
  maker), never a private lowering inside the importer.
"""
from progdesc.translate.table import DRIVER_KEYWORDS, Entry, RuleTable
from progdesc.translate.translator import (FAILED, Environment, Literal, Node, Place,
                                           Translator, Unsupported)

__all__ = ["DRIVER_KEYWORDS", "Entry", "Environment", "FAILED", "Literal", "Node", "Place",
           "RuleTable", "Translator", "Unsupported"]
