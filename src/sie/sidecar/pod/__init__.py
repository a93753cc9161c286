"""The pod's side of the sidecar: its worker children as one fleet, the health publisher, the Kubernetes probes."""
