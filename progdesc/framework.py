"""Program, Block, Variable and Operator: thin typed views over the protos.

Appending an op validates it against its registered definition and writes
the inferred shapes and dtypes into its output variables.
"""
import contextlib
import contextvars
import functools
import itertools
import numbers
import operator
import os

from google.protobuf import message as _pb_message
from google.protobuf import text_format

from lowering import dtypes, infer, registry, sizes
from lowering import progdesc_pb2 as pb
from lowering.blocks import drop_unused_blocks
from lowering.desc import FORWARD_OP, PIPELINE_STAGE, SPLIT_HEADS, fill_op_desc, read_attrs, slot_map
from lowering.errors import FormatError, OperandError, ProgdescError, ProgramError
from lowering.lower import RNG_VAR, precision_of, precision_value
from progdesc.display.text import ROLE_NAMES, block_text, op_line, program_text, type_str
from progdesc.callsites import user_callsite
from progdesc.constants import constant
from progdesc import op_plans
from progdesc.naming import NameGenerator
from progdesc.validation import FORMAT_VERSION, check_desc

class ProgramListener:
    """What a listener added with `add_listener` is told of; each method does nothing here.

    Eager mode (progdesc.recording) is such a listener: it runs each op as it is appended
    and keeps the values of the variables in step with the program.
    """

    def op_appended(self, block, index, opdef, inputs, outputs, attrs):
        """After an op was put at `index` of `block` (`inputs`/`outputs`: {slot: [names]},
        `attrs` as stored); an error raised here takes the op back out."""

    def vars_renamed(self, block, renames):
        """After `Block.rename_output` renamed variables of `block` ({old: new})."""

    def vars_removed(self, program, names):
        """After the variables `names` were taken out of `program` (a failed layer)."""

    def data_value(self, var, value):
        """`data(..., value=array)` declared `var` with `value`; an error taken back."""

    def appending_whole(self, programs):
        """`appended_whole` begins on `programs`; returns a function that takes back what the
        listener keeps for them outside the programs, or None."""

    def training_step_appended(self, program, steps):
        """Optimizer updates began in `program` after a backward pass: the program now holds
        `steps` training steps (told from the second on)."""


_listeners = []


def add_listener(listener):
    """Tell `listener` (a ProgramListener) what happens to every program, from now on;
    returns a function that stops it."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


class Variable:
    """A view of one `VarDesc` in a block; `name` is the variable's name (fixed once the
    layer that made it has returned)."""

    def __init__(self, block, desc, type_=None, name=None):
        self.block = block
        self._desc = desc     # None while the op making it waits in `block._pending`
        self.name = desc.name if name is None else name
        self._type = type_    # (dims, dtype name) as in the desc; kept in step by the Block

    @property
    def desc(self):
        """The variable's `VarDesc` in its block."""
        desc = self._desc
        if desc is None:   # declared by an op not written into the block yet
            self.block._flush()
            desc = self._desc
        return desc

    @desc.setter
    def desc(self, desc):
        self._desc = desc

    def _read_type(self):
        self._type = (tuple(self.desc.dims), dtypes.name_of(self.desc.dtype))
        return self._type

    @property
    def shape(self):
        """Dims, -1 where unknown."""
        return (self._type or self._read_type())[0]

    @property
    def dtype(self):
        """Element type name."""
        return (self._type or self._read_type())[1]

    persistable = property(lambda self: self._desc is not None and self._desc.persistable,
                           doc="Whether the value lives in the Scope between runs.")
    is_parameter = property(lambda self: self.desc.is_parameter,
                            doc="Whether this is a trainable parameter.")
    kind = property(lambda self: pb.VarKind.Name(self.desc.kind), doc="The VarKind name.")

    @property
    def stop_gradient(self):
        """Whether gradients stop at this variable."""
        return self.desc.stop_gradient

    @stop_gradient.setter
    def stop_gradient(self, value):
        self.desc.stop_gradient = bool(value)
        self.block.program.mark_changed()

    def __repr__(self):
        from progdesc.recording.values import preview   # lazy: reading values (eager mode)
        return f"Variable({self.name}: {type_str(self.desc)}){preview(self)}"

    # Values, where there are some (eager mode; see progdesc.recording.values).
    __array_ufunc__ = None   # `array + var` is var.__radd__(array): a constant, not a loop

    def numpy(self):
        """The variable's value as a NumPy array (in eager mode, or a persistable's value in
        the current Scope); reading it does not change the program."""
        from progdesc.recording.values import numpy_of   # lazy: reading values (eager mode)
        return numpy_of(self)

    def __bool__(self):
        from progdesc.recording.values import to_python   # lazy: reading values (eager mode)
        return to_python(self, bool)

    def __int__(self):
        from progdesc.recording.values import to_python   # lazy: reading values (eager mode)
        return to_python(self, int)

    __index__ = __int__

    def __float__(self):
        from progdesc.recording.values import to_python   # lazy: reading values (eager mode)
        return to_python(self, float)

    def _binary(self, op_type, other, reverse=False):
        block = default_main_program().current_block()
        if _is_array(other) and other.ndim:   # an array: a constant of the program, this dtype
            other = constant(block, other, like=self.dtype)
        elif not isinstance(other, Variable):   # a Python scalar: a shape [] constant
            if not isinstance(other, numbers.Real) and not _is_array(other):
                raise OperandError(f"'{op_type}' takes a Variable, an array or a number, got "
                                   f"{type(other).__name__} {other!r}", var=self.name,
                                   op_type=op_type, callsite=user_callsite())
            other = _result(block, "fill_constant", {}, {"shape": [], "dtype": self.dtype,
                                                         "value": float(other)})
        a, b = (other, self) if reverse else (self, other)
        return _result(block, op_type, {"X": a, "Y": b})

    __add__ = lambda self, o: self._binary("add", o)  # noqa: E731
    __radd__ = lambda self, o: self._binary("add", o, True)  # noqa: E731
    __sub__ = lambda self, o: self._binary("sub", o)  # noqa: E731
    __rsub__ = lambda self, o: self._binary("sub", o, True)  # noqa: E731
    __mul__ = lambda self, o: self._binary("mul", o)  # noqa: E731
    __rmul__ = lambda self, o: self._binary("mul", o, True)  # noqa: E731
    __truediv__ = lambda self, o: self._binary("div", o)  # noqa: E731
    __rtruediv__ = lambda self, o: self._binary("div", o, True)  # noqa: E731
    __lt__ = lambda self, o: self._binary("less_than", o)  # noqa: E731
    __le__ = lambda self, o: self._binary("less_equal", o)  # noqa: E731
    __gt__ = lambda self, o: self._binary("greater_than", o)  # noqa: E731
    __ge__ = lambda self, o: self._binary("greater_equal", o)  # noqa: E731

    def __matmul__(self, other):
        return _result(default_main_program().current_block(), "matmul", {"X": self, "Y": other})

    def __neg__(self):
        return _result(default_main_program().current_block(), "neg", {"X": self})


def _result(block, op_type, inputs, attrs=None):
    """The output Variable of a one-output op appended to `block` (the operators of
    Variables: `a + b`, `a @ b`, `-a`)."""
    op = block.append_op(op_type, inputs, attrs=attrs)
    return block.var(op.desc.outputs[0].arguments[0])


class Operator:
    """A view of one `OpDesc` in a block."""

    def __init__(self, block, desc):
        self.block = block
        self.desc = desc

    type = property(lambda self: self.desc.type, doc="The op type.")
    role = property(lambda self: ROLE_NAMES.get(self.desc.role, "forward"),
                    doc="'forward', 'backward', 'optimize', ...")
    callsite = property(lambda self: self.desc.callsite, doc="'file:line' that created the op.")
    inputs = property(lambda self: slot_map(self.desc.inputs), doc="{slot: [variable names]}.")
    outputs = property(lambda self: slot_map(self.desc.outputs), doc="{slot: [variable names]}.")

    @property
    def idx(self):
        """Index of this op in its block."""
        for i, d in enumerate(self.block.desc.ops):
            if d is self.desc or d == self.desc:
                return i
        return -1

    @property
    def attrs(self):
        """{name: value} of the op's attributes."""
        return read_attrs(registry.get(self.type), self.desc)

    def attr(self, name):
        """One attribute's value."""
        return self.attrs[name]

    def input(self, slot):
        """Variable names bound to input slot `slot`."""
        return self.inputs.get(slot, [])

    def output(self, slot):
        """Variable names bound to output slot `slot`."""
        return self.outputs.get(slot, [])

    def __repr__(self):
        return op_line(self.block, self.desc)


class Block:
    """A view of one `BlockDesc`: its variables and its ops, in order."""

    def __init__(self, program, desc):
        self.program = program
        self._desc = desc
        # Planned ops of one fresh output variable, appended but not yet written into
        # `desc` (see op_plans.block_bytes), in order: reading `desc` (or the program's)
        # writes them first (`_flush`).
        self._pending = []
        self._is_root = desc.parent_idx < 0
        self._reindex()

    @property
    def desc(self):
        """The block's `BlockDesc`, every op appended so far in it."""
        if self._pending:
            self._flush()
        return self._desc

    def _counts(self):
        """(ops, variables) the block holds, those of its pending ops included."""
        queued = len(self._pending)   # each pending op: one variable
        if queued:
            n_ops, n_vars = self._written
            return n_ops + queued, n_vars + queued
        return len(self._desc.ops), len(self._desc.vars)

    def _flush(self):
        """Write the pending ops and their output variables into `desc`: one parse of
        their wire-format bytes appends them all (progdesc.op_plans.block_bytes)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        desc = self._desc
        first = len(desc.vars)
        desc.MergeFromString(op_plans.block_bytes(pending))
        for var, var_desc in zip([p[3] for p in pending], desc.vars[first:]):
            var._desc = var_desc

    def _reindex(self):
        """Rebuild the name -> Variable map from the desc; a Variable of a name still
        declared stays the same object, reading its (maybe edited) VarDesc afresh."""
        old, self._vars = getattr(self, "_vars", {}), {}
        for desc in self.desc.vars:
            var = old.get(desc.name)
            if var is None:
                var = Variable(self, desc)
            else:
                var.desc, var._type = desc, None
            self._vars[desc.name] = var

    idx = property(lambda self: self._desc.idx, doc="Index of the block in its program.")
    parent_idx = property(lambda self: self._desc.parent_idx, doc="Parent block index, -1 for root.")

    @property
    def parent(self):
        """The enclosing block, or None for the root block."""
        return self.program.blocks[self.parent_idx] if self.parent_idx >= 0 else None

    @property
    def vars(self):
        """{name: Variable} declared in this block."""
        return dict(self._vars)

    @property
    def ops(self):
        """The block's ops, in order."""
        return [Operator(self, d) for d in self.desc.ops]

    def has_var(self, name):
        """Whether `name` is declared in this block or an enclosing one."""
        return self.find_var(name) is not None

    def find_var(self, name):
        """The Variable `name` from this block or an enclosing one, or None."""
        var = self._vars.get(name)
        block = self
        while var is None and not block._is_root:
            block = block.parent
            var = block._vars.get(name)
        return var

    def var(self, name):
        """The Variable `name`; raises ProgramError if it is not declared."""
        v = self.find_var(name)
        if v is None:
            raise ProgramError(f"no variable '{name}' in block {self.idx} or its parents", var=name)
        return v

    def create_var(self, name, shape=(), dtype="float32", *, persistable=False,
                   stop_gradient=False, is_parameter=False, kind=pb.DENSE_TENSOR,
                   need_check_feed=False):
        """Declare a variable in this block (or return the existing one of that name)."""
        if name in self._vars:
            return self._vars[name]
        dims = _declared_dims(shape, name)
        dtype = dtypes.name_of(dtype)
        too_big = sizes.oversized(dims, dtype)
        if too_big:
            raise ProgramError(f"cannot be declared: {too_big}", var=name)
        desc = self.desc.vars.add(
            name=name, kind=kind, dtype=dtypes.to_enum(dtype), dims=dims,
            persistable=persistable, stop_gradient=stop_gradient, is_parameter=is_parameter,
            need_check_feed=need_check_feed)
        var = self._vars[name] = Variable(self, desc, (tuple(dims), dtype))
        self.program._names.reserve(name)
        self.program.mark_changed()
        return var

    def create_parameter(self, name, shape, dtype="float32", *, trainable=True):
        """Declare a persistable parameter variable."""
        return self.create_var(name, shape, dtype, persistable=True, is_parameter=True,
                               stop_gradient=not trainable)

    def append_op(self, type, inputs=None, outputs=None, attrs=None, *, role=pb.FORWARD,
                  name=None, callsite=None):
        """Validate and append an op; returns its Operator view.

        `inputs`/`outputs` map slot names to a Variable, a name, a NumPy array (made a
        constant of the program) or a list of them. Output variables that do not exist yet
        are created; when `outputs` is None every output slot gets fresh variables named
        after `name` (or the layer being built, or the op type). Shapes and dtypes of
        outputs are inferred. `callsite` ('file:line') defaults to the user's line. An op
        that does not fit raises a ProgdescError naming it and leaves the block as it was.
        """
        return Operator(self, self._add_op(type, inputs, outputs, attrs, role=role, name=name,
                                           callsite=callsite))

    def append_op_outputs(self, type, inputs=None, attrs=None, *, name=None):
        """`append_op` with fresh outputs, returning {output slot: [variable names]} (what
        the functions of progdesc.ops return Variables of)."""
        return self._insert_op(type, inputs, None, attrs, pb.FORWARD, name, None, None)[2]

    def insert_op(self, index, type, inputs=None, outputs=None, attrs=None, *, role=pb.FORWARD,
                  name=None, callsite=None):
        """`append_op`, inserting the op before the op at `index`."""
        return Operator(self, self._add_op(type, inputs, outputs, attrs, role=role, name=name,
                                           callsite=callsite, index=index))

    def remove_op(self, index):
        """Remove the op at `index` (its output variables stay declared)."""
        del self.desc.ops[index]
        self.program.mark_changed()

    def sync(self):
        """Read the block's variables again after `desc` was edited directly (variables
        added, removed, retyped); the program counts as changed. Variables held elsewhere
        stay valid while their name is declared."""
        self._reindex()
        self.program.mark_changed()

    def unused_name(self, base):
        """`base`, or `base_1`, `base_2`, ...: the first no variable visible here has."""
        name, k = base, 1
        while self.find_var(name) is not None:
            name, k = f"{base}_{k}", k + 1
        return name

    def _add_op(self, op_type, inputs=None, outputs=None, attrs=None, *, role=pb.FORWARD,
                name=None, callsite=None, index=None):
        """Validate and insert an op at `index` (default: the end); returns its desc."""
        desc = self._insert_op(op_type, inputs, outputs, attrs, role, name, callsite, index)[0]
        return self.desc.ops[-1] if desc is None else desc   # None: pending, appended last

    def _insert_op(self, op_type, inputs, outputs, attrs, role, name, callsite, index):
        """`_add_op`'s work; returns (desc, {slot: [input names]}, {slot: [output names]})."""
        callsite = user_callsite() if callsite is None else callsite
        at_end = index is None
        n_ops, n_vars = self._counts()
        index = n_ops if at_end else index
        key = plan = None
        try:
            opdef = registry.get(op_type)
            if outputs is None and at_end:   # a signature seen before: what it found, kept
                key, in_map = self._signature(opdef, inputs, attrs)
                plan = None if key is None else op_plans.lookup(key)
            if plan is not None and plan.single is not None:
                pass   # one output variable: `_append_single`, below
            elif plan is not None:
                encoded_attrs = plan.encoded_attrs
                out_map = plan.out_map(self._output_base(opdef, name))
                self._add_planned_vars(plan, out_map)
            else:
                in_map, in_shapes = self._bind_inputs(opdef, inputs)
                if at_end:   # after the constants NumPy inputs became
                    index = len(self.desc.ops)
                full_attrs, encoded_attrs = opdef.checked_attrs(attrs or {})
                inferred = infer.infer(opdef, in_shapes, full_attrs, self.program.desc,
                                       self.idx)
                base = None
                if outputs is None:
                    base = self._output_base(opdef, name)
                    outputs = self._fresh_outputs(opdef, inferred, base)
                out_map = _bind_slots(opdef.output_index, outputs, "output")
                for slot, names in out_map.items():
                    produced = inferred.get(slot, ())
                    if len(names) > len(produced):
                        raise ProgramError(f"output slot '{slot}' binds {len(names)} variables "
                                           f"but the op produces {len(produced)}")
                    for n, (dims, dtype) in zip(names, produced):
                        self._set_output_var(n, dims, dtype)
                if key is not None:
                    op_plans.remember(key, opdef, full_attrs, encoded_attrs, inferred, out_map,
                                      base)
        except ProgdescError as e:
            if at_end and (len(self.desc.ops) > n_ops or len(self.desc.vars) > n_vars):
                self._take_back(range(n_ops, len(self.desc.ops)), n_vars)
            if e.op_type is not None and e.op_index is not None:
                raise
            var = e.var if e.var is not None or e.slot is None else _slot_var(inputs, e.slot)
            raise type(e)(e.detail, var=var, op_type=op_type, op_index=index,
                          block_idx=self.idx, callsite=callsite, slot=e.slot) from None
        if plan is not None and plan.single is not None:
            var = self._append_single(plan, opdef, in_map, role, name, callsite, n_ops, n_vars)
            return None, in_map, {plan.single[0]: [var.name]}
        if plan is not None:
            desc = self.desc.ops.add()
            desc.MergeFromString(plan.op_bytes(in_map, out_map, role, callsite))
        elif index == len(self.desc.ops):
            desc = self.desc.ops.add()
            fill_op_desc(desc, opdef, in_map, out_map, encoded_attrs, role, callsite)
        else:
            self.desc.ops.insert(index, fill_op_desc(pb.OpDesc(), opdef, in_map, out_map,
                                                     encoded_attrs, role, callsite))
            desc = self.desc.ops[index]
        if opdef.random:
            self.program._ensure_rng_var()
        self.program._version += 1   # mark_changed
        if role != self.program._last_role:
            self.program._role_changed(role)
        if _listeners:
            try:
                for listener in tuple(_listeners):
                    listener.op_appended(self, index, opdef, in_map, out_map, encoded_attrs)
            except BaseException:
                self._take_back(range(n_ops, len(self.desc.ops)) if at_end else [index],
                                n_vars)
                raise
        return desc, in_map, out_map

    def _signature(self, opdef, inputs, attrs):
        """(key, {slot: [name]}) of an op whose outputs an `OpPlan` may make (see
        progdesc.op_plans), or (None, None): every input a Variable declared here."""
        if opdef.has_blocks:
            return None, None
        parts, in_map = [opdef.type, registry.GENERATION[0]], {}
        find = self._vars.get if self._is_root else self.find_var
        for slot, value in inputs.items() if inputs else ():
            if value is None:
                continue
            if value.__class__ is not Variable:
                return None, None
            name = value.name
            if find(name) is not value:   # another program's Variable, or a stale one
                return None, None
            parts.append(slot)
            parts.append(value._type or value._read_type())
            in_map[slot] = [name]
        key = op_plans.signature_key(parts, attrs)
        return (None, None) if key is None else (key, in_map)

    def append_planned(self, opdef, inputs, attrs, name=None):
        """The output Variable of an `opdef` op with one output appended at the end with
        fresh outputs, where an op of its signature was appended before (its plan, see
        progdesc.op_plans); None where there is no such plan (nothing is appended then:
        append it with `append_op_outputs`). The cheap path of the functions of
        progdesc.ops."""
        key, in_map = self._signature(opdef, inputs, attrs)
        plan = None if key is None else op_plans.lookup(key)
        if plan is None or plan.single is None or plan.opdef is not opdef:
            return None
        queued = len(self._pending)   # self._counts(), inlined
        if queued:
            n_ops, n_vars = self._written
            n_ops, n_vars = n_ops + queued, n_vars + queued
        else:
            n_ops, n_vars = len(self._desc.ops), len(self._desc.vars)
        return self._append_single(plan, opdef, in_map, pb.FORWARD, name, user_callsite(),
                                   n_ops, n_vars)

    def _append_single(self, plan, opdef, in_map, role, name, callsite, n_ops, n_vars):
        """`_insert_op` of a planned op with one output variable (most ops): the same steps,
        in one frame; returns the output Variable."""
        slot, suffix, dims, dtype, tail, type_ = plan.single
        program = self.program
        if name:
            base = program._names(name)
        elif program._layers:
            base = program._names(f"{program._layers[-1]}.{opdef.type}")
        else:
            base = program._op_names(opdef.type)
        out = base + suffix
        out_map = {slot: [out]}
        if (self._vars.get(out) if self._is_root else self.find_var(out)) is None:
            # the op and its variable wait in `_pending`
            var = self._vars[out] = Variable(self, None, type_, out)
            if not self._pending:   # the first: what `desc` holds, for the next ones
                if self not in program._unflushed:
                    program._unflushed.append(self)
                self._written = (n_ops, n_vars)
            pending = (plan, role, callsite, var, *map(_first, in_map.values()))
            self._pending.append(pending)   # (see op_plans.block_bytes)
        else:
            try:
                self._set_output_var(out, dims, dtype)
            except ProgdescError as e:
                raise type(e)(e.detail, var=e.var, op_type=opdef.type, op_index=n_ops,
                              block_idx=self.idx, callsite=callsite) from None
            pending, var = None, self.find_var(out)
            self.desc.ops.add().MergeFromString(plan.op_bytes(in_map, out_map, role, callsite))
        if opdef.random:
            program._ensure_rng_var()
        program._version += 1   # mark_changed
        if role != program._last_role:
            program._role_changed(role)
        if _listeners:
            try:
                for listener in tuple(_listeners):
                    listener.op_appended(self, n_ops, opdef, in_map, out_map,
                                         plan.encoded_attrs)
            except BaseException:
                if pending is not None and self._pending and self._pending[-1] is pending:
                    self._pending.pop()
                    del self._vars[out]
                    program.mark_changed()
                else:   # written already (the listener read the block)
                    self._take_back(range(n_ops, len(self.desc.ops)), n_vars)
                raise
        return var

    def _add_planned_vars(self, plan, out_map):
        """Declare the outputs of a planned op (see progdesc.op_plans), as `_set_output_var`
        would: a new variable from the plan's VarDesc bytes, an existing one retyped."""
        for slot, tails in plan.var_tails:
            for n, (dims, dtype, tail) in zip(out_map[slot], tails):
                if self.find_var(n) is not None:
                    self._set_output_var(n, dims, dtype)
                    continue
                desc = self.desc.vars.add()
                desc.MergeFromString(op_plans.name_field(n) + tail)
                self._vars[n] = Variable(self, desc, (dims, dtype))

    def _take_back(self, indices, n_vars):
        """Remove the ops at `indices` and the variables declared after the first `n_vars`
        (an op that failed, with the constants made for it)."""
        for index in sorted(indices, reverse=True):
            del self.desc.ops[index]
        for var in self.desc.vars[n_vars:]:
            self._vars.pop(var.name, None)
        del self.desc.vars[n_vars:]
        self.program.mark_changed()

    def _bind_inputs(self, opdef, inputs):
        """({slot: [names]}, {slot: [(dims, dtype name)]}) of an op's `inputs`, checked like
        `_bind_slots` does, and the variables declared with dtypes their slots accept."""
        in_map, in_types = {}, {}
        declared, accepted_dtypes = opdef.input_index, opdef.accepted_dtypes
        for slot_name, value in (inputs or {}).items():
            if value is None:
                continue
            name = _single_name(value)
            if name is not None and slot_name in declared:
                names, types = [name], [self.var_type(name)]
            else:
                value = self._constants_for(value)
                names = _bind_slots(declared, {slot_name: value}, "input", required=False)
                names = names.get(slot_name)
                if names is None:
                    continue
                types = [self.var_type(n) for n in names]
            accepted = accepted_dtypes.get(slot_name)
            if accepted is not None:
                for name, (_, dtype) in zip(names, types):
                    if dtype not in accepted:
                        raise ProgramError(f"input slot '{slot_name}' expects a "
                                           f"{declared[slot_name].dtypes} dtype, got {dtype}",
                                           var=name)
            in_map[slot_name], in_types[slot_name] = names, types
        for slot_name in opdef.required_inputs:
            if not in_map.get(slot_name):
                raise ProgramError(f"required input slot '{slot_name}' is not bound")
        if opdef.same_dtype and len({d for s in opdef.same_dtype
                                     for _, d in in_types.get(s, ())}) > 1:
            _raise_dtype_mismatch(opdef, in_map, in_types)
        return in_map, in_types

    def _constants_for(self, value):
        """`value` (a slot's binding) with each NumPy or JAX array in it made a constant."""
        if _is_array(value):
            return constant(self, value)
        if isinstance(value, (list, tuple)) and any(_is_array(v) for v in value):
            return [self._constants_for(v) for v in value]
        return value

    def var_type(self, name):
        """(dims, dtype name) of variable `name`, declared here or in an enclosing block;
        ProgramError if it is not."""
        var = self.find_var(name)
        if var is None:
            raise ProgramError("is used before it is defined in this block", var=name)
        return var._type or var._read_type()

    def _output_base(self, opdef, name):
        """The base of a new op's output names: `name`, else the op inside the layer being
        built ('fc_0.matmul_0'), else the op ('add_0')."""
        if name:
            return self.program._names(name)
        layers = self.program._layers
        if layers:
            return self.program._names(f"{layers[-1]}.{opdef.type}")
        return self.program._op_names(opdef.type)

    def _fresh_outputs(self, opdef, inferred, base):
        """{slot: [names]} for every output the op produces, named after `base`."""
        outputs = {}
        for slot in opdef.outputs:
            produced = inferred.get(slot.name, ())
            suffix = slot.name.lower()
            outputs[slot.name] = ([f"{base}.{suffix}_{i}" for i in range(len(produced))]
                                  if slot.many else [f"{base}.{suffix}"][:len(produced)])
        return outputs

    def _set_output_var(self, name, dims, dtype):
        var = self.find_var(name)
        if var is None:   # a new variable: create_var's work, for inferred dims and dtype
            desc = self.desc.vars.add(name=name, kind=pb.DENSE_TENSOR,
                                      dtype=dtypes.to_enum(dtype), dims=dims)
            self._vars[name] = Variable(self, desc, (tuple(dims), dtype))
            return
        if var.desc.persistable:
            var_dims, var_dtype = var._type or var._read_type()
            if var_dtype != dtype or (var_dims != tuple(dims)
                                      and not dims_compatible(var_dims, dims)):
                raise ProgramError(f"op writes {dtype}{list(dims)} into a persistable variable "
                                   f"declared {type_str(var.desc)}", var=name)
            return
        var.desc.dtype = dtypes.to_enum(dtype)
        var.desc.ClearField("dims")
        var.desc.dims.extend(dims)
        var._type = (tuple(dims), dtype)

    def rename_output(self, var, base):
        """Name `var` '<base>.out', and the other outputs of the block's last op that
        share its generated prefix '<base>.<slot>'. `var` must be an output of that op,
        which has no readers yet: a layer names its result this way."""
        op = self.desc.ops[-1]
        if not any(var.name in slot.arguments for slot in op.outputs):
            raise ProgramError("is not an output of the block's last op", var=var.name)
        old_base = var.name.rsplit(".", 1)[0]
        renames = {var.name: f"{base}.out"}
        for slot in op.outputs:
            for a in slot.arguments:
                v = self._vars.get(a)
                if a not in renames and a.startswith(old_base + ".") and v is not None \
                        and not v.persistable:
                    renames[a] = f"{base}.{a[len(old_base) + 1:]}"
        for new in renames.values():
            if self.find_var(new) is not None:
                raise ProgramError("a variable of this name already exists; give the layer "
                                   "another name", var=new)
        for slot in op.outputs:
            slot.arguments[:] = [renames.get(a, a) for a in slot.arguments]
        for old, new in renames.items():
            v = self._vars.pop(old)
            v.name = v.desc.name = new
            self._vars[new] = v
        self.program.mark_changed()
        for listener in tuple(_listeners):
            listener.vars_renamed(self, renames)

    def __str__(self):
        return block_text(self)

    def _repr_html_(self):
        from progdesc.display import block_html
        return block_html(self)


_first = operator.itemgetter(0)


def _bind_slots(declared, given, what, required=True):
    """{slot: [names]} of `given` ({slot: Variable, name or a list of them}), checked against
    the `declared` {slot name: Slot}: unknown, overfull and (for inputs, if `required`)
    unbound required slots raise."""
    out = {}
    for slot_name, value in (given or {}).items():
        if value is None:
            continue
        slot = declared.get(slot_name)
        if slot is None:
            raise ProgramError(f"'{slot_name}' is not an {what} slot (declared: "
                               f"{', '.join(declared) or 'none'})")
        name = _single_name(value)
        if name is not None:
            out[slot_name] = [name]
            continue
        values = value if isinstance(value, (list, tuple)) else (value,)
        names = [v if v.__class__ is str else _slot_arg_name(slot_name, v) for v in values]
        if len(names) > 1 and not slot.many:
            raise ProgramError(f"{what} slot '{slot_name}' takes one variable, got {len(names)}")
        if names or slot.many:
            out[slot_name] = names
    if what == "input" and required:
        for slot in declared.values():
            if not slot.optional and not out.get(slot.name):
                raise ProgramError(f"required {what} slot '{slot.name}' is not bound")
    return out


def _slot_var(inputs, label):
    """The name of the variable an op's `inputs` bind to slot `label` ('X', or 'X[1]')."""
    slot, _, index = label.partition("[")
    values = (inputs or {}).get(slot)
    if not isinstance(values, (list, tuple)):
        values = [values]
    i = int(index.rstrip("]") or 0)
    return _single_name(values[i]) if i < len(values) and values[i] is not None else None


def _is_array(value):
    """Whether `value` is a NumPy array or a JAX array (not a Variable or a Python scalar)."""
    return hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "shape")


def _single_name(value):
    """The one variable name `value` (a name, a Variable or a list of one name) binds, or None."""
    cls = value.__class__
    if cls is str:
        return value
    if cls is Variable:
        return value.name
    if cls is list and len(value) == 1 and value[0].__class__ is str:
        return value[0]
    return None


def _slot_arg_name(slot_name, value):
    if isinstance(value, Variable):
        return value.name
    if isinstance(value, str):
        return value
    raise ProgramError(f"slot '{slot_name}' expects Variables or names, "
                       f"got {type(value).__name__}")


def _raise_dtype_mismatch(opdef, in_map, in_types):
    group = [(s, n, d) for s in opdef.same_dtype
             for n, (_, d) in zip(in_map.get(s, []), in_types.get(s, []))]
    first = group[0]
    odd = next(g for g in group if g[2] != first[2])
    raise ProgramError(f"dtype mismatch: slot '{first[0]}' is {first[2]} but slot "
                       f"'{odd[0]}' is {odd[2]} (cast one of them)", var=odd[1])


def dims_compatible(a, b):
    """Whether two dim lists can describe the same array (-1 matches anything)."""
    return len(a) == len(b) and all(x == y or x < 0 or y < 0 for x, y in zip(a, b))


_program_serials = itertools.count()


class Program:
    """A program description: blocks of variables and ops (block 0 is the root)."""

    _unflushed = ()   # blocks holding pending ops (Block._pending); a list once built

    def __init__(self, random_seed=0, precision="default"):
        self.desc = pb.ProgramDesc(format_version=FORMAT_VERSION, random_seed=random_seed,
                                   precision=precision_value(precision))
        self.desc.blocks.add(idx=0, parent_idx=-1)
        self._rebuild()

    @property
    def desc(self):
        """The program's `ProgramDesc`, every op appended so far in it."""
        if self._unflushed:
            for block in self._unflushed:
                block._flush()
            self._unflushed.clear()
        return self._desc

    @desc.setter
    def desc(self, desc):
        self._desc = desc

    def _rebuild(self):
        desc = self.desc   # the pending ops of the blocks being replaced written first
        self._unflushed = []
        self.blocks = [Block(self, b) for b in desc.blocks]
        self._current = 0
        self._version = 0
        self._serial = next(_program_serials)    # with _version, identifies what executors compiled
        taken = {part for b in self.desc.blocks for v in b.vars
                 for part in (v.name, v.name.split(".", 1)[0])}
        self._names = NameGenerator(taken)       # layers, parameters, user-given names
        self._op_names = NameGenerator(taken)    # default names of op outputs
        self._layers = []                        # prefixes of the layers being built
        self._last_role = pb.FORWARD             # of the op appended last, and:
        self._differentiated = False             # a backward pass since the last update
        self._training_steps = 0                 # updates that followed a backward pass

    def _role_changed(self, role):
        """Count training steps (see ProgramListener.training_step_appended): an op of
        `role` follows one of another role."""
        self._last_role = role
        if role == pb.BACKWARD:
            self._differentiated = True
        elif role == pb.OPTIMIZE and self._differentiated:
            self._differentiated = False
            self._training_steps += 1
            if self._training_steps > 1:
                for listener in tuple(_listeners):
                    listener.training_step_appended(self, self._training_steps)

    def mark_changed(self):
        """Count the program as changed (`version`), so that executors compile it again:
        every method of the API does this; call it after editing `desc` directly."""
        self._version += 1

    @property
    def serial(self):
        """A number no other Program of this process has; with `version` it names what an
        executor compiled."""
        return self._serial

    def unique_name(self, base):
        """'base_0', 'base_1', ...: a name no variable of the program has, nor will be given
        by another call (a loaded program's names are known)."""
        return self._names(base)

    @property
    def version(self):
        """A counter that changes whenever the program is modified through its API."""
        return self._version

    @property
    def random_seed(self):
        """Seed of the RNG state, used by the first program run in a Scope.

        Programs sharing a Scope share one RNG state variable: the startup
        program (normally run first) seeds it, and the main program's random
        ops (dropout) continue from there, reproducibly.
        """
        return self.desc.random_seed

    @random_seed.setter
    def random_seed(self, seed):
        self.desc.random_seed = int(seed)
        self.mark_changed()

    @property
    def precision(self):
        """How float32 matrix products, convolutions and attention run: "default" or "highest".

        "default" (the default) is the backend's fast default (JAX's
        `jax_default_matmul_precision` when set): TF32 on NVIDIA GPUs, one
        bfloat16 pass on TPU, true float32 on CPU. "highest" is true float32
        everywhere. Part of the program: clone, save, load and export keep it;
        `Executor(precision=...)` overrides it.
        """
        return precision_of(self.desc)

    precision_enum = property(lambda self: self._desc.precision,
                              doc="`precision` as the ProgramDesc holds it (a number).")

    @precision.setter
    def precision(self, precision):
        self.desc.precision = precision_value(precision)
        self.mark_changed()

    def global_block(self):
        """Block 0."""
        return self.blocks[0]

    def current_block(self):
        """The block ops are appended to now."""
        return self.blocks[self._current]

    def block(self, idx):
        """Block `idx`."""
        return self.blocks[idx]

    def create_block(self, parent_idx=None):
        """Append a sub-block (child of the current block) and make it current."""
        parent = self._current if parent_idx is None else parent_idx
        desc = self.desc.blocks.add(idx=len(self.desc.blocks), parent_idx=parent)
        self.blocks.append(Block(self, desc))
        self._current = desc.idx
        self.mark_changed()
        return self.blocks[-1]

    def rollback(self):
        """Make the parent of the current block current again."""
        self._current = max(self.current_block().parent_idx, 0)

    def list_vars(self):
        """Every Variable of every block."""
        return [v for b in self.blocks for v in b._vars.values()]

    def all_parameters(self):
        """Every trainable-parameter Variable."""
        return [v for v in self.list_vars() if v.is_parameter]

    @contextlib.contextmanager
    def sub_block(self, parent_idx=None):
        """Inside, ops are appended to a new sub-block of the current block (or of block
        `parent_idx`); yields the new Block. The current block is restored afterwards."""
        saved = self._current
        block = self.create_block(parent_idx)
        try:
            yield block
        finally:
            self._current = saved

    @contextlib.contextmanager
    def layer_scope(self, kind, name=None):
        """Inside, ops appended without a name are named after one layer; yields the
        layer's prefix: `name`, else 'fc_0', 'fc_1', ... for kind 'fc' (inside another
        layer 'multi_head_attention_0.dropout_0')."""
        prefix = name or self._names(".".join(self._layers[-1:] + [kind]))
        self._layers.append(prefix)
        try:
            yield prefix
        finally:
            self._layers.pop()

    def _ensure_rng_var(self):
        self.global_block().create_var(RNG_VAR, (2,), "uint32", persistable=True,
                                       stop_gradient=True, kind=pb.RNG_STATE)

    def clone(self, for_test=False):
        """A deep copy; `for_test` drops backward/optimizer ops and sets `is_test` attrs."""
        p = Program.from_desc(self.desc)
        if for_test:
            for block in p.blocks:
                keep = [d for d in block.desc.ops
                        if d.role in (pb.FORWARD, pb.LOSS)]
                del block.desc.ops[:]
                block.desc.ops.extend(keep)
                for d in block.desc.ops:
                    if "is_test" in d.attrs:
                        d.attrs["is_test"].b = True
            if drop_unused_blocks(p.desc):   # the gradient sub-blocks
                p._rebuild()
            p.mark_changed()
        p._names.count_on_from(self._names)
        p._op_names.count_on_from(self._op_names)
        return p

    @classmethod
    def from_desc(cls, desc):
        """A Program over a copy of a `ProgramDesc` message (validated)."""
        p = cls.__new__(cls)
        p.desc = pb.ProgramDesc()
        p.desc.CopyFrom(desc)
        p._rebuild()
        validate(p)
        return p

    def to_bytes(self, strip_callsites=False):
        """Deterministic binary protobuf of the program."""
        desc = self.desc
        if strip_callsites:
            desc = pb.ProgramDesc()
            desc.CopyFrom(self.desc)
            for b in desc.blocks:
                for o in b.ops:
                    o.ClearField("callsite")
        return desc.SerializeToString(deterministic=True)

    @classmethod
    def from_bytes(cls, data):
        """Parse and validate binary protobuf; raises FormatError on bad bytes."""
        desc = pb.ProgramDesc()
        try:
            desc.ParseFromString(bytes(data))
        except (_pb_message.DecodeError, TypeError, ValueError) as e:
            raise FormatError(f"bytes are not a valid ProgramDesc: {e}") from None
        return cls._checked(desc)

    def to_text(self):
        """Protobuf text format (.pbtxt) of the program."""
        return text_format.MessageToString(self.desc)

    @classmethod
    def from_text(cls, text):
        """Parse and validate protobuf text format; raises FormatError on bad text."""
        desc = pb.ProgramDesc()
        try:
            text_format.Parse(text, desc)
        except text_format.ParseError as e:
            raise FormatError(f"text is not a valid ProgramDesc: {e}") from None
        return cls._checked(desc)

    @classmethod
    def _checked(cls, desc):
        check_desc(desc)
        return cls.from_desc(desc)

    def schedule(self, block=0):
        """The `Schedule` of block `block`: its ops in recorded order, what each depends on,
        and the groups of mutually independent ops (see progdesc.schedule). Prints readably,
        shows as a table in Jupyter, draws with `.render()`."""
        from progdesc.schedule import schedule
        return schedule(self, block)

    def __str__(self):
        return program_text(self)

    def __repr__(self):
        n = sum(len(b.desc.ops) for b in self.blocks)
        return f"<Program {len(self.blocks)} block(s), {n} op(s)>"

    def _repr_html_(self):
        from progdesc.display.viewer import Viewer
        return Viewer(self)._repr_html_()

    def table(self):
        """The program as a table, one row per op (what Jupyter showed for a program before
        the viewer): Jupyter shows it, `str()` gives the text listing."""
        from progdesc.display import ProgramTable
        return ProgramTable(self)

    def to_dot(self, **options):
        """Graphviz DOT text of the program (see progdesc.display.program_dot)."""
        from progdesc.display import program_dot
        return program_dot(self, **options)

    def render(self, path=None, format=None, **options):
        """Show or draw the program.

        With no path, format or drawing option (only the viewer's `scope`, `title`,
        `fetch`), a `Viewer`: the interactive viewer, which Jupyter shows. A path ending in
        '.html' (or `format='html'`) writes the viewer's standalone page there. Any other
        path, a `format` ('svg', 'png', ...) or a drawing option (`collapse`, `engine`,
        `show_backward`, ...) draws the static graph (see progdesc.display.render): SVG or
        an image that needs no JavaScript, for documents and previews.
        """
        from progdesc.display import render
        from progdesc.display.viewer import VIEWER_OPTIONS, Viewer
        to_html = format == "html" or (format is None and path is not None and os.fspath(
            path).lower().endswith((".html", ".htm")))
        if to_html or (path is None and format is None and set(options) <= VIEWER_OPTIONS):
            unknown = sorted(set(options) - VIEWER_OPTIONS)
            if unknown:
                raise TypeError(f"render() to HTML writes the interactive viewer, which takes "
                                f"{', '.join(sorted(VIEWER_OPTIONS))}; got {', '.join(unknown)} "
                                "(a static drawing option: give format='svg' or an .svg path)")
            viewer = Viewer(self, **options)
            return viewer if path is None else viewer.save(path)
        return render(self, path, format=format or "svg", **options)


def _declared_dims(shape, name):
    """A variable's dims from `shape` (None or -1: unknown); ProgramError for anything but
    whole sizes."""
    try:
        dims = [-1 if d is None else operator.index(d) for d in shape]
    except TypeError:
        dims = None
    if dims is None or any(d < -1 for d in dims):
        raise ProgramError(f"shape must hold sizes (ints >= 0) or None / -1 for unknown dims, "
                           f"got {shape!r}", var=name)
    return dims


def validate(program):
    """Check every op of a program against the registry; raises ProgramError naming the op."""
    for block in program.blocks:
        for i, op_desc in enumerate(block.desc.ops):
            where = dict(op_type=op_desc.type, op_index=i, block_idx=block.idx,
                         callsite=op_desc.callsite)
            try:
                opdef = registry.get(op_desc.type)
                _bind_slots(opdef.input_index, slot_map(op_desc.inputs), "input")
                _bind_slots(opdef.output_index, slot_map(op_desc.outputs), "output")
                opdef.complete_attrs(read_attrs(opdef, op_desc))
                unknown = set(op_desc.attrs) - {a.name for a in opdef.attrs} - {FORWARD_OP,
                                                                          PIPELINE_STAGE,
                                                                          SPLIT_HEADS}
                if unknown:
                    raise ProgramError(f"attribute '{sorted(unknown)[0]}' is not declared")
                for names in list(slot_map(op_desc.inputs).values()) + list(
                        slot_map(op_desc.outputs).values()):
                    for n in names:
                        if block.find_var(n) is None:
                            raise ProgramError("is not declared in the program", var=n)
            except ProgdescError as e:
                raise type(e)(e.detail, var=e.var, **where) from None


# --- default programs and program_guard ---

_main_program = Program()
_startup_program = Program()
_guarded = contextvars.ContextVar("progdesc_programs", default=None)   # (main, startup)


def default_main_program():
    """The program ops are appended to: the innermost program_guard's in this thread (or
    asyncio task), else the process's default main program, shared by every thread."""
    guarded = _guarded.get()
    return _main_program if guarded is None else guarded[0]


def default_startup_program():
    """The program initializer ops are appended to: the innermost program_guard's in this
    thread (or asyncio task), else the process's default startup program."""
    guarded = _guarded.get()
    return _startup_program if guarded is None else guarded[1]


@contextlib.contextmanager
def program_guard(main_program, startup_program=None):
    """Make `main_program` (and `startup_program`) the defaults inside the block.

    The guard holds for this thread (or asyncio task) only: threads building programs at
    once each use their own guard. A thread starts outside any guard."""
    if not isinstance(main_program, Program):
        raise TypeError("program_guard expects a Program")
    token = _guarded.set((main_program, startup_program or default_startup_program()))
    try:
        yield
    finally:
        _guarded.reset(token)


@contextlib.contextmanager
def appended_whole():
    """Inside, what is added to the current main and startup programs is added whole or
    not at all: if the block raises, their blocks, ops, variables, generated names and
    eager values (and, in eager mode, the Scope's values) are taken back to what they were
    before it, so a retry gets the same names. Every layer runs inside one. Only additions
    are taken back: what the block changes in place (an existing variable) stays."""
    programs = list({id(p): p for p in (default_main_program(),
                                         default_startup_program())}.values())
    marks = [_ProgramMark(p) for p in programs]
    undos = [undo for undo in (listener.appending_whole(programs)
                               for listener in tuple(_listeners)) if undo is not None]
    try:
        yield
    except BaseException:
        for mark in marks:
            mark.restore()
        for undo in undos:
            undo()
        raise
    finally:
        for mark in marks:
            mark.close()


def append_whole(fn):
    """`fn`, running inside `appended_whole` (the decorator of layers and builders)."""
    @functools.wraps(fn)
    def whole(*args, **kwargs):
        with appended_whole():
            return fn(*args, **kwargs)
    return whole


class _ProgramMark:
    """How much of a program existed when `appended_whole` began (see there)."""

    def __init__(self, program):
        self.program = program
        self.n_blocks, self.current = len(program.desc.blocks), program._current
        self.sizes = [(len(b.desc.vars), len(b.desc.ops)) for b in program.blocks]
        generators = (program._names, program._op_names)
        self.owner = program._names.journal is None   # the outermost mark keeps the journal
        if self.owner:
            for generator in generators:
                generator.journal = []
        self.journal_starts = [len(g.journal) for g in generators]

    def restore(self):
        program = self.program
        del program.desc.blocks[self.n_blocks:]
        del program.blocks[self.n_blocks:]
        program._current = self.current
        removed = []
        for block, (n_vars, n_ops) in zip(program.blocks, self.sizes):
            if len(block.desc.ops) > n_ops:
                del block.desc.ops[n_ops:]
            removed += [var.name for var in block.desc.vars[n_vars:]]
            if len(block.desc.vars) > n_vars:
                block._take_back((), n_vars)
        for generator, start in zip((program._names, program._op_names), self.journal_starts):
            NameGenerator.undo(generator.journal[start:])
            del generator.journal[start:]
        program.mark_changed()
        for listener in tuple(_listeners):
            listener.vars_removed(program, removed)

    def close(self):
        if self.owner:
            self.program._names.journal = self.program._op_names.journal = None


def data(name, shape, dtype="float32", *, stop_gradient=True, value=None):
    """Declare an input variable of the current main program (None or -1 for unknown dims).

    `value` (an array, checked as a feed would be) is the value ops appended in eager
    mode read; the program itself is unchanged by it and is fed as usual when it runs.
    """
    block = default_main_program().global_block()
    try:
        if block.find_var(name) is not None:
            from progdesc.recording.loops import why_redeclared   # lazy: it imports this
            raise ProgramError(f"a variable named '{name}' already exists{why_redeclared()}",
                               var=name)
        var = block.create_var(name, shape, dtype, stop_gradient=stop_gradient,
                               need_check_feed=True)
    except ProgdescError as e:
        raise type(e)(e.detail, var=name, callsite=user_callsite()) from None
    if value is not None:
        try:
            for listener in tuple(_listeners):
                listener.data_value(var, value)
        except ProgdescError as e:
            del block.desc.vars[-1]   # the declaration is taken back with its bad value
            del block._vars[name]
            raise type(e)(e.detail, var=name, callsite=user_callsite()) from None
    return var
