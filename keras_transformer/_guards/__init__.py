"""The guards every entry point shares (private): value checks, token-id
checks made once per path, and the fault guards that keep a model's weights
when ``fit``, ``evaluate`` or ``predict`` fail.

Nothing here is public API; the rest of the package may import these
modules (and only these private modules across packages).
"""
