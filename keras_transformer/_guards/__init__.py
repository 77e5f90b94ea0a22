"""The guards every entry point shares (private): value checks, token-id
checks made once per path, the fault guards that keep a model's weights
when ``fit``, ``evaluate`` or ``predict`` fail, and ``private_api``, the one
module that touches other libraries' private names (each checked, with a
public path where the check fails).

Nothing here is public API; the rest of the package may import these
modules (and only these private modules across packages).
"""
