"""Process plumbing the drivers, the bridge and the scheduler share: metrics, JSON logs, wake-ups, config.

Nothing here knows a store's layout or a request's rules; every module is usable by any program.
"""
