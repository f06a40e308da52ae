"""One request in, one reply out: docs/protocol.md in code.

``strict_json`` parses a request line, ``validate`` checks it against the wire rules, ``service`` calls
the collection (``cloudstore.store``) and builds the reply. ``client`` runs a driver program for those
who speak to one from outside (the bridge, the conformance suite, the scheduler).
"""
