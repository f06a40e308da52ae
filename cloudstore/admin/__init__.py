"""``lnk-store-admin``: an operator's tool over a whole store (inspect, gc, migrate).

The drivers answer one agent's request at a time and never look at the
store as a whole; an operator needs to: see what is kept (``inspect``),
clear what is provably dead (``gc``), and move a store between backends
(``migrate``).  Each command is a module of its own; ``walk`` enumerates a
store's keys and tells what each one is, ``verify`` compares two stores
through the drivers' own ops.  See docs/admin.md.
"""
