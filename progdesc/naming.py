"""Unique, readable names for the variables a program's builders make."""


class NameGenerator:
    """Unique, readable names ('fc_0', 'fc_1', ...) counted per program.

    `taken` holds names (and their prefixes before each '.') already in
    use, e.g. by a loaded program; generated names skip them and join them,
    so generators sharing one `taken` set never hand out the same name.
    """

    def __init__(self, taken):
        self._counts = {}
        self._taken = taken
        self.journal = None   # inside `appended_whole`: a list of what to undo

    def __call__(self, prefix):
        """The next unused name starting with `prefix`."""
        counts, taken = self._counts, self._taken
        n = counts.get(prefix, 0)
        name = f"{prefix}_{n}"
        while name in taken:
            n += 1
            name = f"{prefix}_{n}"
        if self.journal is not None:
            self.journal.append((self, prefix, counts.get(prefix), name))
        counts[prefix] = n + 1
        taken.add(name)
        return name

    def reserve(self, name):
        """Count `name` (a variable declared by its own name) and every prefix of it
        before a '.' as taken: a generated 'a.relu_0' (whose output is 'a.relu_0.out')
        must not meet a declared 'a.relu_0.out'."""
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            self._taken.add(".".join(parts[:i]))

    def count_on_from(self, other):
        """Hand out next what `other` (of a program this one is a copy of) would."""
        self._counts = dict(other._counts)

    @staticmethod
    def undo(entries):
        """Take back the names handed out as `entries` (journal entries) recorded."""
        for generator, prefix, count, name in reversed(entries):
            if count is None:
                generator._counts.pop(prefix, None)
            else:
                generator._counts[prefix] = count
            generator._taken.discard(name)
