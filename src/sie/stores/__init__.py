"""Persistent stores behind small protocols: the config service's ConfigStore (fsspec: local, s3://, gs://)
and, later, the gateway's PoolStore."""
