"""The collections over the seam: conversations, leases, jobs, files and tool narrowings as JSON objects.

Everything here reaches the bucket through ``cloudstore.generations.RetryingStore`` and settles every race
with one conditional write (``space.Space.update``, the CAS loop every collection shares). Nothing here
reads a request or writes a reply: that is ``cloudstore.protocol``, one layer up. ``keys`` is the layout
of the bucket, written out; docs/design.md draws the layers.
"""
