"""The table of ONNX ops: a `RuleTable` keyed by op type, with the domain as a prefix for
ops outside the default one ('com.microsoft.FusedMatMul'), versions by opset."""
from progdesc.translate import RuleTable


def key(domain, op_type):
    """The table key of an ONNX op type in `domain` ('' or 'ai.onnx': the default)."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}"


class OnnxRuleTable(RuleTable):
    """ONNX op type -> rule. `since` is the opset version of the op's domain a row holds
    from (the table picks the newest row not above the model's opset); a second row for
    the same type and version is refused (the modules filling the table would override
    each other by import order)."""

    def __init__(self, what="ONNX op"):
        super().__init__(what)

    def _add(self, name, since, entry):
        if any(s == since for s, _ in self._rows.get(name, ())):
            raise ValueError(f"the ONNX table has a row for '{name}' (since {since}) already")
        super()._add(name, since, entry)

    def types(self):
        """The op types the table has rows for (aliases included)."""
        return sorted(set(self._rows) | set(self._aliases))


RULES = OnnxRuleTable()
