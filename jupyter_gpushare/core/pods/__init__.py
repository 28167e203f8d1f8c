"""What a kernel pod asks a Kubernetes cluster for, as data each sharing mode answers in. Pure.

The Kubernetes kind builds pods and claims (``backends/kubernetes/objects``) and reads the
cluster (``backends/kubernetes/cluster``); a mode (:mod:`jupyter_gpushare.core.modes`) says what
a pod of its own asks for and which nodes offer it, in the terms kept here: how a cluster names
GPU sharing (:mod:`.presets`), what it offers (:mod:`.cluster`), a pod's extended resources
(:mod:`.requests`) and one alternative of a ResourceClaim (:mod:`.dra`). Nothing here talks to
a cluster or imports its client.
"""
