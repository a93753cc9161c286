"""Placement of batches on a pod's worker children (seed 002 "Scheduling modes"): round_robin,
least_outstanding by work basis, and lpt_packing with replicas, a fill quantum and compute-driven repacks.

Pure logic: no I/O, no event loop, an injected clock. The sidecar's fleet feeds it reports and asks it where
each batch goes; the HTTP control surface and the metrics read its snapshots.
"""
