"""What a process checks before its first op on a store: the format record and the server.

``store_format`` reads and writes the ``_format`` record, ``server_check`` proves the server honours
preconditions, ``store_gate`` runs both once per process beside the op's own requests. It sits between
the collections and the seam: ``RetryingStore`` asks it before every write.
"""
