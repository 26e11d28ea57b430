"""Scopes: a tree of name -> value maps holding the values of persistable variables.

A lookup walks up to the parent scope (seed 001); a variable is created in a
scope on its first mutable access (`scope.var(name)`); values are jax arrays
that stay on their device.

Every scope is safe to use from several threads: a scope tree has one lock
(`Scope.lock`), and a run holds it from reading the state it needs to writing
back what it computed, so runs on one scope tree take turns and lose no update,
while runs on different trees go on in parallel.

Values handed out (`get`, `ScopeVariable.get` / `.value`) or handed in (`set`)
stay valid: the Executor donates the buffers of the state a program updates (an
update in place on an accelerator), but a value that has crossed the Scope's
boundary is copied once before a run would donate it, and the value the run
writes back is the Scope's own again.
"""
import contextlib
import contextvars
import operator
import threading

import jax
import numpy as np

from lowering.errors import ScopeError

_counter_lock = threading.Lock()


def _moved(structure=True):
    """Count a change that compiled runs must notice (see Scope.generation)."""
    with _counter_lock:
        Scope.generation += 1
        if structure:
            Scope.changes += 1


class ScopeVariable:
    """One named slot of a Scope; `value` is a jax array or None until set."""

    __slots__ = ("name", "_value", "_given", "_scope")

    def __init__(self, scope, name):
        self._scope = scope
        self.name = name
        self._value = None
        self._given = None   # id() of the value last handed out or in (it may be held)

    @property
    def value(self):
        """The stored jax array, or None; it stays valid after later runs."""
        with self._scope.lock:
            value = self._value
            if value is not None and self._given != id(value):
                self._given = id(value)
                _moved(structure=False)   # a run copies it before donating it
            return value

    @value.setter
    def value(self, value):
        self.set(value)

    def set(self, value):
        """Store `value` (anything array-like) as a jax array; it stays valid after later runs."""
        value = value if isinstance(value, jax.Array) else jax.numpy.asarray(value)
        with self._scope.lock:
            self._value, self._given = value, id(value)
            _moved()   # compiled programs re-check what they read

    def get(self):
        """The stored jax array; raises ScopeError if nothing is stored yet."""
        value = self.value
        if value is None:
            raise ScopeError(f"variable '{self.name}' has no value yet", var=self.name)
        return value

    get_tensor = get   # Paddle's spelling (progdesc.paddle_names): np.array() takes it

    def numpy(self):
        """The stored value as a NumPy array (a host copy)."""
        with self._scope.lock:
            if self._value is None:
                raise ScopeError(f"variable '{self.name}' has no value yet", var=self.name)
            return np.array(self._value)

    def current(self):
        """The stored value or None, not handed out: for code that uses it while it holds the
        scope's lock and keeps no reference to it (a run's inputs)."""
        return self._value

    @property
    def shared(self):
        """Whether the stored value may be held outside the Scope (a run copies it before
        donating its buffer)."""
        value = self._value
        return value is not None and self._given == id(value)

    def own_value(self):
        """The stored value, or a copy of it where it may be held outside the Scope, for a
        run to donate; the Scope keeps the stored one until the run writes its result back
        (a failed run leaves it as it was)."""
        value = self._value
        if value is not None and self._given == id(value):
            return jax.device_put(value, value.sharding, may_alias=False)
        return value

    def __repr__(self):
        v = self._value
        shown = 'unset' if v is None else f'{v.dtype}{list(v.shape)}'
        return f"<ScopeVariable {self.name}: {shown}>"


class Scope:
    """A name -> value map with a parent; see the module docstring."""

    generation = 0
    """Counts variable creations, value replacements from outside a run and values handed
    out, in every scope: what an Executor resolved and checked stays valid until it moves."""

    changes = 0
    """The part of `generation` that is not values handed out: holders found and values
    checked stay valid until it moves (values handed out need only a copy)."""

    def __init__(self, parent=None):
        self.parent = parent
        self._vars = {}
        self._kids = []
        self.lock = threading.RLock() if parent is None else parent.lock
        """The lock of this scope tree: a run holds it from reading state to writing back."""

    def new_scope(self):
        """A child scope whose lookups fall back to this one."""
        kid = Scope(self)
        with self.lock:
            self._kids.append(kid)
        return kid

    def drop_kids(self):
        """Forget every child scope."""
        with self.lock:
            self._kids.clear()

    @property
    def kids(self):
        """The child scopes."""
        with self.lock:
            return list(self._kids)

    def var(self, name):
        """The variable `name` of this scope, created (empty) on first access."""
        with self.lock:
            v = self._vars.get(name)
            if v is None:
                v = self._vars[name] = ScopeVariable(self, name)
                _moved()
            return v

    def find_var(self, name):
        """The variable `name` here or in the nearest ancestor that has it, or None."""
        scope = self
        with self.lock:
            while scope is not None:
                v = scope._vars.get(name)
                if v is not None:
                    return v
                scope = scope.parent
        return None

    def get(self, name):
        """The value of `name` (looked up through parents); raises ScopeError if absent.

        The array stays valid after later runs (they copy it before donating its buffer)."""
        v = self.find_var(name)
        value = None if v is None else v.value
        if value is None:
            raise ScopeError(f"no value for '{name}' in this scope or its parents", var=name)
        return value

    def set(self, name, value):
        """Store a value for `name` where it is found, or in this scope if it is new."""
        with self.lock:
            v = self.find_var(name) or self.var(name)
            v.set(value)

    def local_var_names(self):
        """Names of the variables held by this scope itself."""
        with self.lock:
            return sorted(self._vars)

    def snapshot(self):
        """What this scope and its ancestors hold now, for `restore` (values are not copied:
        a Scope's arrays are never changed in place, and none is handed out by this)."""
        with self.lock:
            chain, scope = [], self
            while scope is not None:
                chain.append((scope, {n: (v, v._value, v._given) for n, v in scope._vars.items()}))
                scope = scope.parent
            return chain

    def restore(self, snapshot):
        """Make this scope and its ancestors hold exactly what `snapshot` recorded: variables
        created since are removed, values set since are put back."""
        with self.lock:
            for scope, held in snapshot:
                scope._vars.clear()
                scope._vars.update((n, holder) for n, (holder, _, _) in held.items())
                for holder, value, given in held.values():
                    holder._value, holder._given = value, given
            _moved()

    def _repr_html_(self):
        from progdesc.display import scope_html
        return scope_html(self)

    def __contains__(self, name):
        v = self.find_var(name)
        return v is not None and v._value is not None

    def holders(self, read_names, write_names):
        """ScopeVariables for names read (found through parents, or None) and written.

        A written name that exists nowhere is created in this scope.
        """
        with self.lock:
            write = [self.find_var(n) or self.var(n) for n in write_names]
            read = [self.find_var(n) for n in read_names]
        return read, write

    def store(self, holders, values):
        """Store a run's results (the Scope's own values) into resolved holders; call with
        the lock held."""
        for holder, value in zip(holders, values):
            holder._value = value

    def write_many(self, values, private=False):
        """Store {name: value} at once, under one lock (where each name is found, else here).

        Unless `private` (values no one else holds), they count as handed in: a run
        copies them before donating them."""
        with self.lock:
            for n, value in values.items():
                holder = self.find_var(n) or self.var(n)
                holder._value, holder._given = value, (None if private else id(value))
            _moved()


class _Absent:
    """Stands for a persistable the scope does not hold."""
    _value = None

    def own_value(self):
        return None


ABSENT = _Absent()
"""A holder with no value, standing for a name the scope does not hold (`held_value` and
`own_value` give None)."""
held_value = operator.attrgetter("_value")
"""The value a holder (ScopeVariable or ABSENT) stores, as `ScopeVariable.current()` gives
it: for a run's inputs, read with the lock held (fast: one attribute read)."""

_global_scope = Scope()
_current = contextvars.ContextVar("progdesc_scope", default=None)


def global_scope():
    """The scope used when none is given (the one of the innermost scope_guard)."""
    return _current.get() or _global_scope


@contextlib.contextmanager
def scope_guard(scope):
    """Make `scope` the one `global_scope()` returns inside the block (this thread or
    asyncio task)."""
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)
