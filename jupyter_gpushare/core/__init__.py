"""The pure core: sizes, requests, records and wire shapes, placement, accounting's
arithmetic and the sharing modes. No I/O: no web, Jupyter, cluster, database, process or GPU
library (an import contract says so)."""
