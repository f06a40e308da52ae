"""A deterministic simulation of several machines on one store (issue 10), in FoundationDB's spirit.

The parts, each a module:

* ``machines``   - what a machine is (its own Service, Space, RetryingStore and
                   FaultyBackend on the shared real backend) and what the seed
                   decides besides the schedule (nonces, marks, packing sizes).
* ``scheduler``  - one thread runs at a time, the seed picks which, and which
                   fault each backend request meets; held writes land late;
                   a machine sleeps, or the store stalls, past a lease's lapse.
* ``simtime``    - the history's time: the real clock moved on by those jumps,
                   for the store's Dates and listings and every machine's clocks.
* ``workload``   - what each machine asks: seeded ops on a small key space, as a
                   client that believes the replies it got.
* ``history``    - every op with its reply and the steps it spanned, every
                   backend request with its fault.
* ``models``, ``linear`` - wire.md's rules for one object as a sequential model,
                   and the search for an order of the ops that it accepts.
* ``invariants`` - the checker: named promises, then the models.
* ``run``        - one history checked, many summed up, a report that replays.

``tests/test_simulation.py`` runs it on the three backends.
"""
