"""The accounting's arithmetic: what kernels cost (the fold of slice events) and the usage
report. Pure: the node ledger stores the events (backends/accounting)."""
