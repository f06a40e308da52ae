"""The scheduler's parts; its entry (``lnk-cloud-scheduler``) is ``cloudstore/scheduler.py``.

* ``config``        the settings: JSON config first, flags over it, checked strictly.
* ``runner``        the loop: poll what is due, hand it to workers, sleep; recovery.
* ``watch``         where a poll learns its agents' due jobs (the due index, or a bridge's listing).
* ``claiming``      a worker's claim (lease, then waiting -> firing), fire and finish.
* ``claim_leases``  the claim leases: taken, renewed while firing, fenced when unconfirmed.
* ``fire``          running the operator's command for one job.
* ``store_client``  the store seen from the runner: a pool of driver processes, or a bridge.
* ``log``           one JSON object a line on stderr, or in a file rotated by size.
"""
