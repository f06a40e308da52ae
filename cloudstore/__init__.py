"""cloudstore: Link store drivers that keep an agent's things in cloud buckets.

Kept import-free on purpose: ``lnk-gcs contract`` must answer without paying
for google-cloud-storage or boto3.
"""

__version__ = "0.2.0"
