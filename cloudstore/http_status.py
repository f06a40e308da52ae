"""An HTTP backend's reply status in the seam's words, once for every HTTP store (GCS and S3 alike).

arrow-rs ``object_store`` maps status to its error vocabulary in one place (``client/retry.rs``);
this is that place here. A 4xx that the store gives whatever the retry is a refusal
(``StoreRefused``: the request was not applied, nothing was changed) and the reply names what it
means without repeating the store's own message, which may name the bucket or the object. The
statuses that are *not* such refusals are the seam's other words: absent (404 ``NotFound``), a race
or a timeout (408, 409: ``Transient``), a precondition (412), an unsatisfiable range (416) and a
throttle (429 ``Throttled``). A backend adds only its own words: S3's error codes (``s3._REFUSALS``),
GCS's message texts (``gcs._meaning``).
"""

from __future__ import annotations

import time

from .generations import StoreRefused

#: What a 4xx refusal means, by status, when the backend knows nothing more precise.
REFUSED_STATUS = {
    400: "the store judged the request malformed", 401: "the driver's credentials were not accepted",
    403: "the driver's credentials may not do this here", 405: "the store does not allow this method here",
    411: "the store wants the request's length first", 413: "the request is larger than the store accepts",
    414: "the request's address is longer than the store accepts",
}
#: 4xx statuses that are not refusals of this kind: absent (404), a race or a timeout (408, 409),
#: a precondition (412), an unsatisfiable range (416), a throttle (429).
NOT_REFUSALS = frozenset({404, 408, 409, 412, 416, 429})
#: What a refusal says when neither the status nor the backend knows more.
REFUSED = "the store refused it"
#: What every backend's refusal says of a bucket that does not exist: the drivers add the setting that
#: names it (``protocol.answerer``), the Python API raises ``StoreNotFoundError`` for it.
BUCKET_GONE = "the bucket does not exist"


def is_refusal(status: int) -> bool:
    """Whether ``status`` refuses the request whatever the retry (a 4xx that is none of the seam's other words)."""
    return 400 <= status < 500 and status not in NOT_REFUSALS


def meaning(status: int) -> str:
    """What a refusal of ``status`` means, for a reply."""
    return REFUSED_STATUS.get(status, REFUSED)


def refused(status_text: str, why: str) -> StoreRefused:
    """The seam's refusal: ``the store refused the request (<status_text>): <why>``, the one wording."""
    return StoreRefused(f"the store refused the request ({status_text}): {why}")


def http_retry_after(value: object) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
