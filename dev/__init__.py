"""Development and test tooling (``lookahead_dev``), not shipped in the runtime packages.

``devcluster`` (a real local control plane and Prometheus), ``node`` (a real node: containerd,
CNI, kubelet, kube-scheduler), ``crdgen`` (the CRD from the pydantic models) and the benchmarks ``bench_engine``,
``bench_operator`` and ``bench_decision``.
"""
