"""The HTTP fault proxy the project's fault tests put in front of an emulator.

Its code is ``cloudstore/conformance/fault_proxy.py`` (``lnk-store-check --faults`` runs it in front of
any driver), described there; this module keeps the names the tests import.
"""

# The proxy's core lives in the package now (``lnk-store-check --faults`` runs it in front of any
# driver); every name this module had, private ones included, is the same object there.
from cloudstore.conformance.fault_proxy import (  # noqa: F401
    _GCS_REASONS,
    _HOP,
    _REASONS,
    ACTIONS,
    CONTENT_KEPT,
    GCS_RATE_MESSAGE,
    LIMIT_KINDS,
    PRECONDITION_HEADERS,
    PRECONDITION_PARAMS,
    DateShift,
    FaultProxy,
    RateLimit,
    Rule,
    Seen,
    Stall,
    _Closed,
    _gcs_bucket,
    _gcs_written_name,
    _head_bytes,
    _read_line,
    _read_request,
    _Reply,
    _Request,
    _status_line,
    error_body,
    resign_sigv4,
    selects,
    shifted_date,
    strip_preconditions,
)
