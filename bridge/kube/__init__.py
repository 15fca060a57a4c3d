"""Kubernetes: build the benchmark JobSet with the gpu-telemetry-manager sidecar, submit and follow it.

    profile.py   flags + environment → one validated ProfileSpec
    jobset.py    ProfileSpec → JobSet (plain dicts)
    validate.py  webhook, name, quantity and URL rules the schema doesn't check
    estimate.py  controller pod memory by component
    discovery.py k8s://namespace/service → one URL per ready EndpointSlice endpoint
    submit.py    create / get / watch / delete / results, with API errors explained
    cli.py       the `kube` click group

Importing this package imports nothing heavy; the kubernetes client is loaded only to submit.
"""
