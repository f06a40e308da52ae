"""One request in, one reply out: docs/protocol.md in code.

``answerer`` turns a request line into a reply, opening the store on first need; ``validate`` parses
the line (``runtime.strict_json``) and checks it against the wire rules; ``service`` calls the
collection (``cloudstore.store``) and builds the reply, each op declared once in its ``OPS``.
``client`` runs a driver program for those who speak to one from outside (the bridge, the
conformance suite, the scheduler).
"""
