"""Attribution: which range launched each GPU op, and per-range-instance GPU totals:
``attribute(trace, run=None)`` (rules in docs/attribution.md); nsys-style tables in
:mod:`.summary`. After this import ``maxinstr.attribute.attribute`` names the function; the
module's other names come with ``from maxinstr.attribute.attribute import``.
"""

from __future__ import annotations

from maxinstr.attribute.attribute import ALL_RULES, NSYS_RULES, attribute
from maxinstr.attribute.model import Attribution, JoinMethod, Rule
from maxinstr.attribute.summary import kernels_by_range

__all__ = ["ALL_RULES", "NSYS_RULES", "Attribution", "JoinMethod", "Rule", "attribute", "kernels_by_range"]
