"""The diagnosis rules, one module a concern (analyze/diagnosis.py runs them in order)."""
