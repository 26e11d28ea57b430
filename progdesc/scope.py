"""Scopes: a tree of name -> value maps holding the values of persistable variables.

A lookup walks up to the parent scope (seed 001); a variable is created in a
scope on its first mutable access (`scope.var(name)`); values are jax arrays
that stay on their device. Every scope is safe to use from several threads.
"""
import contextlib
import threading

import jax
import numpy as np

from lowering.errors import ScopeError


class ScopeVariable:
    """One named slot of a Scope; `value` is a jax array or None until set."""

    __slots__ = ("name", "value", "_scope")

    def __init__(self, scope, name):
        self._scope = scope
        self.name = name
        self.value = None

    def set(self, value):
        """Store `value` (anything array-like) as a jax array."""
        with self._scope._lock:
            self.value = value if isinstance(value, jax.Array) else jax.numpy.asarray(value)
            Scope.generation += 1   # compiled programs re-check what they read

    def get(self):
        """The stored jax array; raises ScopeError if nothing is stored yet."""
        if self.value is None:
            raise ScopeError(f"variable '{self.name}' has no value yet", var=self.name)
        return self.value

    def numpy(self):
        """The stored value as a NumPy array (copied to the host)."""
        return np.asarray(self.get())

    def __repr__(self):
        v = self.value
        return f"<ScopeVariable {self.name}: {'unset' if v is None else f'{v.dtype}{list(v.shape)}'}>"


class Scope:
    """A name -> value map with a parent; see the module docstring."""

    generation = 0
    """Counts variable creations and value replacements from outside a run, in every scope:
    what an Executor resolved and checked stays valid until it moves."""

    def __init__(self, parent=None):
        self.parent = parent
        self._vars = {}
        self._kids = []
        self._lock = threading.RLock() if parent is None else parent._lock

    def new_scope(self):
        """A child scope whose lookups fall back to this one."""
        kid = Scope(self)
        with self._lock:
            self._kids.append(kid)
        return kid

    def drop_kids(self):
        """Forget every child scope."""
        with self._lock:
            self._kids.clear()

    @property
    def kids(self):
        """The child scopes."""
        with self._lock:
            return list(self._kids)

    def var(self, name):
        """The variable `name` of this scope, created (empty) on first access."""
        with self._lock:
            v = self._vars.get(name)
            if v is None:
                v = self._vars[name] = ScopeVariable(self, name)
                Scope.generation += 1
            return v

    def find_var(self, name):
        """The variable `name` here or in the nearest ancestor that has it, or None."""
        scope = self
        with self._lock:
            while scope is not None:
                v = scope._vars.get(name)
                if v is not None:
                    return v
                scope = scope.parent
        return None

    def get(self, name):
        """The value of `name` (looked up through parents); raises ScopeError if absent."""
        v = self.find_var(name)
        if v is None or v.value is None:
            raise ScopeError(f"no value for '{name}' in this scope or its parents", var=name)
        return v.value

    def set(self, name, value):
        """Store a value for `name` where it is found, or in this scope if it is new."""
        v = self.find_var(name) or self.var(name)
        v.set(value)

    def local_var_names(self):
        """Names of the variables held by this scope itself."""
        with self._lock:
            return sorted(self._vars)

    def snapshot(self):
        """What this scope and its ancestors hold now, for `restore` (values are not copied:
        a Scope's arrays are never changed in place)."""
        with self._lock:
            chain, scope = [], self
            while scope is not None:
                chain.append((scope, {n: (v, v.value) for n, v in scope._vars.items()}))
                scope = scope.parent
            return chain

    def restore(self, snapshot):
        """Make this scope and its ancestors hold exactly what `snapshot` recorded: variables
        created since are removed, values set since are put back."""
        with self._lock:
            for scope, held in snapshot:
                scope._vars.clear()
                scope._vars.update((n, holder) for n, (holder, _) in held.items())
                for holder, value in held.values():
                    holder.value = value
            Scope.generation += 1

    def _repr_html_(self):
        from progdesc.display import scope_html
        return scope_html(self)

    def __contains__(self, name):
        v = self.find_var(name)
        return v is not None and v.value is not None

    def _holders(self, read_names, write_names):
        """ScopeVariables for names read (found through parents, or None) and written.

        A written name that exists nowhere is created in this scope.
        """
        with self._lock:
            write = [self.find_var(n) or self.var(n) for n in write_names]
            read = [self.find_var(n) for n in read_names]
        return read, write

    def _store(self, holders, values):
        """Store values into resolved holders at once, under one lock."""
        with self._lock:
            for holder, value in zip(holders, values):
                holder.value = value

    def _write(self, values):
        """Store {name: value} at once, under one lock (where each name is found, else here)."""
        with self._lock:
            for n, value in values.items():
                (self.find_var(n) or self.var(n)).value = value
            Scope.generation += 1


_global_scope = Scope()
_current = threading.local()


def global_scope():
    """The scope used when none is given (per thread inside scope_guard)."""
    return getattr(_current, "scope", None) or _global_scope


@contextlib.contextmanager
def scope_guard(scope):
    """Make `scope` the one `global_scope()` returns inside the block (this thread)."""
    saved = getattr(_current, "scope", None)
    _current.scope = scope
    try:
        yield scope
    finally:
        _current.scope = saved
