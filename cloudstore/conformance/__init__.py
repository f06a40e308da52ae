"""lnk-store-check: the store driver conformance suite.

Four families of named checks (``check``, ``check_jobs``, ``check_files``,
``check_narrowing``) drive a driver PROGRAM purely through its commands, as
``docs/protocol.md`` writes the JSON, so they judge a driver in any language.

    from cloudstore.conformance import run
    report = run("lnk-bucket-store", env={"LNK_BUCKET_URL": "file:///tmp/b"}, quick=True)
    assert report.ok, report.failures()

``run`` raises :class:`SetupError` (a ``ValueError``) before any check when
the driver cannot be judged as set up: not found, a failing ``contract``,
a first read answering a setting error (``LNK_BUCKET_URL is not set``).

Modules: ``harness`` (checks, results), ``transport`` (how a request gets
there), ``race`` (racers at a barrier), ``rules`` (refusals and stdout
discipline, shared), one module per family, ``runner`` (which checks a
contract calls for), ``preflight`` (setup told from verdict), ``progress``
(checks done / total while a run lasts), and the CLI's: ``cli``,
``header`` (what is judged), ``leftovers`` (what a run leaves in the store)
and ``json_report`` (``--json``).
"""

from .harness import FAMILIES, Check, Ctx, Report, Result
from .preflight import SetupError
from .runner import run
from .transport import CallTransport, ServeTransport, Transport

__all__ = ["FAMILIES", "Check", "Ctx", "Report", "Result", "run", "SetupError", "Transport", "CallTransport",
           "ServeTransport"]
