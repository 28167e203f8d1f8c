"""The local kind's part of ``jupyter gpushare broker``: the node ledger made the broker's own
(:mod:`.side`, the registry's ``broker_side``), its authority over this node's processes
(:mod:`.authority`), the slices' routes (:mod:`.slice_routes`) and the kernels' reports of their cells
(:mod:`.activity_routes`)."""
