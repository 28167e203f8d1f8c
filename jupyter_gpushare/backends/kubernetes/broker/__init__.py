"""The Kubernetes kind's part of ``jupyter gpushare broker``: the cluster credentials and the one
list+watch (:mod:`.side`, the registry's ``broker_side``), its authority (:mod:`.authority`), the
kernel pods it creates for every server (:mod:`.pods`, :mod:`.pod_objects`), their routes
(:mod:`.pod_routes`) and the orphans it collects (:mod:`.orphans`). (Not to be confused with
:mod:`jupyter_gpushare.backends.kubernetes.pods_from_broker`, a server's client of these routes.)"""
