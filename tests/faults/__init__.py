"""Fault injection for the tests: a backend wrapper that loses replies, lands writes late
and lets a test order several machines' requests; an HTTP proxy for the real SDKs."""
