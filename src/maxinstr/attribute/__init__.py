"""Attribution: which range launched each GPU op, per-range GPU totals (docs/attribution.md). After this
import ``maxinstr.attribute.attribute`` names the function, not the module."""

from __future__ import annotations

from maxinstr.attribute.attribute import ALL_RULES, NSYS_RULES, attribute
from maxinstr.attribute.model import Attribution, JoinMethod, Rule
from maxinstr.attribute.summary import kernels_by_range

__all__ = ["ALL_RULES", "NSYS_RULES", "Attribution", "JoinMethod", "Rule", "attribute", "kernels_by_range"]
